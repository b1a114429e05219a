//! The ranks' output, copied to the launcher's stdout and stderr a line at a time with a
//! `[rank] ` prefix, by one thread per pipe.
//!
//! A pipe reaches end of file only when every process holding its write end has closed it,
//! and a rank's children inherit it; one that outlives its rank (it left the rank's process
//! group, out of the launcher's reach) would hold the launcher for ever. So the threads poll,
//! and [`Output::finish`] stops waiting for them after a deadline.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a pump with nothing to read looks whether it should stop.
const TICK_MS: libc::c_int = 50;

/// The pumps of every rank's stdout and stderr.
pub struct Output {
    prefix: bool,
    pumps: Vec<(usize, JoinHandle<()>)>,
    abandon: Arc<AtomicBool>,
}

impl Output {
    /// Prefix each line with `[rank] ` if `prefix`.
    pub fn new(prefix: bool) -> Output {
        Output {
            prefix,
            pumps: Vec::new(),
            abandon: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Copy `from` (rank `rank`'s stdout, or its stderr if `to_err`) to ours.
    pub fn pump(&mut self, rank: usize, from: impl Into<OwnedFd>, to_err: bool) {
        let from = File::from(from.into());
        let prefix = self.prefix.then(|| format!("[{rank}] ").into_bytes());
        let abandon = self.abandon.clone();
        let handle = std::thread::spawn(move || copy_lines(from, prefix, to_err, &abandon));
        self.pumps.push((rank, handle));
    }

    /// Wait until every pipe reaches end of file, at most `within`; then stop copying. Returns
    /// the ranks whose output some process still held open.
    pub fn finish(self, within: Duration) -> Vec<usize> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline && self.pumps.iter().any(|(_, h)| !h.is_finished()) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut held: Vec<usize> = self
            .pumps
            .iter()
            .filter(|(_, h)| !h.is_finished())
            .map(|(r, _)| *r)
            .collect();
        held.dedup();
        self.abandon.store(true, Ordering::SeqCst);
        for (_, h) in self.pumps {
            let _ = h.join();
        }
        held
    }
}

/// Copy `from` line by line until end of file or `abandon`; a last line without a newline gets
/// one.
fn copy_lines(mut from: File, prefix: Option<Vec<u8>>, to_err: bool, abandon: &AtomicBool) {
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    while !abandon.load(Ordering::SeqCst) {
        let mut pfd = libc::pollfd {
            fd: from.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one pollfd this thread owns.
        match unsafe { libc::poll(&mut pfd, 1, TICK_MS) } {
            0 => continue,
            n if n < 0 => match std::io::Error::last_os_error().kind() {
                std::io::ErrorKind::Interrupted => continue,
                _ => break,
            },
            _ => {}
        }
        match from.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                pending.extend_from_slice(&chunk[..n]);
                if let Some(end) = pending.iter().rposition(|&b| b == b'\n') {
                    let lines: Vec<u8> = pending.drain(..=end).collect();
                    write_lines(&lines, prefix.as_deref(), to_err);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if !pending.is_empty() {
        pending.push(b'\n');
        write_lines(&pending, prefix.as_deref(), to_err);
    }
}

/// Write whole lines, each prefixed, in one locked write so that lines of different ranks do
/// not interleave.
fn write_lines(lines: &[u8], prefix: Option<&[u8]>, to_err: bool) {
    let mut out = Vec::with_capacity(lines.len() + 16);
    for line in lines.split_inclusive(|&b| b == b'\n') {
        out.extend_from_slice(prefix.unwrap_or_default());
        out.extend_from_slice(line);
    }
    let _ = if to_err {
        std::io::stderr().lock().write_all(&out)
    } else {
        std::io::stdout().lock().write_all(&out)
    };
}
