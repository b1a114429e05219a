//! A watchdog process that kills the ranks' process groups when the launcher dies without
//! stopping them itself (SIGKILL, a crash).
//!
//! Each rank also gets a parent-death signal, but that reaches only the rank process: it is not
//! inherited by the rank's children (a wrapper script that forks the real program), and the
//! exec of a set-user-ID program clears it. The watchdog kills each rank's whole group instead.
//! It learns the groups over a socket (each rank process enrols its own group between fork and
//! exec), whose launcher end closes however the launcher dies; end of file there, or being
//! reparented, means the launcher is gone.
//!
//! The watchdog is forked without exec (inside Python there is no binary of the launcher's own
//! to start), from a process with threads: it makes only async-signal-safe system calls, on
//! memory allocated before the fork. It leads a process
//! group of its own, so a signal to the launcher's job (Ctrl-C, `kill -9 %1`) does not take it
//! along; it ignores the signals a terminal or a broadcast sends.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// A message to the watchdog: `+g` watch group `g`, `-g` forget it, `0` the job is over.
type Message = i32;

/// The launcher's end of a running watchdog. Dropping it without [`Guard::dismiss`] (a panic)
/// reads to the watchdog as the launcher's death: it kills the groups.
pub struct Guard {
    tx: OwnedFd,
    pid: libc::pid_t,
}

impl Guard {
    /// Fork a watchdog for up to `groups` process groups.
    pub fn start(groups: usize) -> io::Result<Guard> {
        let mut fds = [0; 2];
        // SAFETY: socketpair fills the two-element array.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned here.
        let (tx, rx) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let mut table: Vec<libc::pid_t> = vec![0; groups];
        // SAFETY: getpid(2).
        let launcher = unsafe { libc::getpid() };
        // SAFETY: the child runs only `watch`, which keeps to async-signal-safe calls and never
        // returns.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            0 => unsafe { watch(rx.as_raw_fd(), launcher, &mut table) },
            pid => Ok(Guard { tx, pid }),
        }
    }

    /// What a rank process uses to put its group under watch before it execs, so that no code of
    /// the rank runs (and forks) before the watchdog knows its group.
    pub fn enrol(&self) -> Enrol {
        Enrol(self.tx.as_raw_fd())
    }

    /// Group `pgid` is gone: its number may be reused, so the watchdog must not kill it.
    pub fn forget(&self, pgid: libc::pid_t) {
        self.send(-pgid);
    }

    /// The launcher has stopped every group itself: the watchdog exits without acting.
    pub fn dismiss(self) {
        self.send(0);
        // It exits at once; reap it, but never wait long on a process that is not ours to stop.
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            let mut status = 0;
            // SAFETY: waitpid(2) on our own child.
            if unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) } != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn send(&self, msg: Message) {
        send(self.tx.as_raw_fd(), msg);
    }
}

/// The launcher's end of the watchdog's socket, for a rank process between fork and exec (the
/// socket is close-on-exec, so the rank keeps no copy).
#[derive(Clone, Copy)]
pub struct Enrol(libc::c_int);

impl Enrol {
    /// Put the calling process's group, which it leads, under watch. Async-signal-safe.
    pub fn own_group(self) {
        // SAFETY: getpid(2).
        send(self.0, unsafe { libc::getpid() });
    }
}

/// Send one message; async-signal-safe. MSG_NOSIGNAL: a dead watchdog must not kill the sender
/// with SIGPIPE (the ranks' parent-death signal still covers them).
fn send(fd: libc::c_int, msg: Message) {
    let bytes = msg.to_ne_bytes();
    // SAFETY: send(2) of a 4-byte buffer.
    unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
}

/// The watchdog: follow the messages on `rx` until the job is over (exit) or the launcher is
/// gone (kill every watched group). Runs in a child forked from a threaded process: only
/// async-signal-safe calls, no allocation, no unwinding.
unsafe fn watch(rx: libc::c_int, launcher: libc::pid_t, groups: &mut [libc::pid_t]) -> ! {
    libc::setpgid(0, 0);
    for sig in [libc::SIGINT, libc::SIGHUP, libc::SIGTERM, libc::SIGTSTP] {
        libc::signal(sig, libc::SIG_IGN);
    }
    libc::prctl(libc::PR_SET_NAME, c"accord-guard".as_ptr());
    // Hold nothing of the launcher's open: not the launcher's end of this socket (its closing is
    // the news), nor its output (whoever reads that waits for end of file), nor its sockets.
    if rx > 0 {
        libc::syscall(libc::SYS_close_range, 0, rx - 1, 0);
    }
    libc::syscall(libc::SYS_close_range, rx + 1, libc::c_uint::MAX, 0);
    loop {
        let mut pfd = libc::pollfd {
            fd: rx,
            events: libc::POLLIN,
            revents: 0,
        };
        let ready = libc::poll(&mut pfd, 1, 200);
        if ready == 0 {
            // Another process may hold a copy of the launcher's end (one forked, not executed,
            // inside an embedding program); being reparented tells the launcher is gone anyway.
            if libc::getppid() != launcher {
                break;
            }
            continue;
        }
        if ready < 0 {
            continue; // EINTR
        }
        let mut msg = [0u8; 4];
        let got = libc::recv(rx, msg.as_mut_ptr().cast(), msg.len(), 0);
        if got == 0 {
            break; // end of file: the launcher is gone
        }
        if got != msg.len() as isize {
            continue; // EINTR
        }
        match Message::from_ne_bytes(msg) {
            0 => libc::_exit(0),
            g if g > 0 => {
                if let Some(slot) = groups.iter_mut().find(|s| **s == 0) {
                    *slot = g;
                }
            }
            g => {
                if let Some(slot) = groups.iter_mut().find(|s| **s == -g) {
                    *slot = 0;
                }
            }
        }
    }
    // SIGKILL, as the parent-death signal kills each rank: a launcher that could not stop its
    // ranks in order leaves no grace to give.
    for &g in groups.iter().filter(|&&g| g > 0) {
        libc::kill(-g, libc::SIGKILL);
    }
    libc::_exit(0)
}
