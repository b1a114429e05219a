//! What Accord's kernels do with an operation: the algorithm, its grid, and whether `auto` gives
//! it to them or to NCCL. Pure functions of facts every rank agrees on (the operation, its total
//! bytes, the world size), so every rank plans alike.

use crate::config::GpuEngine;
use crate::dtype::ReduceOp;
use crate::fingerprint::OpKind;
use crate::op::{Collective, Op};

/// Ranks one communicator of these kernels may have (the signal words are sized for it).
pub(crate) const MAX_RANKS: usize = 16;
/// Blocks one kernel may have (the signal words are sized for it).
pub(crate) const MAX_BLOCKS: u32 = 64;
/// Threads per block.
pub(crate) const THREADS: u32 = 512;
/// The one-shot allreduce always runs this many blocks: its packet halves alternate per block,
/// so every call must give each line to the same block.
pub(crate) const LL_BLOCKS: u32 = 16;
/// The most blocks a bulk kernel runs.
pub(crate) const BULK_BLOCKS: u32 = 64;
/// Bytes each bulk block moves per round before another block is added.
const BYTES_PER_BLOCK: usize = 16 << 10;
/// The largest packet (LL) call: a one-shot allreduce's whole message, an allgather's,
/// reduce-scatter's or alltoall's block per rank (packets double the bytes in the packet area,
/// which is sized for this). `ACCORD_GPU_LL_BYTES` lowers it.
pub(crate) const LL_MAX_BYTES: usize = 256 << 10;

/// A kernel of `collectives.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Algo {
    Barrier,
    /// One-shot allreduce with LL packets.
    AllReduceOneShot,
    /// Allgather as packets.
    AllGatherLl,
    /// Alltoall as packets.
    AllToAllLl,
    /// Reduce-scatter as packets.
    ReduceScatterLl,
    /// Reduce-scatter, then allgather, through the peers' slots.
    AllReduceTwoShot,
    ReduceScatter,
    AllGather,
    Broadcast,
    /// alltoall and alltoallv.
    AllToAll,
}

impl Algo {
    /// The kernel's name in `collectives.cu`.
    pub fn kernel(self) -> &'static str {
        match self {
            Algo::Barrier => "accord_barrier",
            Algo::AllReduceOneShot => "accord_allreduce_ll",
            Algo::AllGatherLl | Algo::AllToAllLl => "accord_exchange_ll",
            Algo::ReduceScatterLl => "accord_reduce_scatter_ll",
            Algo::AllReduceTwoShot => "accord_allreduce_2shot",
            Algo::ReduceScatter => "accord_reduce_scatter",
            Algo::AllGather => "accord_allgather",
            Algo::Broadcast => "accord_broadcast",
            Algo::AllToAll => "accord_alltoall",
        }
    }

    /// Whether the kernel reduces (and so lives in a module built per type and operator).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Algo::AllReduceOneShot
                | Algo::AllReduceTwoShot
                | Algo::ReduceScatter
                | Algo::ReduceScatterLl
        )
    }

    /// For `ACCORD_EXPLAIN`.
    pub fn describe(self) -> &'static str {
        match self {
            Algo::Barrier => "barrier through signal words",
            Algo::AllReduceOneShot => "one-shot allreduce (LL packets to every peer)",
            Algo::AllGatherLl => "allgather as LL packets",
            Algo::AllToAllLl => "alltoall as LL packets",
            Algo::ReduceScatterLl => "reduce-scatter as LL packets",
            Algo::AllReduceTwoShot => "two-shot allreduce (reduce-scatter + allgather)",
            Algo::ReduceScatter => "reduce-scatter through peers' slots",
            Algo::AllGather => "allgather through peers' slots",
            Algo::Broadcast => "broadcast through peers' slots",
            Algo::AllToAll => "alltoall through peers' slots",
        }
    }
}

/// The kernel for `op` on `size` ranks, with packets up to `ll_bytes` (see [`LL_MAX_BYTES`]),
/// or why these kernels do not run it.
pub(crate) fn algorithm(op: &Op, size: usize, ll_bytes: usize) -> Result<Algo, String> {
    if size > MAX_RANKS {
        return Err(format!(
            "Accord's GPU kernels run on at most {MAX_RANKS} ranks, this communicator has {size}"
        ));
    }
    kernel_for(op, size, ll_bytes)
        .ok_or_else(|| format!("{} has no Accord GPU kernel (NCCL runs it)", op.kind()))
}

/// [`algorithm`] without the reason (on every call's path: no allocation).
pub(crate) fn kernel_for(op: &Op, size: usize, ll_bytes: usize) -> Option<Algo> {
    if size > MAX_RANKS {
        return None;
    }
    // By the kind the caller chose, never by the counts it passed: a `v` call whose counts on
    // this rank happen to be equal must plan like the other ranks of the same call.
    let ll = ll_bytes.min(LL_MAX_BYTES);
    // The uniform kinds' block per rank (alltoall: per pair): equal on every rank.
    let block = op.bytes() / size.max(1);
    Some(match (op.kind(), &op.coll) {
        (_, Collective::Barrier) => Algo::Barrier,
        (_, Collective::AllReduce { .. }) if op.bytes() <= ll => Algo::AllReduceOneShot,
        (_, Collective::AllReduce { .. }) => Algo::AllReduceTwoShot,
        (OpKind::AllGather, _) if block <= ll => Algo::AllGatherLl,
        (OpKind::AllGather, _) => Algo::AllGather,
        (OpKind::ReduceScatter, _) if block <= ll => Algo::ReduceScatterLl,
        (OpKind::ReduceScatter, _) => Algo::ReduceScatter,
        (_, Collective::Broadcast { .. }) => Algo::Broadcast,
        (OpKind::AllToAll, _) if block <= ll => Algo::AllToAllLl,
        (OpKind::AllToAll | OpKind::AllToAllV, _) => Algo::AllToAll,
        _ => return None,
    })
}

/// What `auto` decides on besides the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    /// The call's arrays are in the symmetric heap on this rank (the bulk kernels read them
    /// zero-copy). Each rank knows only its own; ranks of a correct program agree, and ranks
    /// that do not fail with a desync (the engine enters the progress records).
    pub heap: bool,
    /// Ranks of the communicator.
    pub size: usize,
}

/// Whether `mode` gives `algo` to these kernels rather than to NCCL; the reason when not.
/// Under `auto` a call goes to the kernels inside the range of total bytes where they beat
/// NCCL ([`auto_range`]); alltoallv (whose sizes ranks do not share) goes to NCCL.
pub(crate) fn chosen(mode: GpuEngine, op: &Op, algo: Algo, f: Facts) -> Result<(), String> {
    match mode {
        GpuEngine::Nccl => return Err("ACCORD_GPU_ENGINE=nccl".into()),
        GpuEngine::Accord => return Ok(()),
        GpuEngine::Auto => {}
    }
    if algo == Algo::AllToAll && op.kind() == OpKind::AllToAllV {
        return Err("alltoallv: ranks' sizes differ, so NCCL runs it under auto".into());
    }
    let bytes = op.bytes();
    let (above, upto) = auto_range(algo, f);
    let arrays = if f.heap {
        "symmetric-heap arrays"
    } else {
        "ordinary arrays"
    };
    let range = match upto {
        0 => "at no size".to_string(),
        _ => format!("at {above} < bytes <= {upto}"),
    };
    match in_auto_range(op, algo, f) {
        true => Ok(()),
        false => Err(format!(
            "NCCL is faster at {bytes} B on {arrays} and {} ranks (the kernel runs {range} \
             under auto; ACCORD_GPU_ENGINE=accord forces it)",
            f.size
        )),
    }
}

/// Whether `auto` gives `algo` for `op` to the kernels ([`chosen`] without the reason).
pub(crate) fn in_auto_range(op: &Op, algo: Algo, f: Facts) -> bool {
    // NCCL has no bitwise reductions: these kernels are the only GPU engine that runs them.
    if matches!(
        op.reduce,
        Some(ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor)
    ) {
        return true;
    }
    if algo == Algo::AllToAll && op.kind() == OpKind::AllToAllV {
        return false;
    }
    let (above, upto) = auto_range(algo, f);
    op.bytes() > above && op.bytes() <= upto
}

/// Under `auto`: the total bytes (exclusive lower bound, inclusive upper bound) each kernel
/// runs, on ordinary arrays or on symmetric-heap arrays (which the bulk kernels take
/// zero-copy), by the number of ranks. Measured against NCCL in the same run
/// (`bench/gpu_engines.sh`, `accord bench --symmetric`; BENCHMARKS.md) on two H200s, two H100s
/// and four H200s, all NVLink:
///
/// - The packet kernels win at every size they take on two ranks. The one-shot allreduce, in
///   which every rank reads every peer's whole message, wins on four up to 64 KiB (at 256 KiB
///   NCCL was 1.09x faster).
/// - The bulk allgather and reduce-scatter win while each rank's block is at most 1 MiB (2 MiB
///   in all on two ranks, 4 MiB on four; 4x that lost on both), alltoall up to 1 MiB in all.
/// - The two-shot allreduce through the scratch wins on two ranks only, between NCCL's protocol
///   switch (above 1 MiB) and 4 MiB; on four, NCCL was faster at every size from 1 MiB.
/// - Zero-copy on two ranks, every bulk kernel wins from 1 MiB up but the two-shot allreduce
///   at 1 MiB. On four, reduce-scatter wins at every size, allgather and alltoall up to 1 MiB
///   per rank (1.2-1.9x slower beyond), and the two-shot allreduce at none (1.03-1.5x slower).
/// - Broadcast stays with NCCL: only the root's array matters, which the others cannot see, and
///   NCCL's was as fast or faster through the scratch.
///
/// Three ranks and more than four were not measured; they take the four-rank ranges, which
/// leave more sizes to NCCL.
pub(crate) fn auto_range(algo: Algo, f: Facts) -> (usize, usize) {
    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;
    const ALL: (usize, usize) = (0, usize::MAX);
    let two = f.size <= 2;
    // Every rank's block at most 1 MiB.
    let blocks = (0, f.size.max(1) * MIB);
    match algo {
        Algo::Barrier | Algo::AllGatherLl | Algo::ReduceScatterLl | Algo::AllToAllLl => ALL,
        Algo::AllReduceOneShot if two => ALL,
        Algo::AllReduceOneShot => (0, 64 * KIB),
        Algo::AllReduceTwoShot if !two => (0, 0),
        Algo::AllReduceTwoShot if f.heap => (MIB, usize::MAX),
        Algo::AllReduceTwoShot => (MIB, 4 * MIB),
        Algo::AllGather | Algo::AllToAll if f.heap && two => ALL,
        Algo::AllGather => blocks,
        Algo::ReduceScatter if f.heap => ALL,
        Algo::ReduceScatter => blocks,
        Algo::AllToAll if f.heap => blocks,
        Algo::AllToAll => (0, MIB),
        Algo::Broadcast => (0, 0),
    }
}

/// Whether peers may read this rank's input `(address, bytes)` where it lies while `algo`
/// writes its output: only the bulk kernels read peers' arrays; the two-shot allreduce and the
/// broadcast may in place too (their writes to an aliased array follow the reads they could
/// disturb, with a barrier between), the others only when input and output do not overlap.
pub(crate) fn readable_in_place(algo: Algo, input: (u64, usize), output: (u64, usize)) -> bool {
    let aliased = input.0 == output.0;
    let overlap = input.0 < output.0 + output.1 as u64 && output.0 < input.0 + input.1 as u64;
    match algo {
        Algo::AllReduceTwoShot | Algo::Broadcast => aliased || !overlap,
        Algo::AllGather | Algo::ReduceScatter | Algo::AllToAll => !overlap,
        _ => false,
    }
}

/// The grid of a bulk kernel whose rounds move `round_bytes` per pair: a block per
/// [`BYTES_PER_BLOCK`], at most [`BULK_BLOCKS`]. `round_bytes` must be agreed by all ranks.
pub(crate) fn bulk_blocks(round_bytes: usize) -> u32 {
    round_bytes
        .div_ceil(BYTES_PER_BLOCK)
        .clamp(1, BULK_BLOCKS as usize) as u32
}

/// The segment of a two-shot allreduce of `count` elements of `elem` bytes on `size` ranks:
/// elements per rank, rounded up so that every segment starts 16-byte aligned.
pub(crate) fn segment(count: usize, elem: usize, size: usize) -> usize {
    let per = count.div_ceil(size.max(1));
    let align = 16 / elem;
    per.div_ceil(align) * align
}

#[cfg(test)]
mod tests;
