//! Progress of long runs (`size i of n`), drawn on a terminal only: pipes, tests and CI see
//! nothing.
//!
//! `accord sim` draws on its own stderr. Benchmark ranks cannot: their stderr is a pipe to
//! the launcher, which copies whole lines, so a bar redrawn in place would never show. The
//! launcher therefore names its terminal in [`TTY_VAR`] and rank 0 draws there.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::os::unix::fs::OpenOptionsExt;

/// The terminal rank 0 of a benchmark draws its progress on (set by `accord bench`).
pub const TTY_VAR: &str = "ACCORD_PROGRESS_TTY";

/// A progress bar, or nothing when there is no terminal to draw on. Cleared when dropped.
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// `total` steps named `what`, on this process's stderr if it is a terminal.
    pub fn stderr(total: usize, what: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        Progress::on(ProgressDrawTarget::stderr(), total, what)
    }

    /// `total` steps named `what` for a benchmark rank: drawn by rank 0 only, on the terminal
    /// the launcher named.
    pub fn for_rank(rank: usize, total: usize, what: &str) -> Progress {
        let Some(path) = std::env::var_os(TTY_VAR).filter(|_| rank == 0) else {
            return Progress(None);
        };
        let tty = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(path);
        match tty.and_then(|w| Ok((w.try_clone()?, w))) {
            Ok((r, w)) if w.is_terminal() => {
                let term = console::Term::read_write_pair(r, w);
                Progress::on(ProgressDrawTarget::term(term, 10), total, what)
            }
            _ => Progress(None),
        }
    }

    /// Nothing drawn.
    pub fn hidden() -> Progress {
        Progress(None)
    }

    fn on(target: ProgressDrawTarget, total: usize, what: &str) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total as u64), target);
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] size {pos}/{len}: {msg} ({elapsed})")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(what.to_string());
        Progress(Some(bar))
    }

    /// Step `i` (from 0) starts, at `bytes` bytes.
    pub fn at(&self, i: usize, bytes: usize) {
        if let Some(b) = &self.0 {
            b.set_position(i as u64 + 1);
            b.set_message(format!("{bytes} B"));
        }
    }

    /// Run `f` (which prints to the same terminal) with the bar hidden.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.0 {
            Some(b) => b.suspend(f),
            None => f(),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

/// For the launcher: `(TTY_VAR, this terminal)` when stderr is a terminal.
pub fn tty_for_ranks() -> Option<(String, String)> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let path = std::fs::read_link("/proc/self/fd/2").ok()?;
    Some((TTY_VAR.to_string(), path.to_string_lossy().into_owned()))
}

/// How many sizes `start`, `start * factor`, ... up to and including `max` there are (the
/// benchmark's and the simulator's rows).
pub fn steps(start: usize, max: usize, factor: usize) -> usize {
    let (mut n, mut b) = (1, start);
    while b < max {
        b = (b.max(1) * factor.max(2)).min(max);
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_follow_the_size_loop() {
        assert_eq!(steps(4, 4 << 20, 2), 21);
        assert_eq!(steps(8, 64 << 20, 64), 5); // 8, 512, 32K, 2M, 64M
        assert_eq!(steps(0, 16, 4), 3); // 0, 4, 16
        assert_eq!(steps(100, 10, 2), 1);
    }

    #[test]
    fn nothing_is_drawn_without_a_terminal() {
        // Tests run with stderr captured, and no launcher named a terminal.
        if !std::io::stderr().is_terminal() {
            assert!(Progress::stderr(3, "x").0.is_none());
        }
        if std::env::var_os(TTY_VAR).is_none() {
            assert!(Progress::for_rank(0, 3, "x").0.is_none());
        }
        assert!(Progress::for_rank(1, 3, "x").0.is_none());
    }
}
