//! SIGINT, SIGTERM and SIGHUP to the launcher: noted by a handler, passed on to every rank's
//! process group by the launcher, and raised again once the ranks are stopped.
//!
//! The ranks lead process groups of their own, so a terminal's Ctrl-C or hang-up, which goes to
//! the foreground process group, reaches only the launcher; passing the signal on is what
//! delivers it to the ranks.

use libc::c_int;
use std::sync::atomic::{AtomicI32, Ordering};

/// The signals passed on to the ranks.
const FORWARDED: [c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The last signal received and not yet taken (0: none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn note(sig: c_int) {
    RECEIVED.store(sig, Ordering::SeqCst);
}

/// The launcher's handlers, in place from [`Handlers::install`] until dropped, which restores
/// the dispositions the caller had (the launcher also runs inside Python).
pub struct Handlers {
    saved: Vec<(c_int, libc::sigaction)>,
}

impl Handlers {
    /// Catch the forwarded signals, except any the caller ignores: under `nohup`, or as a
    /// shell's background job, the launcher keeps ignoring them, and so do the ranks, which
    /// inherit the disposition.
    pub fn install() -> Handlers {
        RECEIVED.store(0, Ordering::SeqCst);
        let mut saved = Vec::new();
        for sig in FORWARDED {
            // SAFETY: sigaction on zeroed, then filled, plain-data structs; the handler only
            // stores into an atomic.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                    || old.sa_sigaction == libc::SIG_IGN
                {
                    continue;
                }
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = note as *const () as libc::sighandler_t;
                new.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut new.sa_mask);
                if libc::sigaction(sig, &new, std::ptr::null_mut()) == 0 {
                    saved.push((sig, old));
                }
            }
        }
        Handlers { saved }
    }

    /// The signal received since the last call, if any.
    pub fn take(&self) -> Option<c_int> {
        match RECEIVED.swap(0, Ordering::SeqCst) {
            0 => None,
            sig => Some(sig),
        }
    }

    /// Restore the caller's handling of the signals and raise `sig` again, so that the caller
    /// sees it as if there were no launcher in between: the `accord` binary dies of it (its
    /// parent sees a signalled process, not an exit code), and an embedding program's own
    /// handler runs (Python raises KeyboardInterrupt for SIGINT). Returns the shell's code for
    /// the signal, `128 + sig`, if the process survives it.
    pub fn reraise(self, sig: c_int) -> i32 {
        drop(self);
        // SAFETY: raise(3) with a valid signal number.
        unsafe { libc::raise(sig) };
        128 + sig
    }
}

impl Drop for Handlers {
    fn drop(&mut self) {
        for (sig, old) in &self.saved {
            // SAFETY: puts back the struct sigaction read in `install`.
            unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
        }
    }
}

/// `SIGTERM` for the signals the launcher sends and forwards; `signal N` for others.
pub fn name(sig: c_int) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGKILL => "SIGKILL".into(),
        _ => format!("signal {sig}"),
    }
}
