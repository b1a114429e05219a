//! Transports move bytes between ranks. They know peers, envelopes and byte ranges — never which
//! collective is running.
//!
//! A transport has two halves:
//! - [`Transport::send`] hands a message to a peer. It may block for flow control but never waits
//!   for the peer's *application* to post a receive, so schedules cannot deadlock on sends.
//! - incoming frames land in the transport's [`Mailbox`], keyed by (source, communicator,
//!   sequence). The executor takes them from there with a deadline.
//!
//! Large messages travel as several frames of at most [`chunk_bytes`] so that the receiver can
//! reduce one chunk while the next is still on the wire. A receive that copies a whole message
//! into one place may post that place ([`Mailbox::post`]), so that a transport reading frames
//! from a socket reads them straight there ([`placement`]).
//!
//! Implementations: [`inproc`] (threads in one process, used by most tests), [`tcp`], and
//! [`hybrid`] (shared-memory rings to ranks of the same host, TCP to the others).
//!
//! Every blocking wait is recorded in the mailbox's [`waits`], so that a peer whose call timed
//! out can ask this rank what it waits for ([`Transport::probe`]) and blame the right rank.

pub mod cpus;
pub mod hybrid;
pub mod inproc;
pub mod mailbox;
pub mod payloads;
pub mod placement;
pub mod shm;
pub mod tcp;
pub mod waits;
pub mod wire;

pub use mailbox::{Frame, Mailbox, WaitError};

use crate::error::Result;
use crate::fingerprint::Fingerprint;

/// The label every message carries: which communicator, which call on it, and that call's
/// fingerprint (checked by the receiver against its own call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    /// Communicator id (identical on every member, distinct between communicators).
    pub comm: u64,
    /// Sequence number of the call on that communicator, or [`P2P_LANE`] | tag for send/recv.
    pub seq: u64,
    /// The sender's call.
    pub fp: Fingerprint,
}

/// Sequence numbers with this bit set are point-to-point messages; the low bits hold the tag.
pub const P2P_LANE: u64 = 1 << 63;

pub use crate::config::{DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES};

/// Frame payload size: `ACCORD_CHUNK_BYTES` if set (a multiple of 8, at most
/// [`MAX_CHUNK_BYTES`]), else [`DEFAULT_CHUNK_BYTES`].
pub fn chunk_bytes() -> usize {
    crate::config::get().chunk_bytes
}

/// The slowest kind of link a transport's world uses: what a cost model needs to know about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    /// Threads of one process.
    InProcess,
    /// Shared memory between the processes of one host.
    SharedMemory,
    /// TCP (between hosts, or wherever some pair of ranks talks over sockets).
    Tcp,
}

/// Moves bytes between the ranks of one world.
pub trait Transport: Send + Sync + 'static {
    /// This process's rank in the transport's world.
    fn rank(&self) -> usize;
    /// Number of ranks in the transport's world.
    fn size(&self) -> usize;
    /// Short name for logs and cost models (`inproc`, `tcp`, `shm`, `tcp+shm`).
    fn name(&self) -> &'static str;
    /// The slowest link between two ranks of the world, for choosing algorithms.
    fn link(&self) -> LinkKind;
    /// Send `data` to `peer` (not self) labelled with `env`, as frames of at most
    /// [`chunk_bytes`]. Returns once the bytes are handed off; the caller's buffer is free again.
    fn send(&self, peer: usize, env: &Envelope, data: &[u8]) -> Result<()>;
    /// Begin [`Transport::send`]: the returned [`Sending`] may still read `data` until it is
    /// waited for (dropping it waits too), so the caller can receive meanwhile. Transports that
    /// cannot send in the background send at once.
    fn send_start<'a>(
        &'a self,
        peer: usize,
        env: &Envelope,
        data: &'a [u8],
    ) -> Result<Sending<'a>> {
        self.send(peer, env, data).map(|()| Sending::done())
    }
    /// Where incoming frames for this rank land.
    fn mailbox(&self) -> &Mailbox;
    /// Tell every reachable peer that the world is given up because rank `by` failed with
    /// `reason`; best effort. `by` is this rank, or the rank whose notice reached this one: a
    /// rank forwards the notice it heard before it closes, so that a peer that sees it close
    /// still learns who failed first rather than blaming the messenger.
    fn abort(&self, by: usize, reason: &str);
    /// Say goodbye to every peer and close this rank's connections, as dropping the transport
    /// does (a peer waiting for this rank then learns that it closed); later sends fail. For
    /// [`crate::Communicator::close`]: where nothing is open, nothing to do.
    fn shutdown(&self) {}
    /// Ask each of `peers` what its blocked calls wait for (see [`waits`]), waiting at most
    /// `within` for the answers; one [`waits::Answer`] per peer, in order. Transports that
    /// cannot ask answer [`waits::Answer::Unknown`].
    fn probe(&self, peers: &[usize], within: std::time::Duration) -> Vec<waits::Answer> {
        let _ = within;
        vec![waits::Answer::Unknown; peers.len()]
    }
}

/// A send that may still be reading its bytes ([`Transport::send_start`]).
#[must_use = "a send in the background must be waited for"]
pub struct Sending<'a> {
    rest: Option<Box<dyn FnOnce() -> Result<()> + 'a>>,
}

impl<'a> Sending<'a> {
    /// A send that has finished.
    pub fn done() -> Self {
        Sending { rest: None }
    }

    /// A send that `finish` completes (waiting for whatever still writes).
    pub fn later(finish: impl FnOnce() -> Result<()> + 'a) -> Self {
        Sending {
            rest: Some(Box::new(finish)),
        }
    }

    /// Whether nothing is left to wait for (every small send).
    pub fn is_done(&self) -> bool {
        self.rest.is_none()
    }

    /// Wait until the bytes are handed off; the send's outcome.
    pub fn wait(mut self) -> Result<()> {
        self.rest.take().map_or(Ok(()), |f| f())
    }
}

impl Drop for Sending<'_> {
    /// The bytes must not be read after the send is gone: wait (the outcome is lost; a caller
    /// that drops a send is already failing).
    fn drop(&mut self) {
        if let Some(f) = self.rest.take() {
            let _ = f();
        }
    }
}

/// Split `data` into frames no larger than `chunk` and call `emit(offset, bytes)` for each; a
/// zero-length message is still one (empty) frame so the receiver sees it.
pub fn for_each_chunk(
    data: &[u8],
    chunk: usize,
    mut emit: impl FnMut(usize, &[u8]) -> Result<()>,
) -> Result<()> {
    if data.is_empty() {
        return emit(0, data);
    }
    let mut off = 0;
    while off < data.len() {
        let end = (off + chunk).min(data.len());
        emit(off, &data[off..end])?;
        off = end;
    }
    Ok(())
}

/// How a network transport learns its peers' addresses: each rank publishes where it listens and
/// looks the others up. The rendezvous store implements this; tests may use a map.
pub trait AddressBook: Send + Sync {
    /// Publish this rank's listening address (e.g. `10.0.0.5:41234`).
    fn publish(&self, rank: usize, addr: &str) -> Result<()>;
    /// The address `rank` published, waiting for it until `deadline`.
    fn lookup(&self, rank: usize, deadline: std::time::Instant) -> Result<String>;
}

/// Where the ranks of one host exchange what shared memory needs at join (segment locations,
/// what each rank could map, its CPUs): each rank publishes keys, then waits for its peers'.
/// The rendezvous store implements this.
pub trait Directory {
    /// Publish `value` under `key`.
    fn put(&self, key: &str, value: &[u8]) -> Result<()>;
    /// The values of `keys`, in order, waiting until all are published or `timeout` passes.
    fn get_all(&self, keys: &[String], timeout: std::time::Duration) -> Result<Vec<Vec<u8>>>;
    /// Wait until every one of `keys` is published or `timeout` passes.
    fn wait_all(&self, keys: &[String], timeout: std::time::Duration) -> Result<()>;
}
