//! The engine-neutral device communicator: what every engine's operations go through.
//!
//! [`DeviceComm`] gives each operation its place in the communicator's order (a sequence number,
//! and for collectives a count ranks compare and a rolling hash of fingerprints), records a CUDA
//! event behind it on its stream, and keeps it as outstanding until the event passes. The
//! watchdog ([`super::watchdog`]) retires finished operations, publishes progress and fails the
//! communicator when [`super::health`] says so. A failure is recorded once (the poison), aborts
//! every engine, and from then on fails waits of unfinished operations and every later call.
//!
//! The engine that runs an operation is picked per call ([`super::select`]); the neutral layer
//! reaches it only through [`DeviceEngine`].

use super::cuda::{CuContext, CuStream, Driver};
use super::device::{DeviceSlice, Event, EventPool, Stream};
use super::engine::{DeviceEngine, EngineResult, Fault, P2p};
use super::group;
use super::link::HostLink;
use super::outstanding::{Head, OpState, Outstanding, Peers};
use super::request::GpuRequest;
use super::select::{Engines, Joined};
use super::watchdog;
use crate::atomic_duration::AtomicDuration;
use crate::buffer::Staging;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::op::{Collective, Op};
use crate::rendezvous::StoreClient;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// A communicator over device memory, one device per rank, whatever engines run its
/// operations. Shared by the facade's handles and the watchdog.
pub(crate) struct DeviceComm {
    pub(super) cu: &'static Driver,
    pub(super) engines: Engines,
    ctx: usize,
    stream: usize,
    device: usize,
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) id: String,
    pub(super) host: Arc<dyn HostLink>,
    /// Host rank of every rank of this communicator, where known (children of a split without
    /// a store are not).
    pub(super) host_of: Option<Vec<usize>>,
    /// The other processes' host ranks: the host's notice that one is gone fails this
    /// communicator.
    pub(super) watched: Vec<usize>,
    /// The rendezvous store under `gpu/{id}`, if the host has one.
    pub(super) store: Option<StoreClient>,
    pub(super) multi: bool,
    /// Whether the watchdog runs (`ACCORD_GPU_WATCHDOG=0` turns it off, to measure its cost).
    watch: bool,
    pub(super) state: Mutex<OpState>,
    events: Arc<EventPool>,
    pub(super) poisoned: AtomicBool,
    poison: Mutex<Option<Error>>,
    /// Whether operations seen finished before the failure keep their results: not after a
    /// desync, which is found after mismatched calls may have finished with garbage.
    spares_finished: AtomicBool,
    pub(super) aborted: AtomicBool,
    /// An abort frees the engines' library state: the watchdog's queries hold this shared while
    /// they use it, and a failure holds it exclusively while it records itself and aborts, so
    /// neither runs during the other and nobody sees the failure before the abort is over.
    /// Operations are not covered: an abort from another thread may end one that blocks.
    abort_lock: RwLock<()>,
    timeout: AtomicDuration,
    pub(super) stop: AtomicBool,
    pub(super) splits: AtomicU64,
    /// Scratch device word for the barrier.
    scratch: u64,
    /// This communicator's work on the timeline, when `ACCORD_TRACE` is set.
    pub(super) timeline: super::timeline::Timeline,
}

impl DeviceComm {
    /// Wrap a freshly created engine: the communicator's stream, scratch word and watchdog. The
    /// engine is aborted (dropped unclosed) if this fails.
    pub(crate) fn wrap(host: &Arc<dyn HostLink>, mut j: Joined) -> Result<Arc<DeviceComm>> {
        let cu = super::cuda::driver()?;
        cu.make_current(j.ctx as CuContext)?;
        let me = host.rank();
        // A map that does not place this rank on this process is not to be trusted.
        let host_of = j
            .host_of
            .clone()
            .filter(|m| m.len() == j.size && m.get(j.rank) == Some(&me));
        let mut watched: Vec<usize> = match &host_of {
            Some(map) => map.iter().copied().filter(|&h| h != me).collect(),
            None => (0..host.size()).filter(|&h| h != me).collect(),
        };
        watched.sort_unstable();
        watched.dedup();
        let stream = cu.new_stream()?;
        let mut scratch = 0u64;
        // SAFETY: allocates 8 bytes in the current context; zeroed before use.
        unsafe {
            cu.check((cu.mem_alloc)(&mut scratch, 8), "cuMemAlloc")?;
            cu.check((cu.memset_d8)(scratch, 0, 8), "cuMemsetD8")?;
            cu.check(
                (cu.stream_synchronize)(std::ptr::null_mut()),
                "cuStreamSynchronize",
            )?;
        }
        let preferred = std::mem::take(&mut j.preferred);
        let comm = Arc::new(DeviceComm {
            cu,
            ctx: j.ctx,
            stream: stream as usize,
            device: j.device,
            rank: j.rank,
            size: j.size,
            store: host.store(&format!("gpu/{}", j.id)),
            id: j.id,
            host: host.clone(),
            host_of,
            watched,
            multi: j.multi,
            engines: Engines::new(preferred, j.engine),
            watch: std::env::var("ACCORD_GPU_WATCHDOG").map_or(true, |v| v != "0"),
            state: Mutex::new(OpState::default()),
            events: EventPool::new(cu),
            poisoned: AtomicBool::new(false),
            poison: Mutex::new(None),
            spares_finished: AtomicBool::new(true),
            aborted: AtomicBool::new(false),
            abort_lock: RwLock::new(()),
            timeout: AtomicDuration::new(host.timeout()),
            stop: AtomicBool::new(false),
            splits: AtomicU64::new(0),
            scratch,
            timeline: Default::default(),
        });
        comm.set_timeout(host.timeout());
        if comm.watch {
            watchdog::start(&comm);
        }
        Ok(comm)
    }

    /// This rank.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The device ordinal.
    pub(crate) fn device(&self) -> usize {
        self.device
    }

    /// The id shared by all ranks.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The driver and the device's primary context (as a raw `CUcontext`).
    pub(crate) fn context(&self) -> (&'static Driver, usize) {
        (self.cu, self.ctx)
    }

    /// The communicator's own stream as a raw `CUstream`.
    pub(crate) fn stream(&self) -> usize {
        self.stream
    }

    /// The engine the communicator was created with (splits, version, raw handle).
    pub(crate) fn fallback(&self) -> &dyn DeviceEngine {
        self.engines.fallback()
    }

    /// Deadline for any one operation (enforced by the watchdog).
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout.get()
    }

    pub(crate) fn set_timeout(&self, t: Duration) {
        self.timeout.set(t);
        for e in self.engines.iter() {
            e.set_timeout(t);
        }
    }

    /// Fail with `reason`: stop the engines' kernels and fail every pending and later operation.
    pub(crate) fn abort(&self, reason: &str) {
        self.fail(Error::Aborted {
            reason: reason.to_string(),
        });
    }

    // -----------------------------------------------------------------------------------------
    // The operation path.

    /// Enqueue the checked collective `op` on `stream`. `send` is `None` in place; the barrier
    /// takes no buffers (pass anything, e.g. [`DeviceSlice::empty`]). The slices must be of
    /// `op.dtype` and hold what `op` needs on this rank, except the sides `staging` names: their
    /// blocks (checked against the slice by the caller) are copied through a packed temporary
    /// in stream order (see [`DeviceComm::staged`]).
    pub(crate) fn run(
        self: &Arc<Self>,
        op: &Op,
        send: Option<DeviceSlice>,
        recv: DeviceSlice,
        stream: Stream,
        staging: Staging<'_>,
    ) -> Result<GpuRequest> {
        if matches!(op.coll, Collective::Scan { .. }) {
            // Its scratch array is freed in stream order right behind the kernel, which a
            // group would launch only at its end.
            super::group::not_in_group("scan or exscan on GPU buffers")?;
        }
        if staging.any() {
            // The copies into the caller's blocks follow the operation in stream order, which a
            // group would launch only at its end.
            super::group::not_in_group(
                "a v collective with displacements (Parts::with_displs) on GPU buffers that are \
                 not back to back",
            )?;
        }
        let recv = match op.coll {
            // SAFETY: the communicator's own 8-byte scratch allocation.
            Collective::Barrier => unsafe { DeviceSlice::from_raw(self.scratch, 1, DataType::I32) },
            _ => {
                // In the caller's type, before it is re-expressed; staged sides as the packed
                // temporary the engine will get.
                let packed = |s: DeviceSlice, n: usize| {
                    // SAFETY: a description only (length and type); nothing is read through it.
                    unsafe { DeviceSlice::from_raw(s.ptr(), n, s.dtype()) }
                };
                let fs = match (send, staging.send) {
                    (Some(s), Some(_)) => Some(packed(s, op.send_len(self.rank))),
                    (s, _) => s,
                };
                let fr = match staging.recv {
                    Some(_) => packed(recv, op.recv_len(self.rank)),
                    None => recv,
                };
                fits(op, self.rank, fs, fr)?;
                recv
            }
        };
        let esz = op.dtype.size();
        let lowered = super::lower::lower(op)?;
        let (op, send, recv) = match &lowered {
            None => (op, send, recv),
            Some(low) => (
                low,
                send.map(|s| super::lower::view(s, low.dtype)),
                super::lower::view(recv, low.dtype),
            ),
        };
        // Staged or not, where the caller's arrays lie: ranks of one call must choose alike.
        let heap = self.engines.heap_arrays(op, send, recv);
        let (at, engine) = self.engines.pick(op, heap, self.rank)?;
        self.launch(
            op.fp,
            Some((at, heap)),
            Peers::default(),
            stream,
            |s| match staging.any() {
                false => engine.enqueue(op, send, recv, s),
                true => self.staged(op, esz, (send, recv), staging, s, |send, recv| {
                    engine.enqueue(op, send, recv, s)
                }),
            },
        )
    }

    /// Run `enqueue` on packed temporaries for the sides `staging` names, all on stream `s`:
    /// allocate them (`cuMemAllocAsync`), copy the send blocks of the caller's array into
    /// theirs, enqueue the operation, copy the received blocks out into the caller's array,
    /// free them (`cuMemFreeAsync`). Everything is in stream order, so the temporaries live
    /// until the operation has used them, and the event recorded after this marks the copies
    /// out as part of the operation. `esz` is the size of the caller's elements (the blocks'
    /// unit); `op` may be re-expressed in another type.
    fn staged(
        &self,
        op: &Op,
        esz: usize,
        (send, recv): (Option<DeviceSlice>, DeviceSlice),
        staging: Staging<'_>,
        s: CuStream,
        enqueue: impl FnOnce(Option<DeviceSlice>, DeviceSlice) -> EngineResult<()>,
    ) -> EngineResult<()> {
        let cu = self.cu;
        // Peers may already be in the operation: a rank that fails to stage its blocks must
        // not go on out of step with them.
        let fatal = |e: Error| Fault::fatal(e);
        let send_bytes = staging.send.map_or(0, |b| b.total() * esz);
        let recv_bytes = staging.recv.map_or(0, |b| b.total() * esz);
        // One allocation; the receive side at an aligned offset.
        let recv_at = send_bytes.next_multiple_of(256);
        let bytes = recv_at + recv_bytes;
        let mut base = 0u64;
        if bytes > 0 {
            // SAFETY: out-pointer to a local; freed below on the same stream.
            let rc = unsafe { (cu.mem_alloc_async)(&mut base, bytes, s) };
            cu.check(rc, "cuMemAllocAsync").map_err(fatal)?;
        }
        let copy = |dst: u64, src: u64, n: usize| -> Result<()> {
            // SAFETY: both ranges lie in live device memory: the caller's blocks were checked
            // against its array, the packed offsets against the temporary's size.
            let rc = unsafe { (cu.memcpy_dtod_async)(dst, src, n, s) };
            cu.check(rc, "cuMemcpyDtoDAsync")
        };
        let result = (|| -> EngineResult<()> {
            let es = op.dtype.size();
            let send = match (send, staging.send) {
                (Some(user), Some(b)) => {
                    for (p, at, n) in b.copies(esz) {
                        copy(base + p as u64, user.ptr() + at as u64, n).map_err(fatal)?;
                    }
                    // SAFETY: the temporary's send part, `send_bytes` bytes.
                    Some(unsafe { DeviceSlice::from_raw(base, send_bytes / es, op.dtype) })
                }
                (s, _) => s,
            };
            let packed_recv = match staging.recv {
                // SAFETY: the temporary's receive part, `recv_bytes` bytes.
                Some(_) => unsafe {
                    DeviceSlice::from_raw(base + recv_at as u64, recv_bytes / es, op.dtype)
                },
                None => recv,
            };
            enqueue(send, packed_recv)?;
            if let Some(b) = staging.recv {
                for (p, at, n) in b.copies(esz) {
                    copy(recv.ptr() + at as u64, packed_recv.ptr() + p as u64, n).map_err(fatal)?;
                }
            }
            Ok(())
        })();
        if bytes > 0 {
            // SAFETY: allocated above on `s`; freed once the work queued before it is done.
            let rc = unsafe { (cu.mem_free_async)(base, s) };
            result?;
            return cu.check(rc, "cuMemFreeAsync").map_err(fatal);
        }
        result
    }

    /// Put the traced work that has finished on the timeline.
    pub(super) fn resolve_timeline(&self) {
        if crate::observe::trace::enabled() {
            self.timeline
                .resolve(self.cu, self.host.rank(), self.device);
        }
    }

    /// The issue count of the oldest operation not yet finished on the GPU (asking the events
    /// of those the watchdog has not retired yet); `None` when all have finished.
    pub(crate) fn oldest_unfinished(&self) -> Option<u64> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.outstanding
            .iter()
            .find(|o| !o.event.finished.load(Ordering::Acquire) && !o.event.done().unwrap_or(false))
            .map(|o| o.seq)
    }

    /// The last collective, for messages: with the engine that ran it where there are several
    /// (ranks that passed symmetric-heap arrays and ranks that did not may have picked
    /// different ones).
    pub(super) fn last_call(&self, st: &OpState) -> String {
        let Some(fp) = st.last else {
            return String::new();
        };
        match self.engines.len() {
            1 => fp.to_string(),
            _ => format!(
                "{fp} on {}{}",
                self.engines.name_at(st.route.0),
                if st.route.1 {
                    ", symmetric-heap arrays"
                } else {
                    ""
                }
            ),
        }
    }

    /// Enqueue point-to-point sends and receives (one group when several) on `stream`, named
    /// `fp` in the watchdog's messages. Not collective: their fingerprints do not enter the
    /// cross-rank hash (ranks issue different sends and receives), but they do count in the
    /// sequence numbers, which therefore agree between ranks only for collectives-only use.
    pub(crate) fn run_p2p(
        self: &Arc<Self>,
        fp: Fingerprint,
        ops: &[P2p],
        stream: Stream,
    ) -> Result<GpuRequest> {
        for o in ops {
            let (P2p::Send { peer, .. } | P2p::Recv { peer, .. }) = *o;
            if peer >= self.size {
                return Err(Error::invalid(format!(
                    "rank {peer} does not exist in a GPU communicator of {} ranks",
                    self.size
                )));
            }
        }
        let ops: Vec<P2p> = ops
            .iter()
            .map(|o| match *o {
                P2p::Send { buf, peer } => P2p::Send {
                    buf: super::lower::movable(buf),
                    peer,
                },
                P2p::Recv { buf, peer } => P2p::Recv {
                    buf: super::lower::movable(buf),
                    peer,
                },
            })
            .collect();
        let engine = self.engines.fallback();
        let peers = Peers::of(&ops);
        self.launch(fp, None, peers, stream, |s| engine.enqueue_p2p(&ops, s))
    }

    /// Give the operation its place and event, and enqueue it with `f`. `route`: for a
    /// collective, the engine's place and whether on symmetric-heap arrays.
    fn launch(
        self: &Arc<Self>,
        fp: Fingerprint,
        route: Option<(usize, bool)>,
        peers: Peers,
        stream: Stream,
        f: impl FnOnce(CuStream) -> EngineResult<()>,
    ) -> Result<GpuRequest> {
        if self.poisoned.load(Ordering::Acquire) {
            if let Some(e) = self.poison() {
                return Err(e);
            }
        }
        self.cu.make_current(self.ctx as CuContext)?;
        let s = self.stream_of(stream);
        let event = Arc::new(self.events.take()?);
        let (seq, cseq) = {
            let mut st = self.state.lock().expect("gpu op state");
            st.seq += 1;
            if let Some(route) = route {
                st.cseq += 1;
                st.hash = mix(st.hash, &fp) ^ route_bits(route);
                st.last = Some(fp);
                st.route = route;
            }
            (st.seq, st.cseq)
        };
        let traced = match crate::observe::trace::enabled() && !self.capturing(s) {
            true => self.timeline.before(self.cu, s),
            false => None,
        };
        f(s).map_err(|fault| self.fault(fault))?;
        if let Some(start) = traced {
            let args = serde_json::json!({"seq": seq, "call": fp.to_string()});
            let name = fp.kind.name().to_string();
            self.timeline.after(self.cu, s, start, name, args);
        }
        if self.capturing(s) {
            // Captured into a CUDA graph: the work runs at each replay, on the caller's stream,
            // and the caller synchronises with that. Nothing to wait for here: the request is
            // complete, the event never recorded (waiting a stream on it is a no-op).
            event.armed.store(true, Ordering::Release);
            event.finished.store(true, Ordering::Release);
            return Ok(GpuRequest::new(event, self.clone(), seq));
        }
        if !group::defer_record(&event, s, self) {
            event.record(s);
        }
        let mut st = self.state.lock().expect("gpu op state");
        if !self.watch {
            // Nobody retires finished operations: keep only the newest (for synchronize).
            st.outstanding.clear();
        }
        st.outstanding.push_back(Outstanding {
            seq,
            cseq: route.map(|_| cseq),
            fp,
            peers,
            event: event.clone(),
            since: Instant::now(),
        });
        Ok(GpuRequest::new(event, self.clone(), seq))
    }

    /// Whether `s` is capturing work into a CUDA graph.
    fn capturing(&self, s: CuStream) -> bool {
        let Ok(launch) = self.cu.launch() else {
            return false;
        };
        let mut status = 0;
        // SAFETY: out-pointer to a local; `s` is a live stream of the current context.
        let rc = unsafe { (launch.stream_is_capturing)(s, &mut status) };
        rc == 0 && status != 0
    }

    /// The error of an engine's failure, after failing the communicator if the failure is fatal.
    pub(super) fn fault(&self, fault: Fault) -> Error {
        if !fault.fatal {
            return *fault.error;
        }
        // A peer that found a desync gives up, and this rank's engine may fail because of it
        // (NCCL reports an internal error once the peer aborted): the desync is what to name.
        // Failing already (the watchdog saw a peer die): that is the cause to report.
        let error = super::watchdog::desync_soon(self)
            .or_else(|| self.poison())
            .unwrap_or(*fault.error);
        self.fail(error.clone());
        error
    }

    /// After a launch group ended with work still being enqueued: wait for every engine.
    pub(super) fn finish_enqueue(&self, what: &str) -> Result<()> {
        for e in self.engines.iter() {
            e.finish_enqueue(what).map_err(|f| self.fault(f))?;
        }
        Ok(())
    }

    /// Block until every operation issued so far has finished; the communicator's failure if
    /// one of them did not finish before it (or, after a desync, finished with mismatched
    /// calls). A failure after they all finished (a peer that exited since) shows at the next
    /// call instead.
    pub(crate) fn synchronize(self: &Arc<Self>) -> Result<()> {
        let last = {
            let st = self.state.lock().expect("gpu op state");
            st.outstanding.back().map(|o| (o.event.clone(), o.seq))
        };
        let r = match last {
            Some((event, seq)) => GpuRequest::new(event, self.clone(), seq).wait(),
            None => match self.poison() {
                Some(e) if !self.spares_finished.load(Ordering::Acquire) => Err(e),
                _ => Ok(()),
            },
        };
        self.resolve_timeline();
        r
    }

    /// A request that completes once the work enqueued on `stream` so far has: for operations
    /// made of a collective and stream-ordered work after it (a redistribution's unpacking),
    /// whose callers must wait for the whole.
    pub(crate) fn mark(self: &Arc<Self>, stream: Stream) -> Result<GpuRequest> {
        self.cu.make_current(self.ctx as CuContext)?;
        let s = self.stream_of(stream);
        let event = Arc::new(self.events.take()?);
        event.record(s);
        let seq = self.state.lock().expect("gpu op state").seq;
        Ok(GpuRequest::new(event, self.clone(), seq))
    }

    /// Block until the work enqueued on `stream` so far (the caller's kernels included) has
    /// finished: the communicator's failure if it fails first, a timeout naming the stream's
    /// device if the work is still running after the communicator's timeout.
    pub(crate) fn wait_stream(self: &Arc<Self>, stream: Stream) -> Result<()> {
        self.cu.make_current(self.ctx as CuContext)?;
        let event = Arc::new(self.events.take()?);
        event.record(self.stream_of(stream));
        let (start, timeout) = (Instant::now(), self.timeout());
        let req = GpuRequest::new(event, self.clone(), 0);
        let mut spins = 0u32;
        while !req.test()? {
            if start.elapsed() > timeout {
                return Err(Error::Timeout {
                    op: "sync_stream".into(),
                    seq: 0,
                    comm: self.id.clone(),
                    waiting_for: vec![],
                    after: timeout,
                    hint: format!(
                        "; the work on stream {stream:?} of device {} did not finish (a kernel \
                         of the caller's, or an operation waiting for its peers)",
                        self.device
                    ),
                });
            }
            spins += 1;
            match spins {
                0..2000 => std::hint::spin_loop(),
                _ => std::thread::sleep(Duration::from_micros(50)),
            }
        }
        Ok(())
    }

    /// Release the engines now, for a closed communicator. Later calls fail with `e` at once;
    /// the work already issued (on any stream) is waited for, within the timeout, then the
    /// engines are destroyed, or aborted if that wait ran out or an engine faulted. Operations
    /// that finished keep their results.
    pub(crate) fn shutdown(&self, e: Error) {
        let _ = self.cu.make_current(self.ctx as CuContext);
        {
            let _exclusive = self.abort_lock.write().unwrap_or_else(|p| p.into_inner());
            let mut p = self.poison.lock().unwrap_or_else(|p| p.into_inner());
            if p.is_none() {
                self.spares_finished.store(true, Ordering::Release);
                *p = Some(e);
            }
            self.poisoned.store(true, Ordering::Release);
        }
        let deadline = Instant::now() + self.timeout();
        let drained = loop {
            let pending = self.unless_aborted(|| {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                st.retire(&|| self.faulted()).is_some()
            });
            match pending {
                Some(false) => break true,
                None => break false,
                Some(true) if self.faulted() || Instant::now() >= deadline => break false,
                Some(true) => std::thread::sleep(Duration::from_micros(200)),
            }
        };
        self.resolve_timeline();
        let _exclusive = self.abort_lock.write().unwrap_or_else(|p| p.into_inner());
        if !self.aborted.swap(true, Ordering::AcqRel) {
            for engine in self.engines.iter() {
                match drained {
                    true => engine.close(),
                    false => engine.abort(),
                }
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Failure.

    /// Run `f` unless the communicator has been aborted (`None` then), with no abort able to
    /// run meanwhile.
    pub(super) fn unless_aborted<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let _shared = self.abort_lock.read().unwrap_or_else(|p| p.into_inner());
        (!self.aborted.load(Ordering::Acquire)).then(f)
    }

    /// The error that failed this communicator, if any.
    pub(crate) fn poison(&self) -> Option<Error> {
        if !self.poisoned.load(Ordering::Acquire) {
            return None;
        }
        // Set under the exclusive lock: this waits for the abort to finish.
        let _shared = self.abort_lock.read().unwrap_or_else(|p| p.into_inner());
        self.poison.lock().ok().and_then(|p| p.clone())
    }

    /// Whether `event`'s operation has finished with its own result; the failure if the
    /// communicator failed first. Completion is only believed when seen with no abort able to
    /// run meanwhile: aborted kernels return early and complete their events too.
    pub(super) fn settled(&self, event: &Event) -> Result<bool> {
        if !event.finished.load(Ordering::Acquire) {
            match self.unless_aborted(|| event.done()) {
                // Asked after the event passed: a kernel records its failure before returning.
                Some(Ok(true)) => match self.engines.device_fault() {
                    Some(e) => self.fail(e),
                    None => event.finished.store(true, Ordering::Release),
                },
                Some(other) => return other,
                None => {}
            }
        }
        match self.poison() {
            Some(e) if !event.finished.load(Ordering::Acquire) => Err(e),
            Some(e) if !self.spares_finished.load(Ordering::Acquire) => Err(e),
            _ => Ok(true),
        }
    }

    /// Whether an engine's kernels recorded a failure on the device.
    fn faulted(&self) -> bool {
        self.engines.device_fault().is_some()
    }

    /// Retire finished operations; the oldest unfinished one (`None` also once aborted).
    pub(super) fn oldest(&self) -> Option<Head> {
        self.unless_aborted(|| self.state.lock().ok()?.retire(&|| self.faulted()))
            .flatten()
    }

    pub(super) fn stream_of(&self, s: Stream) -> CuStream {
        match s {
            Stream::Comm => self.stream as CuStream,
            Stream::Raw(h) => h as CuStream,
        }
    }

    /// Record the first failure, abort the engines once, and log it. The failure shows (through
    /// [`DeviceComm::poison`]) only once the abort has finished: a caller that returns the error
    /// and exits would otherwise tear CUDA down under an abort still running in the watchdog's
    /// thread, which crashed one process in three at exit in the desync test.
    pub(crate) fn fail(&self, e: Error) {
        let _exclusive = self.abort_lock.write().unwrap_or_else(|p| p.into_inner());
        if !self.aborted.load(Ordering::Acquire) {
            // The last look before the abort: what has finished by now keeps its result.
            if let Ok(mut st) = self.state.lock() {
                st.retire(&|| self.faulted());
            }
        }
        let mut first = None;
        {
            let mut p = self.poison.lock().unwrap_or_else(|p| p.into_inner());
            if p.is_none() {
                tracing::error!("gpu communicator {} rank {}: {e}", self.id, self.rank);
                first = Some(format!("GPU communicator rank {} failed: {e}", self.rank));
                let spares = !matches!(e, Error::Desync { .. });
                self.spares_finished.store(spares, Ordering::Release);
                *p = Some(e);
            }
        }
        self.poisoned.store(true, Ordering::Release);
        if !self.aborted.swap(true, Ordering::AcqRel) {
            // No watchdog query is in flight; an abort is allowed from any thread and makes the
            // engines' kernels return.
            for engine in self.engines.iter() {
                engine.abort();
            }
        }
        if let Some(reason) = first {
            crate::observe::on_failure(reason);
        }
    }
}

impl Drop for DeviceComm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let cu = self.cu;
        let _ = cu.make_current(self.ctx as CuContext);
        if !self.aborted.load(Ordering::Acquire) {
            // SAFETY: the engines are idle once the communicator's stream is (operations on
            // callers' streams were waited for by their owners or are ended by the release).
            unsafe { (cu.stream_synchronize)(self.stream as CuStream) };
            for engine in self.engines.iter() {
                engine.close();
            }
        }
        self.state.get_mut().map(|s| s.outstanding.clear()).ok();
        // SAFETY: our own stream and scratch word, no longer used.
        unsafe {
            (cu.mem_free)(self.scratch);
            (cu.stream_destroy)(self.stream as CuStream);
        }
    }
}

/// Whether the slices match `op` on rank `rank`: its element type, and at least the elements it
/// reads or writes there (the engines trust this with raw device pointers).
fn fits(op: &Op, rank: usize, send: Option<DeviceSlice>, recv: DeviceSlice) -> Result<()> {
    let input = send.unwrap_or(recv);
    for s in [input, recv] {
        if s.dtype() != op.dtype {
            return Err(Error::invalid(format!(
                "{}: a device buffer is {} but the call is on {}",
                op.kind(),
                s.dtype(),
                op.dtype
            )));
        }
    }
    let reads = match op.coll {
        // The root's send buffer, read by the engine though the schedule calls it unused.
        Collective::Broadcast { count, root } if root == rank => count,
        _ => op.send_len(rank),
    };
    let writes = match op.coll {
        // Device reduces leave non-roots' receive buffers alone (the schedule's scratch).
        Collective::Reduce { root, .. } if root != rank => 0,
        _ => op.recv_len(rank),
    };
    if input.count() < reads || recv.count() < writes {
        return Err(Error::invalid(format!(
            "{}: device buffers of {} and {} elements, but this rank reads {reads} and writes \
             {writes}",
            op.kind(),
            input.count(),
            recv.count()
        )));
    }
    Ok(())
}

/// What the engine choice adds to the rolling hash: its place in the list (nothing for the
/// first, so communicators of one engine hash as before). Whether the arrays are in the heap
/// stays out: ranks may mix heap and ordinary arrays in a call that one engine runs.
fn route_bits((at, _heap): (usize, bool)) -> u64 {
    (at as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Fold one fingerprint into the rolling hash (order-sensitive).
pub(crate) fn mix(h: u64, fp: &Fingerprint) -> u64 {
    h.rotate_left(5) ^ fp_hash(fp)
}

pub(crate) fn fp_hash(fp: &Fingerprint) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in fp.encode() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::ReduceOp;
    use crate::fingerprint::OpKind;

    fn slice(count: usize, dtype: DataType) -> DeviceSlice {
        // SAFETY: never dereferenced.
        unsafe { DeviceSlice::from_raw(0x1000, count, dtype) }
    }

    fn op(kind: OpKind, root: Option<usize>, send: usize, recv: usize, rank: usize) -> Op {
        let reduce = matches!(kind, OpKind::AllReduce | OpKind::Reduce).then_some(ReduceOp::Sum);
        let req = crate::op::Request {
            kind,
            dtype: DataType::F32,
            reduce,
            root,
            send: Some(crate::op::Extent::len(send)),
            recv: crate::op::Extent::len(recv),
        };
        Op::new(req, rank, 2).unwrap()
    }

    #[test]
    fn slices_must_hold_what_the_op_reads_and_writes_here() {
        let f32s = |n| slice(n, DataType::F32);
        let ar = op(OpKind::AllReduce, None, 8, 8, 0);
        assert!(fits(&ar, 0, Some(f32s(8)), f32s(8)).is_ok());
        assert!(
            fits(&ar, 0, Some(f32s(16)), f32s(9)).is_ok(),
            "longer is fine"
        );
        assert!(fits(&ar, 0, Some(f32s(7)), f32s(8)).is_err());
        assert!(fits(&ar, 0, Some(f32s(8)), f32s(7)).is_err());
        assert!(fits(&ar, 0, None, f32s(8)).is_ok(), "in place");
        assert!(fits(&ar, 0, None, f32s(7)).is_err());
        let wrong = slice(8, DataType::I32);
        assert!(fits(&ar, 0, Some(wrong), f32s(8)).is_err());
        assert!(fits(&ar, 0, Some(f32s(8)), wrong).is_err());
        // A reduce's non-root receives nothing; its root receives the whole.
        let red = op(OpKind::Reduce, Some(1), 8, 0, 0);
        assert!(fits(&red, 0, Some(f32s(8)), f32s(0)).is_ok());
        let red = op(OpKind::Reduce, Some(1), 8, 8, 1);
        assert!(fits(&red, 1, Some(f32s(8)), f32s(4)).is_err());
        // The broadcast root's send buffer is read.
        let bc = op(OpKind::Broadcast, Some(0), 8, 8, 0);
        assert!(fits(&bc, 0, Some(f32s(4)), f32s(8)).is_err());
        assert!(fits(&bc, 1, Some(f32s(0)), f32s(8)).is_ok());
        // An allgather writes every rank's block.
        let ag = op(OpKind::AllGather, None, 3, 6, 0);
        assert!(fits(&ag, 0, Some(f32s(3)), f32s(6)).is_ok());
        assert!(fits(&ag, 0, Some(f32s(3)), f32s(5)).is_err());
    }

    #[test]
    fn hash_is_order_sensitive() {
        let a = Fingerprint::new(OpKind::AllReduce, DataType::F32, 4).with_op(ReduceOp::Sum);
        let b = Fingerprint::new(OpKind::Broadcast, DataType::F32, 4).with_root(0);
        assert_ne!(mix(mix(0, &a), &b), mix(mix(0, &b), &a));
        assert_ne!(mix(0, &a), mix(0, &b));
    }
}
