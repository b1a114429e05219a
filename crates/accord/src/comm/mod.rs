//! The communicator: every operation, validated, fingerprinted, planned and executed.
//!
//! Naming follows one scheme: `op` works in place on one buffer, `op_into` reads one buffer and
//! writes another, `op_v` takes per-rank counts, `i`-prefixed methods start the operation in the
//! background and return a [`Request`]. Typed methods take `&[T]` with `T: Element`; each has an
//! erased twin taking bytes and a [`DataType`] (`*_bytes`), which the Python layer binds.

use crate::atomic_duration::AtomicDuration;
use crate::dtype::{as_bytes, as_bytes_mut, DataType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::{self, Buffers, Call};
use crate::fingerprint::{Fingerprint, OpKind};
use crate::p2p_order::{Side, Turn, Turns};
use crate::schedule::{algorithms, tuner, Algorithm, Collective, Schedule};
use crate::transport::{Envelope, Frame, Transport, P2P_LANE};
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

mod group;
mod p2p;
mod request;

pub use request::Request;
use request::RESERVED_SEQ;

/// Default deadline of every blocking call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The deadline from `ACCORD_TIMEOUT` (seconds, may be fractional), else [`DEFAULT_TIMEOUT`].
pub fn timeout_from_env() -> Duration {
    std::env::var("ACCORD_TIMEOUT")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_TIMEOUT)
}

/// A group of ranks that communicate. Cheap to clone (clones share state and sequence numbers).
///
/// Every member must call the same collective operations in the same order with compatible
/// arguments; disagreements are detected and reported as [`Error::Desync`] on the ranks involved.
/// After any failure the communicator is *poisoned*: later calls return the first error at once.
#[derive(Clone)]
pub struct Communicator {
    inner: Arc<Inner>,
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

struct Inner {
    transport: Arc<dyn Transport>,
    /// Communicator rank -> transport rank.
    ranks: Vec<usize>,
    rank: usize,
    id: u64,
    name: String,
    seq: AtomicU64,
    splits: AtomicU64,
    timeout: AtomicDuration,
    poison: Mutex<Option<Error>>,
    /// Plans by (collective, element size): the algorithm choice depends on both.
    cache: Mutex<HashMap<(Collective, usize), Arc<Schedule>>>,
    /// Per-communicator algorithm choices that override the tuner (tests, tuning).
    forced: Mutex<HashMap<OpKind, Algorithm>>,
    model: tuner::CostModel,
    /// The shared-memory fast path (world communicators bootstrapped with a
    /// [`crate::shm_coll::ShmWorld`]), and the communicator of the host leaders for
    /// hierarchical collectives when the world spans hosts.
    shm: Option<(Arc<crate::shm_coll::ShmWorld>, Option<Communicator>)>,
    /// Things that must live as long as the communicator (store client and server...).
    _keep: Vec<Arc<dyn Any + Send + Sync>>,
    /// The order of point-to-point messages per (peer, tag).
    turns: Arc<Turns>,
}

impl Communicator {
    /// A communicator over all ranks of `transport`.
    pub fn new(transport: Arc<dyn Transport>) -> Self {
        Self::with_resources(transport, Vec::new())
    }

    /// Like [`Communicator::new`], keeping `keep` alive as long as the communicator.
    pub fn with_resources(
        transport: Arc<dyn Transport>,
        keep: Vec<Arc<dyn Any + Send + Sync>>,
    ) -> Self {
        let ranks = (0..transport.size()).collect();
        let rank = transport.rank();
        let model = match transport.name() {
            "inproc" => tuner::CostModel::inproc(),
            "shm" => tuner::CostModel::shm(),
            // "tcp", and "tcp+shm" (several hosts: the slowest links are TCP).
            _ => tuner::CostModel::tcp(),
        };
        let shm_world = keep
            .iter()
            .find_map(|k| k.clone().downcast::<crate::shm_coll::ShmWorld>().ok());
        let mut comm = Communicator {
            inner: Arc::new(Inner {
                transport,
                ranks,
                rank,
                id: 1,
                name: "world".into(),
                seq: AtomicU64::new(0),
                splits: AtomicU64::new(0),
                timeout: AtomicDuration::new(timeout_from_env()),
                poison: Mutex::new(None),
                cache: Mutex::new(HashMap::new()),
                forced: Mutex::new(HashMap::new()),
                model,
                shm: None,
                _keep: keep,
                turns: Arc::default(),
            }),
        };
        if let Some(w) = shm_world.filter(|w| w.host_of.len() == comm.size()) {
            let leaders = (!w.single_host() && w.leaders.contains(&rank))
                .then(|| comm.child(&w.leaders.clone(), u64::MAX, "leaders", 0x5348_4d4c));
            if let Some(inner) = Arc::get_mut(&mut comm.inner) {
                inner.shm = Some((w, leaders));
            }
        }
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

    /// The rendezvous store this communicator was bootstrapped through, if any (communicators
    /// built directly on a transport have none).
    pub fn store(&self) -> Option<Arc<crate::rendezvous::StoreClient>> {
        self.inner._keep.iter().find_map(|k| {
            if let Some(r) = k.downcast_ref::<crate::rendezvous::Rendezvous>() {
                return Some(r.store.clone());
            }
            k.downcast_ref::<crate::rendezvous::StoreClient>()
                .map(|c| Arc::new(c.clone()))
        })
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

    /// Change the deadline of later calls on this communicator.
    pub fn set_timeout(&self, t: Duration) {
        self.inner.timeout.set(t);
    }

    /// The first error this communicator hit, if any.
    pub fn poisoned(&self) -> Option<Error> {
        self.inner.poison.lock().unwrap().clone()
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
    }

    /// Use `algo` for every later `kind` operation on this communicator (`None`: let the tuner
    /// choose again). An algorithm that does not apply to a call makes that call fail with
    /// [`Error::Unsupported`].
    pub fn force_algorithm(&self, kind: OpKind, algo: Option<Algorithm>) {
        let mut f = self.inner.forced.lock().unwrap();
        match algo {
            Some(a) => f.insert(kind, a),
            None => f.remove(&kind),
        };
        // Plans chosen before no longer apply.
        self.inner.cache.lock().unwrap().clear();
    }

    /// The algorithm the tuner picks for `coll` with elements of `dtype`, and its cost table.
    pub fn explain(&self, coll: &Collective, dtype: DataType) -> String {
        tuner::explain(coll, self.size(), dtype.size(), &self.inner.model)
    }

    // ----------------------------------------------------------------------------------------
    // Machinery shared by every operation.

    fn check_poison(&self) -> Result<()> {
        match &*self.inner.poison.lock().unwrap() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn poison_with(&self, e: Error) {
        let mut p = self.inner.poison.lock().unwrap();
        if p.is_none() {
            *p = Some(e);
        }
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
        self.poison_with(e.clone());
        let t = &self.inner.transport;
        match (&e, t.mailbox().aborted()) {
            // Pass on the notice we heard, before this rank may close (see above).
            (Error::Aborted { .. }, Some((by, reason))) if by != t.rank() => t.abort(by, &reason),
            (Error::Aborted { .. }, _) => {}
            _ => t.abort(t.rank(), &format!("{e}")),
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
    fn schedule(&self, coll: &Collective, kind: OpKind, dtype: DataType) -> Result<Arc<Schedule>> {
        let key = (coll.clone(), dtype.size());
        if let Some(s) = self.inner.cache.lock().unwrap().get(&key) {
            return Ok(s.clone());
        }
        let forced = self.inner.forced.lock().unwrap().get(&coll.kind()).copied();
        let algo = match (forced, coll) {
            (Some(a), _) => a,
            // Each rank sees only its own alltoallv counts, so a size-based choice could differ
            // between ranks; pairwise works for every count pattern.
            (None, Collective::AllToAll { .. }) if kind == OpKind::AllToAllV => Algorithm::Pairwise,
            (None, _) => tuner::select(coll, self.size(), dtype.size(), &self.inner.model),
        };
        if self.rank() == 0 && std::env::var("ACCORD_EXPLAIN").is_ok_and(|v| v.trim() == "1") {
            eprintln!(
                "accord: {} on {} ({} ranks) uses {algo}\n{}",
                kind,
                self.name(),
                self.size(),
                tuner::explain(coll, self.size(), dtype.size(), &self.inner.model)
            );
        }
        let s = Arc::new(algorithms::build(coll, self.size(), self.rank(), algo)?);
        let mut cache = self.inner.cache.lock().unwrap();
        if cache.len() > 4096 {
            cache.clear(); // bounded: workloads with ever-changing sizes must not grow it forever
        }
        cache.insert(key, s.clone());
        Ok(s)
    }

    /// The sequence number of the operation about to run: a reserved one (nonblocking
    /// requests), else the next in order.
    fn next_seq(&self) -> u64 {
        let reserved = RESERVED_SEQ.with(|c| match c.get() {
            Some((id, seq)) if id == self.inner.id => {
                c.set(None);
                Some(seq)
            }
            _ => None,
        });
        reserved.unwrap_or_else(|| self.reserve_seq())
    }

    /// Plan and run one collective. `input == None` means in place (the output is also the input).
    fn run(&self, seq: u64, job: &Job, input: Option<&[u8]>, output: &mut [u8]) -> Result<()> {
        self.check_poison()?;
        // The sequence number is spent: from here on, a failure must reach the peers.
        let sched = self
            .schedule(&job.coll, job.fp.kind, job.dtype)
            .map_err(|e| self.fail(e))?;
        let bufs = match input {
            Some(i) => Buffers {
                input: i.as_ptr(),
                input_len: i.len(),
                output: output.as_mut_ptr(),
                output_len: output.len(),
            },
            None => Buffers {
                input: output.as_ptr(),
                input_len: output.len(),
                output: output.as_mut_ptr(),
                output_len: output.len(),
            },
        };
        let call = self.call(seq, job.fp, job.dtype, job.op.unwrap_or(ReduceOp::Sum));
        exec::execute(&call, &sched, &bufs).map_err(|e| self.fail(e))
    }

    fn call(&self, seq: u64, fp: Fingerprint, dtype: DataType, op: ReduceOp) -> Call<'_> {
        Call {
            transport: &*self.inner.transport,
            ranks: &self.inner.ranks,
            me: self.rank(),
            comm_id: self.inner.id,
            comm_name: &self.inner.name,
            seq,
            fp,
            dtype,
            op,
            timeout: self.timeout(),
        }
    }

    // ----------------------------------------------------------------------------------------
    // Collectives (typed).

    /// Wait until every rank has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.run_new(self.job_barrier(), None, &mut [])
    }

    /// Copy `root`'s `buf` into every rank's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.broadcast_bytes(as_bytes_mut(buf), T::DTYPE, root)
    }

    /// Reduce every rank's `buf` with `op`, leaving the result in every `buf`.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.all_reduce_bytes(None, as_bytes_mut(buf), T::DTYPE, op)
    }

    /// Reduce every rank's `send` with `op` into every rank's `recv`.
    pub fn all_reduce_into<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.all_reduce_bytes(Some(as_bytes(send)), as_bytes_mut(recv), T::DTYPE, op)
    }

    /// Reduce every rank's `buf` into `root`'s `buf`; other ranks' `buf` is left unchanged.
    pub fn reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        if self.rank() == root {
            return self.reduce_bytes(None, as_bytes_mut(buf), T::DTYPE, op, root);
        }
        let mut out = vec![0u8; std::mem::size_of_val(buf)];
        self.reduce_bytes(Some(as_bytes(buf)), &mut out, T::DTYPE, op, root)
    }

    /// Reduce every rank's `send` into `root`'s `recv`. Non-root ranks may pass an empty `recv`.
    pub fn reduce_into<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.reduce_bytes(Some(as_bytes(send)), as_bytes_mut(recv), T::DTYPE, op, root)
    }

    /// Every rank's `send` (equal lengths) lands in block `i` of every rank's `recv`.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.all_gather_bytes(as_bytes(send), as_bytes_mut(recv), T::DTYPE)
    }

    /// Like [`Communicator::all_gather`] with per-rank `counts` (all ranks pass the same vector).
    pub fn all_gather_v<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
    ) -> Result<()> {
        self.all_gather_v_bytes(as_bytes(send), as_bytes_mut(recv), counts, T::DTYPE)
    }

    /// Every rank's `send` lands in block `i` of `root`'s `recv` (non-roots may pass empty `recv`).
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.gather_bytes(as_bytes(send), as_bytes_mut(recv), T::DTYPE, root)
    }

    /// Like [`Communicator::gather`] with per-rank `counts` (all ranks pass the same vector).
    pub fn gather_v<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        root: usize,
    ) -> Result<()> {
        self.gather_v_bytes(as_bytes(send), as_bytes_mut(recv), counts, T::DTYPE, root)
    }

    /// Block `i` of `root`'s `send` lands in rank `i`'s `recv` (non-roots may pass empty `send`).
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.scatter_bytes(as_bytes(send), as_bytes_mut(recv), T::DTYPE, root)
    }

    /// Like [`Communicator::scatter`] with per-rank `counts` (all ranks pass the same vector).
    pub fn scatter_v<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        root: usize,
    ) -> Result<()> {
        self.scatter_v_bytes(as_bytes(send), as_bytes_mut(recv), counts, T::DTYPE, root)
    }

    /// Reduce every rank's `send` (size x `recv.len()`); block `i` of the result lands in rank
    /// `i`'s `recv`.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce_scatter_bytes(as_bytes(send), as_bytes_mut(recv), T::DTYPE, op)
    }

    /// Like [`Communicator::reduce_scatter`] with per-rank `counts` (all ranks pass the same
    /// vector).
    pub fn reduce_scatter_v<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce_scatter_v_bytes(as_bytes(send), as_bytes_mut(recv), counts, T::DTYPE, op)
    }

    /// Block `j` of `send` goes to rank `j`; block `j` of `recv` comes from rank `j` (equal blocks).
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.all_to_all_bytes(as_bytes(send), as_bytes_mut(recv), T::DTYPE)
    }

    /// All-to-all with this rank's own `send_counts` (to each rank) and `recv_counts` (from each).
    pub fn all_to_all_v<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        self.all_to_all_v_bytes(
            as_bytes(send),
            send_counts,
            as_bytes_mut(recv),
            recv_counts,
            T::DTYPE,
        )
    }
}

/// A validated collective call: what to compute, its fingerprint, its element type and operator.
pub(crate) struct Job {
    coll: Collective,
    fp: Fingerprint,
    dtype: DataType,
    op: Option<ReduceOp>,
}

impl Job {
    fn new(coll: Collective, fp: Fingerprint, dtype: DataType, op: Option<ReduceOp>) -> Job {
        Job {
            coll,
            fp,
            dtype,
            op,
        }
    }
}

/// Element count of `bytes` bytes of `dtype`, or an error naming the buffer.
fn elements(what: &str, bytes: usize, dtype: DataType) -> Result<usize> {
    if !bytes.is_multiple_of(dtype.size()) {
        return Err(Error::invalid(format!(
            "{what} has {bytes} bytes, not a whole number of {dtype} elements"
        )));
    }
    Ok(bytes / dtype.size())
}

fn expect_len(op: OpKind, what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::invalid(format!(
            "{op}: {what} has {got} elements but this call needs {want}"
        )));
    }
    Ok(())
}

// Erased operations: validate, build a Job, run it. Each typed method above is a thin cast.
impl Communicator {
    fn job_barrier(&self) -> Job {
        let fp = Fingerprint::new(OpKind::Barrier, DataType::U8, 0);
        Job::new(Collective::Barrier, fp, DataType::U8, None)
    }

    fn check_counts(&self, op: OpKind, counts: &[usize]) -> Result<()> {
        if counts.len() != self.size() {
            return Err(Error::invalid(format!(
                "{op}: counts has {} entries but the communicator has {} ranks",
                counts.len(),
                self.size()
            )));
        }
        Ok(())
    }

    /// Check the buffers of `coll` against this rank's expected sizes.
    fn check_buffers(
        &self,
        coll: &Collective,
        input: Option<usize>,
        output: usize,
        dtype: DataType,
    ) -> Result<()> {
        let kind = coll.kind();
        if let Some(i) = input {
            expect_len(
                kind,
                "send buffer",
                elements("send buffer", i, dtype)?,
                coll.in_len(self.rank()),
            )?;
        }
        let out = elements("receive buffer", output, dtype)?;
        expect_len(kind, "receive buffer", out, coll.out_len(self.rank()))
    }

    fn run_new(&self, job: Job, input: Option<&[u8]>, output: &mut [u8]) -> Result<()> {
        self.check_buffers(&job.coll, input.map(<[u8]>::len), output.len(), job.dtype)?;
        if job
            .op
            .is_some_and(|op| crate::dtype::averages_wide(job.dtype, op))
        {
            return self.run_wide(job, input, output);
        }
        // Nonblocking requests may run concurrently and in any order on each rank: they take the
        // message path, which matches by sequence number. Blocking calls may take the
        // shared-memory path, which runs calls in program order.
        let reserved =
            RESERVED_SEQ.with(|c| matches!(c.get(), Some((id, _)) if id == self.inner.id));
        let seq = self.next_seq();
        if let Some((w, leaders)) = &self.inner.shm {
            if !reserved && w.supports(&job.coll, &job.fp) {
                self.check_poison()?;
                let call = crate::shm_coll::ShmCall {
                    comm_id: self.inner.id,
                    seq,
                    fp: job.fp,
                    dtype: job.dtype,
                    op: job.op.unwrap_or(ReduceOp::Sum),
                    timeout: self.timeout(),
                    comm_name: &self.inner.name,
                };
                return w
                    .run(self, leaders.as_ref(), &call, &job.coll, input, output)
                    .map_err(|e| self.fail(e));
            }
        }
        self.run(seq, &job, input, output)
    }

    /// Run an f16/bf16 average in f32 (see [`crate::dtype::averages_wide`]): every rank widens,
    /// so the frames and staging agree; the fingerprint still names the caller's type.
    fn run_wide(&self, mut job: Job, input: Option<&[u8]>, output: &mut [u8]) -> Result<()> {
        let narrow = job.dtype;
        let wide_in = input.map(|i| crate::dtype::widen_half(narrow, i));
        // In place, `output` holds this rank's contribution; otherwise its contents are unused.
        let mut wide_out = crate::dtype::widen_half(narrow, output);
        job.dtype = DataType::F32;
        self.run_new(job, wide_in.as_deref(), &mut wide_out)?;
        crate::dtype::narrow_half(narrow, &wide_out, output);
        Ok(())
    }

    /// Run `coll` on this communicator under the fingerprint `fp` of a call on another one:
    /// the leaders' step of a hierarchical collective, whose frames must carry what the world
    /// call was (its root, its reduce op) so that leaders of ranks that disagree fail.
    pub(crate) fn run_as(
        &self,
        fp: Fingerprint,
        coll: Collective,
        dtype: DataType,
        op: Option<ReduceOp>,
        input: Option<&[u8]>,
        output: &mut [u8],
    ) -> Result<()> {
        self.run_new(Job::new(coll, fp, dtype, op), input, output)
    }

    /// Whether collectives of this communicator can take the shared-memory path.
    pub fn uses_shm(&self) -> bool {
        self.inner
            .shm
            .as_ref()
            .is_some_and(|(w, _)| !w.single_host() || w.group.is_some())
    }

    /// Erased [`Communicator::broadcast`].
    pub fn broadcast_bytes(&self, buf: &mut [u8], dtype: DataType, root: usize) -> Result<()> {
        self.check_rank("root", root)?;
        let count = elements("buffer", buf.len(), dtype)?;
        let fp = Fingerprint::new(OpKind::Broadcast, dtype, count).with_root(root);
        self.run_new(
            Job::new(Collective::Broadcast { count, root }, fp, dtype, None),
            None,
            buf,
        )
    }

    /// Erased all-reduce; `send == None` is in place.
    pub fn all_reduce_bytes(
        &self,
        send: Option<&[u8]>,
        recv: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        op.check(dtype)?;
        let count = elements("receive buffer", recv.len(), dtype)?;
        let fp = Fingerprint::new(OpKind::AllReduce, dtype, count).with_op(op);
        self.run_new(
            Job::new(Collective::AllReduce { count }, fp, dtype, Some(op)),
            send,
            recv,
        )
    }

    /// Erased reduce; `send == None` is in place (root's `recv` holds its contribution). On
    /// non-root ranks `recv` may be empty.
    pub fn reduce_bytes(
        &self,
        send: Option<&[u8]>,
        recv: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        op.check(dtype)?;
        self.check_rank("root", root)?;
        let count = match send {
            Some(s) => elements("send buffer", s.len(), dtype)?,
            None => elements("buffer", recv.len(), dtype)?,
        };
        let fp = Fingerprint::new(OpKind::Reduce, dtype, count)
            .with_op(op)
            .with_root(root);
        let job = Job::new(Collective::Reduce { count, root }, fp, dtype, Some(op));
        if self.rank() != root && recv.len() != count * dtype.size() {
            // Non-roots need scratch of the full size; their `recv` is not written.
            let mut scratch = vec![0u8; count * dtype.size()];
            return self.run_new(job, Some(send.unwrap_or(&[])), &mut scratch);
        }
        self.run_new(job, send, recv)
    }

    /// Erased [`Communicator::all_gather`].
    pub fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8], dtype: DataType) -> Result<()> {
        let count = elements("send buffer", send.len(), dtype)?;
        let counts = vec![count; self.size()];
        let fp = Fingerprint::new(OpKind::AllGather, dtype, count);
        self.run_new(
            Job::new(Collective::AllGather { counts }, fp, dtype, None),
            Some(send),
            recv,
        )
    }

    /// Erased [`Communicator::all_gather_v`].
    pub fn all_gather_v_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
        dtype: DataType,
    ) -> Result<()> {
        self.check_counts(OpKind::AllGatherV, counts)?;
        let fp = Fingerprint::new(OpKind::AllGatherV, dtype, 0).with_counts(counts);
        let coll = Collective::AllGather {
            counts: counts.to_vec(),
        };
        self.run_new(Job::new(coll, fp, dtype, None), Some(send), recv)
    }

    /// Erased [`Communicator::gather`].
    pub fn gather_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.check_rank("root", root)?;
        let count = elements("send buffer", send.len(), dtype)?;
        let counts = vec![count; self.size()];
        let fp = Fingerprint::new(OpKind::Gather, dtype, count).with_root(root);
        self.run_rooted(
            Job::new(Collective::Gather { counts, root }, fp, dtype, None),
            Some(send),
            recv,
        )
    }

    /// Erased [`Communicator::gather_v`].
    pub fn gather_v_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.check_rank("root", root)?;
        self.check_counts(OpKind::GatherV, counts)?;
        let fp = Fingerprint::new(OpKind::GatherV, dtype, 0)
            .with_root(root)
            .with_counts(counts);
        let coll = Collective::Gather {
            counts: counts.to_vec(),
            root,
        };
        self.run_rooted(Job::new(coll, fp, dtype, None), Some(send), recv)
    }

    /// Erased [`Communicator::scatter`].
    pub fn scatter_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.check_rank("root", root)?;
        let count = elements("receive buffer", recv.len(), dtype)?;
        let counts = vec![count; self.size()];
        let fp = Fingerprint::new(OpKind::Scatter, dtype, count).with_root(root);
        self.run_rooted(
            Job::new(Collective::Scatter { counts, root }, fp, dtype, None),
            Some(send),
            recv,
        )
    }

    /// Erased [`Communicator::scatter_v`].
    pub fn scatter_v_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.check_rank("root", root)?;
        self.check_counts(OpKind::ScatterV, counts)?;
        let fp = Fingerprint::new(OpKind::ScatterV, dtype, 0)
            .with_root(root)
            .with_counts(counts);
        let coll = Collective::Scatter {
            counts: counts.to_vec(),
            root,
        };
        self.run_rooted(Job::new(coll, fp, dtype, None), Some(send), recv)
    }

    /// Rooted operations: buffers that only matter at the root may be empty elsewhere.
    fn run_rooted(&self, job: Job, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        let me = self.rank();
        let in_len = job.coll.in_len(me) * job.dtype.size();
        let out_len = job.coll.out_len(me) * job.dtype.size();
        // Non-root ranks may pass anything for the root-only buffer: ignore it.
        let send = match send {
            Some(s) if in_len == 0 => Some(&s[..0]),
            s => s,
        };
        if out_len == 0 {
            return self.run_new(job, send, &mut recv[..0]);
        }
        self.run_new(job, send, recv)
    }

    /// Erased [`Communicator::reduce_scatter`].
    pub fn reduce_scatter_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        op.check(dtype)?;
        let count = elements("receive buffer", recv.len(), dtype)?;
        let counts = vec![count; self.size()];
        let fp = Fingerprint::new(OpKind::ReduceScatter, dtype, count).with_op(op);
        self.run_new(
            Job::new(Collective::ReduceScatter { counts }, fp, dtype, Some(op)),
            Some(send),
            recv,
        )
    }

    /// Erased [`Communicator::reduce_scatter_v`].
    pub fn reduce_scatter_v_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        op.check(dtype)?;
        self.check_counts(OpKind::ReduceScatterV, counts)?;
        let fp = Fingerprint::new(OpKind::ReduceScatterV, dtype, 0)
            .with_op(op)
            .with_counts(counts);
        let coll = Collective::ReduceScatter {
            counts: counts.to_vec(),
        };
        self.run_new(Job::new(coll, fp, dtype, Some(op)), Some(send), recv)
    }

    /// Erased [`Communicator::all_to_all`].
    pub fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8], dtype: DataType) -> Result<()> {
        let n = self.size();
        let total = elements("send buffer", send.len(), dtype)?;
        if total % n != 0 {
            return Err(Error::invalid(format!(
                "alltoall: send buffer has {total} elements, not a multiple of the {n} ranks"
            )));
        }
        let counts = vec![total / n; n];
        let fp = Fingerprint::new(OpKind::AllToAll, dtype, total / n);
        let coll = Collective::AllToAll {
            send_counts: counts.clone(),
            recv_counts: counts,
        };
        self.run_new(Job::new(coll, fp, dtype, None), Some(send), recv)
    }

    /// Erased [`Communicator::all_to_all_v`].
    pub fn all_to_all_v_bytes(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
        dtype: DataType,
    ) -> Result<()> {
        self.check_counts(OpKind::AllToAllV, send_counts)?;
        self.check_counts(OpKind::AllToAllV, recv_counts)?;
        let fp = Fingerprint::new(OpKind::AllToAllV, dtype, 0);
        let coll = Collective::AllToAll {
            send_counts: send_counts.to_vec(),
            recv_counts: recv_counts.to_vec(),
        };
        self.run_new(Job::new(coll, fp, dtype, None), Some(send), recv)
    }
}
