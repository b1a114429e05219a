//! Admission of connections that have not proved the token yet.
//!
//! A listener's unauthenticated connections cost the listener only what [`HandshakeLimits`]
//! allows: at most `max_pending` of them are in the handshake at once (more are closed as soon
//! as they are accepted, with a warning at most once a second), each must finish the whole
//! handshake within `deadline` of being accepted however it paces its bytes, and all of them
//! share the one thread that calls `Gate::turn`: their sockets are non-blocking and polled
//! together. Only a connection that has proved the token leaves the gate, in blocking mode, for
//! its owner to serve (on a thread of its own if it likes).

use super::{Challenge, Role, Token, REPLY_LEN};
use crate::error::{Error, Result};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Bounds on connections that have not finished the authentication handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeLimits {
    /// Most connections in the handshake at once; more are closed as soon as they arrive.
    pub max_pending: usize,
    /// Time from accepting a connection to the end of its handshake; slower ones are closed.
    pub deadline: Duration,
}

impl Default for HandshakeLimits {
    /// 128 connections, 5 seconds: a handshake takes one round trip, and 128 descriptors fit
    /// well under the common limit of 1,024 open files.
    fn default() -> Self {
        HandshakeLimits {
            max_pending: 128,
            deadline: Duration::from_secs(5),
        }
    }
}

impl HandshakeLimits {
    /// Refuse limits that would turn every connection away.
    pub fn check(&self) -> Result<()> {
        if self.max_pending == 0 {
            return Err(Error::invalid(
                "HandshakeLimits::max_pending must be at least 1",
            ));
        }
        if self.deadline.is_zero() {
            return Err(Error::invalid("HandshakeLimits::deadline must be positive"));
        }
        Ok(())
    }
}

/// What became of a connection that left the gate.
pub(crate) enum Outcome {
    /// It proved the token; the stream is in blocking mode with no timeouts changed.
    Passed(TcpStream, SocketAddr),
    /// It failed, timed out or closed during the handshake, and was closed.
    Refused(SocketAddr, Error),
}

/// The unauthenticated connections of one listener.
pub(crate) struct Gate {
    token: Token,
    role: Role,
    limits: HandshakeLimits,
    /// Names the listener in logs and errors, e.g. "the store" or "rank 3".
    label: String,
    pending: Vec<Pending>,
    /// Connections closed because the gate was full, not yet logged.
    unlogged_full: usize,
    last_full_log: Option<Instant>,
    /// Accept failed (e.g. out of descriptors): leave the listener alone until then.
    accept_paused_until: Option<Instant>,
}

/// Pause after a failed accept, so an exhausted descriptor table does not spin the thread.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Least time between two warnings about a full gate.
const FULL_LOG_INTERVAL: Duration = Duration::from_secs(1);

impl Gate {
    pub(crate) fn new(token: Token, role: Role, limits: HandshakeLimits, label: String) -> Self {
        Gate {
            token,
            role,
            limits,
            label,
            pending: Vec::new(),
            unlogged_full: 0,
            last_full_log: None,
            accept_paused_until: None,
        }
    }

    /// Wait up to `wait` for something to happen on `listener` (which must be non-blocking) or
    /// on a connection in the handshake, then accept new connections, advance handshakes and
    /// close the ones past their deadline. Returns the connections that left the gate.
    pub(crate) fn turn(&mut self, listener: &TcpListener, wait: Duration) -> Vec<Outcome> {
        let mut done = Vec::new();
        let now = Instant::now();
        let wait = self
            .pending
            .iter()
            .map(|p| p.deadline.saturating_duration_since(now))
            .fold(wait, Duration::min);
        let listen = self.accept_paused_until.is_none_or(|t| now >= t);
        let mut fds = Vec::with_capacity(self.pending.len() + 1);
        fds.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: if listen { libc::POLLIN } else { 0 },
            revents: 0,
        });
        fds.extend(self.pending.iter().map(|p| libc::pollfd {
            fd: p.stream.as_raw_fd(),
            events: p.interest(),
            revents: 0,
        }));
        // Round up, so a deadline less than a millisecond away is waited for, not spun on.
        let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures for the whole call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                tracing::warn!("{}: poll failed: {e}", self.label);
                std::thread::sleep(wait.min(ACCEPT_BACKOFF));
            }
            return done;
        }
        // Backwards, so that swap_remove only moves entries already visited.
        for i in (0..self.pending.len()).rev() {
            if fds[i + 1].revents == 0 {
                continue;
            }
            match self.pending[i].step(&self.token) {
                Step::Continue => {}
                Step::Passed => done.push(self.pending.swap_remove(i).passed()),
                Step::Failed(e) => {
                    let p = self.pending.swap_remove(i);
                    done.push(Outcome::Refused(p.peer, e));
                }
            }
        }
        let now = Instant::now();
        let deadline = self.limits.deadline;
        let mut i = 0;
        while i < self.pending.len() {
            if now >= self.pending[i].deadline {
                let p = self.pending.swap_remove(i);
                let e = Error::Unauthorized(format!(
                    "{}: no complete authentication handshake within {deadline:?}; closed",
                    p.what
                ));
                done.push(Outcome::Refused(p.peer, e));
            } else {
                i += 1;
            }
        }
        if fds[0].revents != 0 {
            self.accept_all(listener, &mut done);
        }
        done
    }

    fn accept_all(&mut self, listener: &TcpListener, done: &mut Vec<Outcome>) {
        loop {
            match listener.accept() {
                Ok((stream, peer)) => self.admit(stream, peer, done),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!("{}: accepting a connection failed: {e}", self.label);
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    fn admit(&mut self, stream: TcpStream, peer: SocketAddr, done: &mut Vec<Outcome>) {
        if self.pending.len() >= self.limits.max_pending {
            drop(stream);
            self.note_full(peer);
            return;
        }
        let what = format!("connection to {} from {peer}", self.label);
        if let Err(e) = stream.set_nonblocking(true) {
            let e = Error::io(format!("{what}: setting socket options"), e);
            done.push(Outcome::Refused(peer, e));
            return;
        }
        let challenge = Challenge::new(self.role);
        let mut p = Pending {
            out: challenge.hello().to_vec(),
            challenge,
            stream,
            peer,
            what,
            deadline: Instant::now() + self.limits.deadline,
            sent: 0,
            reply: [0; REPLY_LEN],
            got: 0,
            verdict: None,
        };
        match p.step(&self.token) {
            Step::Continue => self.pending.push(p),
            Step::Passed => done.push(p.passed()),
            Step::Failed(e) => done.push(Outcome::Refused(peer, e)),
        }
    }

    fn note_full(&mut self, peer: SocketAddr) {
        self.unlogged_full += 1;
        let now = Instant::now();
        if self
            .last_full_log
            .is_none_or(|t| now.duration_since(t) >= FULL_LOG_INTERVAL)
        {
            tracing::warn!(
                "{}: {} connections are already in the authentication handshake; closed {} \
                 more at once (the latest from {peer})",
                self.label,
                self.limits.max_pending,
                self.unlogged_full
            );
            self.unlogged_full = 0;
            self.last_full_log = Some(now);
        }
    }
}

/// One connection in the handshake.
struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    /// Names the connection in errors.
    what: String,
    deadline: Instant,
    challenge: Challenge,
    /// Bytes to send, of which `sent` are gone.
    out: Vec<u8>,
    sent: usize,
    /// The connector's reply, of which `got` bytes have arrived.
    reply: [u8; REPLY_LEN],
    got: usize,
    /// Set once the reply is checked; reported after the answer to it is sent.
    verdict: Option<Result<()>>,
}

enum Step {
    Continue,
    Passed,
    Failed(Error),
}

impl Pending {
    fn interest(&self) -> libc::c_short {
        if self.sent < self.out.len() {
            libc::POLLOUT
        } else {
            libc::POLLIN
        }
    }

    /// Move the handshake on as far as the socket allows without blocking. Never reads past the
    /// reply, so whatever an authenticated connector sends next stays in the socket.
    fn step(&mut self, token: &Token) -> Step {
        let failed = |what: &str, e: io::Error| {
            Step::Failed(Error::io(format!("{what}: authentication handshake"), e))
        };
        loop {
            if self.sent < self.out.len() {
                match (&self.stream).write(&self.out[self.sent..]) {
                    Ok(0) => return failed(&self.what, io::ErrorKind::WriteZero.into()),
                    Ok(n) => self.sent += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Continue,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return failed(&self.what, e),
                }
                continue;
            }
            if let Some(verdict) = self.verdict.take() {
                return match verdict {
                    Ok(()) => Step::Passed,
                    Err(e) => Step::Failed(e),
                };
            }
            match (&self.stream).read(&mut self.reply[self.got..]) {
                Ok(0) => return failed(&self.what, io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    self.got += n;
                    if self.got == REPLY_LEN {
                        let (answer, verdict) =
                            self.challenge.answer(token, &self.reply, &self.what);
                        self.out = answer;
                        self.sent = 0;
                        self.verdict = Some(verdict);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return failed(&self.what, e),
            }
        }
    }

    fn passed(self) -> Outcome {
        match self.stream.set_nonblocking(false) {
            Ok(()) => Outcome::Passed(self.stream, self.peer),
            Err(e) => Outcome::Refused(
                self.peer,
                Error::io(format!("{}: setting socket options", self.what), e),
            ),
        }
    }
}
