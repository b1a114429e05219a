//! Collectives on NVIDIA GPU memory through NCCL, bootstrapped by a host [`Communicator`].
//!
//! CUDA (the driver, `libcuda.so.1`) and NCCL are opened at run time, so this module builds and
//! its tests run on machines without either; every entry point then returns
//! [`Error::Unsupported`] saying what is missing. See [`nccl`] for where NCCL is looked for.
//!
//! ## Creating a communicator
//!
//! ```no_run
//! # fn main() -> accord::Result<()> {
//! use accord::gpu::{DeviceBuffer, GpuCommunicator, Stream};
//! use accord::ReduceOp;
//! let host = accord::init()?; // any init method: accord run, torchrun, mpirun, tcp://, file://
//! let local = std::env::var("LOCAL_RANK").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
//! let gpu = GpuCommunicator::new(&host, local)?;
//! let buf = DeviceBuffer::from_host(&gpu, &vec![1.0f32; 1 << 20])?;
//! gpu.all_reduce(buf.slice(), buf.slice(), ReduceOp::Sum, Stream::Comm)?.wait()?;
//! # Ok(()) }
//! ```
//!
//! Rank 0 creates the `ncclUniqueId` and broadcasts it over the host communicator, so every way
//! of starting the host communicator works unchanged. Before that, all ranks exchange their
//! NCCL versions: different versions fail at once on every rank, naming ranks and versions.
//! ([`GpuCommunicator::with_unique_id`] takes an id the caller distributed itself.)
//!
//! Initialisation has a deadline too (the host communicator's timeout). NCCL's blocking init
//! cannot be interrupted, so Accord initialises in NCCL's nonblocking mode, waits with the
//! deadline (aborting on expiry, naming the ranks that never started), and then trades that
//! communicator for a blocking twin with `ncclCommSplit`: operations on a nonblocking
//! communicator are launched from an NCCL helper thread and cost about 100 us each. A split of
//! a blocking communicator blocks whatever the child's configuration, so splits
//! ([`GpuCommunicator::split`], [`GpuCommunicator::split_group`]) first meet in the rendezvous
//! store under the deadline (naming ranks that never call split) and only then call NCCL.
//! `ACCORD_NCCL_INIT=blocking` falls back to NCCL's plain blocking init (no deadline).
//!
//! ## The API for bindings
//!
//! Everything is expressed in raw terms a binding can produce from any array library:
//!
//! - buffers are [`DeviceSlice`]s: a device address (`CUdeviceptr`, e.g. PyTorch's
//!   `tensor.data_ptr()` or DLPack's `data + byte_offset`), an element count and a [`DataType`];
//! - streams are [`Stream::Raw`] with the `CUstream` handle as an integer (PyTorch's
//!   `torch.cuda.current_stream().cuda_stream`, CuPy's `Stream.ptr`), or [`Stream::Comm`] for the
//!   communicator's own stream;
//! - every operation enqueues its work and returns a [`GpuRequest`] at once, without waiting for
//!   the GPU. [`GpuRequest::wait`] blocks the host; [`GpuRequest::stream_wait`] makes another
//!   stream wait on the GPU instead; [`GpuRequest::test`] polls.
//!
//! The caller keeps buffers alive until the operation completes on its stream (as with NCCL).
//! Operations of one communicator must be called in the same order on every rank; calls from
//! several threads on one communicator must be serialised by the caller.
//!
//! ## Operations
//!
//! broadcast, reduce, allreduce, allgather, reduce_scatter map to NCCL's own collectives. The
//! variable-count variants, gather, scatter, alltoall(v) and send/recv use grouped `ncclSend` /
//! `ncclRecv` (allgatherv as grouped broadcasts, reduce_scatterv as grouped reduces). Barrier is
//! a one-element allreduce, ordered on the stream. [`ReduceOp::Avg`] uses `ncclAvg`; the bitwise
//! operators do not exist in NCCL and fail with [`Error::Unsupported`]. [`GpuCommunicator::split`]
//! uses `ncclCommSplit`.
//!
//! ## Several GPUs per process
//!
//! [`GpuCommunicator::new_multi`] creates one communicator per device (NCCL ranks
//! `host_rank * devices.len() + i`). Issue one operation on each inside [`group`], which wraps
//! `ncclGroupStart`/`ncclGroupEnd`, so a single thread can drive all of them without deadlock.
//! [`GpuCommunicator::split_group`] splits them together (each device may pick its own color).
//!
//! Caveat (CUDA, not Accord): when threads of one process drive several GPUs, a thread that
//! allocates or frees device memory while another GPU's NCCL kernel waits for it can deadlock,
//! because peer mappings make `cuMemAlloc`/`cuMemFree` wait for the other device. Allocate
//! before issuing collectives, or use one process per GPU.
//!
//! ## No silent hangs
//!
//! Each communicator has a watchdog thread. It retires finished operations (one CUDA event each)
//! and checks, every few milliseconds (at most 50):
//!
//! - the host communicator that bootstrapped it, which sees a member's process end (its
//!   connection closes) or a rank abort the world within milliseconds, also while no operation
//!   runs: the failure is [`Error::PeerLost`] naming that rank (or the abort), shown within 2 s
//!   whatever the timeout. An operation issued before the notice gets a quarter second to
//!   finish first (a peer that finished its part and exited leaves this rank's part to finish);
//!   an idle communicator fails at once, so its next call fails naming the rank;
//! - `ncclCommGetAsyncError`, which reports a peer's lost connection where NCCL notices one;
//! - the oldest unfinished operation against the timeout (the host communicator's, from
//!   `ACCORD_TIMEOUT`, or [`GpuCommunicator::set_timeout`]).
//!
//! The decision is a pure function of these observations and the clock (module `health`). On a
//! failure the watchdog aborts the NCCL communicator (`ncclCommAbort`, which also stops its
//! kernels) and poisons the communicator: waits of unfinished operations and later calls return
//! the error, never before the abort has finished (a process that exits on the error must not
//! tear CUDA down under it). Operations seen finished before the failure keep their results,
//! except after a desync. A timeout names the operation, its sequence number and the ranks that
//! never entered it.
//!
//! Ranks publish their progress — the last entered sequence number and a rolling hash of every
//! operation's fingerprint — to the rendezvous store under `gpu/{id}/progress/{rank}`, from the
//! watchdog thread about once a second when it changed (never on the operation path). The same
//! values detect desynchronisation: when two ranks have entered the same number of operations
//! but their fingerprint hashes differ, both get [`Error::Desync`] naming each side's last call,
//! and the communicator is aborted instead of hanging or reducing mismatched buffers.

pub mod cuda;
mod health;
pub mod nccl;
mod watchdog;

use crate::atomic_duration::AtomicDuration;
use crate::comm::Communicator;
use crate::dtype::{DataType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, OpKind};
use crate::rendezvous::StoreClient;
use cuda::{CuContext, CuEvent, CuStream, Driver};
use nccl::{Nccl, NcclComm, NcclUniqueId};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A span of device memory: address, element count and element type.
///
/// Construct from raw parts with [`DeviceSlice::from_raw`] (bindings) or from a
/// [`DeviceBuffer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSlice {
    ptr: u64,
    count: usize,
    dtype: DataType,
}

impl DeviceSlice {
    /// A slice of `count` elements of `dtype` at device address `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` must be a device (or managed) address valid for `count * dtype.size()` bytes on the
    /// communicator's device until every operation using it has completed on its stream.
    pub unsafe fn from_raw(ptr: u64, count: usize, dtype: DataType) -> Self {
        DeviceSlice { ptr, count, dtype }
    }

    /// An empty slice (for ranks that receive nothing, e.g. non-roots of a gather).
    pub fn empty(dtype: DataType) -> Self {
        DeviceSlice {
            ptr: 0,
            count: 0,
            dtype,
        }
    }

    /// Device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Number of elements.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }

    /// Elements `start .. start + count` of this slice.
    pub fn sub(&self, start: usize, count: usize) -> Result<DeviceSlice> {
        if start.checked_add(count).is_none_or(|end| end > self.count) {
            return Err(Error::invalid(format!(
                "elements {start}..{} are outside a device buffer of {}",
                start.saturating_add(count),
                self.count
            )));
        }
        Ok(DeviceSlice {
            ptr: self.ptr + (start * self.dtype.size()) as u64,
            count,
            dtype: self.dtype,
        })
    }

    fn as_ptr(&self) -> *const c_void {
        self.ptr as *const c_void
    }

    fn as_mut_ptr(&self) -> *mut c_void {
        self.ptr as *mut c_void
    }
}

/// Which CUDA stream an operation is enqueued on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The communicator's own non-blocking stream.
    Comm,
    /// A caller's `CUstream` / `cudaStream_t`, as an integer (0 is the legacy default stream).
    Raw(usize),
}

/// Issue operations on several communicators (one per GPU of this process) as one NCCL group.
///
/// Requests returned inside `f` are armed when the group ends.
pub fn group<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    let n = nccl::nccl()?;
    group_start(n)?;
    let r = f();
    let end = group_end(n);
    let r = r?;
    end?;
    Ok(r)
}

/// Open [`group`] depth, and the events to record (on their streams, of their communicators)
/// once the outermost ends.
type GroupState = (usize, Vec<(Arc<Event>, CuStream, Arc<Inner>)>);

thread_local! {
    static GROUP: RefCell<GroupState> = const { RefCell::new((0, Vec::new())) };
}

/// Communicators are created and split outside [`group`]: inside one, NCCL defers the work to
/// the group's end, after this call would have had to return the new communicator.
fn not_in_group(what: &str) -> Result<()> {
    if GROUP.with(|g| g.borrow().0) > 0 {
        return Err(Error::invalid(format!(
            "{what} inside gpu::group is not possible; do it before or after the group"
        )));
    }
    Ok(())
}

fn group_start(n: &Nccl) -> Result<()> {
    // SAFETY: no arguments.
    let rc = unsafe { (n.group_start)() };
    if rc != 0 {
        return Err(Error::Aborted {
            reason: format!("ncclGroupStart: {}", n.describe(rc, std::ptr::null_mut())),
        });
    }
    GROUP.with(|g| g.borrow_mut().0 += 1);
    Ok(())
}

fn group_end(n: &Nccl) -> Result<()> {
    // SAFETY: no arguments; paired with group_start.
    let rc = unsafe { (n.group_end)() };
    let pending = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.0 = g.0.saturating_sub(1);
        if g.0 == 0 {
            std::mem::take(&mut g.1)
        } else {
            Vec::new()
        }
    });
    let mut result = Ok(());
    if rc == nccl::NCCL_IN_PROGRESS {
        // The group is launched from NCCL's thread: every communicator in it must be ready
        // before its events are recorded behind the work.
        let mut seen: Vec<*const Inner> = Vec::new();
        for (_, _, inner) in &pending {
            if !seen.contains(&Arc::as_ptr(inner)) {
                seen.push(Arc::as_ptr(inner));
                result = result.and(inner.rc("ncclGroupEnd", rc));
            }
        }
    } else if rc != 0 {
        result = Err(Error::Aborted {
            reason: format!("ncclGroupEnd: {}", n.describe(rc, std::ptr::null_mut())),
        });
    }
    for (ev, stream, _) in pending {
        ev.record(stream);
    }
    result
}

/// Issue `issue(i)` for `i in 0..count`, as one NCCL group when there are several (one thread
/// drives several GPUs), every one even after another fails; the first failure, or the group
/// end's, is returned. Raw group calls: used outside [`group`], with no events to arm.
fn issue_grouped(n: &Nccl, count: usize, mut issue: impl FnMut(usize) -> Result<()>) -> Result<()> {
    let grouped = count > 1;
    if grouped {
        // SAFETY: no arguments; paired below.
        unsafe { (n.group_start)() };
    }
    let mut issued = Ok(());
    for i in 0..count {
        issued = issued.and(issue(i));
    }
    if grouped {
        // SAFETY: paired with the start above.
        let rc = unsafe { (n.group_end)() };
        if rc != 0 && rc != nccl::NCCL_IN_PROGRESS {
            issued = issued.and(Err(Error::Aborted {
                reason: format!("ncclGroupEnd: {}", n.describe(rc, std::ptr::null_mut())),
            }));
        }
    }
    issued
}

/// A CUDA event taken from its communicator's pool, returned there when dropped.
struct Event {
    handle: usize,
    pool: Arc<EventPool>,
    /// Recorded behind its operation. Inside [`group`] that happens only when the group ends,
    /// and CUDA reports an event never recorded (or last recorded for an earlier operation) as
    /// complete.
    armed: AtomicBool,
    /// Seen complete while the communicator was not aborted: the result is the operation's,
    /// not what an abort left behind.
    finished: AtomicBool,
}

impl Event {
    fn record(&self, stream: CuStream) {
        // SAFETY: a live event and a stream of the same context.
        unsafe { (self.pool.cu.event_record)(self.handle as CuEvent, stream) };
        self.armed.store(true, Ordering::Release);
    }

    /// Whether the GPU has passed the event. After an abort this says nothing about the
    /// operation's result (aborted kernels return early): see [`Inner::settled`].
    fn done(&self) -> Result<bool> {
        if !self.armed.load(Ordering::Acquire) {
            return Ok(false);
        }
        self.pool.cu.event_done(self.handle as CuEvent)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(mut free) = self.pool.free.lock() {
            free.push(self.handle);
        }
    }
}

struct EventPool {
    cu: &'static Driver,
    free: Mutex<Vec<usize>>,
}

impl EventPool {
    fn take(self: &Arc<Self>) -> Result<Event> {
        let h = self.free.lock().ok().and_then(|mut f| f.pop());
        let handle = match h {
            Some(h) => h,
            None => self.cu.new_event(cuda::CU_EVENT_DISABLE_TIMING)? as usize,
        };
        Ok(Event {
            handle,
            pool: self.clone(),
            armed: AtomicBool::new(false),
            finished: AtomicBool::new(false),
        })
    }
}

impl Drop for EventPool {
    fn drop(&mut self) {
        for h in self.free.get_mut().map(std::mem::take).unwrap_or_default() {
            // SAFETY: every pooled event is live and unused.
            unsafe { (self.cu.event_destroy)(h as CuEvent) };
        }
    }
}

/// An operation in flight, as the watchdog sees it.
struct Outstanding {
    seq: u64,
    /// For collectives: how many collectives this rank has entered, this one included.
    cseq: Option<u64>,
    fp: Fingerprint,
    event: Arc<Event>,
    since: Instant,
}

/// Bookkeeping updated on every operation (under one uncontended lock).
struct OpState {
    /// Operations issued (collective and point-to-point).
    seq: u64,
    /// Collectives issued: the number ranks compare.
    cseq: u64,
    hash: u64,
    last: Option<Fingerprint>,
    outstanding: VecDeque<Outstanding>,
}

impl OpState {
    /// Retire finished operations in issue order, marking them finished (callers hold the abort
    /// lock, so no abort runs meanwhile); the oldest unfinished one.
    fn retire(&mut self) -> Option<watchdog::Head> {
        while let Some(front) = self.outstanding.front() {
            if !front.event.done().unwrap_or(false) {
                return Some(watchdog::Head {
                    seq: front.seq,
                    cseq: front.cseq,
                    fp: front.fp,
                    since: front.since,
                });
            }
            front.event.finished.store(true, Ordering::Release);
            self.outstanding.pop_front();
        }
        None
    }
}

/// State shared by the communicator's handles and its watchdog.
struct Inner {
    cu: &'static Driver,
    nccl: &'static Nccl,
    comm: usize,
    ctx: usize,
    stream: usize,
    device: usize,
    rank: usize,
    size: usize,
    id: String,
    host: Communicator,
    /// Host-communicator rank of every rank of this communicator, where known (children of a
    /// split without a store are not).
    host_of: Option<Vec<usize>>,
    /// The other processes' host-communicator ranks: the host's notice that one is gone fails
    /// this communicator.
    watched: Vec<usize>,
    store: Option<StoreClient>,
    multi: bool,
    /// Whether the watchdog runs (`ACCORD_GPU_WATCHDOG=0` turns it off, to measure its cost).
    watch: bool,
    state: Mutex<OpState>,
    events: Arc<EventPool>,
    poisoned: AtomicBool,
    poison: Mutex<Option<Error>>,
    /// Whether operations seen finished before the failure keep their results: not after a
    /// desync, which is found after mismatched calls may have finished with garbage.
    spares_finished: AtomicBool,
    aborted: AtomicBool,
    /// `ncclCommAbort` frees the communicator: the watchdog's queries hold this shared while
    /// they use it, and a failure holds it exclusively while it records itself and aborts, so
    /// neither runs during the other and nobody sees the failure before the abort is over.
    /// Operations are not covered: NCCL allows aborting from another thread to end one that
    /// blocks.
    abort_lock: std::sync::RwLock<()>,
    timeout: AtomicDuration,
    stop: AtomicBool,
    splits: AtomicU64,
    /// Scratch device word for barrier.
    scratch: u64,
}

// SAFETY: the raw handles (NCCL communicator, context, stream) are used from several threads
// only in ways NCCL and CUDA allow: operations are serialised by the caller (documented), the
// watchdog only queries events and the async error, and aborts.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

/// A communicator over GPU buffers, one device per rank (see the [module docs](self)).
///
/// Cheap to clone; clones share the NCCL communicator.
#[derive(Clone)]
pub struct GpuCommunicator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for GpuCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuCommunicator")
            .field("id", &self.inner.id)
            .field("rank", &self.inner.rank)
            .field("size", &self.inner.size)
            .field("device", &self.inner.device)
            .finish()
    }
}

/// Work enqueued on a stream; wait for it or poll it. Dropping it does not cancel anything.
pub struct GpuRequest {
    event: Arc<Event>,
    inner: Arc<Inner>,
    seq: u64,
}

impl std::fmt::Debug for GpuRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuRequest")
            .field("seq", &self.seq)
            .finish()
    }
}

impl GpuRequest {
    /// Block the host until the operation has finished on the GPU, or the communicator fails
    /// before it did (the watchdog enforces the timeout and watches the peers).
    pub fn wait(&self) -> Result<()> {
        let mut spins = 0u32;
        loop {
            if self.inner.settled(&self.event)? {
                return Ok(());
            }
            spins += 1;
            if spins < 2000 {
                std::hint::spin_loop();
            } else if spins < 4000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// `Ok(true)` if the operation has finished; an error if the communicator failed first.
    pub fn test(&self) -> Result<bool> {
        self.inner.settled(&self.event)
    }

    /// Make `stream` wait (on the GPU, not the host) until the operation has finished.
    pub fn stream_wait(&self, stream: Stream) -> Result<()> {
        let s = self.inner.stream_of(stream);
        // SAFETY: a live event and stream.
        let rc = unsafe { (self.inner.cu.stream_wait_event)(s, self.event.handle as CuEvent, 0) };
        self.inner.cu.check(rc, "cuStreamWaitEvent")
    }

    /// The operation's sequence number on its communicator.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

fn nccl_dtype(d: DataType) -> i32 {
    match d {
        DataType::I8 => 0,
        DataType::U8 => 1,
        DataType::I32 => 2,
        DataType::U32 => 3,
        DataType::I64 => 4,
        DataType::U64 => 5,
        DataType::F16 => 6,
        DataType::F32 => 7,
        DataType::F64 => 8,
        DataType::BF16 => 9,
    }
}

fn nccl_op(op: ReduceOp, dtype: DataType) -> Result<i32> {
    op.check(dtype)?;
    Ok(match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Avg => 4,
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
            return Err(Error::Unsupported(format!(
                "reduce op {op} is not available on GPU buffers (NCCL has no bitwise reductions); \
                 use sum/prod/min/max/avg, or reduce on the host"
            )))
        }
    })
}

/// Whether alltoall(v) moves a rank's own block with `cuMemcpyDtoDAsync` before the NCCL kernel
/// (`ACCORD_GPU_ALLTOALL_SELF=copy`) instead of as a send/receive to itself inside the NCCL
/// group (the default). The copy runs serially ahead of the kernel on the same stream, so it
/// adds its whole duration; inside the group NCCL overlaps it with the transfers to the peers.
fn self_block_by_copy() -> bool {
    static COPY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *COPY.get_or_init(|| {
        std::env::var("ACCORD_GPU_ALLTOALL_SELF").is_ok_and(|v| v.eq_ignore_ascii_case("copy"))
    })
}

fn same_dtype(a: &DeviceSlice, b: &DeviceSlice) -> Result<()> {
    if a.dtype != b.dtype {
        return Err(Error::invalid(format!(
            "send buffer is {} but receive buffer is {}",
            a.dtype, b.dtype
        )));
    }
    Ok(())
}

fn need(what: &str, buf: &DeviceSlice, want: usize) -> Result<()> {
    if buf.count < want {
        return Err(Error::invalid(format!(
            "{what} holds {} elements but {want} are needed",
            buf.count
        )));
    }
    Ok(())
}

/// Exchange NCCL versions (or load failures) over the host communicator; all ranks agree on the
/// outcome, so none is left waiting in NCCL initialisation for a rank that gave up.
fn agreed_nccl(host: &Communicator, per_rank: usize) -> Result<&'static Nccl> {
    let local = cuda::driver().and_then(|_| nccl::nccl());
    let mine: i64 = match &local {
        Ok(n) => n.version as i64,
        Err(_) => -1,
    };
    let mut all = vec![0i64; host.size() * 2];
    host.all_gather(&[mine, per_rank as i64], &mut all)?;
    let n = local?;
    let failed: Vec<usize> = (0..host.size()).filter(|r| all[2 * r] < 0).collect();
    if !failed.is_empty() {
        return Err(Error::Unsupported(format!(
            "rank(s) {failed:?} could not load CUDA or NCCL; see their logs"
        )));
    }
    if (0..host.size()).any(|r| all[2 * r] != mine) {
        let list: Vec<String> = (0..host.size())
            .map(|r| format!("rank {r}: {}", nccl::version_string(all[2 * r] as i32)))
            .collect();
        return Err(Error::Unsupported(format!(
            "NCCL versions differ between ranks ({}); every rank must load the same NCCL \
             (this rank loaded {} from {}; ACCORD_NCCL_LIBRARY selects one)",
            list.join(", "),
            n.version_string(),
            n.path
        )));
    }
    if (0..host.size()).any(|r| all[2 * r + 1] != per_rank as i64) {
        let list: Vec<String> = (0..host.size())
            .map(|r| format!("rank {r}: {}", all[2 * r + 1]))
            .collect();
        return Err(Error::invalid(format!(
            "every process must drive the same number of GPUs ({})",
            list.join(", ")
        )));
    }
    Ok(n)
}

/// A fresh `ncclUniqueId`, for [`GpuCommunicator::with_unique_id`] (which this process must then
/// share with the others itself). [`GpuCommunicator::new`] does all of this over the host.
pub fn unique_id() -> Result<NcclUniqueId> {
    cuda::driver()?;
    let n = nccl::nccl()?;
    let mut uid = NcclUniqueId { internal: [0; 128] };
    // SAFETY: writes 128 bytes.
    let rc = unsafe { (n.get_unique_id)(&mut uid) };
    if rc != 0 {
        return Err(Error::Aborted {
            reason: format!("ncclGetUniqueId: {}", n.describe(rc, std::ptr::null_mut())),
        });
    }
    Ok(uid)
}

/// Wait until a nonblocking call on `comm` has finished: `Ok` once `ncclCommGetAsyncError` leaves
/// `ncclInProgress`, `Err(Some(rc))` if it failed, `Err(None)` at the deadline. Yields first
/// (enqueueing finishes within microseconds), then sleeps (initialisation takes milliseconds).
fn settle(n: &Nccl, comm: NcclComm, deadline: Instant) -> std::result::Result<(), Option<i32>> {
    let mut polls = 0u32;
    loop {
        let mut rc = 0;
        // SAFETY: a communicator NCCL handed out and nobody destroyed.
        let call = unsafe { (n.comm_get_async_error)(comm, &mut rc) };
        if call != 0 {
            return Err(Some(call));
        }
        match rc {
            0 => return Ok(()),
            nccl::NCCL_IN_PROGRESS => {}
            e => return Err(Some(e)),
        }
        if Instant::now() >= deadline {
            return Err(None);
        }
        polls += 1;
        if polls < 200 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

/// The error for an NCCL initialisation that did not finish in time, naming the ranks (NCCL
/// ranks: `k` per process) that never started it, from their processes' marks in the store.
fn join_timeout(host: &Communicator, store: Option<&StoreClient>, id: &str, k: usize) -> Error {
    let missing: Vec<usize> = match store {
        Some(s) => (0..host.size())
            .filter(|r| !matches!(s.try_get(&format!("joining/{r}")), Ok(Some(_))))
            .flat_map(|r| r * k..(r + 1) * k)
            .collect(),
        None => Vec::new(),
    };
    let (waiting_for, hint) = if missing.is_empty() {
        let me = host.rank() * k..(host.rank() + 1) * k;
        let others = (0..host.size() * k).filter(|r| !me.contains(r)).collect();
        let hint = "; every rank started NCCL initialisation, so it is stuck inside NCCL \
                    (network, or a rank that died after starting; NCCL_DEBUG=INFO tells more)";
        (others, hint.to_string())
    } else {
        (
            missing,
            "; they never started NCCL initialisation".to_string(),
        )
    };
    Error::Timeout {
        op: "NCCL initialisation".into(),
        seq: 0,
        comm: format!("gpu/{id}"),
        waiting_for,
        after: host.timeout(),
        hint,
    }
}

/// Blocking twins of ready nonblocking communicators (`parents[i]`: the communicator, its
/// context, this rank's key), through one `ncclCommSplit` each (as one NCCL group when several),
/// waited on up to `timeout`. Operations on a nonblocking communicator cost ~100 us each, on a
/// blocking one a few: only initialisation needs the deadline.
///
/// On success the caller retires the parents. On failure the parents and any children are
/// aborted here, in that order: with a nonblocking parent NCCL writes the child handle from its
/// own thread when the split finishes, and aborting the parent waits for that thread, so only
/// then may the slots be read (and freed).
fn blocking_twins(
    n: &Nccl,
    cu: &Driver,
    parents: &[(NcclComm, CuContext, i32)],
    timeout: Duration,
) -> std::result::Result<Vec<NcclComm>, String> {
    let mut news: Vec<NcclComm> = vec![std::ptr::null_mut(); parents.len()];
    let outs = news.as_mut_ptr();
    let mut issued = issue_grouped(n, parents.len(), |i| {
        let (parent, ctx, key) = parents[i];
        cu.make_current(ctx)?;
        let mut cfg = nccl::NcclConfig::new(true);
        // SAFETY: a live communicator; the config outlives the call; slot `i` of `news` stays
        // valid until NCCL's thread is done with it (`news` lives to the end of this function,
        // and on failure the parents are aborted, which waits for that thread, before it is
        // dropped).
        let rc = unsafe { (n.comm_split)(parent, 0, key, outs.add(i), &mut cfg) };
        if rc != 0 && rc != nccl::NCCL_IN_PROGRESS {
            return Err(Error::Aborted {
                reason: n.describe(rc, parent),
            });
        }
        Ok(())
    })
    .map_err(|e| match e {
        Error::Aborted { reason } => reason,
        e => e.to_string(),
    });
    let deadline = Instant::now() + timeout;
    let slot = |i: usize| {
        // SAFETY: an element of `news`; NCCL's thread wrote it before the parent settled.
        unsafe { std::ptr::read_volatile(&news[i]) }
    };
    let why = |comm: NcclComm, rc: Option<i32>| match rc {
        Some(rc) => n.describe(rc, comm),
        None => format!(
            "did not finish within {timeout:?} (a rank did not take part, or NCCL is stuck; \
             NCCL_DEBUG=INFO tells more)"
        ),
    };
    // The parents first: their settling is the split's completion.
    for &(parent, _, _) in parents {
        if issued.is_ok() {
            issued = settle(n, parent, deadline).map_err(|rc| why(parent, rc));
        }
    }
    for i in 0..parents.len() {
        let child = slot(i);
        if issued.is_ok() && child.is_null() {
            issued = Err("NCCL returned no communicator".into());
        }
        if issued.is_ok() {
            issued = settle(n, child, deadline).map_err(|rc| why(child, rc));
        }
    }
    match issued {
        Ok(()) => Ok((0..parents.len()).map(slot).collect()),
        Err(why) => {
            let ps: Vec<NcclComm> = parents.iter().map(|p| p.0).collect();
            abort_all(n, &ps);
            let children: Vec<NcclComm> = (0..parents.len()).map(slot).collect();
            abort_all(n, &children);
            Err(why)
        }
    }
}

fn abort_all(n: &Nccl, comms: &[NcclComm]) {
    for &c in comms.iter().filter(|c| !c.is_null()) {
        // SAFETY: communicators NCCL handed out and nobody else uses; abort stops their threads.
        unsafe { (n.comm_abort)(c) };
    }
}

/// Free communicators that are no longer needed: finalize them all (one may wait for the
/// others, e.g. the GPUs of one process), wait up to `timeout`, then destroy; abort whatever
/// does not finalize in time.
fn retire(n: &Nccl, comms: &[NcclComm], timeout: Duration) {
    let live: Vec<NcclComm> = comms.iter().copied().filter(|c| !c.is_null()).collect();
    // SAFETY: live communicators with no work left, each destroyed or aborted exactly once.
    let started: Vec<bool> = live
        .iter()
        .map(|&c| matches!(unsafe { (n.comm_finalize)(c) }, 0 | nccl::NCCL_IN_PROGRESS))
        .collect();
    let deadline = Instant::now() + timeout;
    for (&c, ok) in live.iter().zip(started) {
        // SAFETY: as above.
        unsafe {
            if ok && settle(n, c, deadline).is_ok() {
                (n.comm_destroy)(c);
            } else {
                (n.comm_abort)(c);
            }
        }
    }
}

/// A rank's `"color key"` as posted for a split.
fn parse_choice(v: &[u8]) -> Option<(i32, i32)> {
    let text = std::str::from_utf8(v).ok()?;
    let (col, key) = text.split_once(' ')?;
    Some((col.parse().ok()?, key.parse().ok()?))
}

/// The host-communicator rank of each rank of the split's child of color `col`, in the child's
/// rank order (NCCL orders by key, then by parent rank), from the parent's map and every parent
/// rank's (color, key).
fn child_host_of(
    parent: Option<&[usize]>,
    choices: Option<&[(i32, i32)]>,
    col: i32,
) -> Option<Vec<usize>> {
    let (parent, choices) = (parent?, choices?);
    let mut members: Vec<usize> = (0..choices.len())
        .filter(|&r| choices[r].0 == col)
        .collect();
    members.sort_by_key(|&r| (choices[r].1, r));
    members.iter().map(|&r| parent.get(r).copied()).collect()
}

fn id_of(uid: &NcclUniqueId) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in uid.internal {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

impl GpuCommunicator {
    /// A communicator over device `device` (ordinal in this process's visible devices) for
    /// every rank of `host`. Collective over `host`.
    pub fn new(host: &Communicator, device: usize) -> Result<GpuCommunicator> {
        let mut v = Self::create(host, &[device])?;
        Ok(v.remove(0))
    }

    /// One communicator per device in `devices` (every process must pass the same number);
    /// NCCL rank of device `i` is `host.rank() * devices.len() + i`. Drive them with [`group`].
    pub fn new_multi(host: &Communicator, devices: &[usize]) -> Result<Vec<GpuCommunicator>> {
        if devices.is_empty() {
            return Err(Error::invalid("new_multi needs at least one device"));
        }
        Self::create(host, devices)
    }

    /// Join the NCCL communicator of an id this process got some other way (see [`unique_id`]):
    /// every rank of `host` calls it with the same id. Unlike [`GpuCommunicator::new`] it makes
    /// no collective call on `host` first, so NCCL versions are not compared.
    pub fn with_unique_id(
        host: &Communicator,
        uid: &NcclUniqueId,
        devices: &[usize],
    ) -> Result<Vec<GpuCommunicator>> {
        if devices.is_empty() {
            return Err(Error::invalid("with_unique_id needs at least one device"));
        }
        cuda::driver()?;
        Self::join(host, nccl::nccl()?, uid, devices)
    }

    fn create(host: &Communicator, devices: &[usize]) -> Result<Vec<GpuCommunicator>> {
        let n = agreed_nccl(host, devices.len())?;
        let mut uid = NcclUniqueId { internal: [0; 128] };
        if host.rank() == 0 {
            match unique_id() {
                Ok(u) => uid = u,
                // Still broadcast (zeros) so the others do not wait; they fail below.
                Err(e) => tracing::error!("{e}"),
            }
        }
        host.broadcast(&mut uid.internal, 0)?;
        if uid.internal.iter().all(|&b| b == 0) {
            return Err(Error::Aborted {
                reason: "rank 0 could not create an NCCL unique id (see its log)".into(),
            });
        }
        Self::join(host, n, &uid, devices)
    }

    /// `ncclCommInitRankConfig` in nonblocking mode, then wait for it under the host's timeout:
    /// a rank that never joins costs a clear error, not a hang. Each rank marks in the store
    /// that it started, so the error can say who is missing.
    fn join(
        host: &Communicator,
        n: &'static Nccl,
        uid: &NcclUniqueId,
        devices: &[usize],
    ) -> Result<Vec<GpuCommunicator>> {
        not_in_group("creating a GPU communicator")?;
        let cu = cuda::driver()?;
        let ctxs: Vec<CuContext> = devices
            .iter()
            .map(|&d| cu.primary_context(d))
            .collect::<Result<_>>()?;
        let id = id_of(uid);
        let store = host.store().map(|s| s.with_prefix(&format!("gpu/{id}")));
        if let Some(s) = &store {
            // Best effort: only used to name the missing ranks on a timeout.
            let _ = s.set(&format!("joining/{}", host.rank()), "1");
        }
        let k = devices.len();
        let nranks = host.size() * k;
        // Escape hatch: NCCL's plain blocking init, without a deadline.
        let blocking = std::env::var("ACCORD_NCCL_INIT").is_ok_and(|v| v == "blocking");
        let mut comms: Vec<NcclComm> = vec![std::ptr::null_mut(); k];
        let mut outcome = issue_grouped(n, k, |i| {
            cu.make_current(ctxs[i])?;
            let mut cfg = nccl::NcclConfig::new(blocking);
            let out = &mut comms[i];
            // SAFETY: `out` is a valid out-pointer; the id is the one all ranks share; the
            // config outlives the call.
            let rc = unsafe {
                (n.comm_init_rank_config)(
                    out,
                    nranks as i32,
                    *uid,
                    (host.rank() * k + i) as i32,
                    &mut cfg,
                )
            };
            if rc != 0 && rc != nccl::NCCL_IN_PROGRESS {
                return Err(Error::Aborted {
                    reason: format!("ncclCommInitRankConfig: {}", n.describe(rc, *out)),
                });
            }
            Ok(())
        });
        let deadline = Instant::now() + host.timeout();
        for (i, &c) in comms.iter().enumerate() {
            if outcome.is_err() || c.is_null() {
                break;
            }
            outcome = match settle(n, c, deadline) {
                Ok(()) => Ok(()),
                Err(Some(rc)) => Err(Error::Aborted {
                    reason: format!(
                        "NCCL initialisation on rank {} (GPU {}): {}",
                        host.rank() * k + i,
                        devices[i],
                        n.describe(rc, c)
                    ),
                }),
                Err(None) => Err(join_timeout(host, store.as_ref(), &id, k)),
            };
        }
        if let Err(e) = outcome {
            abort_all(n, &comms);
            return Err(e);
        }
        // Every rank is in: trade the nonblocking communicators for blocking twins.
        let comms = if blocking {
            comms
        } else {
            let parents: Vec<_> = (0..k)
                .map(|i| (comms[i], ctxs[i], (host.rank() * k + i) as i32))
                .collect();
            let twins =
                blocking_twins(n, cu, &parents, host.timeout()).map_err(|why| Error::Aborted {
                    reason: format!("NCCL initialisation on rank {}: {why}", host.rank()),
                })?;
            retire(n, &comms, host.timeout());
            twins
        };
        let mut out = Vec::with_capacity(k);
        for (i, &comm) in comms.iter().enumerate() {
            let g = Self::wrap(
                host,
                n,
                cu,
                comm,
                ctxs[i],
                devices[i],
                host.rank() * k + i,
                nranks,
                id.clone(),
                k > 1,
                Some((0..nranks).map(|r| r / k).collect()),
            );
            match g {
                Ok(g) => out.push(g),
                Err(e) => {
                    // The wrapped ones abort or destroy theirs when dropped.
                    abort_all(n, &comms[i..]);
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn wrap(
        host: &Communicator,
        n: &'static Nccl,
        cu: &'static Driver,
        comm: NcclComm,
        ctx: CuContext,
        device: usize,
        rank: usize,
        size: usize,
        id: String,
        multi: bool,
        host_of: Option<Vec<usize>>,
    ) -> Result<GpuCommunicator> {
        cu.make_current(ctx)?;
        let me = host.rank();
        // A map that does not place this rank on this process is not to be trusted.
        let host_of = host_of.filter(|m| m.len() == size && m.get(rank) == Some(&me));
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
        let inner = Arc::new(Inner {
            cu,
            nccl: n,
            comm: comm as usize,
            ctx: ctx as usize,
            stream: stream as usize,
            device,
            rank,
            size,
            store: host.store().map(|s| s.with_prefix(&format!("gpu/{id}"))),
            id,
            host: host.clone(),
            host_of,
            watched,
            multi,
            watch: std::env::var("ACCORD_GPU_WATCHDOG").map_or(true, |v| v != "0"),
            state: Mutex::new(OpState {
                seq: 0,
                cseq: 0,
                hash: 0,
                last: None,
                outstanding: VecDeque::new(),
            }),
            events: Arc::new(EventPool {
                cu,
                free: Mutex::new(Vec::new()),
            }),
            poisoned: AtomicBool::new(false),
            poison: Mutex::new(None),
            spares_finished: AtomicBool::new(true),
            aborted: AtomicBool::new(false),
            abort_lock: std::sync::RwLock::new(()),
            timeout: AtomicDuration::new(host.timeout()),
            stop: AtomicBool::new(false),
            splits: AtomicU64::new(0),
            scratch,
        });
        if inner.watch {
            watchdog::start(&inner);
        }
        Ok(GpuCommunicator { inner })
    }

    /// This rank (NCCL rank).
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks (NCCL ranks: processes x GPUs per process).
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// On one rank an average is the sum (divided by one). NCCL 2.28 left the last element of a
    /// one-rank f64 average of 65,537 elements unwritten (seen on an H100: it kept what the
    /// buffer held), so the sum it computes correctly is asked for instead.
    fn one_rank_op(&self, op: ReduceOp) -> ReduceOp {
        if self.size() == 1 && op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        }
    }

    /// The device ordinal this communicator works on.
    pub fn device(&self) -> usize {
        self.inner.device
    }

    /// The communicator's id (shared by all ranks; names its keys in the store).
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The loaded NCCL's version, e.g. `2.28.9`, and where it came from.
    pub fn nccl_version(&self) -> (String, String) {
        (
            self.inner.nccl.version_string(),
            self.inner.nccl.path.clone(),
        )
    }

    /// The communicator's own stream as a raw `CUstream`.
    pub fn stream(&self) -> usize {
        self.inner.stream
    }

    /// The raw `ncclComm_t` (for interoperation; do not destroy it).
    pub fn raw_comm(&self) -> usize {
        self.inner.comm
    }

    /// Deadline for any one operation (enforced by the watchdog).
    pub fn timeout(&self) -> Duration {
        self.inner.timeout.get()
    }

    /// Change the deadline.
    pub fn set_timeout(&self, t: Duration) {
        self.inner.timeout.set(t);
    }

    /// The error that failed this communicator, if any.
    pub fn poisoned(&self) -> Option<Error> {
        self.inner.poison()
    }

    /// Abort: stop NCCL's kernels and fail every pending and later operation with `reason`.
    pub fn abort(&self, reason: &str) {
        self.inner.fail(Error::Aborted {
            reason: reason.to_string(),
        });
    }

    /// Block until every operation issued so far has finished; the communicator's failure if
    /// one of them did not finish before it (or, after a desync, finished with mismatched
    /// calls). A failure after they all finished (a peer that exited since) shows at the next
    /// call instead.
    pub fn synchronize(&self) -> Result<()> {
        let last = {
            let st = self.inner.state.lock().expect("gpu op state");
            st.outstanding.back().map(|o| (o.event.clone(), o.seq))
        };
        match last {
            Some((event, seq)) => GpuRequest {
                event,
                inner: self.inner.clone(),
                seq,
            }
            .wait(),
            None => match self.inner.poison() {
                Some(e) if !self.inner.spares_finished.load(Ordering::Acquire) => Err(e),
                _ => Ok(()),
            },
        }
    }

    // -----------------------------------------------------------------------------------------
    // The operation path.

    fn launch(
        &self,
        fp: Fingerprint,
        stream: Stream,
        f: impl FnOnce(&Nccl, NcclComm, CuStream) -> Result<()>,
    ) -> Result<GpuRequest> {
        self.launch_as(fp, true, stream, f)
    }

    fn launch_as(
        &self,
        fp: Fingerprint,
        collective: bool,
        stream: Stream,
        f: impl FnOnce(&Nccl, NcclComm, CuStream) -> Result<()>,
    ) -> Result<GpuRequest> {
        let inner = &self.inner;
        if inner.poisoned.load(Ordering::Acquire) {
            if let Some(e) = inner.poison() {
                return Err(e);
            }
        }
        inner.cu.make_current(inner.ctx as CuContext)?;
        let s = inner.stream_of(stream);
        let event = Arc::new(inner.events.take()?);
        let (seq, cseq) = {
            let mut st = inner.state.lock().expect("gpu op state");
            st.seq += 1;
            if collective {
                st.cseq += 1;
                st.hash = mix(st.hash, &fp);
                st.last = Some(fp);
            }
            (st.seq, st.cseq)
        };
        f(inner.nccl, inner.comm as NcclComm, s)?;
        let in_group = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.0 > 0 {
                g.1.push((event.clone(), s, inner.clone()));
                true
            } else {
                false
            }
        });
        if !in_group {
            event.record(s);
        }
        let mut st = inner.state.lock().expect("gpu op state");
        if !inner.watch {
            // Nobody retires finished operations: keep only the newest (for synchronize).
            st.outstanding.clear();
        }
        st.outstanding.push_back(Outstanding {
            seq,
            cseq: collective.then_some(cseq),
            fp,
            event: event.clone(),
            since: Instant::now(),
        });
        Ok(GpuRequest {
            event,
            inner: inner.clone(),
            seq,
        })
    }

    /// allreduce: `recv[i] = op over ranks of send[i]`; `send` and `recv` may be the same.
    pub fn all_reduce(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        op: ReduceOp,
        stream: Stream,
    ) -> Result<GpuRequest> {
        same_dtype(&send, &recv)?;
        need("receive buffer", &recv, send.count)?;
        let o = nccl_op(self.one_rank_op(op), send.dtype)?;
        let fp = Fingerprint::new(OpKind::AllReduce, send.dtype, send.count).with_op(op);
        self.launch(fp, stream, |n, c, s| {
            // SAFETY: buffers validated above; the caller keeps them alive (DeviceSlice contract).
            self.inner.rc("allreduce", unsafe {
                (n.all_reduce)(
                    send.as_ptr(),
                    recv.as_mut_ptr(),
                    send.count,
                    nccl_dtype(send.dtype),
                    o,
                    c,
                    s,
                )
            })
        })
    }

    /// broadcast `send` of `root` into every rank's `recv` (`send` is read on the root only;
    /// pass the same slice twice for in place).
    pub fn broadcast(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        root: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        self.check_root(root)?;
        same_dtype(&send, &recv)?;
        if self.rank() == root {
            need("receive buffer", &recv, send.count)?;
        }
        let count = recv.count;
        let fp = Fingerprint::new(OpKind::Broadcast, recv.dtype, count).with_root(root);
        self.launch(fp, stream, |n, c, s| {
            // SAFETY: as for all_reduce.
            self.inner.rc("broadcast", unsafe {
                (n.broadcast)(
                    send.as_ptr(),
                    recv.as_mut_ptr(),
                    count,
                    nccl_dtype(recv.dtype),
                    root as i32,
                    c,
                    s,
                )
            })
        })
    }

    /// reduce into `recv` on `root` (`recv` is ignored elsewhere).
    pub fn reduce(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        op: ReduceOp,
        root: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        self.check_root(root)?;
        same_dtype(&send, &recv)?;
        if self.rank() == root {
            need("receive buffer", &recv, send.count)?;
        }
        let o = nccl_op(self.one_rank_op(op), send.dtype)?;
        let fp = Fingerprint::new(OpKind::Reduce, send.dtype, send.count)
            .with_op(op)
            .with_root(root);
        self.launch(fp, stream, |n, c, s| {
            // SAFETY: as for all_reduce.
            self.inner.rc("reduce", unsafe {
                (n.reduce)(
                    send.as_ptr(),
                    recv.as_mut_ptr(),
                    send.count,
                    nccl_dtype(send.dtype),
                    o,
                    root as i32,
                    c,
                    s,
                )
            })
        })
    }

    /// allgather: `recv` (size x `send.count`) holds every rank's `send` in rank order.
    pub fn all_gather(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        stream: Stream,
    ) -> Result<GpuRequest> {
        same_dtype(&send, &recv)?;
        need("receive buffer", &recv, send.count * self.size())?;
        let fp = Fingerprint::new(OpKind::AllGather, send.dtype, send.count);
        self.launch(fp, stream, |n, c, s| {
            // SAFETY: as for all_reduce.
            self.inner.rc("allgather", unsafe {
                (n.all_gather)(
                    send.as_ptr(),
                    recv.as_mut_ptr(),
                    send.count,
                    nccl_dtype(send.dtype),
                    c,
                    s,
                )
            })
        })
    }

    /// allgatherv: rank r contributes `counts[r]` elements; `recv` holds them back to back.
    pub fn all_gather_v(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        counts: &[usize],
        stream: Stream,
    ) -> Result<GpuRequest> {
        same_dtype(&send, &recv)?;
        self.check_counts("counts", counts)?;
        need("send buffer", &send, counts[self.rank()])?;
        need("receive buffer", &recv, counts.iter().sum())?;
        let fp = Fingerprint::new(OpKind::AllGatherV, send.dtype, 0).with_counts(counts);
        let me = self.rank();
        self.launch(fp, stream, |n, c, s| {
            let dt = nccl_dtype(send.dtype);
            self.grouped(n, |inner| {
                let mut off = 0;
                for (r, &cnt) in counts.iter().enumerate() {
                    let dst = recv.sub(off, cnt)?;
                    let src = if r == me { send.as_ptr() } else { dst.as_ptr() };
                    // SAFETY: ranges checked by `sub`.
                    inner.rc("allgatherv", unsafe {
                        (n.broadcast)(src, dst.as_mut_ptr(), cnt, dt, r as i32, c, s)
                    })?;
                    off += cnt;
                }
                Ok(())
            })
        })
    }

    /// gather: `recv` on `root` holds size x `send.count` elements in rank order.
    pub fn gather(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        root: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        let counts = vec![send.count; self.size()];
        self.rooted_exchange(OpKind::Gather, recv, send, &counts, root, stream)
    }

    /// gatherv: rank r sends `counts[r]` elements; `recv` on `root` holds them back to back.
    pub fn gather_v(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        counts: &[usize],
        root: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        self.rooted_exchange(OpKind::GatherV, recv, send, counts, root, stream)
    }

    /// scatter: rank r receives elements `r*recv.count ..` of `send` on `root`.
    pub fn scatter(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        root: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        let counts = vec![recv.count; self.size()];
        self.rooted_exchange(OpKind::Scatter, send, recv, &counts, root, stream)
    }

    /// scatterv: rank r receives `counts[r]` elements, taken back to back from `send` on `root`.
    pub fn scatter_v(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        counts: &[usize],
        root: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        self.rooted_exchange(OpKind::ScatterV, send, recv, counts, root, stream)
    }

    /// Gather (blocks flow to the root) and scatter (blocks flow from it) as grouped
    /// send/recv: `whole` is the root's buffer of every block back to back, `mine` this rank's
    /// block of `counts[rank]` elements.
    fn rooted_exchange(
        &self,
        kind: OpKind,
        whole: DeviceSlice,
        mine: DeviceSlice,
        counts: &[usize],
        root: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        let to_root = matches!(kind, OpKind::Gather | OpKind::GatherV);
        let (mine_name, whole_name) = if to_root {
            ("send buffer", "receive buffer")
        } else {
            ("receive buffer", "send buffer")
        };
        self.check_root(root)?;
        same_dtype(&whole, &mine)?;
        self.check_counts("counts", counts)?;
        let me = self.rank();
        need(mine_name, &mine, counts[me])?;
        if me == root {
            need(whole_name, &whole, counts.iter().sum())?;
        }
        let fp = match kind {
            OpKind::GatherV | OpKind::ScatterV => Fingerprint::new(kind, mine.dtype, 0),
            _ => Fingerprint::new(kind, mine.dtype, mine.count),
        }
        .with_root(root);
        let what = kind.name();
        self.launch(fp, stream, |n, c, s| {
            let dt = nccl_dtype(mine.dtype);
            self.grouped(n, |inner| {
                if me != root {
                    // SAFETY: length checked above.
                    return inner.rc(what, unsafe {
                        if to_root {
                            (n.send)(mine.as_ptr(), counts[me], dt, root as i32, c, s)
                        } else {
                            (n.recv)(mine.as_mut_ptr(), counts[me], dt, root as i32, c, s)
                        }
                    });
                }
                let mut off = 0;
                for (r, &cnt) in counts.iter().enumerate() {
                    let block = whole.sub(off, cnt)?;
                    if r == me {
                        let (src, dst) = if to_root {
                            (mine, block)
                        } else {
                            (block, mine)
                        };
                        inner.copy(src, dst, s)?;
                    } else {
                        // SAFETY: range checked by `sub`.
                        inner.rc(what, unsafe {
                            if to_root {
                                (n.recv)(block.as_mut_ptr(), cnt, dt, r as i32, c, s)
                            } else {
                                (n.send)(block.as_ptr(), cnt, dt, r as i32, c, s)
                            }
                        })?;
                    }
                    off += cnt;
                }
                Ok(())
            })
        })
    }

    /// reduce_scatter: `recv` (count c) gets block `rank` of the reduction of every rank's
    /// `send` (size x c).
    pub fn reduce_scatter(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        op: ReduceOp,
        stream: Stream,
    ) -> Result<GpuRequest> {
        same_dtype(&send, &recv)?;
        need("send buffer", &send, recv.count * self.size())?;
        let o = nccl_op(self.one_rank_op(op), send.dtype)?;
        let fp = Fingerprint::new(OpKind::ReduceScatter, recv.dtype, recv.count).with_op(op);
        self.launch(fp, stream, |n, c, s| {
            // SAFETY: as for all_reduce.
            self.inner.rc("reduce_scatter", unsafe {
                (n.reduce_scatter)(
                    send.as_ptr(),
                    recv.as_mut_ptr(),
                    recv.count,
                    nccl_dtype(send.dtype),
                    o,
                    c,
                    s,
                )
            })
        })
    }

    /// reduce_scatterv: rank r gets `counts[r]` elements: its block of the reduction of every
    /// rank's `send` (sum(counts) elements, blocks back to back).
    pub fn reduce_scatter_v(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        counts: &[usize],
        op: ReduceOp,
        stream: Stream,
    ) -> Result<GpuRequest> {
        same_dtype(&send, &recv)?;
        self.check_counts("counts", counts)?;
        need("send buffer", &send, counts.iter().sum())?;
        need("receive buffer", &recv, counts[self.rank()])?;
        let o = nccl_op(self.one_rank_op(op), send.dtype)?;
        let fp = Fingerprint::new(OpKind::ReduceScatterV, send.dtype, 0)
            .with_op(op)
            .with_counts(counts);
        let me = self.rank();
        self.launch(fp, stream, |n, c, s| {
            let dt = nccl_dtype(send.dtype);
            self.grouped(n, |inner| {
                let mut off = 0;
                for (r, &cnt) in counts.iter().enumerate() {
                    let src = send.sub(off, cnt)?;
                    let dst = if r == me {
                        recv.as_mut_ptr()
                    } else {
                        std::ptr::null_mut()
                    };
                    // SAFETY: range checked by `sub`; `dst` only used on the root `r`.
                    inner.rc("reduce_scatterv", unsafe {
                        (n.reduce)(src.as_ptr(), dst, cnt, dt, o, r as i32, c, s)
                    })?;
                    off += cnt;
                }
                Ok(())
            })
        })
    }

    /// alltoall: block r (of `send.count / size` elements) of `send` goes to rank r; `recv`
    /// gets the blocks in rank order.
    pub fn all_to_all(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        stream: Stream,
    ) -> Result<GpuRequest> {
        let n = self.size();
        if (send.count / n) * n != send.count {
            return Err(Error::invalid(format!(
                "alltoall send buffer of {} elements does not split into {n} equal blocks",
                send.count
            )));
        }
        let counts = vec![send.count / n; n];
        self.all_to_all_impl(send, &counts, recv, &counts, stream, false)
    }

    /// alltoallv: `send_counts[r]` elements go to rank r (blocks back to back in `send`);
    /// `recv_counts[r]` arrive from rank r.
    pub fn all_to_all_v(
        &self,
        send: DeviceSlice,
        send_counts: &[usize],
        recv: DeviceSlice,
        recv_counts: &[usize],
        stream: Stream,
    ) -> Result<GpuRequest> {
        self.all_to_all_impl(send, send_counts, recv, recv_counts, stream, true)
    }

    fn all_to_all_impl(
        &self,
        send: DeviceSlice,
        send_counts: &[usize],
        recv: DeviceSlice,
        recv_counts: &[usize],
        stream: Stream,
        v: bool,
    ) -> Result<GpuRequest> {
        same_dtype(&send, &recv)?;
        self.check_counts("send_counts", send_counts)?;
        self.check_counts("recv_counts", recv_counts)?;
        need("send buffer", &send, send_counts.iter().sum())?;
        need("receive buffer", &recv, recv_counts.iter().sum())?;
        let fp = if v {
            Fingerprint::new(OpKind::AllToAllV, send.dtype, 0)
        } else {
            Fingerprint::new(OpKind::AllToAll, send.dtype, send_counts[0])
        };
        let me = self.rank();
        self.launch(fp, stream, |n, c, s| {
            let dt = nccl_dtype(send.dtype);
            self.grouped(n, |inner| {
                let (mut so, mut ro) = (0, 0);
                for r in 0..send_counts.len() {
                    let src = send.sub(so, send_counts[r])?;
                    let dst = recv.sub(ro, recv_counts[r])?;
                    so += send_counts[r];
                    ro += recv_counts[r];
                    if r == me {
                        if src.count != dst.count {
                            return Err(Error::invalid(format!(
                                "alltoallv: rank {me} sends itself {} elements but expects {}",
                                src.count, dst.count
                            )));
                        }
                        if self_block_by_copy() {
                            inner.copy(src, dst, s)?;
                            continue;
                        }
                    }
                    // Peers and (by default) this rank itself: NCCL pairs the send to self with
                    // the receive from self inside the group.
                    // SAFETY: ranges checked by `sub`.
                    unsafe {
                        inner.rc(
                            "alltoall",
                            (n.send)(src.as_ptr(), src.count, dt, r as i32, c, s),
                        )?;
                        inner.rc(
                            "alltoall",
                            (n.recv)(dst.as_mut_ptr(), dst.count, dt, r as i32, c, s),
                        )?;
                    }
                }
                Ok(())
            })
        })
    }

    /// Send `buf` to `peer` (matched by the peer's [`GpuCommunicator::recv`], in call order;
    /// NCCL has no tags).
    pub fn send(&self, buf: DeviceSlice, peer: usize, stream: Stream) -> Result<GpuRequest> {
        self.check_root(peer)?;
        let fp = Fingerprint::new(OpKind::P2p, buf.dtype, buf.count);
        self.launch_p2p(fp, stream, |n, c, s| {
            // SAFETY: DeviceSlice contract.
            self.inner.rc("send", unsafe {
                (n.send)(
                    buf.as_ptr(),
                    buf.count,
                    nccl_dtype(buf.dtype),
                    peer as i32,
                    c,
                    s,
                )
            })
        })
    }

    /// Receive `buf.count` elements from `peer`.
    pub fn recv(&self, buf: DeviceSlice, peer: usize, stream: Stream) -> Result<GpuRequest> {
        self.check_root(peer)?;
        let fp = Fingerprint::new(OpKind::P2p, buf.dtype, buf.count);
        self.launch_p2p(fp, stream, |n, c, s| {
            // SAFETY: DeviceSlice contract.
            self.inner.rc("recv", unsafe {
                (n.recv)(
                    buf.as_mut_ptr(),
                    buf.count,
                    nccl_dtype(buf.dtype),
                    peer as i32,
                    c,
                    s,
                )
            })
        })
    }

    /// Send `send` to `to` and receive `recv` from `from` in one step (no deadlock on rings).
    pub fn send_recv(
        &self,
        send: DeviceSlice,
        to: usize,
        recv: DeviceSlice,
        from: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        self.check_root(to)?;
        self.check_root(from)?;
        let fp = Fingerprint::new(OpKind::SendRecv, send.dtype, send.count);
        self.launch_p2p(fp, stream, |n, c, s| {
            self.grouped(n, |inner| {
                // SAFETY: DeviceSlice contract.
                unsafe {
                    inner.rc(
                        "sendrecv",
                        (n.send)(
                            send.as_ptr(),
                            send.count,
                            nccl_dtype(send.dtype),
                            to as i32,
                            c,
                            s,
                        ),
                    )?;
                    inner.rc(
                        "sendrecv",
                        (n.recv)(
                            recv.as_mut_ptr(),
                            recv.count,
                            nccl_dtype(recv.dtype),
                            from as i32,
                            c,
                            s,
                        ),
                    )
                }
            })
        })
    }

    /// Point-to-point operations are not collective: their fingerprints do not enter the
    /// cross-rank hash (ranks issue different sends and receives), but they do count in the
    /// sequence numbers, which therefore agree between ranks only for collectives-only use.
    fn launch_p2p(
        &self,
        fp: Fingerprint,
        stream: Stream,
        f: impl FnOnce(&Nccl, NcclComm, CuStream) -> Result<()>,
    ) -> Result<GpuRequest> {
        self.launch_as(fp, false, stream, f)
    }

    /// Barrier, ordered on the stream: completes once every rank has reached it.
    pub fn barrier(&self, stream: Stream) -> Result<GpuRequest> {
        // SAFETY: the communicator's own 8-byte scratch allocation.
        let buf = unsafe { DeviceSlice::from_raw(self.inner.scratch, 1, DataType::I32) };
        let fp = Fingerprint::new(OpKind::Barrier, DataType::I32, 0);
        self.launch(fp, stream, |n, c, s| {
            // SAFETY: as above.
            self.inner.rc("barrier", unsafe {
                (n.all_reduce)(buf.as_ptr(), buf.as_mut_ptr(), 1, 2, 0, c, s)
            })
        })
    }

    /// Split into disjoint communicators with `ncclCommSplit`: ranks passing the same `color`
    /// form one, ordered by (`key`, rank); `None` gets `None`. Collective over this
    /// communicator. Communicators from [`GpuCommunicator::new_multi`] split together, with
    /// [`GpuCommunicator::split_group`].
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<GpuCommunicator>> {
        if self.inner.multi {
            return Err(Error::invalid(
                "this communicator drives one of several GPUs of its process: split all of \
                 them at once with GpuCommunicator::split_group",
            ));
        }
        let mut v = Self::split_group(std::slice::from_ref(self), &[(color, key)])?;
        Ok(v.pop().flatten())
    }

    /// Split this process's communicators (one per GPU, from [`GpuCommunicator::new_multi`])
    /// in one NCCL group: `how[i]` is the `(color, key)` of `comms[i]`, as in
    /// [`GpuCommunicator::split`]. Devices of one process may pick different colors.
    ///
    /// Every rank first posts its `(color, key)` to the rendezvous store and waits, under the
    /// timeout, until all ranks of the communicator have: a rank that never calls split is
    /// named in a timeout instead of leaving the others blocked inside NCCL.
    pub fn split_group(
        comms: &[GpuCommunicator],
        how: &[(Option<u32>, i64)],
    ) -> Result<Vec<Option<GpuCommunicator>>> {
        not_in_group("splitting a GPU communicator")?;
        if comms.is_empty() || comms.len() != how.len() {
            return Err(Error::invalid(format!(
                "split_group needs one (color, key) per communicator ({} communicators, {} \
                 pairs)",
                comms.len(),
                how.len()
            )));
        }
        let mut args = Vec::with_capacity(how.len());
        for &(color, key) in how {
            let c = match color {
                None => -1, // NCCL_SPLIT_NOCOLOR
                Some(c) => i32::try_from(c).map_err(|_| {
                    Error::invalid(format!("split color {c} is above {}", i32::MAX))
                })?,
            };
            let k = i32::try_from(key)
                .map_err(|_| Error::invalid(format!("split key {key} does not fit in 32 bits")))?;
            args.push((c, k));
        }
        for c in comms {
            if let Some(e) = c.inner.poison() {
                return Err(e);
            }
        }
        let first = &comms[0].inner;
        let timeout = comms
            .iter()
            .map(|c| c.inner.timeout.get())
            .max()
            .unwrap_or_default();
        let k = first.splits.fetch_add(1, Ordering::Relaxed) + 1;
        for c in &comms[1..] {
            c.inner.splits.fetch_add(1, Ordering::Relaxed);
        }
        // Every rank's (color, key), where the store has them: who ends up in which child.
        let mut choices: Option<Vec<(i32, i32)>> = None;
        if let Some(store) = &first.store {
            for (c, &(col, key)) in comms.iter().zip(&args) {
                store.set(&format!("split/{k}/{}", c.rank()), format!("{col} {key}"))?;
            }
            let keys: Vec<String> = (0..first.size).map(|r| format!("split/{k}/{r}")).collect();
            let missing = store.wait_missing(&keys, timeout)?;
            if !missing.is_empty() {
                let ranks: Vec<usize> = missing
                    .iter()
                    .filter_map(|m| m.rsplit('/').next()?.parse().ok())
                    .collect();
                return Err(Error::Timeout {
                    op: "split".into(),
                    seq: k,
                    comm: format!("gpu/{}", first.id),
                    waiting_for: ranks,
                    after: timeout,
                    hint: "; they never called split".into(),
                });
            }
            choices = store
                .multi_get(&keys, timeout)
                .ok()
                .and_then(|values| values.iter().map(|v| parse_choice(v)).collect());
        }
        // Every rank is in: the (blocking) split runs to completion.
        let n = first.nccl;
        let mut news: Vec<NcclComm> = vec![std::ptr::null_mut(); comms.len()];
        let issued = issue_grouped(n, comms.len(), |i| {
            let (inner, (col, key)) = (&comms[i].inner, args[i]);
            inner.cu.make_current(inner.ctx as CuContext)?;
            // SAFETY: a live blocking communicator; a null config inherits its settings.
            let rc = unsafe {
                (n.comm_split)(
                    inner.comm as NcclComm,
                    col,
                    key,
                    &mut news[i],
                    std::ptr::null_mut(),
                )
            };
            inner.rc("ncclCommSplit", rc)
        });
        if let Err(e) = issued {
            abort_all(n, &news);
            return Err(e);
        }
        let mut out = Vec::with_capacity(comms.len());
        for (i, (c, &(col, _))) in comms.iter().zip(&args).enumerate() {
            let inner = &c.inner;
            let new = news[i];
            if col < 0 || new.is_null() {
                out.push(None);
                continue;
            }
            // Several GPUs of this process in the same child: drive them with `group`.
            let multi = args.iter().filter(|a| a.0 == col).count() > 1;
            let (mut rank, mut size) = (0, 0);
            // SAFETY: a ready communicator; each call writes one int.
            let child = unsafe {
                (
                    (n.comm_user_rank)(new, &mut rank),
                    (n.comm_count)(new, &mut size),
                )
            };
            let child = match child {
                (0, 0) => Self::wrap(
                    &inner.host,
                    n,
                    inner.cu,
                    new,
                    inner.ctx as CuContext,
                    inner.device,
                    rank as usize,
                    size as usize,
                    format!("{}-s{k}c{col}", inner.id),
                    multi,
                    child_host_of(inner.host_of.as_deref(), choices.as_deref(), col),
                ),
                (0, rc) | (rc, _) => Err(Error::Aborted {
                    reason: format!("ncclCommUserRank/Count: {}", n.describe(rc, new)),
                }),
            };
            match child {
                Ok(g) => {
                    g.set_timeout(inner.timeout.get());
                    out.push(Some(g));
                }
                Err(e) => {
                    // Children wrapped so far clean up when dropped.
                    abort_all(n, &news[i..]);
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    // -----------------------------------------------------------------------------------------

    fn grouped(&self, n: &Nccl, f: impl FnOnce(&Inner) -> Result<()>) -> Result<()> {
        // Raw group calls: nest inside a caller's `group` without arming its events.
        // SAFETY: no arguments.
        self.inner
            .rc("ncclGroupStart", unsafe { (n.group_start)() })?;
        let r = f(&self.inner);
        // SAFETY: paired with the start above.
        let e = self.inner.rc("ncclGroupEnd", unsafe { (n.group_end)() });
        r.and(e)
    }

    fn check_root(&self, root: usize) -> Result<()> {
        if root >= self.size() {
            return Err(Error::invalid(format!(
                "rank {root} does not exist in a GPU communicator of {} ranks",
                self.size()
            )));
        }
        Ok(())
    }

    fn check_counts(&self, what: &str, counts: &[usize]) -> Result<()> {
        if counts.len() != self.size() {
            return Err(Error::invalid(format!(
                "{what} has {} entries for {} ranks",
                counts.len(),
                self.size()
            )));
        }
        Ok(())
    }
}

impl Inner {
    /// Run `f` on the communicator unless it has been aborted (`None` then), with no abort
    /// able to free it meanwhile.
    fn unless_aborted<R>(&self, f: impl FnOnce(NcclComm) -> R) -> Option<R> {
        let _shared = self.abort_lock.read().unwrap_or_else(|p| p.into_inner());
        (!self.aborted.load(Ordering::Acquire)).then(|| f(self.comm as NcclComm))
    }

    /// NCCL's words for `rc` on this communicator (its last error, unless it was aborted).
    fn describe(&self, rc: nccl::NcclResult) -> String {
        self.unless_aborted(|c| self.nccl.describe(rc, c))
            .unwrap_or_else(|| self.nccl.describe(rc, std::ptr::null_mut()))
    }

    fn poison(&self) -> Option<Error> {
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
    fn settled(&self, event: &Event) -> Result<bool> {
        if !event.finished.load(Ordering::Acquire) {
            match self.unless_aborted(|_| event.done()) {
                Some(Ok(true)) => event.finished.store(true, Ordering::Release),
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

    /// Retire finished operations; the oldest unfinished one (`None` also once aborted).
    fn oldest(&self) -> Option<watchdog::Head> {
        self.unless_aborted(|_| self.state.lock().ok()?.retire())
            .flatten()
    }

    fn stream_of(&self, s: Stream) -> CuStream {
        match s {
            Stream::Comm => self.stream as CuStream,
            Stream::Raw(h) => h as CuStream,
        }
    }

    /// Map an NCCL result: usage errors are the caller's and leave the communicator usable;
    /// anything else fails it.
    fn rc(&self, what: &str, rc: nccl::NcclResult) -> Result<()> {
        let rc = if rc == nccl::NCCL_IN_PROGRESS {
            // Nonblocking communicator: the call finishes in NCCL's thread; wait for it before
            // anything else is enqueued (events, the next call).
            match settle(
                self.nccl,
                self.comm as NcclComm,
                Instant::now() + self.timeout.get(),
            ) {
                Ok(()) => 0,
                Err(Some(rc)) => rc,
                Err(None) => {
                    let e = Error::Aborted {
                        reason: format!(
                            "{what} on rank {}: NCCL did not finish enqueueing within {:?}",
                            self.rank,
                            self.timeout.get()
                        ),
                    };
                    self.fail(e.clone());
                    return Err(e);
                }
            }
        } else {
            rc
        };
        match rc {
            0 => Ok(()),
            4 | 5 => Err(Error::invalid(format!("{what}: {}", self.describe(rc)))),
            _ => {
                let e = Error::Aborted {
                    reason: format!("{what} on rank {}: {}", self.rank, self.describe(rc)),
                };
                self.fail(e.clone());
                Err(e)
            }
        }
    }

    fn copy(&self, src: DeviceSlice, dst: DeviceSlice, s: CuStream) -> Result<()> {
        if src.bytes() == 0 {
            return Ok(());
        }
        // SAFETY: both ranges were validated by the caller.
        let rc = unsafe { (self.cu.memcpy_dtod_async)(dst.ptr, src.ptr, src.bytes(), s) };
        self.cu.check(rc, "cuMemcpyDtoDAsync")
    }

    /// Record the first failure, abort NCCL once, and log it. The failure shows (through
    /// [`Inner::poison`]) only once the abort has finished: a caller that returns the error and
    /// exits would otherwise tear CUDA down under an abort still running in the watchdog's
    /// thread, which crashed one process in three at exit in the desync test.
    fn fail(&self, e: Error) {
        let _exclusive = self.abort_lock.write().unwrap_or_else(|p| p.into_inner());
        if !self.aborted.load(Ordering::Acquire) {
            // The last look before the abort: what has finished by now keeps its result.
            if let Ok(mut st) = self.state.lock() {
                st.retire();
            }
        }
        {
            let mut p = self.poison.lock().unwrap_or_else(|p| p.into_inner());
            if p.is_none() {
                tracing::error!("gpu communicator {} rank {}: {e}", self.id, self.rank);
                let spares = !matches!(e, Error::Desync { .. });
                self.spares_finished.store(spares, Ordering::Release);
                *p = Some(e);
            }
        }
        self.poisoned.store(true, Ordering::Release);
        if !self.aborted.swap(true, Ordering::AcqRel) {
            // SAFETY: a live communicator, aborted exactly once, with no watchdog query in
            // flight; abort is allowed from any thread and makes NCCL's kernels return.
            unsafe { (self.nccl.comm_abort)(self.comm as NcclComm) };
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let cu = self.cu;
        let _ = cu.make_current(self.ctx as CuContext);
        if !self.aborted.load(Ordering::Acquire) {
            // SAFETY: the communicator is idle once its stream is (operations on callers'
            // streams were waited for by their owners or are aborted by destroy).
            unsafe {
                (cu.stream_synchronize)(self.stream as CuStream);
                (self.nccl.comm_destroy)(self.comm as NcclComm);
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

/// Fold one fingerprint into the rolling hash (order-sensitive).
fn mix(h: u64, fp: &Fingerprint) -> u64 {
    h.rotate_left(5) ^ fp_hash(fp)
}

fn fp_hash(fp: &Fingerprint) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in fp.encode() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Device memory owned by Rust, for tests, benchmarks and callers without an array library.
pub struct DeviceBuffer<T: Element> {
    ptr: u64,
    len: usize,
    ctx: usize,
    _t: std::marker::PhantomData<T>,
}

// SAFETY: a device allocation is not tied to a host thread.
unsafe impl<T: Element> Send for DeviceBuffer<T> {}
// SAFETY: as above; mutation goes through the GPU.
unsafe impl<T: Element> Sync for DeviceBuffer<T> {}

impl<T: Element> DeviceBuffer<T> {
    /// `len` uninitialised elements on `comm`'s device (plain `cuMemAlloc`).
    pub fn alloc(comm: &GpuCommunicator, len: usize) -> Result<Self> {
        let cu = comm.inner.cu;
        cu.make_current(comm.inner.ctx as CuContext)?;
        let mut ptr = 0u64;
        if len > 0 {
            // SAFETY: out-pointer to a local.
            cu.check(
                unsafe { (cu.mem_alloc)(&mut ptr, len * T::DTYPE.size()) },
                "cuMemAlloc",
            )?;
        }
        Ok(DeviceBuffer {
            ptr,
            len,
            ctx: comm.inner.ctx,
            _t: std::marker::PhantomData,
        })
    }

    /// A copy of `data` on `comm`'s device.
    pub fn from_host(comm: &GpuCommunicator, data: &[T]) -> Result<Self> {
        let b = Self::alloc(comm, data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }

    /// Overwrite the start of the buffer with `data`; returns once the data is on the device.
    pub fn copy_from_host(&self, data: &[T]) -> Result<()> {
        let cu = cuda::driver()?;
        if data.len() > self.len {
            return Err(Error::invalid("host data longer than the device buffer"));
        }
        if data.is_empty() {
            return Ok(());
        }
        cu.make_current(self.ctx as CuContext)?;
        let bytes = crate::dtype::as_bytes(data);
        // SAFETY: both ranges hold `bytes.len()` bytes.
        cu.check(
            unsafe { (cu.memcpy_htod)(self.ptr, bytes.as_ptr().cast(), bytes.len()) },
            "cuMemcpyHtoD",
        )?;
        // From pageable memory the copy returns once the data is staged, and the DMA finishes
        // later on the legacy default stream, which non-blocking streams (ours, PyTorch's) do
        // not wait for: a collective could read the old contents. Wait for it here.
        // SAFETY: null is the legacy default stream of the current context.
        cu.check(
            unsafe { (cu.stream_synchronize)(std::ptr::null_mut()) },
            "cuStreamSynchronize",
        )
    }

    /// The whole buffer copied to the host (synchronous; waits for the legacy default stream,
    /// so wait for your operations first).
    pub fn to_host(&self) -> Result<Vec<T>> {
        let cu = cuda::driver()?;
        let mut out = vec![T::zeroed(); self.len];
        if self.len == 0 {
            return Ok(out);
        }
        cu.make_current(self.ctx as CuContext)?;
        let bytes = crate::dtype::as_bytes_mut(&mut out);
        // SAFETY: both ranges hold `bytes.len()` bytes.
        cu.check(
            unsafe { (cu.memcpy_dtoh)(bytes.as_mut_ptr().cast(), self.ptr, bytes.len()) },
            "cuMemcpyDtoH",
        )?;
        Ok(out)
    }

    /// The buffer as an untyped slice for communicator calls.
    pub fn slice(&self) -> DeviceSlice {
        DeviceSlice {
            ptr: self.ptr,
            count: self.len,
            dtype: T::DTYPE,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ptr != 0 {
            if let Ok(cu) = cuda::driver() {
                let _ = cu.make_current(self.ctx as CuContext);
                // SAFETY: our own allocation, freed once.
                unsafe { (cu.mem_free)(self.ptr) };
            }
        }
    }
}

/// Why GPU work cannot run here, or `None` if CUDA, a device and NCCL are all present. Tests and
/// tools print this and skip.
pub fn unavailable_reason() -> Option<String> {
    let cu = match cuda::driver() {
        Ok(c) => c,
        Err(e) => return Some(e.to_string()),
    };
    match cu.device_count() {
        Ok(0) => return Some("no CUDA device visible".into()),
        Err(e) => return Some(e.to_string()),
        _ => {}
    }
    nccl::nccl().err().map(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitwise_ops_are_unsupported_with_a_reason() {
        let e = nccl_op(ReduceOp::BXor, DataType::I32).unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e}");
        assert!(e.to_string().contains("NCCL has no bitwise"), "{e}");
        assert_eq!(nccl_op(ReduceOp::Avg, DataType::BF16).unwrap(), 4);
        assert!(nccl_op(ReduceOp::Avg, DataType::I32).is_err());
    }

    #[test]
    fn hash_is_order_sensitive() {
        let a = Fingerprint::new(OpKind::AllReduce, DataType::F32, 4).with_op(ReduceOp::Sum);
        let b = Fingerprint::new(OpKind::Broadcast, DataType::F32, 4).with_root(0);
        assert_ne!(mix(mix(0, &a), &b), mix(mix(0, &b), &a));
        assert_ne!(mix(0, &a), mix(0, &b));
    }

    #[test]
    fn a_split_child_knows_which_processes_hold_its_ranks() {
        // Parent: 4 ranks on 2 processes (2 GPUs each). Colors 0,1,0,1; keys reverse rank 0/2.
        let parent = [0, 0, 1, 1];
        let choices = [(0, 5), (1, 0), (0, 1), (1, 0)];
        // Color 0: ranks 2 (key 1) then 0 (key 5): processes 1, 0.
        assert_eq!(
            child_host_of(Some(&parent), Some(&choices), 0),
            Some(vec![1, 0])
        );
        // Color 1: equal keys keep the parent order: ranks 1, 3.
        assert_eq!(
            child_host_of(Some(&parent), Some(&choices), 1),
            Some(vec![0, 1])
        );
        assert_eq!(child_host_of(None, Some(&choices), 0), None);
        assert_eq!(child_host_of(Some(&parent), None, 0), None);
        assert_eq!(parse_choice(b"-1 7"), Some((-1, 7)));
        assert_eq!(parse_choice(b"3"), None);
    }

    #[test]
    fn sub_slices_are_bounds_checked() {
        // SAFETY: never dereferenced.
        let s = unsafe { DeviceSlice::from_raw(0x1000, 10, DataType::F32) };
        assert_eq!(s.sub(2, 3).unwrap().ptr(), 0x1008);
        assert!(s.sub(8, 3).is_err());
        assert!(s.sub(usize::MAX, 2).is_err());
    }
}
