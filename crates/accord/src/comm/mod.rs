//! The communicator: every operation, on host or device buffers, checked into an [`Op`] once
//! and run by the engine its buffers call for.
//!
//! One name per operation. Buffers say where their memory is and how it is laid out
//! ([`crate::buffer`]): a receive buffer alone works in place, a `(send, recv)` pair out of
//! place, [`crate::Parts`] gives per-rank counts (the `v` variants), and erased bytes are one
//! more buffer type. [`Communicator::spawn`] runs any operation in the background.
//!
//! - `api`: the operations users call, which build the [`Op`];
//! - `host`: host buffers: the shared-memory engine or a schedule over the transport;
//! - `hierarchy`: worlds over several hosts, composed from those engines;
//! - `gpu`: device buffers, handed to the device engine attached to the communicator;
//! - `p2p`, `group`, `request`: messages, sub-communicators, background operations.

use crate::atomic_duration::AtomicDuration;
use crate::buffer::{AsInOut, AsRecv, AsSend, RecvBuf, RecvData, SendBuf, SendData};
use crate::config;
use crate::dtype::{self, DataType, ReduceOp};
use crate::engine::HostEngine;
use crate::error::{Error, Result};
use crate::exec::{self, Buffers, Routed};
use crate::fingerprint::{Fingerprint, OpKind};
use crate::op::Op;
use crate::p2p_order::{Side, Turn, Turns};
use crate::schedule::{pieces, tuner, Algorithm, Collective, Schedule};
use crate::transport::{Envelope, Frame, Transport, P2P_LANE};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

mod api;
mod device;
mod devices;
mod gpu;
mod group;
mod hierarchy;
mod host;
mod p2p;
mod plans;
mod probe;
mod recorded;
mod request;
mod symmetric;

pub use hierarchy::{
    allreduce_pieces, allreduce_striped, allreduce_whole_on_stripes, alltoall_on_stripes,
    ALLTOALL_MAX_BLOCK_BYTES, BLOCKS_MAX_BYTES, PIPELINE_MIN_BYTES, STRIPE_MIN_BYTES,
    WHOLE_STRIPES_MAX_RANKS,
};
pub use probe::MessageInfo;
pub use request::{Completion, Request};

/// Default deadline of every blocking call.
pub const DEFAULT_TIMEOUT: Duration = crate::config::DEFAULT_TIMEOUT;

/// The deadline from `ACCORD_TIMEOUT` (see [`crate::config`]), else [`DEFAULT_TIMEOUT`]. Read
/// at every init rather than once: a process may set it just before it joins (Ray actors do).
pub fn timeout_from_env() -> Duration {
    let only_timeout = |k: &str| (k == "ACCORD_TIMEOUT").then(|| std::env::var(k).ok())?;
    crate::config::Config::from_lookup(&only_timeout).timeout
}

/// Element count of `bytes` bytes of `dtype`, or an error naming the buffer (`what`). Element
/// sizes are powers of two: a mask and a shift, not a division, on every call.
fn elements(what: impl std::fmt::Display, bytes: usize, dtype: DataType) -> Result<usize> {
    let size = dtype.size();
    debug_assert!(size.is_power_of_two(), "{dtype} is {size} bytes");
    if bytes & (size - 1) != 0 {
        return Err(Error::invalid(format!(
            "{what} has {bytes} bytes, not a whole number of {dtype} elements"
        )));
    }
    Ok(bytes >> size.trailing_zeros())
}

/// A group of ranks that communicate. Cheap to clone (clones share state and sequence numbers).
///
/// Every member must call the same collective operations in the same order with compatible
/// arguments; disagreements are detected and reported as [`Error::Desync`] on the ranks involved.
/// After any failure the communicator is *poisoned*: later calls return the first error at once.
#[derive(Clone)]
pub struct Communicator {
    inner: Arc<Inner>,
    /// A sequence number taken ahead for this handle's next operation.
    reserved: Option<Arc<ReservedSeq>>,
}

/// What a world communicator was bootstrapped with.
#[derive(Debug, Default)]
pub(crate) struct Resources {
    /// The rendezvous: the store client (and the store itself on the rank that hosts it), kept
    /// alive as long as the communicator.
    pub rendezvous: Option<crate::rendezvous::Rendezvous>,
    /// Placement over hosts and this host's shared-memory group.
    pub shm: Option<Arc<crate::shm_coll::ShmWorld>>,
    /// The job's name in flight-record dumps ([`crate::observe::job_id`]).
    pub job: String,
}

/// A place in the communicator's order, taken ahead by [`Communicator::reserve`].
struct ReservedSeq {
    seq: u64,
    taken: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("name", &self.inner.name)
            .field("rank", &self.inner.rank)
            .field("size", &self.inner.ranks.len())
            .field("transport", &self.inner.transport.name())
            .finish()
    }
}

/// A cached plan and the algorithm it runs.
type Plan = (Arc<Schedule>, Algorithm);

struct Inner {
    transport: Arc<dyn Transport>,
    /// Communicator rank -> transport rank.
    ranks: Vec<usize>,
    /// For a communicator that runs steps of another's calls (the hierarchy's leaders and
    /// stripes): its ranks as the other communicator numbers them, which its errors use.
    shown_as: Option<Vec<usize>>,
    rank: usize,
    id: u64,
    name: String,
    seq: AtomicU64,
    splits: AtomicU64,
    /// The deadline of every blocking call: shared with the communicators that run steps of
    /// this one's calls (the hierarchy's), so that `set_timeout` reaches them too.
    timeout: Arc<AtomicDuration>,
    poison: Mutex<Option<Error>>,
    /// Whether `poison` holds an error: every call checks this, without taking the lock.
    poisoned: std::sync::atomic::AtomicBool,
    /// `close` was called.
    closed: std::sync::atomic::AtomicBool,
    /// The schedules built so far, by call.
    cache: Mutex<plans::Plans>,
    /// `ACCORD_EXPLAIN=1`: say which engine and algorithm run each operation.
    explain: bool,
    /// The (operation, engine) pairs `ACCORD_EXPLAIN` has reported.
    explained: Mutex<std::collections::HashSet<(OpKind, &'static str)>>,
    /// Per-communicator algorithm choices that override the tuner (tests, tuning).
    forced: Mutex<HashMap<OpKind, Algorithm>>,
    model: tuner::CostModel,
    /// Engines tried in order before the schedule over the transport (see [`crate::engine`]):
    /// shared memory on one host, or the hierarchy across hosts, for world communicators
    /// bootstrapped with a [`crate::shm_coll::ShmWorld`].
    engines: Vec<Arc<dyn HostEngine>>,
    /// What the world was bootstrapped with; children share it.
    resources: Arc<Resources>,
    /// The order of point-to-point messages per (peer, tag).
    turns: Arc<Turns>,
    /// The device engine for device buffers, once attached ([`Communicator::attach_device`]).
    device: std::sync::OnceLock<crate::gpu::GpuCommunicator>,
    /// Held while a device engine is being attached.
    attaching: Mutex<()>,
    /// Whether host buffers run here. Not on the communicators of several GPUs of one process
    /// ([`Communicator::attach_devices`]): their ranks are GPUs, several per transport rank.
    host_side: bool,
    /// This host's ranks, connected for the symmetric heap once it is first used.
    symmetric: Mutex<Option<Arc<crate::gpu::symm::LocalGroup>>>,
    /// The last operations (see [`crate::observe`]); `None` with `ACCORD_FLIGHT_RECORDER=0`.
    flight: Option<crate::observe::FlightRecorder>,
}

impl Communicator {
    /// A communicator over all ranks of `transport`.
    pub fn new(transport: Arc<dyn Transport>) -> Self {
        Self::with_resources(transport, Resources::default())
    }

    /// Like [`Communicator::new`], with what the world was bootstrapped with: the rendezvous
    /// (kept alive as long as the communicator) and the shared-memory placement, which gives
    /// collectives their shared-memory path.
    pub(crate) fn with_resources(transport: Arc<dyn Transport>, mut resources: Resources) -> Self {
        if resources.job.is_empty() {
            resources.job = crate::observe::job_id();
        }
        crate::observe::trace::init();
        let ranks = (0..transport.size()).collect();
        let rank = transport.rank();
        let model = crate::config::get().cost_model(transport.link());
        let shm_world = resources.shm.clone();
        let mut comm = Communicator {
            inner: Arc::new(Inner {
                transport,
                ranks,
                shown_as: None,
                rank,
                id: 1,
                name: "world".into(),
                seq: AtomicU64::new(0),
                splits: AtomicU64::new(0),
                timeout: Arc::new(AtomicDuration::new(timeout_from_env())),
                poison: Mutex::new(None),
                poisoned: Default::default(),
                closed: Default::default(),
                cache: Mutex::default(),
                forced: Mutex::new(HashMap::new()),
                explain: crate::config::get().explain,
                explained: Default::default(),
                model,
                engines: Vec::new(),
                resources: Arc::new(resources),
                turns: Arc::default(),
                device: Default::default(),
                attaching: Default::default(),
                host_side: true,
                symmetric: Default::default(),
                flight: crate::observe::new_recorder(),
            }),
            reserved: None,
        };
        if let Some(w) = shm_world.filter(|w| w.host_of.len() == comm.size()) {
            let engine = match w.single_host() {
                true => w.single_host_engine(),
                false if !crate::config::get().hierarchy => None,
                false => {
                    Some(Arc::new(hierarchy::Hierarchy::new(&comm, w, rank)) as Arc<dyn HostEngine>)
                }
            };
            if let (Some(e), Some(inner)) = (engine, Arc::get_mut(&mut comm.inner)) {
                inner.engines.push(e);
            }
        }
        comm.register();
        comm
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.inner.ranks.len()
    }

    /// The communicator's name (`world`, or `world/split1/color3` for groups).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The rendezvous store this communicator was bootstrapped through, in its world's
    /// namespace (`ACCORD_STORE_PREFIX` where set, else the root), if any (communicators built
    /// directly on a transport have none).
    pub fn store(&self) -> Option<Arc<crate::rendezvous::StoreClient>> {
        let r = self.inner.resources.rendezvous.as_ref()?;
        Some(r.store.clone())
    }

    /// The transport's name (`inproc`, `tcp`, `shm`, `tcp+shm`).
    pub fn transport_name(&self) -> &'static str {
        self.inner.transport.name()
    }

    /// Transport (world) rank of communicator rank `r`.
    pub fn world_rank(&self, r: usize) -> usize {
        self.inner.ranks[r]
    }

    /// The deadline every blocking call gets.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout.get()
    }

    /// Change the deadline of later calls on this communicator (device operations too).
    pub fn set_timeout(&self, t: Duration) {
        self.inner.timeout.set(t);
        if let Some(g) = self.inner.device.get() {
            g.set_timeout(t);
        }
    }

    /// The first error this communicator hit, if any (its device engine's included).
    pub fn poisoned(&self) -> Option<Error> {
        let own = self.inner.poison.lock().unwrap().clone();
        own.or_else(|| self.inner.device.get()?.poisoned())
    }

    /// Without waiting: what the transport already knows about `members` (ranks of this
    /// communicator) — a world abort, or a lost connection to one of them ([`Error::PeerLost`],
    /// naming its world rank). Work outside the transport (GPU communicators) polls this to stop
    /// as soon as the host knows a peer is gone, even with no host call running.
    pub fn members_failure(&self, members: &[usize]) -> Option<Error> {
        let m = self.inner.transport.mailbox();
        if let Some((by, reason)) = m.aborted() {
            return Some(Error::aborted_by(by, &reason));
        }
        let world = members.iter().filter_map(|&r| self.inner.ranks.get(r));
        world
            .filter(|&&w| w != self.inner.ranks[self.inner.rank])
            .find_map(|&w| m.lost(w).map(|cause| Error::PeerLost { rank: w, cause }))
    }

    /// Give up on the whole world: peers' pending and later calls fail naming this rank and
    /// `reason`.
    pub fn abort(&self, reason: &str) {
        self.poison_with(Error::Aborted {
            reason: format!("rank {} aborted: {reason}", self.rank()),
        });
        let me = self.inner.transport.rank();
        self.inner.transport.abort(me, reason);
        if let Some(g) = self.inner.device.get() {
            g.abort(reason);
        }
    }

    /// Close this communicator: every later call on it fails with [`Error::InvalidArgument`]
    /// saying that it was closed. The world communicator (the one [`crate::init`] returns)
    /// also says goodbye to every peer and closes its connections, so the groups split from it
    /// end with it (as MPI's finalize ends every communicator), and a peer still waiting for
    /// this rank learns that it closed its communicator instead of waiting for its deadline.
    /// The device engine (NCCL's communicator and buffers, Accord's kernels' memory) is released
    /// now, once the work issued on it has finished (within the timeout; aborted otherwise);
    /// host memory and threads go when the last handle is dropped. Closing again does nothing
    /// more.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        let closed = Error::InvalidArgument(format!(
            "communicator {} was closed on this rank",
            self.name()
        ));
        self.poison_with(closed.clone());
        // The device engine goes now (NCCL's communicator and buffers), once what was issued
        // on it has finished, not whenever the last handle of this communicator is dropped.
        if let Some(d) = self.inner.device.get() {
            d.shutdown(closed);
        }
        if self.inner.id == 1 {
            self.inner.transport.shutdown();
            let _ = crate::observe::trace::flush();
        }
    }

    /// Whether [`Communicator::close`] was called (on this handle or another of the same
    /// communicator).
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// Use `algo` for every later `kind` operation on this communicator (`None`: let the tuner
    /// choose again). An algorithm that does not apply to a call makes that call fail with
    /// [`Error::Unsupported`]; ranks whose calls run different algorithms fail with
    /// [`Error::Desync`] naming both (their blocks could match in size but not in meaning).
    pub fn force_algorithm(&self, kind: OpKind, algo: Option<Algorithm>) {
        let mut f = self.inner.forced.lock().unwrap();
        match algo {
            Some(a) => f.insert(kind, a),
            None => f.remove(&kind),
        };
        // Plans chosen before no longer apply.
        self.inner.cache.lock().unwrap().clear();
    }

    /// Whether collectives of this communicator can take the shared-memory path.
    pub fn uses_shm(&self) -> bool {
        !self.inner.engines.is_empty()
    }

    /// The algorithm the tuner picks for `coll` with elements of `dtype`, and its cost table:
    /// for each piece where the call runs in pieces (`ACCORD_PIECE_BYTES`), as it runs.
    pub fn explain(&self, coll: &Collective, dtype: DataType) -> String {
        let esz = dtype.size();
        match pieces::piece_of(coll, esz, config::get().piece_bytes) {
            Some(piece) => format!(
                "in pieces of {} elements, each:\n{}",
                piece.elements(),
                tuner::explain(&piece, self.size(), esz, &self.inner.model)
            ),
            None => tuner::explain(coll, self.size(), esz, &self.inner.model),
        }
    }

    // ----------------------------------------------------------------------------------------
    // Machinery shared by every operation.

    #[inline]
    fn check_poison(&self) -> Result<()> {
        if !self.inner.poisoned.load(Ordering::Acquire) {
            return Ok(());
        }
        match &*self.inner.poison.lock().unwrap() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Poison with `e` unless poisoned already; whether it was not.
    fn poison_with(&self, e: Error) -> bool {
        let mut p = self.inner.poison.lock().unwrap();
        if p.is_none() {
            *p = Some(e);
            self.inner.poisoned.store(true, Ordering::Release);
            return true;
        }
        false
    }

    /// Record a failure: poison this communicator and tell every peer, so nobody waits for us.
    ///
    /// A rank that gave up tells its peers and often exits right after; a peer that was about
    /// to send to it, or waiting for it, would see its connection end and blame it. The abort
    /// notice, when one has arrived, names the first failure instead.
    fn fail(&self, e: Error) -> Error {
        if let Error::PeerLost { rank, .. } = e {
            self.await_last_word(rank);
        }
        let e = match (e, self.inner.transport.mailbox().aborted()) {
            (Error::PeerLost { .. }, Some((by, reason))) => Error::aborted_by(by, &reason),
            (e, _) => e,
        };
        let first = self.poison_with(e.clone());
        let t = &self.inner.transport;
        match (&e, t.mailbox().aborted()) {
            // Pass on the notice we heard, before this rank may close (see above).
            (Error::Aborted { .. }, Some((by, reason))) if by != t.rank() => t.abort(by, &reason),
            (Error::Aborted { .. }, _) => {}
            _ => t.abort(t.rank(), &format!("{e}")),
        }
        if first && self.inner.flight.is_some() {
            crate::observe::dump_all(&format!("rank {} failed: {e}", t.rank()));
        }
        if first {
            let _ = crate::observe::trace::flush();
        }
        e
    }

    /// A peer that gave up sends its abort notice before it closes, on the same connection, but
    /// its death may be seen first another way (its process gone from shared memory, a send
    /// failing). Wait briefly until the connection's end has been read: any notice it sent is
    /// in the mailbox by then. A killed process's connection ends at once, so this costs only
    /// the time for the kernel to say so.
    fn await_last_word(&self, rank: usize) {
        const GRACE: Duration = Duration::from_millis(250);
        let mailbox = self.inner.transport.mailbox();
        // `rank` is a world rank (see Error::PeerLost).
        let peer = rank;
        let until = Instant::now() + GRACE;
        while mailbox.aborted().is_none() && mailbox.lost(peer).is_none() && Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn check_rank(&self, what: &str, r: usize) -> Result<()> {
        if r >= self.size() {
            return Err(Error::invalid(format!(
                "{what} {r} is not a rank of a communicator of size {}",
                self.size()
            )));
        }
        Ok(())
    }

    /// The cached plan for `coll`, choosing the algorithm on first use. The choice is made once
    /// per (collective, sizes) so the tuner stays off the per-call path; with `ACCORD_EXPLAIN=1`
    /// rank 0 prints the cost table behind each new choice.
    fn schedule(
        &self,
        coll: &Collective,
        kind: OpKind,
        dtype: DataType,
    ) -> Result<(Arc<Schedule>, Algorithm)> {
        if let Some(s) = self
            .inner
            .cache
            .lock()
            .unwrap()
            .get(kind, coll, dtype.size())
        {
            return Ok(s.clone());
        }
        let forced = self.inner.forced.lock().unwrap().get(&coll.kind()).copied();
        let (piece_bytes, esz) = (config::get().piece_bytes, dtype.size());
        let algo = match (forced, coll) {
            (Some(a), _) => a,
            // Each rank sees only its own alltoallv counts, so a size-based choice could differ
            // between ranks; pairwise works for every count pattern.
            (None, Collective::AllToAll { .. }) if kind == OpKind::AllToAllV => Algorithm::Pairwise,
            // A call in pieces runs each piece with the algorithm best for a piece.
            (None, _) => pieces::select(coll, self.size(), esz, &self.inner.model, piece_bytes),
        };
        if self.rank() == 0 && self.inner.explain {
            eprintln!(
                "accord: {} on {} ({} ranks) uses {algo}\n{}",
                kind,
                self.name(),
                self.size(),
                self.explain(coll, dtype)
            );
        }
        let s = Arc::new(pieces::build(
            coll,
            self.size(),
            self.rank(),
            algo,
            esz,
            piece_bytes,
        )?);
        let plan = (s.clone(), algo);
        self.inner
            .cache
            .lock()
            .unwrap()
            .insert(kind, coll, esz, plan);
        Ok((s, algo))
    }

    /// With `ACCORD_EXPLAIN=1`, rank 0 says once per operation kind which engine runs it
    /// (schedules also print the algorithm and its cost table, see `schedule`).
    #[inline(always)]
    fn explain_engine(&self, op: &Op, engine: impl FnOnce() -> &'static str) {
        if !self.inner.explain {
            return;
        }
        self.explain_now(op, engine())
    }

    #[cold]
    fn explain_now(&self, op: &Op, engine: &'static str) {
        if self.rank() != 0 {
            return;
        }
        if self
            .inner
            .explained
            .lock()
            .unwrap()
            .insert((op.kind(), engine))
        {
            eprintln!(
                "accord: {} on {} ({} ranks) runs on {engine}",
                op.kind(),
                self.name(),
                self.size()
            );
        }
    }

    /// The sequence number of the operation about to run, and whether it was reserved ahead
    /// ([`Communicator::reserve`]): such operations may run concurrently and in any order on
    /// each rank, so they take the message path, which matches by sequence number.
    fn next_seq(&self) -> Result<(u64, bool)> {
        match &self.reserved {
            None => Ok((self.reserve_seq(), false)),
            Some(r) if !r.taken.swap(true, Ordering::Relaxed) => Ok((r.seq, true)),
            Some(_) => Err(Error::invalid(
                "a reserved communicator handle runs one operation; reserve again for the next",
            )),
        }
    }
}
