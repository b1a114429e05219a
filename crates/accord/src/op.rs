//! The op descriptor: one collective call as every engine sees it.
//!
//! A call starts as what the caller passed (an [`OpKind`], an element type, a reduce operator, a
//! root, and the lengths of its send and receive buffers, with per-rank counts where the call has
//! them). [`Op::new`] checks all of it against the communicator's rank and size, once, and gives
//! an [`Op`]: the [`Collective`] to compute (what algorithms and kernels need to know about sizes)
//! and the [`Fingerprint`] every rank must agree on. Host engines (schedules over a transport,
//! shared memory), device engines (NCCL) and the Python binding all take an `Op`; none checks the
//! arguments again.

use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, OpKind};
use std::time::{Duration, Instant};

/// What is being computed, with everything an algorithm needs to know about sizes.
///
/// Counts are in elements. Variable-size operations lay blocks out contiguously in rank order
/// (block `i` starts at the sum of the counts before it). `In` and `Out` name the caller's send
/// and receive buffers as [`crate::schedule`] sees them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Synchronise; no data.
    Barrier,
    /// `Out` (count elements) of `root` is copied to every rank's `Out`. `In` is unused.
    Broadcast {
        /// Elements.
        count: usize,
        /// Source rank.
        root: usize,
    },
    /// Every rank's `In` (count) is reduced into `root`'s `Out` (count). Other ranks' `Out` may be
    /// used as scratch and is left unspecified.
    Reduce {
        /// Elements.
        count: usize,
        /// Destination rank.
        root: usize,
    },
    /// Every rank's `In` is reduced into every rank's `Out`.
    AllReduce {
        /// Elements.
        count: usize,
    },
    /// Rank `i`'s `In` (counts\[i\]) lands in block `i` of every rank's `Out` (sum of counts).
    AllGather {
        /// Per-rank block sizes.
        counts: Vec<usize>,
    },
    /// Like [`Collective::AllGather`] but only `root`'s `Out` is filled.
    Gather {
        /// Per-rank block sizes.
        counts: Vec<usize>,
        /// Destination rank.
        root: usize,
    },
    /// Block `i` of `root`'s `In` (sum of counts) lands in rank `i`'s `Out` (counts\[i\]).
    Scatter {
        /// Per-rank block sizes.
        counts: Vec<usize>,
        /// Source rank.
        root: usize,
    },
    /// Every rank's `In` (sum of counts) is reduced; block `i` of the result lands in rank `i`'s
    /// `Out` (counts\[i\]).
    ReduceScatter {
        /// Per-rank block sizes.
        counts: Vec<usize>,
    },
    /// Block `j` of this rank's `In` goes to rank `j`; block `j` of `Out` comes from rank `j`.
    /// Counts are this rank's own: what it sends to and receives from each peer.
    AllToAll {
        /// Elements sent to each rank.
        send_counts: Vec<usize>,
        /// Elements received from each rank.
        recv_counts: Vec<usize>,
    },
    /// Prefix reduction: rank `r`'s `Out` (count) gets the reduction of the `In` of ranks
    /// `0..=r` (inclusive) or `0..r` (exclusive; rank 0's `Out` is then left as it was, as MPI
    /// leaves it undefined).
    Scan {
        /// Elements.
        count: usize,
        /// Whether rank `r`'s own input is left out (MPI's `Exscan`).
        exclusive: bool,
    },
}

impl Collective {
    /// The operation kind (for algorithm tables and environment overrides).
    pub fn kind(&self) -> OpKind {
        match self {
            Collective::Barrier => OpKind::Barrier,
            Collective::Broadcast { .. } => OpKind::Broadcast,
            Collective::Reduce { .. } => OpKind::Reduce,
            Collective::AllReduce { .. } => OpKind::AllReduce,
            Collective::AllGather { .. } => OpKind::AllGather,
            Collective::Gather { .. } => OpKind::Gather,
            Collective::Scatter { .. } => OpKind::Scatter,
            Collective::ReduceScatter { .. } => OpKind::ReduceScatter,
            Collective::AllToAll { .. } => OpKind::AllToAll,
            Collective::Scan {
                exclusive: false, ..
            } => OpKind::Scan,
            Collective::Scan {
                exclusive: true, ..
            } => OpKind::ExScan,
        }
    }

    /// Elements this rank's `In` must hold.
    pub fn in_len(&self, rank: usize) -> usize {
        match self {
            Collective::Barrier | Collective::Broadcast { .. } => 0,
            Collective::Reduce { count, .. }
            | Collective::AllReduce { count }
            | Collective::Scan { count, .. } => *count,
            Collective::AllGather { counts } | Collective::Gather { counts, .. } => counts[rank],
            Collective::Scatter { counts, root } => {
                if rank == *root {
                    counts.iter().sum()
                } else {
                    0
                }
            }
            Collective::ReduceScatter { counts } => counts.iter().sum(),
            Collective::AllToAll { send_counts, .. } => send_counts.iter().sum(),
        }
    }

    /// Elements this rank's `Out` must hold.
    pub fn out_len(&self, rank: usize) -> usize {
        match self {
            Collective::Barrier => 0,
            Collective::Broadcast { count, .. }
            | Collective::AllReduce { count }
            | Collective::Scan { count, .. } => *count,
            Collective::Reduce { count, .. } => *count,
            Collective::AllGather { counts } => counts.iter().sum(),
            Collective::Gather { counts, root } => {
                if rank == *root {
                    counts.iter().sum()
                } else {
                    0
                }
            }
            Collective::Scatter { counts, .. } | Collective::ReduceScatter { counts } => {
                counts[rank]
            }
            Collective::AllToAll { recv_counts, .. } => recv_counts.iter().sum(),
        }
    }

    /// The same collective counted in elements `k` times smaller (every count times `k`):
    /// how an engine that lacks a type runs it on that type's bytes or components.
    pub fn scaled(&self, k: usize) -> Collective {
        let mul = |v: &[usize]| v.iter().map(|c| c * k).collect::<Vec<_>>();
        match self {
            Collective::Barrier => Collective::Barrier,
            Collective::Broadcast { count, root } => Collective::Broadcast {
                count: count * k,
                root: *root,
            },
            Collective::Reduce { count, root } => Collective::Reduce {
                count: count * k,
                root: *root,
            },
            Collective::AllReduce { count } => Collective::AllReduce { count: count * k },
            Collective::Scan { count, exclusive } => Collective::Scan {
                count: count * k,
                exclusive: *exclusive,
            },
            Collective::AllGather { counts } => Collective::AllGather {
                counts: mul(counts),
            },
            Collective::Gather { counts, root } => Collective::Gather {
                counts: mul(counts),
                root: *root,
            },
            Collective::Scatter { counts, root } => Collective::Scatter {
                counts: mul(counts),
                root: *root,
            },
            Collective::ReduceScatter { counts } => Collective::ReduceScatter {
                counts: mul(counts),
            },
            Collective::AllToAll {
                send_counts,
                recv_counts,
            } => Collective::AllToAll {
                send_counts: mul(send_counts),
                recv_counts: mul(recv_counts),
            },
        }
    }

    /// Total payload in elements, for the cost model (the largest per-rank buffer).
    pub fn elements(&self) -> usize {
        match self {
            Collective::Barrier => 0,
            Collective::Broadcast { count, .. }
            | Collective::Reduce { count, .. }
            | Collective::AllReduce { count }
            | Collective::Scan { count, .. } => *count,
            Collective::AllGather { counts }
            | Collective::Gather { counts, .. }
            | Collective::Scatter { counts, .. }
            | Collective::ReduceScatter { counts } => counts.iter().sum(),
            Collective::AllToAll {
                send_counts,
                recv_counts,
            } => send_counts
                .iter()
                .sum::<usize>()
                .max(recv_counts.iter().sum()),
        }
    }
}

/// One side of a call as the caller passed it: its length in elements, and the per-rank counts
/// when the caller partitioned it (the `v` variants: allgatherv's receive side, scatterv's send
/// side...).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extent<'a> {
    /// Elements in the buffer.
    pub len: usize,
    /// Per-rank block sizes, if the caller gave them.
    pub counts: Option<&'a [usize]>,
}

impl<'a> Extent<'a> {
    /// A buffer of `len` elements without per-rank counts.
    pub fn len(len: usize) -> Self {
        Extent { len, counts: None }
    }

    /// A buffer of `len` elements laid out in per-rank blocks of `counts`.
    pub fn parts(len: usize, counts: &'a [usize]) -> Self {
        Extent {
            len,
            counts: Some(counts),
        }
    }
}

/// What a caller asked for, before it is checked: the input of [`Op::new`].
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The collective, without `v` (per-rank counts make a call variable-sized).
    pub kind: OpKind,
    /// Element type of both buffers.
    pub dtype: DataType,
    /// The reduce operator, for reducing collectives.
    pub reduce: Option<ReduceOp>,
    /// The root, for rooted collectives.
    pub root: Option<usize>,
    /// The send buffer; `None` for a call in place (the receive buffer holds the input).
    pub send: Option<Extent<'a>>,
    /// The receive buffer (for broadcast, the buffer).
    pub recv: Extent<'a>,
}

/// A checked collective call: what to compute and what every rank must agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// What to compute, with sizes.
    pub coll: Collective,
    /// What every rank of the call must agree on; carried by every frame.
    pub fp: Fingerprint,
    /// Element type.
    pub dtype: DataType,
    /// Reduce operator (reducing collectives only).
    pub reduce: Option<ReduceOp>,
    /// Whether the caller passed no send buffer (the receive buffer is also the input).
    pub in_place: bool,
}

impl Op {
    /// The barrier.
    pub fn barrier() -> Op {
        Op {
            coll: Collective::Barrier,
            fp: Fingerprint::new(OpKind::Barrier, DataType::U8, 0),
            dtype: DataType::U8,
            reduce: None,
            in_place: true,
        }
    }

    /// Check `req` as rank `rank` of a communicator of `size` ranks.
    ///
    /// Checks: the reduce operator is given exactly where needed and supports the dtype; the
    /// root is a rank; per-rank counts have one entry per rank; every buffer this rank uses
    /// has the length the call needs (buffers used only at the root may have any length
    /// elsewhere: they are not touched).
    #[inline(always)]
    pub fn new(req: Request<'_>, rank: usize, size: usize) -> Result<Op> {
        let Request {
            kind,
            dtype,
            reduce,
            root,
            send,
            recv,
        } = req;
        let reduces = matches!(
            kind,
            OpKind::AllReduce
                | OpKind::Reduce
                | OpKind::ReduceScatter
                | OpKind::Scan
                | OpKind::ExScan
        );
        match (reduces, reduce) {
            (true, Some(ReduceOp::Avg)) if matches!(kind, OpKind::Scan | OpKind::ExScan) => {
                return Err(Error::invalid(format!(
                    "{kind}: reduce op avg is not defined for prefix reductions (each rank's \
                     prefix has its own length); use sum and divide by rank + 1"
                )))
            }
            (true, Some(op)) => op.check(dtype)?,
            (true, None) => return Err(Error::invalid(format!("{kind} needs a reduce operator"))),
            (false, Some(_)) => {
                return Err(Error::invalid(format!("{kind} takes no reduce operator")))
            }
            (false, None) => {}
        }
        let rooted = matches!(
            kind,
            OpKind::Broadcast | OpKind::Reduce | OpKind::Gather | OpKind::Scatter
        );
        let root = match (rooted, root) {
            (true, Some(r)) if r < size => Some(r),
            (true, Some(r)) => {
                return Err(Error::invalid(format!(
                    "{kind}: root {r} is not a rank of a communicator of size {size}"
                )))
            }
            (true, None) => return Err(Error::invalid(format!("{kind} needs a root"))),
            (false, Some(_)) => return Err(Error::invalid(format!("{kind} takes no root"))),
            (false, None) => None,
        };
        let counts_of = |e: Option<Extent<'_>>| -> Result<Option<Vec<usize>>> {
            match e.and_then(|e| e.counts) {
                None => Ok(None),
                Some(c) if c.len() == size => Ok(Some(c.to_vec())),
                Some(c) => Err(Error::invalid(format!(
                    "{kind}: counts has {} entries but the communicator has {size} ranks",
                    c.len()
                ))),
            }
        };
        let send_counts = counts_of(send)?;
        let recv_counts = counts_of(Some(recv))?;
        let in_place = send.is_none();
        let send_len = send.map(|s| s.len);
        let is_root = root == Some(rank);

        let (coll, kind) =
            match kind {
                OpKind::Barrier => return Ok(Op::barrier()),
                OpKind::Broadcast => (
                    Collective::Broadcast {
                        count: recv.len,
                        root: root.unwrap_or(0),
                    },
                    kind,
                ),
                OpKind::AllReduce => (Collective::AllReduce { count: recv.len }, kind),
                OpKind::Scan | OpKind::ExScan => (
                    Collective::Scan {
                        count: recv.len,
                        exclusive: kind == OpKind::ExScan,
                    },
                    kind,
                ),
                OpKind::Reduce => {
                    // Non-roots may pass no receive buffer: the count comes from what they send.
                    let count = match send_len {
                        Some(n) if !is_root || !in_place => n,
                        _ => recv.len,
                    };
                    let root = root.unwrap_or(0);
                    (Collective::Reduce { count, root }, kind)
                }
                OpKind::AllGather | OpKind::Gather => {
                    let own = send_len.ok_or_else(|| no_send(kind))?;
                    let v = recv_counts.is_some();
                    let counts = recv_counts.unwrap_or_else(|| vec![own; size]);
                    match (kind, root) {
                        (OpKind::Gather, Some(root)) => (
                            Collective::Gather { counts, root },
                            if v { OpKind::GatherV } else { kind },
                        ),
                        _ => (
                            Collective::AllGather { counts },
                            if v { OpKind::AllGatherV } else { kind },
                        ),
                    }
                }
                OpKind::Scatter | OpKind::ReduceScatter => {
                    if send.is_none() {
                        return Err(no_send(kind));
                    }
                    let v = send_counts.is_some();
                    let counts = send_counts.unwrap_or_else(|| vec![recv.len; size]);
                    match (kind, root) {
                        (OpKind::Scatter, Some(root)) => (
                            Collective::Scatter { counts, root },
                            if v { OpKind::ScatterV } else { kind },
                        ),
                        _ => (
                            Collective::ReduceScatter { counts },
                            if v { OpKind::ReduceScatterV } else { kind },
                        ),
                    }
                }
                OpKind::AllToAll => {
                    let total = send_len.ok_or_else(|| no_send(kind))?;
                    match (send_counts, recv_counts) {
                        (Some(s), Some(r)) => (
                            Collective::AllToAll {
                                send_counts: s,
                                recv_counts: r,
                            },
                            OpKind::AllToAllV,
                        ),
                        (None, None) => {
                            if total % size != 0 {
                                return Err(Error::invalid(format!(
                                "alltoall: send buffer has {total} elements, not a multiple of \
                                 the {size} ranks"
                            )));
                            }
                            let counts = vec![total / size; size];
                            let coll = Collective::AllToAll {
                                send_counts: counts.clone(),
                                recv_counts: counts,
                            };
                            (coll, kind)
                        }
                        _ => return Err(Error::invalid(
                            "alltoallv: give per-rank counts for both the send and the receive \
                             buffer",
                        )),
                    }
                }
                other => {
                    return Err(Error::invalid(format!(
                        "{other} is not a collective an op describes"
                    )))
                }
            };
        let op = Op {
            fp: fingerprint(kind, dtype, reduce, root, &coll),
            coll,
            dtype,
            reduce,
            in_place,
        };
        op.check_lengths(rank, send_len, recv.len)?;
        Ok(op)
    }

    /// The operation kind, `v` variants included.
    pub fn kind(&self) -> OpKind {
        self.fp.kind
    }

    /// The root, for rooted collectives.
    pub fn root(&self) -> Option<usize> {
        self.fp.root.map(|r| r as usize)
    }

    /// The reduce operator, `Sum` where the collective does not reduce (engines need one).
    pub fn reduce_or_sum(&self) -> ReduceOp {
        self.reduce.unwrap_or(ReduceOp::Sum)
    }

    /// Bytes of the largest buffer of one rank: what engine selection and cost models weigh.
    pub fn bytes(&self) -> usize {
        self.coll.elements() * self.dtype.size()
    }

    /// Elements this rank's send buffer must hold (0 if it sends nothing).
    pub fn send_len(&self, rank: usize) -> usize {
        self.coll.in_len(rank)
    }

    /// Elements this rank's receive buffer must hold (0 if nothing lands here).
    pub fn recv_len(&self, rank: usize) -> usize {
        self.coll.out_len(rank)
    }

    /// Check this rank's buffer lengths (elements). Buffers that matter only at the root
    /// (scatter's and broadcast's send, gather's and reduce's receive) may have any length
    /// elsewhere: they are not touched.
    #[inline(always)]
    fn check_lengths(&self, rank: usize, send: Option<usize>, recv: usize) -> Result<()> {
        let kind = self.kind();
        let (send_at_root_only, recv_at_root_only) = match self.coll {
            Collective::Scatter { root, .. } => (root != rank, false),
            Collective::Broadcast { root, .. } => (root != rank, false),
            Collective::Gather { root, .. } | Collective::Reduce { root, .. } => {
                (false, root != rank)
            }
            _ => (false, false),
        };
        if let Some(got) = send {
            let need = match self.coll {
                Collective::Broadcast { count, .. } => count,
                _ => self.send_len(rank),
            };
            if !send_at_root_only && got != need {
                return Err(wrong_len(kind, "send buffer", got, need));
            }
        }
        let need = self.recv_len(rank);
        if !recv_at_root_only && recv != need {
            let what = if send.is_none() {
                "buffer"
            } else {
                "receive buffer"
            };
            return Err(wrong_len(kind, what, recv, need));
        }
        Ok(())
    }
}

/// The fingerprint of a call: every field a rank could disagree on. Per-rank counts all ranks
/// pass the same (allgatherv, gatherv, scatterv, reduce_scatterv) are hashed; alltoallv's counts
/// are each rank's own, so they are not compared.
#[inline(always)]
fn fingerprint(
    kind: OpKind,
    dtype: DataType,
    reduce: Option<ReduceOp>,
    root: Option<usize>,
    coll: &Collective,
) -> Fingerprint {
    let count = match coll {
        Collective::Barrier => 0,
        Collective::Broadcast { count, .. }
        | Collective::Reduce { count, .. }
        | Collective::AllReduce { count }
        | Collective::Scan { count, .. } => *count,
        Collective::AllGather { counts }
        | Collective::Gather { counts, .. }
        | Collective::Scatter { counts, .. }
        | Collective::ReduceScatter { counts } => counts[0],
        Collective::AllToAll { send_counts, .. } => send_counts[0],
    };
    let mut fp = Fingerprint::new(kind, dtype, count);
    match (kind, coll) {
        (OpKind::AllToAllV, _) => fp.count = 0,
        (
            OpKind::AllGatherV | OpKind::GatherV | OpKind::ScatterV | OpKind::ReduceScatterV,
            Collective::AllGather { counts }
            | Collective::Gather { counts, .. }
            | Collective::Scatter { counts, .. }
            | Collective::ReduceScatter { counts },
        ) => {
            fp.count = 0;
            fp = fp.with_counts(counts);
        }
        _ => {}
    }
    if let Some(op) = reduce {
        fp = fp.with_op(op);
    }
    if let Some(r) = root {
        fp = fp.with_root(r);
    }
    fp
}

/// One operation in flight, as an engine runs it: which call of which communicator, what every
/// rank agreed on, and its deadline. Built from an [`Op`] ([`Op::call`]) or, for point-to-point
/// messages, from their own fingerprint.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call<'a> {
    /// Communicator id (frames and wait records carry it).
    pub comm_id: u64,
    /// Communicator name, for messages.
    pub comm_name: &'a str,
    /// The call's sequence number on its communicator.
    pub seq: u64,
    /// What every rank of the call must agree on.
    pub fp: Fingerprint,
    /// Element type the engine computes in (f32 for a widened f16/bf16 average).
    pub dtype: DataType,
    /// Reduce operator (`Sum` where the collective does not reduce).
    pub op: ReduceOp,
    /// How long the call may wait (`set_timeout`): its waits for peers end by its start plus
    /// this.
    pub timeout: Duration,
    /// Where the call is a step of a larger one (a hierarchical collective's step between
    /// hosts), that one's deadline: the step's waits end then, not `timeout` after the step
    /// began, so the whole call keeps one deadline.
    pub until: Option<Instant>,
}

impl Call<'_> {
    /// The instant this call's waits end by, reading the clock only when it is not a step
    /// with a deadline of its own.
    pub fn deadline(&self) -> Instant {
        self.until.unwrap_or_else(|| Instant::now() + self.timeout)
    }
}

impl Op {
    /// This op as call `seq` of communicator `comm_id`, a step of a larger call ending by
    /// `until` where given.
    pub(crate) fn call<'a>(
        &self,
        comm_id: u64,
        comm_name: &'a str,
        seq: u64,
        timeout: Duration,
        until: Option<Instant>,
    ) -> Call<'a> {
        Call {
            comm_id,
            comm_name,
            seq,
            fp: self.fp,
            dtype: self.dtype,
            op: self.reduce_or_sum(),
            timeout,
            until,
        }
    }
}

fn no_send(kind: OpKind) -> Error {
    Error::invalid(format!(
        "{kind} needs a send buffer (it has no in-place form)"
    ))
}

fn wrong_len(kind: OpKind, what: &str, got: usize, want: usize) -> Error {
    Error::invalid(format!(
        "{kind}: {what} has {got} elements but this call needs {want}"
    ))
}

#[cfg(test)]
mod tests;
