//! Collectives across hosts, composed from the engines: shared memory inside each host
//! ([`ShmWorld`]'s host steps), the host leaders' communicator (TCP) between them.
//!
//! Large allreduces are *striped* where every host has the same number of ranks `R > 1`: after
//! the host's reduction, local rank `i` of every host reduces the `i`-th of `R` slices with the
//! `i`-th ranks of the other hosts (its stripe communicator), so the network carries `R`
//! streams of a slice each instead of one leader's stream of everything, and the reduction work
//! between hosts is shared; each rank then broadcasts its slice inside the host. Every rank
//! takes part in a stripe, so ranks of different hosts that disagree about the call all fail.
//! Reduce-scatter and allgather of equal blocks go over the same stripes (`blocks`).
//!
//! Other collectives, and worlds whose hosts have different rank counts for the striped ones,
//! take a schedule over the point-to-point transport.

mod blocks;

use super::*;
use crate::engine::HostEngine;
use crate::op::Call;
use crate::shm_coll::ShmWorld;

/// Allreduce, broadcast, reduce-scatter and allgather over hosts: `world` places the ranks, `leaders` is the communicator
/// of the lowest rank of each host (present on leaders only).
pub(super) struct Hierarchy {
    pub world: Arc<ShmWorld>,
    pub leaders: Option<Communicator>,
    /// This rank's stripe: the ranks of its local index on every host, where every host has
    /// the same number of ranks (more than one).
    pub stripe: Option<Stripe>,
    /// This rank and the world size.
    pub me: usize,
    pub size: usize,
}

/// A rank's place among the stripes of a striped allreduce.
pub(super) struct Stripe {
    pub comm: Communicator,
    /// This rank's index on its host, and the number of ranks per host.
    pub index: usize,
    pub per_host: usize,
    /// Every world rank's block's place when blocks are ordered by stripe, then host.
    pub slots: Vec<usize>,
}

/// Allreduces of at least this many bytes are striped (where hosts have equal rank counts;
/// `ACCORD_HIER_STRIPE_BYTES`, which every rank must set alike).
/// Measured over network namespaces on 16 CPUs: from 1 MiB striping took 2 x 2 and 4 x 2 ranks
/// from 1.2-1.7x OpenMPI's time to 0.8-1.08x; at 256 KiB it helped 2 x 2 (1.18 to 1.00x) and
/// hurt 4 x 2 (1.58 to 1.76x).
pub const STRIPE_MIN_BYTES: usize = 1 << 20;

/// Reduce-scatters and allgathers whose whole buffer is below this many bytes go over the
/// stripes (`ACCORD_HIER_BLOCKS_BYTES`, alike on every rank); larger ones take one schedule over
/// the transport, which overlaps its shared-memory and network steps where the stripes run
/// them one after the other. Measured over network namespaces on 16 CPUs against that
/// schedule: up to 256 KiB the stripes took 0.68-1.03x its time (2 x 2 and 4 x 2 ranks), at
/// 1 MiB 0.88-1.45x, from 4 MiB 1.05-1.73x. Over a real network, which carries less this way,
/// the balance may lie higher.
pub const BLOCKS_MAX_BYTES: usize = 1 << 20;

/// Element range `[start, start + len)` of slice `i` of `count` elements cut in `parts`.
fn slice(count: usize, parts: usize, i: usize) -> (usize, usize) {
    let (base, extra) = (count / parts, count % parts);
    (i * base + i.min(extra), base + usize::from(i < extra))
}

impl Hierarchy {
    /// The stripe communicator of rank `me` of `comm`, if hosts have equal rank counts `> 1`.
    pub(super) fn stripe_of(comm: &Communicator, world: &ShmWorld, me: usize) -> Option<Stripe> {
        let hosts = world.leaders.len();
        let on = |h: usize| (0..world.host_of.len()).filter(move |&r| world.host_of[r] == h);
        let per_host = on(0).count();
        if hosts < 2 || per_host < 2 || (1..hosts).any(|h| on(h).count() != per_host) {
            return None;
        }
        let index = on(world.host_of[me]).position(|r| r == me)?;
        if index != world.local_index(me) {
            return None; // not the host group's order: keep the leaders' path
        }
        let members: Vec<usize> = (0..hosts).map(|h| on(h).nth(index).unwrap()).collect();
        let label = format!("stripe{index}");
        let comm = comm.child(&members, u64::MAX - 1, &label, 0x5354_5250 + index as u64);
        Some(Stripe {
            comm,
            index,
            per_host,
            slots: blocks::stripe_slots(&world.host_of, hosts),
        })
    }
}

impl HostEngine for Hierarchy {
    fn name(&self) -> &'static str {
        "shared memory within hosts, TCP between leaders or stripes"
    }

    fn supports(&self, op: &Op) -> bool {
        match &op.coll {
            Collective::AllGather { counts } | Collective::ReduceScatter { counts } => {
                self.stripes_carry(counts, op.dtype.size())
            }
            coll => self.world.supports(coll, &op.fp),
        }
    }

    fn run(&self, call: &Call<'_>, op: &Op, input: Option<&[u8]>, output: &mut [u8]) -> Result<()> {
        let (world, leaders, me) = (&*self.world, self.leaders.as_ref(), self.me);
        let host = world.host_of[me];
        let leader = world.leaders[host];
        let deadline = Instant::now() + call.timeout;
        match op.coll {
            Collective::AllReduce { count } => {
                let out = output.as_mut_ptr();
                let inp = input.map_or(out as *const u8, <[u8]>::as_ptr);
                // Sum-like partial results per host; Avg is finished once, over the world.
                world.host_allreduce(call, deadline, inp, out, count)?;
                let reduce = blocks::sum_like(call.op);
                let esz = call.dtype.size();
                let striped = self.stripe.as_ref().filter(|s| {
                    count * esz >= crate::config::get().hier_stripe_bytes && count >= s.per_host
                });
                if let Some(s) = striped {
                    let (start, len) = slice(count, s.per_host, s.index);
                    tracing::debug!(stripe = s.index, start, len, "striped allreduce");
                    let step = Op {
                        coll: Collective::AllReduce { count: len },
                        reduce: Some(reduce),
                        in_place: true,
                        ..op.clone()
                    };
                    let mine = &mut output[start * esz..(start + len) * esz];
                    s.comm.run_as(&step, None, mine)?;
                    for j in 0..s.per_host {
                        let (start, len) = slice(count, s.per_host, j);
                        // SAFETY: slice j lies inside the count elements of `output`.
                        let at = unsafe { output.as_mut_ptr().add(start * esz) };
                        world.host_broadcast(call, deadline, at, len, j)?;
                    }
                    // Every slice's root waits until its host has read it: a root that returned
                    // and closed its communicator would leave readers of its slice failing.
                    world.host_barrier(call, deadline)?;
                    dtype::finalize(call.dtype, call.op, output, self.size);
                    return Ok(());
                }
                if me == leader {
                    let step = Op {
                        coll: Collective::AllReduce { count },
                        reduce: Some(reduce),
                        in_place: true,
                        ..op.clone()
                    };
                    leaders
                        .expect("leader communicator")
                        .run_as(&step, None, output)?;
                }
                world.host_broadcast(call, deadline, output.as_mut_ptr(), count, 0)?;
                dtype::finalize(call.dtype, call.op, output, self.size);
                Ok(())
            }
            Collective::Broadcast { count, root } => {
                let out = output.as_mut_ptr();
                let root_host = world.host_of[root];
                if host == root_host {
                    world.host_broadcast(call, deadline, out, count, world.local_index(root))?;
                }
                if me == leader {
                    // The world call's fingerprint names the world root: leaders whose ranks
                    // disagree on it (even on a root of the same host) fail here.
                    let step = Op {
                        coll: Collective::Broadcast {
                            count,
                            root: root_host,
                        },
                        ..op.clone()
                    };
                    leaders
                        .expect("leader communicator")
                        .run_as(&step, None, output)?;
                }
                if host != root_host {
                    world.host_broadcast(call, deadline, output.as_mut_ptr(), count, 0)?;
                } else {
                    // The root's host had its data first; it waits for its leader's step, so
                    // that a disagreement between hosts fails every rank, not only the leaders.
                    world.host_barrier(call, deadline)?;
                }
                Ok(())
            }
            Collective::ReduceScatter { ref counts } => {
                let input = input.ok_or_else(|| no_input(call))?;
                self.reduce_scatter(call, op, deadline, input, output, counts[0])
            }
            Collective::AllGather { ref counts } => {
                let input = input.ok_or_else(|| no_input(call))?;
                self.allgather(call, op, deadline, input, output, counts[0])
            }
            _ => Err(Error::Unsupported(format!(
                "internal: {} on the hierarchical path",
                call.fp
            ))),
        }
    }
}

/// Reduce-scatter and allgather always have a send buffer (the op's checks require one).
fn no_input(call: &Call<'_>) -> Error {
    Error::Unsupported(format!(
        "internal: {} on the hierarchical path without a send buffer",
        call.fp
    ))
}

#[cfg(test)]
mod tests {
    use super::slice;

    #[test]
    fn slices_cover_the_buffer_once_in_order() {
        for count in [0, 1, 2, 7, 1031, 40_009] {
            for parts in 1..=9 {
                let mut next = 0;
                for i in 0..parts {
                    let (start, len) = slice(count, parts, i);
                    assert_eq!(start, next, "count {count}, {parts} parts, slice {i}");
                    assert!(len == count / parts || len == count / parts + 1);
                    next = start + len;
                }
                assert_eq!(next, count);
            }
        }
    }
}
