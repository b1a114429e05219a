//! The algorithm library: which algorithms apply to a collective, and building their schedules.
//!
//! Every algorithm works for any world size (not only powers of two), any root and any block
//! sizes (including zero), never sends to itself, and cannot deadlock under the execution
//! semantics of [`super`]; [`super::check::verify`] proves this for small worlds.

use super::{
    agreement, allgather, allreduce, alltoall, barrier, broadcast, gather_scatter, reduce,
    reduce_scatter, scan,
};
use super::{Algorithm, Collective, Schedule};
use crate::error::{Error, Result};
use Algorithm::*;

/// Algorithms that can compute `coll`, in order of preference when costs tie.
pub fn applicable(coll: &Collective) -> &'static [Algorithm] {
    match coll {
        Collective::Barrier => &[Dissemination, Direct],
        Collective::Broadcast { .. } => &[BinomialTree, ScatterAllgather, Ring, Direct],
        Collective::Reduce { .. } => &[BinomialTree, Rabenseifner, Direct],
        Collective::AllReduce { .. } => &[Ring, RecursiveDoubling, Rabenseifner, Direct],
        Collective::AllGather { .. } => &[Ring, RecursiveDoubling, Bruck, Direct],
        Collective::Gather { .. } | Collective::Scatter { .. } => &[BinomialTree, Direct],
        Collective::ReduceScatter { .. } => &[Ring, Rabenseifner, Direct],
        Collective::Scan { .. } => &[RecursiveDoubling],
        Collective::AllToAll {
            send_counts,
            recv_counts,
        } => {
            if alltoall::uniform(send_counts, recv_counts) {
                &[Pairwise, Bruck, Direct]
            } else {
                &[Pairwise, Direct]
            }
        }
    }
}

/// Build `rank`'s schedule for `coll` in a world of `world` ranks with `algo`.
///
/// Fails with [`Error::Unsupported`] if `algo` does not apply to `coll`, and with
/// [`Error::InvalidArgument`] if the sizes do not fit the world (wrong number of counts, a rank
/// or root outside the world).
pub fn build(coll: &Collective, world: usize, rank: usize, algo: Algorithm) -> Result<Schedule> {
    validate(coll, world, rank)?;
    if !applicable(coll).contains(&algo) {
        return Err(Error::Unsupported(format!(
            "{} has no {algo} algorithm (available: {})",
            coll.kind().name(),
            names(applicable(coll))
        )));
    }
    let (p, r) = (world, rank);
    let sched = match coll {
        Collective::Barrier => match algo {
            Dissemination => barrier::dissemination(p, r),
            _ => barrier::direct(p, r),
        },
        &Collective::Broadcast { count, root } => match algo {
            BinomialTree => broadcast::binomial(count, root, p, r),
            ScatterAllgather => broadcast::scatter_allgather(count, root, p, r),
            Ring => broadcast::ring(count, root, p, r),
            _ => broadcast::direct(count, root, p, r),
        },
        &Collective::Reduce { count, root } => match algo {
            BinomialTree => reduce::binomial(count, root, p, r),
            Rabenseifner => reduce::rabenseifner(count, root, p, r),
            _ => reduce::direct(count, root, p, r),
        },
        &Collective::AllReduce { count } => match algo {
            Ring => allreduce::ring(count, p, r),
            RecursiveDoubling => allreduce::recursive_doubling(count, p, r),
            Rabenseifner => allreduce::rabenseifner(count, p, r),
            _ => allreduce::direct(count, p, r),
        },
        Collective::AllGather { counts } => match algo {
            Ring => allgather::ring(counts, p, r),
            RecursiveDoubling => allgather::recursive_doubling(counts, p, r),
            Bruck => allgather::bruck(counts, p, r),
            _ => allgather::direct(counts, p, r),
        },
        Collective::Gather { counts, root } => match algo {
            BinomialTree => gather_scatter::gather_binomial(counts, *root, p, r),
            _ => gather_scatter::gather_direct(counts, *root, p, r),
        },
        Collective::Scatter { counts, root } => match algo {
            BinomialTree => gather_scatter::scatter_binomial(counts, *root, p, r),
            _ => gather_scatter::scatter_direct(counts, *root, p, r),
        },
        Collective::ReduceScatter { counts } => match algo {
            Ring => reduce_scatter::ring(counts, p, r),
            Rabenseifner => reduce_scatter::rabenseifner(counts, p, r),
            _ => reduce_scatter::direct(counts, p, r),
        },
        Collective::AllToAll {
            send_counts,
            recv_counts,
        } => match algo {
            Pairwise => alltoall::pairwise(send_counts, recv_counts, p, r),
            Bruck => alltoall::bruck(send_counts.first().copied().unwrap_or(0), p, r),
            _ => alltoall::direct(send_counts, recv_counts, p, r),
        },
        &Collective::Scan { count, exclusive } => scan::recursive_doubling(count, exclusive, p, r),
    };
    Ok(if needs_tokens(coll, algo) {
        agreement::with_agreement(coll, algo, p, r, sched)
    } else {
        sched
    })
}

/// Whether data flows only from or to one root, so that the schedule needs the tokens of
/// [`agreement`]; the binomial broadcast and reduce carry their agreement in their own rounds.
pub(crate) fn needs_tokens(coll: &Collective, algo: Algorithm) -> bool {
    match coll {
        Collective::Broadcast { .. } | Collective::Reduce { .. } => algo != BinomialTree,
        Collective::Gather { .. } | Collective::Scatter { .. } => true,
        _ => false,
    }
}

/// `ring, direct`.
fn names(algos: &[Algorithm]) -> String {
    algos
        .iter()
        .map(|a| a.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reject sizes that do not describe a call in a world of `world` ranks.
fn validate(coll: &Collective, world: usize, rank: usize) -> Result<()> {
    if world == 0 || rank >= world {
        return Err(Error::invalid(format!(
            "rank {rank} is not in a world of {world}"
        )));
    }
    let root = match coll {
        Collective::Broadcast { root, .. }
        | Collective::Reduce { root, .. }
        | Collective::Gather { root, .. }
        | Collective::Scatter { root, .. } => Some(*root),
        _ => None,
    };
    if let Some(root) = root.filter(|&root| root >= world) {
        return Err(Error::invalid(format!(
            "root {root} is not in a world of {world}"
        )));
    }
    let lens: &[&Vec<usize>] = match coll {
        Collective::AllGather { counts }
        | Collective::Gather { counts, .. }
        | Collective::Scatter { counts, .. }
        | Collective::ReduceScatter { counts } => &[counts],
        Collective::AllToAll {
            send_counts,
            recv_counts,
        } => &[send_counts, recv_counts],
        _ => &[],
    };
    match lens.iter().find(|c| c.len() != world) {
        Some(c) => Err(Error::invalid(format!(
            "{} needs one count per rank ({world}), got {}",
            coll.kind().name(),
            c.len()
        ))),
        None => Ok(()),
    }
}
