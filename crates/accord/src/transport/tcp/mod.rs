//! Ranks as processes connected by a full mesh of TCP connections.
//!
//! # Forming the world
//!
//! [`TcpTransport::connect`] binds a listener on an ephemeral port, publishes its address through
//! an [`AddressBook`] (the rendezvous store, or [`MemoryAddressBook`] in tests) and then, at the
//! same time,
//!
//! - connects to every lower rank (looking its address up, retrying refused connections until the
//!   deadline), and
//! - accepts a connection from every higher rank.
//!
//! Every new connection runs the mutual token handshake of [`crate::auth`] with
//! [`Role::Peer`] before anything else is read from it. The forming rank runs the handshakes of
//! its inbound connections itself, without blocking, through a `Gate` (`auth::gate`) bounded by
//! [`TcpOptions::handshake`] (raised to at least the number of higher ranks, which all connect
//! at once): a connection beyond the limit is closed on arrival, and one that has not finished
//! the handshake by the deadline is closed then, so strangers cost no threads and few
//! descriptors. A dialing rank whose connection is closed during the handshake retries until
//! the world's deadline. A connection that fails the handshake is closed and none of its bytes
//! are acted on; the refusal is logged and, if the world then fails to form, quoted in the
//! timeout error. After the handshake the connector introduces itself:
//!
//! ```text
//! connector -> acceptor : rank u32 | world size u32 | lane u16 | lanes u8 | format u8
//! acceptor  -> connector: 0                                                  (accepted)
//!                         1 | reason length u16 | reason (UTF-8)             (refused)
//! ```
//!
//! Integers are little-endian; `format` is the frames' format version ([`wire::PROTOCOL`]). The
//! acceptor refuses another format (a rank of another release: the message says so), a different
//! world size, a rank that is not above its own or not below the world size, and a rank (or one of
//! its lanes) that is already connected, so two processes started with the same rank get a clear
//! error instead of a scrambled world. A pair of ranks has as many connections ("lanes",
//! [`TcpOptions::lanes`], 1 to 8) as the higher rank asks for; the world is formed once every lane
//! of every pair is.
//!
//! # Moving bytes
//!
//! [`Transport::send`] writes each chunk as one frame: a 72-byte [`Header`] followed by the
//! payload, under a per-connection write lock. One reader thread per connection always drains
//! its socket into the [`Mailbox`], whatever the application does, so blocking writes cannot
//! deadlock. Where a pair has several lanes, messages from [`STRIPE_MIN_BYTES`] (256 KiB,
//! `ACCORD_TCP_STRIPE_BYTES`) are dealt over them frame by frame, written by one thread per lane
//! at once (in the background with [`Transport::send_start`]), and put back in order on arrival
//! (module `lanes`): one connection moves only what one thread copies into the kernel and one
//! copies out. A call
//! waiting for a small message (under 64 KiB, the whole call counted) reads its peer's socket
//! itself for up to `ACCORD_TCP_POLL_US` (50 us, renewed while bytes come) before it sleeps,
//! and the reader thread keeps out of its way meanwhile (module `reader`): a small message then
//! costs no thread wake-up at all. Between two ranks a 4-byte allreduce went from 31 us (sleep
//! and wake) to 13-19 us (polling the mailbox) to 8-9 us (reading the socket), OpenMPI's time
//! from C. Where this host's ranks outnumber its CPUs, waits sleep at once (polling took the CPU
//! from the ranks that had work); where every rank and its reader thread can have a CPU of their
//! own, waits for messages up to 1 MiB (`ACCORD_TCP_PUMP_BYTES`) read the socket themselves too
//! (on 16 CPUs, 64-256 KiB calls 1.2-1.9x faster). A frame of at least 32 KiB that a waiting
//! receive has posted a destination for is read straight into it rather than into a buffer
//! the receive then copies ([`super::placement`]). The reader
//! reports a peer as lost as soon as its connection ends: with `rank N closed its communicator`
//! after a goodbye frame, and with `connection closed (process exited or was killed)` otherwise.
//! Malformed bytes make the reader report the peer lost with the protocol error and close the
//! connection; they never cause a panic or an allocation larger than
//! [`super::MAX_CHUNK_BYTES`]. A frame of a kind this version does not know is skipped.
//!
//! # Status queries
//!
//! A rank whose call timed out asks the rank it waited for what *that* rank is blocked on (the
//! blame chain, module `blame`): it sends a `Query` frame, and the peer answers with a `Status` frame
//! listing its recorded waits ([`super::waits`]). The answer comes from the peer's transport
//! threads (its reader hands the query to a responder thread, so that no reader ever blocks on
//! a write), not from its application thread, which may be blocked; a process that does not
//! answer at all is stopped or hung.
//!
//! # Configuration
//!
//! | Environment variable      | Meaning                                                        |
//! |---------------------------|----------------------------------------------------------------|
//! | `ACCORD_HOST`             | Address the listener binds to (default: the published address) |
//! | `ACCORD_ADVERTISE_HOST`   | Host or IP published for peers to connect to                   |
//! | `ACCORD_TCP_LANES`        | Connections to each lower rank (1-8; default [`lanes_for`])    |
//! | `ACCORD_TCP_BUSY_POLL_US` | `SO_BUSY_POLL` on every connection (default: the kernel's)     |
//!
//! Without `ACCORD_ADVERTISE_HOST`, the published host is `ACCORD_HOST` when that is a specific
//! address; otherwise the first non-loopback IPv4 address this machine's host name resolves to;
//! otherwise `127.0.0.1`, which only works for single-machine jobs. Set `ACCORD_ADVERTISE_HOST`
//! on machines whose host name does not resolve to the interface the other ranks can reach.
//!
//! Without `ACCORD_HOST`, the listener binds the published address, so it is reachable only
//! through the interface the other ranks are told to use (only loopback when `127.0.0.1` is
//! published). When that address is not one of this machine's (behind NAT), it listens on every
//! interface and logs a warning; so it does, quietly, for a published host *name* that resolves
//! here to a loopback address (`/etc/hosts` often maps the machine's own name so), since other
//! machines resolve it to something else. `ACCORD_HOST=0.0.0.0` asks for every interface.

use super::waits::{self, Answer, Blocked};
use super::wire::{self, FrameKind, Header, HEADER_LEN, QUERY_LEN};
use super::{
    chunk_bytes, for_each_chunk, AddressBook, Envelope, Frame, LinkKind, Mailbox, Sending,
    Transport,
};
use crate::auth::gate::{Gate, Outcome};
use crate::auth::{self, HandshakeLimits, Role, Token};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, OpKind};
use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, TcpKeepalive, Type};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::ToSocketAddrs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod lanes;
mod memory_book;
mod mesh;
mod reader;
mod write;
pub use lanes::{lanes_for, MAX_LANES, STRIPE_MIN_BYTES};
use lanes::{LaneWriter, Sequencer};
pub use memory_book::MemoryAddressBook;
use mesh::{busy_poll, dial, listen_for, poll_for, AcceptCtx};
use reader::Inbound;
use write::{write_frame, write_frame_noting};

/// Socket send and receive buffer size requested for every connection.
const SOCKET_BUFFER_BYTES: usize = 4 * 1024 * 1024;
/// Buffer of each reader thread (headers and small frames are read through it).
const READ_BUFFER_BYTES: usize = 256 * 1024;
/// How long a registered peer's address may refuse connections before it counts as gone.
const REFUSED_MEANS_GONE: Duration = Duration::from_secs(2);
/// How long `abort` and `shutdown` may block on one peer.
const COURTESY_WRITE: Duration = Duration::from_secs(1);
/// How long `shutdown` waits for peers to acknowledge the goodbye before closing anyway.
const GOODBYE_GRACE: Duration = Duration::from_secs(5);
/// Most lower ranks dialed at the same time.
const MAX_DIALERS: usize = 16;
/// Longest single wait on the address book, so a failed world formation stops promptly.
const LOOKUP_SLICE: Duration = Duration::from_millis(500);
/// Most status queries waiting for the responder thread.
const MAX_QUERIES_QUEUED: usize = 1024;
/// Default world-formation and write timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Refusals of inbound connections quoted in a world-formation timeout (the rest are counted).
const QUOTED_REFUSALS: usize = 8;

/// How a [`TcpTransport`] listens, what it publishes, and how long it waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpOptions {
    /// Address the listener binds to (`ACCORD_HOST`); empty (the default) binds the advertised
    /// address, as described in the [module documentation](self).
    pub bind_host: String,
    /// Host or IP published for peers to connect to (`ACCORD_ADVERTISE_HOST`). `None` picks one
    /// as described in the [module documentation](self).
    pub advertise_host: Option<String>,
    /// Deadline for forming the world (unless `form_deadline` is set), and the write timeout
    /// of every connection afterwards.
    pub timeout: Duration,
    /// When forming the world must be done, if sooner than `timeout` from now: the job's join
    /// deadline, so that a rank that registered and then died is named as soon as a rank that
    /// never registered would be.
    pub form_deadline: Option<Instant>,
    /// Bounds on inbound connections that have not proved the token yet.
    pub handshake: HandshakeLimits,
    /// Connections this rank opens to each lower rank (1 to [`MAX_LANES`]): messages from
    /// [`STRIPE_MIN_BYTES`] are dealt over them (see `lanes`). The higher rank of a pair
    /// decides. Default: `ACCORD_TCP_LANES`, else 1 ([`lanes_for`] is what jobs started
    /// through the rendezvous take).
    pub lanes: usize,
}

impl Default for TcpOptions {
    /// Options from `ACCORD_HOST` and `ACCORD_ADVERTISE_HOST`, with a 300 s timeout.
    fn default() -> Self {
        let cfg = crate::config::get();
        TcpOptions {
            bind_host: cfg.host.clone(),
            advertise_host: cfg.advertise_host.clone(),
            timeout: DEFAULT_TIMEOUT,
            form_deadline: None,
            handshake: HandshakeLimits::default(),
            lanes: cfg.tcp_lanes.unwrap_or(1),
        }
    }
}

impl TcpOptions {
    /// Loopback-only options (bind and publish `127.0.0.1`) with the given timeout; for tests and
    /// single-machine jobs.
    pub fn loopback(timeout: Duration) -> Self {
        TcpOptions {
            bind_host: "127.0.0.1".into(),
            advertise_host: None,
            timeout,
            form_deadline: None,
            handshake: HandshakeLimits::default(),
            lanes: crate::config::get().tcp_lanes.unwrap_or(1),
        }
    }

    /// The host this rank publishes, following the rules in the [module documentation](self).
    pub fn advertised_host(&self) -> String {
        if let Some(h) = &self.advertise_host {
            return h.clone();
        }
        match self.bind_host.parse::<IpAddr>() {
            Ok(ip) if !ip.is_unspecified() => return ip.to_string(),
            Err(_) if !self.bind_host.is_empty() => return self.bind_host.clone(),
            _ => {}
        }
        let ipv4_only = !matches!(self.bind_host.parse::<IpAddr>(), Ok(IpAddr::V6(_)));
        host_name_ip(ipv4_only)
            .map(|ip| ip.to_string())
            .unwrap_or_else(|| Ipv4Addr::LOCALHOST.to_string())
    }
}

/// The first non-loopback address this machine's host name resolves to.
fn host_name_ip(ipv4_only: bool) -> Option<IpAddr> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for `buf.len()` bytes; gethostname NUL-terminates on success
    // when the name fits, and we also stop at the buffer's end.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = std::str::from_utf8(&buf[..end]).ok()?;
    let addrs: Vec<IpAddr> = (name, 0).to_socket_addrs().ok()?.map(|a| a.ip()).collect();
    let usable = |ip: &IpAddr| !ip.is_loopback() && !ip.is_unspecified();
    addrs
        .iter()
        .find(|ip| ip.is_ipv4() && usable(ip))
        .or_else(|| {
            addrs
                .iter()
                .find(|ip| !ipv4_only && ip.is_ipv6() && usable(ip))
        })
        .copied()
}

fn host_port(host: &str, port: u16) -> String {
    if host.parse::<Ipv6Addr>().is_ok() {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The connections to a peer.
struct Peer {
    /// Lane 0's write half; the lock keeps a frame's header and payload together.
    writer: Mutex<Socket>,
    /// A handle for shutting lane 0 down without taking the write lock.
    ctl: TcpStream,
    /// The order the next data frame to this peer takes (see `lanes`).
    order: std::sync::atomic::AtomicU32,
    /// The other lanes, each with its writer thread.
    extra: Vec<LaneWriter>,
}

impl Peer {
    /// Shut every lane down.
    fn shutdown(&self, how: Shutdown) {
        let _ = self.ctl.shutdown(how);
        for l in &self.extra {
            l.shutdown(how);
        }
    }
}

/// One rank's end of a TCP full mesh. See the [module documentation](self).
pub struct TcpTransport {
    rank: usize,
    size: usize,
    timeout: Duration,
    published: String,
    mailbox: Arc<Mailbox>,
    /// Indexed by rank; `None` at this rank's own index.
    peers: Vec<Option<Peer>>,
    readers: Mutex<Vec<JoinHandle<()>>>,
    /// Each peer's receiving side, which waiting callers may also read.
    inbounds: Vec<Option<Arc<Inbound>>>,
    closing: Arc<AtomicBool>,
}

/// A status query from `.0` with nonce `.1`, handed from a reader to the responder thread.
type Query = (usize, u64);

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("published", &self.published)
            .finish_non_exhaustive()
    }
}

/// A connection that passed the handshake, or why one did not.
enum Arrival {
    /// Lane `.1` of `.2` to or from rank `.0`, authenticated and introduced.
    Peer(usize, usize, usize, TcpStream),
    /// An incoming connection was refused, and why.
    Refused(String),
    /// Connecting to a lower rank failed.
    DialFailed(Error),
}

impl TcpTransport {
    /// Join the world as `rank` of `size`: listen, publish this rank's address in `book`, connect
    /// to every lower rank and accept every higher rank, authenticating each connection with
    /// `token`.
    ///
    /// Fails with [`Error::Timeout`] naming the ranks that never connected if the mesh is not
    /// complete within `opts.timeout`, with [`Error::Unauthorized`] if a peer does not know the
    /// token, and with [`Error::InvalidArgument`] if a peer disagrees about the world size or
    /// already has a connection for this rank.
    pub fn connect(
        rank: usize,
        size: usize,
        token: &Token,
        book: &dyn AddressBook,
        opts: TcpOptions,
    ) -> Result<Arc<TcpTransport>> {
        if size == 0 || rank >= size {
            return Err(Error::invalid(format!(
                "rank {rank} outside a world of {size} ranks"
            )));
        }
        if size > u32::MAX as usize {
            return Err(Error::invalid(format!(
                "a world of {size} ranks is too big"
            )));
        }
        if opts.timeout.is_zero() {
            return Err(Error::invalid("the TCP transport timeout must be positive"));
        }
        opts.handshake.check()?;
        let start = Instant::now();
        let deadline = opts
            .form_deadline
            .map_or(start + opts.timeout, |d| d.min(start + opts.timeout));

        let advertised = opts.advertised_host();
        let listener = listen_for(&opts.bind_host, &advertised)?;
        if let Some(poll) = crate::config::get().tcp_busy_poll {
            // Connections inherit the listener's setting or set it as the listener did; a rank
            // that may not busy-poll fails here, before any peer counts on it.
            busy_poll(&SockRef::from(&listener), poll)?;
        }
        let port = listener
            .local_addr()
            .map_err(|e| Error::io("reading the listener's address", e))?
            .port();
        let published = host_port(&advertised, port);
        book.publish(rank, &published)?;
        tracing::debug!(rank, size, addr = %published, "tcp transport listening");

        let lanes = opts.lanes.clamp(1, MAX_LANES);
        // Each peer's lanes: this rank's count for lower ranks, the higher rank's once it
        // introduces itself.
        let mut streams: Vec<Vec<Option<TcpStream>>> = (0..size)
            .map(|p| match p < rank {
                true => (0..lanes).map(|_| None).collect(),
                false => Vec::new(),
            })
            .collect();
        let mut refusals: Vec<String> = Vec::new();
        let mut refused = 0usize;
        let limits = HandshakeLimits {
            max_pending: opts.handshake.max_pending.max((size - rank) * lanes),
            ..opts.handshake
        };
        let mut gate = Gate::new(token.clone(), Role::Peer, limits, format!("rank {rank}"));
        let claimed = Arc::new(Mutex::new(vec![Vec::new(); size]));
        let cancel = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<Arrival>();

        let outcome: Result<()> = std::thread::scope(|s| {
            // Dial the lower ranks from a few workers, so one slow rank does not hold up the
            // others and a timeout names exactly the ranks that are missing.
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            for _ in 0..rank.min(MAX_DIALERS) {
                let (tx, cancel, next) = (tx.clone(), cancel.clone(), next.clone());
                s.spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let (peer, lane) = (i / lanes, i % lanes);
                    if peer >= rank || cancel.load(Ordering::Relaxed) {
                        break;
                    }
                    let to = (peer, lane, lanes);
                    let arrival = match dial(rank, size, to, token, book, deadline, &cancel) {
                        Ok(stream) => Arrival::Peer(peer, lane, lanes, stream),
                        Err(e) => Arrival::DialFailed(e),
                    };
                    if tx.send(arrival).is_err() {
                        break;
                    }
                });
            }
            let mut dial_hints: Vec<String> = Vec::new();
            loop {
                // New connections: the gate runs their token handshakes without blocking; one
                // that passes is introduced on its own thread.
                for outcome in gate.turn(&listener, Duration::ZERO) {
                    match outcome {
                        Outcome::Passed(stream, from) => {
                            let ctx = AcceptCtx {
                                rank,
                                size,
                                claimed: claimed.clone(),
                                deadline,
                                tx: tx.clone(),
                            };
                            std::thread::Builder::new()
                                .name(format!("accord-tcp-hs{rank}"))
                                .spawn(move || ctx.run(stream, from))
                                .map_err(|e| Error::io("starting a handshake thread", e))?;
                        }
                        Outcome::Refused(from, e) => {
                            tx.send(Arrival::Refused(format!("from {from}: {e}")))
                                .expect("the receiver lives in this scope");
                        }
                    }
                }
                while let Ok(arrival) = rx.try_recv() {
                    match arrival {
                        Arrival::Peer(peer, lane, n, stream) => {
                            // The introduction checked `lane < n` and one `n` per peer.
                            let l = &mut streams[peer];
                            if l.is_empty() {
                                l.resize_with(n, || None);
                            }
                            l[lane] = Some(stream);
                        }
                        Arrival::Refused(why) => {
                            tracing::warn!(rank, "refused a peer connection: {why}");
                            refused += 1;
                            if refusals.len() < QUOTED_REFUSALS {
                                refusals.push(why);
                            }
                        }
                        Arrival::DialFailed(Error::Timeout { hint, .. }) => dial_hints.push(hint),
                        Arrival::DialFailed(e) => {
                            cancel.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                    }
                }
                let missing: Vec<usize> = (0..size)
                    .filter(|&p| {
                        let l = &streams[p];
                        p != rank && (l.is_empty() || l.iter().any(Option::is_none))
                    })
                    .collect();
                if missing.is_empty() {
                    return Ok(());
                }
                let now = Instant::now();
                if now >= deadline {
                    cancel.store(true, Ordering::Relaxed);
                    let mut hint = dial_hints.concat();
                    let higher: Vec<String> = missing
                        .iter()
                        .filter(|&&p| p > rank)
                        .map(|p| p.to_string())
                        .collect();
                    if !higher.is_empty() {
                        hint.push_str(&format!(
                            "; rank(s) {} never connected to this rank's listener at {published}",
                            higher.join(", ")
                        ));
                    }
                    if !refusals.is_empty() {
                        hint.push_str(&format!(
                            "; refused {refused} connection(s): {}{}",
                            refusals.join("; "),
                            if refused > refusals.len() {
                                "; ..."
                            } else {
                                ""
                            }
                        ));
                    }
                    return Err(Error::Timeout {
                        op: format!("forming the TCP mesh (rank {rank} of {size})"),
                        seq: 0,
                        comm: "world".into(),
                        waiting_for: missing,
                        after: now - start,
                        hint,
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        cancel.store(true, Ordering::Relaxed);
        // Connections still in the handshake are closed with the listener.
        drop(listener);
        drop(gate);
        outcome?;

        let mailbox = Arc::new(Mailbox::new());
        let (poll, poll_large) = poll_for(streams.iter().filter_map(|l| l.first()?.as_ref()));
        mailbox.set_poll(poll);
        mailbox.set_poll_large(poll_large);
        mailbox.set_pump_below(crate::config::get().tcp_pump_bytes);
        let closing = Arc::new(AtomicBool::new(false));
        let (queries, asked) = mpsc::sync_channel::<Query>(MAX_QUERIES_QUEUED);
        let mut peers = Vec::with_capacity(size);
        let mut readers = Vec::with_capacity(size.saturating_sub(1));
        let mut inbounds: Vec<Option<Arc<Inbound>>> = (0..size).map(|_| None).collect();
        for (peer, lanes) in streams.into_iter().enumerate() {
            if lanes.is_empty() {
                peers.push(None);
                continue;
            }
            let n = lanes.len();
            let sequencer = (n > 1).then(|| Arc::new(Sequencer::new(peer, n, mailbox.clone())));
            let mut first = None;
            let mut extra = Vec::with_capacity(n - 1);
            for (lane, stream) in lanes.into_iter().flatten().enumerate() {
                let setup = |e| Error::io(format!("setting up the connection to rank {peer}"), e);
                stream.set_read_timeout(None).map_err(setup)?;
                stream
                    .set_write_timeout(Some(opts.timeout))
                    .map_err(setup)?;
                let inbound = Arc::new(Inbound::new(
                    (peer, lane),
                    sequencer.clone(),
                    size,
                    mailbox.clone(),
                    closing.clone(),
                    stream.try_clone().map_err(setup)?,
                    queries.clone(),
                ));
                let reader = inbound.clone();
                readers.push(
                    std::thread::Builder::new()
                        .name(format!("accord-tcp{rank}<{peer}.{lane}"))
                        .spawn(move || reader.run())
                        .map_err(|e| Error::io("starting a reader thread", e))?,
                );
                if lane == 0 {
                    inbounds[peer] = Some(inbound);
                    first = Some(stream);
                } else {
                    let name = format!("accord-tcp{rank}>{peer}.{lane}");
                    extra.push(LaneWriter::start(&stream, name)?);
                }
            }
            let stream = first.expect("every peer has lane 0");
            peers.push(Some(Peer {
                writer: Mutex::new(Socket::from(stream.try_clone().map_err(|e| {
                    Error::io(format!("setting up the connection to rank {peer}"), e)
                })?)),
                ctl: stream,
                order: std::sync::atomic::AtomicU32::new(0),
                extra,
            }));
        }
        tracing::debug!(rank, size, "tcp mesh formed in {:.1?}", start.elapsed());
        // Waits read their peer's socket themselves (weakly held: the mailbox outlives nothing).
        let weak: Vec<_> = inbounds
            .iter()
            .map(|i| i.as_ref().map(Arc::downgrade))
            .collect();
        mailbox.set_pump(Box::new(move |src| {
            weak.get(src).and_then(|w| w.as_ref()?.upgrade())?.enter()
        }));
        let t = Arc::new(TcpTransport {
            rank,
            size,
            timeout: opts.timeout,
            published,
            mailbox,
            peers,
            readers: Mutex::new(readers),
            inbounds,
            closing,
        });
        // Ends when every reader has ended (their senders are gone) or the transport is gone.
        drop(queries);
        let weak = Arc::downgrade(&t);
        std::thread::Builder::new()
            .name(format!("accord-tcp{rank}-status"))
            .spawn(move || {
                while let Ok((peer, nonce)) = asked.recv() {
                    match weak.upgrade() {
                        Some(t) => t.answer(peer, nonce),
                        None => break,
                    }
                }
            })
            .map_err(|e| Error::io("starting the status thread", e))?;
        Ok(t)
    }

    /// Answer `peer`'s status query `nonce` with what this rank's calls wait for.
    fn answer(&self, peer: usize, nonce: u64) {
        let Some(Some(p)) = self.peers.get(peer) else {
            return;
        };
        if self.closing.load(Ordering::SeqCst) || self.mailbox.lost(peer).is_some() {
            return;
        }
        let body = waits::encode_status(nonce, &self.mailbox.waits().now());
        let hdr = self.control_header(FrameKind::Status, body.len());
        if let Err(e) = self.courtesy_write(&p.writer, &p.ctl, &hdr, &body) {
            tracing::debug!(rank = self.rank, peer, "status not sent: {e}");
        }
    }

    /// What can be known about `peer` without asking it: that it is lost, or (on this host)
    /// that its process is stopped.
    fn known_state(&self, peer: usize) -> Option<Answer> {
        if let Some(cause) = self.mailbox.lost(peer) {
            return Some(Answer::Lost(cause));
        }
        let pid = self.mailbox.waits().pid(peer)?;
        let state = waits::process_state(pid)?;
        waits::is_stopped(state).then_some(Answer::Stopped { pid, state })
    }

    /// Whether calls waiting for `peer` read its connection themselves (the default). Off for
    /// peers whose data comes another way (shared memory), whose connection then carries only
    /// control frames, which the reader thread handles.
    pub fn set_read_by_waiters(&self, peer: usize, on: bool) {
        if let Some(Some(i)) = self.inbounds.get(peer) {
            i.pumped.store(on, Ordering::Relaxed);
        }
    }

    /// The mailbox, shared with transports that deliver into it too.
    pub fn mailbox_arc(&self) -> Arc<Mailbox> {
        self.mailbox.clone()
    }

    /// The address this rank published for its peers.
    pub fn published_addr(&self) -> &str {
        &self.published
    }

    /// Simulate this process's death: close every connection abruptly, without a goodbye.
    #[doc(hidden)]
    pub fn kill_for_test(&self) {
        self.close(false);
    }

    fn close(&self, goodbye: bool) {
        if self.closing.swap(true, Ordering::SeqCst) {
            return;
        }
        for (peer, p) in self.peers.iter().enumerate() {
            let Some(p) = p else { continue };
            if goodbye && self.mailbox.lost(peer).is_none() {
                // On every lane: the peer counts this rank gone once each has said it.
                let hdr = self.control_header(FrameKind::Bye, 0);
                let _ = self.courtesy_write(&p.writer, &p.ctl, &hdr, &[]);
                for l in &p.extra {
                    let _ = self.courtesy_write(&l.writer, &l.ctl, &hdr, &[]);
                }
                // The peer answers our goodbye by closing its end, which ends our reader.
                p.shutdown(Shutdown::Write);
            } else {
                p.shutdown(Shutdown::Both);
            }
        }
        let mut readers = std::mem::take(&mut *self.readers.lock().unwrap());
        let grace = Instant::now() + GOODBYE_GRACE.min(self.timeout);
        while Instant::now() < grace && readers.iter().any(|r| !r.is_finished()) {
            std::thread::sleep(Duration::from_millis(1));
        }
        for p in self.peers.iter().flatten() {
            p.shutdown(Shutdown::Both);
        }
        for r in readers.drain(..) {
            let _ = r.join();
        }
    }

    fn control_header(&self, kind: FrameKind, len: usize) -> [u8; HEADER_LEN] {
        Header {
            kind,
            src: self.rank as u32,
            chunk_len: len as u32,
            env: Envelope {
                comm: 0,
                seq: 0,
                fp: Fingerprint::new(OpKind::P2p, crate::dtype::DataType::U8, 0),
            },
            total_len: len as u64,
            offset: 0,
            order: 0,
        }
        .encode()
    }

    /// Write one control frame on a connection (`writer`, `ctl`) without blocking long: skip
    /// it if its write lock stays busy, and give up on a write that does not finish within
    /// [`COURTESY_WRITE`].
    fn courtesy_write(
        &self,
        writer: &Mutex<Socket>,
        ctl: &TcpStream,
        hdr: &[u8],
        body: &[u8],
    ) -> io::Result<()> {
        let until = Instant::now() + COURTESY_WRITE;
        let w = loop {
            match writer.try_lock() {
                Ok(w) => break w,
                Err(TryLockError::Poisoned(e)) => break e.into_inner(),
                Err(TryLockError::WouldBlock) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(TryLockError::WouldBlock) => {
                    return Err(io::Error::new(io::ErrorKind::WouldBlock, "sender busy"))
                }
            }
        };
        w.set_write_timeout(Some(COURTESY_WRITE.min(self.timeout)))?;
        let r = write_frame(&w, hdr, body);
        if r.is_err() {
            // A partly written frame leaves the stream unusable.
            let _ = ctl.shutdown(Shutdown::Both);
        }
        let _ = w.set_write_timeout(Some(self.timeout));
        r
    }

    /// The connections to `peer`, if a message may be sent there now.
    fn peer_to_send(&self, peer: usize) -> Result<&Peer> {
        if peer == self.rank {
            return Err(Error::invalid(format!(
                "rank {peer} cannot send to itself over TCP"
            )));
        }
        let Some(Some(p)) = self.peers.get(peer) else {
            return Err(Error::invalid(format!(
                "peer {peer} outside a world of {}",
                self.size
            )));
        };
        if self.closing.load(Ordering::SeqCst) {
            return Err(Error::PeerLost {
                rank: peer,
                cause: format!("rank {}'s TCP transport was shut down", self.rank),
            });
        }
        if let Some(cause) = self.mailbox.lost(peer) {
            return Err(Error::PeerLost { rank: peer, cause });
        }
        Ok(p)
    }

    /// `data` as a message dealt over `p`'s lanes, if it is large enough and `p` has several.
    fn striped<'d>(&self, p: &Peer, env: &Envelope, data: &'d [u8]) -> Option<lanes::Outgoing<'d>> {
        if data.len() < crate::config::get().tcp_stripe_bytes || p.extra.is_empty() {
            return None;
        }
        let chunk = lanes::stripe_chunk(data.len(), p.extra.len() + 1, chunk_bytes());
        let frames = data.len().div_ceil(chunk) as u32;
        Some(lanes::Outgoing {
            src: self.rank as u32,
            env: *env,
            data,
            chunk,
            base: p.order.fetch_add(frames, Ordering::Relaxed),
        })
    }

    fn write_failed(&self, peer: usize, p: &Peer, e: io::Error) -> Error {
        // The stream may hold part of a frame now: nothing more can be sent on it.
        p.shutdown(Shutdown::Both);
        let cause = if let Some(cause) = self.mailbox.lost(peer) {
            cause
        } else if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            format!(
                "rank {peer} accepted no data for {:.1?} (write timed out; is it stuck?)",
                self.timeout
            )
        } else {
            format!("sending to rank {peer} failed: {e}")
        };
        self.mailbox.peer_lost(peer, cause.clone());
        Error::PeerLost { rank: peer, cause }
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn name(&self) -> &'static str {
        "tcp"
    }

    fn link(&self) -> LinkKind {
        LinkKind::Tcp
    }

    fn send(&self, peer: usize, env: &Envelope, data: &[u8]) -> Result<()> {
        let p = self.peer_to_send(peer)?;
        // A write blocks while the peer does not read: a rank blocked here waits for it. A
        // frame the connection takes at once (every small one) is not recorded: recording
        // costs an allocation, two clock reads and two trips through the record's lock.
        let blocked = || {
            self.mailbox.waits().enter(Blocked {
                comm: env.comm,
                seq: env.seq,
                ranks: vec![peer],
                gave_up: false,
            })
        };
        let src = self.rank as u32;
        if let Some(m) = self.striped(p, env, data) {
            let _blocked = blocked();
            let shut = || p.shutdown(Shutdown::Both);
            return lanes::send_striped(&p.writer, &p.extra, &m, &shut)
                .map_err(|e| self.write_failed(peer, p, e));
        }
        for_each_chunk(data, chunk_bytes(), |off, bytes| {
            let order = p.order.fetch_add(1, Ordering::Relaxed);
            let hdr = lanes::data_header(src, *env, data.len(), off, bytes.len(), order, 0);
            // Waiting behind another writer of the connection is waiting for the peer too.
            let (w, held) = match p.writer.try_lock() {
                Ok(w) => (w, None),
                Err(TryLockError::Poisoned(e)) => (e.into_inner(), None),
                Err(TryLockError::WouldBlock) => {
                    let held = blocked();
                    (
                        p.writer.lock().unwrap_or_else(|e| e.into_inner()),
                        Some(held),
                    )
                }
            };
            write_frame_noting(&w, &hdr, bytes, || held.is_none().then(blocked))
                .map_err(|e| self.write_failed(peer, p, e))
        })
    }

    /// A message dealt over several lanes returns once lane 0's share is written; the other
    /// lanes' writer threads go on in the background.
    fn send_start<'a>(
        &'a self,
        peer: usize,
        env: &Envelope,
        data: &'a [u8],
    ) -> Result<Sending<'a>> {
        let p = self.peer_to_send(peer)?;
        let Some(m) = self.striped(p, env, data) else {
            return self.send(peer, env, data).map(|()| Sending::done());
        };
        let shut = || p.shutdown(Shutdown::Both);
        let (mine, posted) = lanes::start_striped(&p.writer, &p.extra, &m, &shut);
        Ok(Sending::later(move || {
            let shut = || p.shutdown(Shutdown::Both);
            lanes::finish_striped(posted, mine, &shut).map_err(|e| self.write_failed(peer, p, e))
        }))
    }

    fn mailbox(&self) -> &Mailbox {
        &self.mailbox
    }

    fn abort(&self, by: usize, reason: &str) {
        // Payload: the failing rank, then as much of the reason as fits.
        let mut end = reason.len().min(super::wire::MAX_REASON_BYTES - 4);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        let mut body = (by as u32).to_le_bytes().to_vec();
        body.extend_from_slice(&reason.as_bytes()[..end]);
        if !self.closing.load(Ordering::SeqCst) {
            let hdr = self.control_header(FrameKind::Abort, body.len());
            for (peer, p) in self.peers.iter().enumerate() {
                let Some(p) = p else { continue };
                // A peer cut off for flooding is still connected and must hear why.
                let reachable = self.mailbox.lost(peer).is_none() || self.mailbox.cut_off(peer);
                if peer != by && reachable {
                    if let Err(e) = self.courtesy_write(&p.writer, &p.ctl, &hdr, &body) {
                        tracing::debug!(rank = self.rank, peer, "abort notice not sent: {e}");
                    }
                }
            }
        }
        self.mailbox.abort(by, reason);
    }

    /// Say goodbye to every peer and close every connection; waits (briefly) for the peers to
    /// acknowledge and for the reader threads to end. `Drop` does it too; later sends fail.
    fn shutdown(&self) {
        self.close(true);
    }

    fn probe(&self, peers: &[usize], within: Duration) -> Vec<Answer> {
        let waits = self.mailbox.waits();
        let mut out: Vec<Option<Answer>> = vec![None; peers.len()];
        let mut asked: Vec<(usize, Query)> = Vec::new();
        for (i, &p) in peers.iter().enumerate() {
            let Some(Some(peer)) = self.peers.get(p) else {
                out[i] = Some(Answer::Unknown);
                continue;
            };
            if self.closing.load(Ordering::SeqCst) {
                out[i] = Some(Answer::Unknown);
                continue;
            }
            out[i] = self.known_state(p);
            if out[i].is_some() {
                continue;
            }
            let nonce = waits.ask(p);
            let hdr = self.control_header(FrameKind::Query, QUERY_LEN);
            match self.courtesy_write(&peer.writer, &peer.ctl, &hdr, &nonce.to_le_bytes()) {
                Ok(()) => asked.push((i, (p, nonce))),
                Err(e) => {
                    waits.await_answers(&[(p, nonce)], Instant::now());
                    // A peer that takes no bytes for a second does not read its socket.
                    out[i] = Some(match self.mailbox.lost(p) {
                        Some(cause) => Answer::Lost(cause),
                        None if e.kind() == io::ErrorKind::WouldBlock => Answer::Silent,
                        None => Answer::Lost(format!("sending to rank {p} failed: {e}")),
                    });
                }
            }
        }
        let queries: Vec<Query> = asked.iter().map(|&(_, q)| q).collect();
        let got = waits.await_answers(&queries, Instant::now() + within);
        for (&(i, (p, _)), answer) in asked.iter().zip(got) {
            out[i] = Some(match answer {
                Some(w) => Answer::Waiting(w),
                None => self.known_state(p).unwrap_or(Answer::Silent),
            });
        }
        out.into_iter()
            .map(|a| a.unwrap_or(Answer::Unknown))
            .collect()
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.close(true);
    }
}
