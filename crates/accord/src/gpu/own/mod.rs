//! Accord's own GPU collectives: kernels over a symmetric scratch that every rank of the host
//! maps, for the ranks of one host (NVLink or PCIe peer access).
//!
//! The engine runs allreduce (one-shot with LL packets up to 256 KiB, two-shot above),
//! allgather, reduce_scatter, broadcast, alltoall, alltoallv and the barrier, for every element
//! type and reduce operator (the bitwise ones too, which NCCL lacks). Every rank reduces in rank
//! order, so results are bit-identical on every rank and equal to a sequential reduction
//! (16-bit floats round after each step, as on the host; their average sums in `f32`).
//!
//! Buffers of any device allocation work: the kernels copy through the scratch (`scratch`),
//! rounds of `ACCORD_GPU_CHUNK_BYTES` per pair of ranks, two halves alternating, so no host
//! synchronisation is ever needed and the calls can be captured in CUDA graphs. Arrays of the
//! communicator's symmetric heap ([`crate::Communicator::alloc_symmetric`]) go zero-copy in the
//! bulk kernels (two-shot allreduce, allgather, reduce_scatter, broadcast, alltoall): peers read
//! them where they lie, in one round when every rank's array is in the heap; ranks may mix heap
//! and ordinary arrays in one call. The packet (LL) kernels always send packets: their data
//! travels with its arrival flags, which a read of the peer's array would need a barrier for.
//!
//! Which engine runs a call ([`plan::chosen`]): `ACCORD_GPU_ENGINE=auto` (the default) gives
//! these kernels the sizes where they beat NCCL (measured by world size, on ordinary or on heap
//! arrays: [`plan::auto_range`]), the bitwise reductions NCCL lacks, and NCCL the rest; `accord` gives them
//! everything they run; `nccl` never loads them. Every rank of a communicator must use the same
//! setting (checked when the device is attached). Where NCCL cannot run at all — it is not
//! installed, or ranks share a GPU, which NCCL refuses — and the ranks are on one host, these
//! kernels are the communicator's only engine: the calls above work, the others (point-to-point,
//! reduce, gather, scatter, the `v` variants of allgather and reduce-scatter, splits) fail with
//! [`Error::Unsupported`] saying so.
//!
//! Calls of one communicator must not run at the same time on two streams: the kernels share
//! the communicator's counters and scratch, so a call issued on another stream than the
//! previous one must be ordered after it (e.g. with `Completion::stream_wait`), as the calls of
//! a NCCL communicator are best ordered too.
//!
//! Guarantees are the NCCL path's: the neutral layer's ordering, fingerprints, watchdog and
//! timeouts apply unchanged. In addition every barrier compares a hash of the call with the
//! peers', so ranks that issue different collectives stop with [`Error::Desync`] before writing
//! their output; every wait on the GPU gives up at the communicator's deadline and names the
//! peer; an abort raises a host word every kernel polls.

mod kernels;
pub(crate) mod plan;
mod scratch;

use super::cuda::{CuContext, CuStream, Driver, KernelArgs};
use super::device::DeviceSlice;
use super::engine::{DeviceEngine, EngineResult, Fault, P2p, PendingChild};
use super::link::HostLink;
use super::select::Joined;
use super::symm::{registry, LocalGroup};
use crate::atomic_duration::AtomicDuration;
use crate::config::GpuEngine;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::op::{Collective, Op};
use kernels::{bytes_of, Ctx, Loaded, Parts};
use plan::{Algo, MAX_RANKS};
use scratch::Scratch;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Collectives enqueued on these kernels, and those of them whose input or output a peer reads
/// where it lies (`crate::testing`).
static CALLS: AtomicU64 = AtomicU64::new(0);
static ZERO_COPY: AtomicU64 = AtomicU64::new(0);

pub(crate) fn calls() -> u64 {
    CALLS.load(Ordering::Relaxed)
}

pub(crate) fn zero_copy_calls() -> u64 {
    ZERO_COPY.load(Ordering::Relaxed)
}

/// The engine's name, in messages and [`crate::DeviceInfo`].
pub(crate) const NAME: &str = "Accord";

/// What the ranks found out together before creating a device communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Survey {
    /// `ACCORD_GPU_ENGINE`, the same on every rank.
    pub mode: GpuEngine,
    /// Whether every rank is on this host.
    pub one_host: bool,
    /// Why NCCL cannot run this communicator, if it cannot.
    pub no_nccl: Option<String>,
}

/// Meet the other ranks (collective over `host`): their engine setting, host and GPU.
pub(crate) fn survey(host: &dyn HostLink, device: usize) -> Result<Survey> {
    let mode = crate::config::get().gpu_engine;
    let code = |m: GpuEngine| m as i64;
    let nccl_ok = super::cuda::driver()
        .and_then(|_| super::nccl::nccl())
        .is_ok();
    let gpu = gpu_identity(device).unwrap_or(-1);
    let cfg = crate::config::get();
    let mine = [
        code(mode),
        super::symm::host_id(),
        i64::from(nccl_ok),
        gpu,
        cfg.gpu_chunk_bytes as i64,
        cfg.gpu_ll_bytes as i64,
    ];
    let all = host.all_gather_i64(&mine)?;
    let rows: Vec<&[i64]> = all.chunks(mine.len()).collect();
    // The kernels' layout and choices follow these: every rank must have the same.
    for (k, var) in [(4, "ACCORD_GPU_CHUNK_BYTES"), (5, "ACCORD_GPU_LL_BYTES")] {
        if rows.iter().any(|r| r[k] != mine[k]) {
            let each: Vec<String> = (0..rows.len())
                .map(|r| format!("rank {r}: {}", rows[r][k]))
                .collect();
            return Err(Error::invalid(format!(
                "{var} differs between ranks ({}); set the same value everywhere",
                each.join(", ")
            )));
        }
    }
    if rows.iter().any(|r| r[0] != code(mode)) {
        let each: Vec<String> = rows
            .iter()
            .enumerate()
            .map(|(r, row)| format!("rank {r}: {}", mode_of(row[0]).name()))
            .collect();
        return Err(Error::invalid(format!(
            "ACCORD_GPU_ENGINE differs between ranks ({}); set the same value everywhere",
            each.join(", ")
        )));
    }
    let one_host = rows.iter().all(|r| r[1] == mine[1]);
    let missing: Vec<usize> = (0..rows.len()).filter(|&r| rows[r][2] == 0).collect();
    let shared = (0..rows.len()).find_map(|a| {
        (a + 1..rows.len())
            .find(|&b| rows[a][1] == rows[b][1] && rows[a][3] >= 0 && rows[a][3] == rows[b][3])
            .map(|b| (a, b))
    });
    let no_nccl = match (missing.is_empty(), shared) {
        (false, _) => Some(format!("rank(s) {missing:?} could not load NCCL")),
        (true, Some((a, b))) => Some(format!("ranks {a} and {b} share a GPU, which NCCL refuses")),
        (true, None) => None,
    };
    Ok(Survey {
        mode,
        one_host,
        no_nccl,
    })
}

fn mode_of(code: i64) -> GpuEngine {
    [GpuEngine::Auto, GpuEngine::Accord, GpuEngine::Nccl]
        .into_iter()
        .find(|&m| m as i64 == code)
        .unwrap_or(GpuEngine::Auto)
}

/// The device's PCI domain, bus and device numbers as one number: equal on two ranks of a host
/// when they drive the same GPU.
fn gpu_identity(device: usize) -> Result<i64> {
    let cu = super::cuda::driver()?;
    let launch = cu.launch()?;
    let mut v = [0i32; 3];
    // Attributes 50, 33, 34: PCI domain, bus, device.
    for (out, attr) in v.iter_mut().zip([50, 33, 34]) {
        // SAFETY: out-pointer to a local.
        let rc = unsafe { (launch.device_get_attribute)(out, attr, device as i32) };
        cu.check(rc, "cuDeviceGetAttribute")?;
    }
    Ok((i64::from(v[0]) << 32) | (i64::from(v[1]) << 8) | i64::from(v[2]))
}

/// The engines to try before NCCL on a new top-level communicator `j` (collective over
/// `host`): this one when the survey allows it. Under `auto` a failure to start the kernels
/// (no NVRTC, no peer access) is logged and NCCL runs everything; under `accord` it is an error.
pub(crate) fn beside(
    host: &Arc<dyn HostLink>,
    j: &Joined,
    s: &Survey,
) -> Result<Vec<Box<dyn DeviceEngine>>> {
    let wanted = s.mode != GpuEngine::Nccl
        && s.one_host
        && !j.multi
        && j.size <= MAX_RANKS
        && (j.size > 1 || s.mode == GpuEngine::Accord);
    if !wanted {
        return Ok(Vec::new());
    }
    let made = OwnEngine::open(host, j.device, &j.id, s.mode, None);
    let ok = host.all_gather_i64(&[i64::from(made.is_ok())])?;
    match (made, ok.iter().all(|&v| v == 1)) {
        (Ok(e), true) => Ok(vec![Box::new(e) as Box<dyn DeviceEngine>]),
        (made, _) => {
            let why = match made {
                Err(e) => e.to_string(),
                Ok(_) => {
                    let bad: Vec<usize> = (0..ok.len()).filter(|&r| ok[r] != 1).collect();
                    format!("rank(s) {bad:?} could not start them (see their logs)")
                }
            };
            if s.mode == GpuEngine::Accord {
                return Err(Error::Unsupported(format!(
                    "ACCORD_GPU_ENGINE=accord, but Accord's GPU kernels cannot run: {why}"
                )));
            }
            tracing::warn!("Accord's GPU kernels are off for this communicator: {why}");
            Ok(Vec::new())
        }
    }
}

/// A communicator whose only engine is this one, for when NCCL cannot run it (collective).
pub(crate) fn alone(host: &Arc<dyn HostLink>, device: usize, s: &Survey) -> Result<Joined> {
    let why = s.no_nccl.clone().unwrap_or_default();
    if !s.one_host || host.size() > MAX_RANKS {
        return Err(Error::Unsupported(format!(
            "GPU collectives need NCCL here ({why}); Accord's own kernels cover ranks of one host \
             (at most {MAX_RANKS})"
        )));
    }
    let mut id = [0u8; 8];
    if host.rank() == 0 {
        id = rand_id();
    }
    host.broadcast_bytes(&mut id, 0)?;
    let id = format!("k{:016x}", u64::from_le_bytes(id));
    let engine = OwnEngine::open(host, device, &id, s.mode, Some(why.clone()))?;
    tracing::info!("GPU communicator {id}: Accord's kernels only ({why})");
    let cu = super::cuda::driver()?;
    Ok(Joined {
        ctx: cu.primary_context(device)? as usize,
        engine: Box::new(engine),
        preferred: Vec::new(),
        device,
        rank: host.rank(),
        size: host.size(),
        id,
        multi: false,
        host_of: Some((0..host.size()).collect()),
    })
}

fn rand_id() -> [u8; 8] {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish().to_le_bytes()
}

/// Accord's kernels on one communicator of one host.
pub(crate) struct OwnEngine {
    cu: &'static Driver,
    ctx: usize,
    rank: usize,
    size: usize,
    comm: String,
    mode: GpuEngine,
    /// Why NCCL cannot run this communicator, when this engine is its only one.
    alone: Option<String>,
    scratch: Scratch,
    /// The communicator's symmetric heap as the kernels look it up (after `scratch`: dropped
    /// once the scratch's drop drained the device).
    _table: Arc<registry::Table>,
    /// The heap's name, to recognise its arrays.
    heap: String,
    /// Keeps the mesh the scratch was shared over.
    _group: Arc<LocalGroup>,
    base: Ctx,
    kernels: Loaded,
    /// The largest packet call (`ACCORD_GPU_LL_BYTES`).
    ll_bytes: usize,
    timeout: AtomicDuration,
    /// The last call launched, for messages about a failure the kernels recorded.
    last: Mutex<Option<crate::fingerprint::Fingerprint>>,
    closed: AtomicBool,
}

impl OwnEngine {
    /// Map the scratch with every rank of the host and load the data-movement kernels
    /// (collective over `host`, whose ranks are this communicator's).
    fn open(
        host: &Arc<dyn HostLink>,
        device: usize,
        id: &str,
        mode: GpuEngine,
        alone: Option<String>,
    ) -> Result<OwnEngine> {
        let cu = super::cuda::driver()?;
        let ctx = cu.primary_context(device)? as usize;
        let group = LocalGroup::join(host.clone(), (cu, ctx), device, &format!("{id}/kernels"))?;
        let (rank, size) = (host.rank(), host.size());
        if group.peers().len() != size {
            return Err(Error::Unsupported(
                "Accord's GPU kernels need every rank on this host".into(),
            ));
        }
        let scratch = Scratch::new(&group, crate::config::get().gpu_chunk_bytes)?;
        let heap = host.heap_name();
        let table = registry::table(&heap, cu, ctx)?;
        let mut base = Ctx {
            sym_table: table.ptr(),
            sig: scratch.buf.ptr(),
            epochs: scratch.counters,
            control: scratch.control_dev,
            ll_off: scratch.layout.ll_off,
            ll_slot: scratch.layout.ll_slot,
            bulk_off: scratch.layout.bulk_off,
            chunk: scratch.layout.chunk,
            rank: rank as u32,
            size: size as u32,
            ..Ctx::default()
        };
        for r in 0..size {
            let p = scratch.buf.peer_ptr(r).ok_or_else(|| {
                Error::Unsupported(format!("rank {r}'s scratch is not mapped here"))
            })?;
            base.peer_sig[r] = p;
            base.peer_scratch[r] = p;
        }
        let kernels = Loaded::new(device);
        // Compile now, so a missing NVRTC shows while every rank can still agree to go without.
        kernels.get(Algo::Barrier, DataType::U8, crate::ReduceOp::Sum)?;
        Ok(OwnEngine {
            cu,
            ctx,
            rank,
            size,
            comm: format!("gpu/{id}"),
            mode,
            alone,
            scratch,
            _table: table,
            heap,
            _group: group,
            base,
            kernels,
            ll_bytes: crate::config::get().gpu_ll_bytes,
            timeout: AtomicDuration::new(host.timeout()),
            last: Mutex::new(None),
            closed: AtomicBool::new(false),
        })
    }

    /// The communicator's context for one call.
    fn ctx_for(&self, op: &Op) -> Ctx {
        let mut c = self.base;
        c.hash = call_hash(op);
        c.timeout_ns = self.timeout.get().as_nanos().min(u64::MAX as u128) as u64;
        c
    }

    /// What `auto` decides on besides the call.
    fn facts(&self, heap: bool) -> plan::Facts {
        plan::Facts {
            heap,
            size: self.size,
        }
    }

    /// Bytes of its input this rank's kernel reads (a broadcast's non-roots read none).
    fn read_bytes(&self, op: &Op) -> usize {
        op.dtype.size()
            * match op.coll {
                Collective::Broadcast { count, root } if root == self.rank => count,
                Collective::Broadcast { .. } => 0,
                _ => op.send_len(self.rank),
            }
    }

    /// What this rank tells its peers about the call's input and output: where they lie in the
    /// symmetric heap (`registry::describe`), or 0 for arrays the kernel copies through the
    /// scratch. Only the bulk kernels read peers' arrays; they may in place only where no rank
    /// writes what a peer still reads (the two-shot allreduce and the broadcast, whose writes to
    /// an aliased array follow the reads).
    fn directs(
        &self,
        algo: Algo,
        op: &Op,
        send: Option<DeviceSlice>,
        recv: DeviceSlice,
    ) -> (u64, u64) {
        let es = op.dtype.size();
        let input = send.unwrap_or(recv);
        let reads = self.read_bytes(op);
        let safe = plan::readable_in_place(
            algo,
            (input.ptr(), input.bytes()),
            (recv.ptr(), recv.bytes()),
        );
        let din = match safe && reads > 0 {
            true => registry::describe(&self.heap, input.ptr(), reads),
            false => 0,
        };
        let dout = match algo {
            Algo::AllReduceTwoShot => {
                registry::describe(&self.heap, recv.ptr(), op.recv_len(self.rank) * es)
            }
            _ => 0,
        };
        (din, dout)
    }

    fn launch(&self, algo: Algo, op: &Op, grid: u32, args: KernelArgs, s: CuStream) -> Result<()> {
        let kernel = self.kernels.get(algo, op.dtype, op.reduce_or_sum())?;
        if let Ok(mut last) = self.last.lock() {
            *last = Some(op.fp);
        }
        self.cu.make_current(self.ctx as CuContext)?;
        // SAFETY: the arguments follow the kernel's parameter list (Ctx, then the pointers and
        // sizes below); the neutral layer checked that the slices hold what the op touches on
        // this rank; the scratch outlives every launch (freed after the stream drained).
        unsafe { kernel.launch([grid, 1, 1], [plan::THREADS, 1, 1], 0, s, args.as_bytes()) }
    }
}

/// The call's fingerprint, hashed to the 32 bits the kernels compare.
fn call_hash(op: &Op) -> u32 {
    let h = super::comm::fp_hash(&op.fp);
    (h ^ (h >> 32)) as u32
}

impl DeviceEngine for OwnEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    fn supports(&self, op: &Op, heap: bool) -> std::result::Result<(), String> {
        // Alone, this engine runs whatever it can: there is nothing to fall back to.
        if let Some(no_nccl) = &self.alone {
            return plan::algorithm(op, self.size, self.ll_bytes)
                .map(|_| ())
                .map_err(|why| format!("{why}; but NCCL cannot run this communicator: {no_nccl}"));
        }
        let algo = plan::algorithm(op, self.size, self.ll_bytes)?;
        plan::chosen(self.mode, op, algo, self.facts(heap))
            .map_err(|why| format!("{}: {why}", algo.describe()))
    }

    fn heap_arrays(&self, op: &Op, send: Option<DeviceSlice>, recv: DeviceSlice) -> bool {
        // Where the arrays lie, not whether this call may read them in place (in place or
        // not is each rank's choice): ranks of a correct program must choose alike.
        let es = op.dtype.size();
        let input = send.unwrap_or(recv);
        let reads = self.read_bytes(op);
        let writes = op.recv_len(self.rank) * es;
        let lies = |ptr: u64, n: usize| n == 0 || registry::describe(&self.heap, ptr, n) != 0;
        (reads > 0 || writes > 0) && lies(input.ptr(), reads) && lies(recv.ptr(), writes)
    }

    fn accepts(&self, op: &Op, heap: bool) -> bool {
        let Some(algo) = plan::kernel_for(op, self.size, self.ll_bytes) else {
            return false;
        };
        self.alone.is_some()
            || match self.mode {
                GpuEngine::Nccl => false,
                GpuEngine::Accord => true,
                GpuEngine::Auto => plan::in_auto_range(op, algo, self.facts(heap)),
            }
    }

    fn explain(&self, op: &Op) -> String {
        match plan::algorithm(op, self.size, self.ll_bytes) {
            Ok(a) => format!("Accord {}", a.describe()),
            Err(e) => e,
        }
    }

    fn enqueue(
        &self,
        op: &Op,
        send: Option<DeviceSlice>,
        recv: DeviceSlice,
        s: CuStream,
    ) -> EngineResult<()> {
        let algo = plan::algorithm(op, self.size, self.ll_bytes).map_err(Error::Unsupported)?;
        let mut c = self.ctx_for(op);
        (c.din, c.dout) = self.directs(algo, op, send, recv);
        CALLS.fetch_add(1, Ordering::Relaxed);
        if c.din | c.dout != 0 {
            ZERO_COPY.fetch_add(1, Ordering::Relaxed);
        }
        let input = send.unwrap_or(recv);
        let es = op.dtype.size();
        let chunk = self.scratch.layout.chunk as usize;
        let args = KernelArgs::new().bytes(bytes_of(&c), 8);
        let (grid, args) = match (algo, &op.coll) {
            (Algo::Barrier, _) => (1, args),
            (Algo::AllReduceOneShot, &Collective::AllReduce { count }) => (
                plan::LL_BLOCKS,
                args.ptr(input.ptr())
                    .ptr(recv.ptr())
                    .u64((count * es) as u64),
            ),
            (Algo::AllGatherLl, Collective::AllGather { counts }) => (
                plan::LL_BLOCKS,
                args.ptr(input.ptr())
                    .ptr(recv.ptr())
                    .u64((counts[self.rank] * es) as u64)
                    .u32(0),
            ),
            (Algo::AllToAllLl, Collective::AllToAll { send_counts, .. }) => (
                plan::LL_BLOCKS,
                args.ptr(input.ptr())
                    .ptr(recv.ptr())
                    .u64((send_counts[0] * es) as u64)
                    .u32(1),
            ),
            (Algo::ReduceScatterLl, Collective::ReduceScatter { counts }) => (
                plan::LL_BLOCKS,
                args.ptr(input.ptr())
                    .ptr(recv.ptr())
                    .u64(counts[self.rank] as u64),
            ),
            (Algo::AllReduceTwoShot, &Collective::AllReduce { count }) => {
                let seg = plan::segment(count, es, self.size);
                (
                    plan::bulk_blocks((seg * es).min(chunk)),
                    args.ptr(input.ptr())
                        .ptr(recv.ptr())
                        .u64(count as u64)
                        .u64(seg as u64),
                )
            }
            (Algo::ReduceScatter, Collective::ReduceScatter { counts }) => {
                let count = counts[self.rank];
                (
                    plan::bulk_blocks((count * es).min(chunk)),
                    args.ptr(input.ptr()).ptr(recv.ptr()).u64(count as u64),
                )
            }
            (Algo::AllGather, Collective::AllGather { counts }) => {
                let bytes = counts[self.rank] * es;
                (
                    plan::bulk_blocks(bytes.min(chunk)),
                    args.ptr(input.ptr()).ptr(recv.ptr()).u64(bytes as u64),
                )
            }
            (Algo::Broadcast, &Collective::Broadcast { count, root }) => (
                plan::bulk_blocks((count * es).min(chunk)),
                args.ptr(input.ptr())
                    .ptr(recv.ptr())
                    .u64((count * es) as u64)
                    .u32(root as u32),
            ),
            (
                Algo::AllToAll,
                Collective::AllToAll {
                    send_counts,
                    recv_counts,
                },
            ) => {
                let parts = alltoall_parts(send_counts, recv_counts, es, self.rank)?;
                let grid = match op.kind() {
                    crate::fingerprint::OpKind::AllToAll => {
                        plan::bulk_blocks((send_counts[0] * es).min(chunk))
                    }
                    // Ranks' sizes differ: a grid they all know.
                    _ => plan::BULK_BLOCKS,
                };
                (
                    grid,
                    args.ptr(input.ptr())
                        .ptr(recv.ptr())
                        .bytes(bytes_of(&parts), 8),
                )
            }
            _ => {
                return Err(Error::Unsupported(format!(
                    "{} does not match {}",
                    algo.describe(),
                    op.kind()
                ))
                .into())
            }
        };
        // A failed launch leaves the peers waiting in theirs: the communicator must fail.
        self.launch(algo, op, grid, args, s).map_err(Fault::fatal)
    }

    fn enqueue_p2p(&self, _ops: &[P2p], _s: CuStream) -> EngineResult<()> {
        Err(Error::Unsupported(
            "point-to-point on GPU memory needs NCCL, which this communicator runs without \
             (Accord's kernels cover the collectives only)"
                .into(),
        )
        .into())
    }

    fn finish_enqueue(&self, _what: &str) -> EngineResult<()> {
        Ok(())
    }

    fn async_error(&self) -> Option<Error> {
        self.device_fault()
    }

    fn device_fault(&self) -> Option<Error> {
        let word = self.scratch.error_word();
        if word == 0 {
            return None;
        }
        let last = match self.last.lock().ok().and_then(|l| *l) {
            Some(fp) => fp.to_string(),
            None => "a collective".into(),
        };
        Some(scratch::decode(
            word,
            &self.comm,
            self.rank,
            &last,
            self.timeout.get(),
        ))
    }

    fn abort(&self) {
        self.scratch.raise_abort();
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    fn split_begin(&self, _color: i32, _key: i32) -> EngineResult<Box<dyn PendingChild>> {
        Err(Error::Unsupported(
            "splitting a GPU communicator needs NCCL, which this communicator runs without".into(),
        )
        .into())
    }

    fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout);
    }

    fn version(&self) -> (String, String) {
        (
            env!("CARGO_PKG_VERSION").to_string(),
            "compiled at run time with NVRTC".into(),
        )
    }

    fn raw_handle(&self) -> usize {
        0
    }
}

/// alltoall(v) blocks in bytes, checked against the kernel's limits.
fn alltoall_parts(send: &[usize], recv: &[usize], es: usize, me: usize) -> Result<Parts> {
    let mut p = Parts::default();
    let (mut so, mut ro) = (0, 0);
    for r in 0..send.len().min(MAX_RANKS) {
        p.send_off[r] = (so * es) as u64;
        p.send_len[r] = (send[r] * es) as u64;
        p.recv_off[r] = (ro * es) as u64;
        p.recv_len[r] = (recv[r] * es) as u64;
        so += send[r];
        ro += recv[r];
    }
    if send.get(me) != recv.get(me) {
        return Err(Error::invalid(format!(
            "alltoallv: rank {me} sends itself {} elements but expects {}",
            send.get(me).copied().unwrap_or(0),
            recv.get(me).copied().unwrap_or(0)
        )));
    }
    Ok(p)
}
