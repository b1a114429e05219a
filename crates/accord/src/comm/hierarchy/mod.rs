//! Collectives across hosts, composed from the engines: shared memory inside each host
//! ([`ShmWorld`]'s host steps), the host leaders' communicator (TCP) between them.
//!
//! Large allreduces are *striped* where every host has the same number of ranks `R > 1`: the
//! host reduce-scatters the vector in `R` slices, local rank `i` of every host allreduces the
//! `i`-th slice with the `i`-th ranks of the other hosts (its stripe communicator), and the host
//! gathers the slices back. The network carries `R` streams of a slice each instead of one
//! leader's stream of everything, and the reductions inside and between hosts are shared. Every
//! rank takes part in a stripe, so ranks of different hosts that disagree about the call all
//! fail. Smaller allreduces reduce inside the host, then, on hosts of two ranks and while the
//! host's copies together stay below the striping size, every rank reduces its host's sums with
//! the other hosts' over its own stripe; else (and without stripes) the leaders do, and
//! broadcast the result inside their hosts.
//! Reduce-scatter and allgather of equal blocks, and regular all-to-all, go over the same
//! stripes below their limits (`blocks`).
//!
//! A barrier meets inside each host, then on the stripes (or between the leaders), then inside
//! each host again, whose ranks so leave together.
//!
//! A call keeps one deadline over all its steps: its steps between hosts end when the call's
//! timeout, counted from its start, runs out, however long the steps inside the host took.
//!
//! Other collectives, and worlds whose hosts have different rank counts for the striped ones,
//! take a schedule over the point-to-point transport.

mod blocks;

pub use blocks::PIPELINE_MIN_BYTES;

use super::*;
use crate::engine::HostEngine;
use crate::op::Call;
use crate::shm_coll::ShmWorld;

/// Allreduce, broadcast, reduce-scatter, allgather, all-to-all and barrier over hosts: `world`
/// places the ranks, `leaders` is the communicator of the lowest rank of each host (present on
/// leaders only).
///
/// Ranks that disagree about a call must meet somewhere to hear it: every path starts with a
/// step inside the host that compares the call, and its first step between hosts runs on the
/// rank's own stripe, or for leaders on the leaders' communicator, which is stripe 0's where
/// stripes exist (the same ranks in the same order).
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

/// A rank's place among the stripes (striped allreduce, reduce-scatter, allgather and
/// all-to-all).
pub(super) struct Stripe {
    pub comm: Communicator,
    /// This rank's index on its host, and the number of ranks per host.
    pub index: usize,
    pub per_host: usize,
    /// Every world rank's block's place when blocks are ordered by stripe, then host.
    pub slots: Vec<usize>,
    /// Every rank of the world without its engines, for the reduce-scatters, allgathers and
    /// all-to-alls too large for the stripes, of unequal blocks or of the v variant.
    pub flat: Communicator,
}

impl Stripe {
    /// The number of hosts (ranks of each stripe).
    pub fn hosts(&self) -> usize {
        self.slots.len() / self.per_host
    }

    /// Copy the world-ordered blocks of `bytes` bytes in `input` into `out` ordered by stripe,
    /// then host ([`Stripe::slots`]).
    pub fn order_by_stripe(&self, input: &[u8], out: &mut [u8], bytes: usize) {
        for (r, &slot) in self.slots.iter().enumerate() {
            out[slot * bytes..][..bytes].copy_from_slice(&input[r * bytes..][..bytes]);
        }
    }

    /// The reverse of [`Stripe::order_by_stripe`].
    pub fn order_by_rank(&self, by_stripe: &[u8], out: &mut [u8], bytes: usize) {
        for (r, &slot) in self.slots.iter().enumerate() {
            out[r * bytes..][..bytes].copy_from_slice(&by_stripe[slot * bytes..][..bytes]);
        }
    }
}

/// Allreduces of at least this many bytes are striped (where hosts have equal rank counts;
/// `ACCORD_HIER_STRIPE_BYTES`, which every rank must set alike).
/// Measured over network namespaces on 16 CPUs (2 x 2 and 4 x 2 ranks) against the leaders'
/// path: 0.74x its time at 64 KiB, 0.54-0.56x at 256 KiB, 0.97-1.11x at 16 KiB. Below it, while
/// the host's copies of the vector together stay below it too, every rank reduces the whole
/// vector over its stripe: 0.89-0.97x the leaders' time at 4 and 16 KiB over 4 x 2 namespaces
/// (measured with the barrier's change).
pub const STRIPE_MIN_BYTES: usize = 64 << 10;

/// Hosts of at most this many ranks run allreduces below [`STRIPE_MIN_BYTES`] whole on every
/// rank's stripe (while the host's copies together stay below it): measured with 2 ranks per
/// host. With more, every round carries that many copies per host, which the simulator prices
/// above the leaders' path where the calibration found a crowded round slow.
pub const WHOLE_STRIPES_MAX_RANKS: usize = 2;

/// Whether an allreduce of `bytes` below the striping size, across hosts of `per_host` ranks
/// with stripes, runs whole on every rank's stripe rather than between the leaders (the
/// engine's choice, which `accord sim` prices too).
pub fn allreduce_whole_on_stripes(bytes: usize, per_host: usize) -> bool {
    per_host <= WHOLE_STRIPES_MAX_RANKS && bytes * per_host < crate::config::get().hier_stripe_bytes
}

/// Whether an allreduce of `count` elements (`bytes` bytes) across hosts of `per_host` ranks
/// with stripes is striped, one slice per local rank (the engine's choice, which `accord sim`
/// prices too).
pub fn allreduce_striped(bytes: usize, count: usize, per_host: usize) -> bool {
    bytes >= crate::config::get().hier_stripe_bytes && count >= per_host
}

/// The pieces a striped allreduce of `bytes` bytes runs in: 4 from `ACCORD_HIER_PIPELINE_BYTES`
/// (default [`PIPELINE_MIN_BYTES`]), else 1.
pub fn allreduce_pieces(bytes: usize) -> usize {
    match bytes >= crate::config::get().hier_pipeline_bytes {
        true => blocks::PIECES,
        false => 1,
    }
}

/// Reduce-scatters and allgathers whose whole buffer is below this many bytes go over the
/// stripes (`ACCORD_HIER_BLOCKS_BYTES`, alike on every rank); larger ones take one schedule over
/// the transport, which overlaps its shared-memory and network steps where the stripes run
/// them one after the other. Measured over network namespaces on 16 CPUs against that
/// schedule: up to 256 KiB the stripes took 0.68-1.03x its time (2 x 2 and 4 x 2 ranks), at
/// 1 MiB 0.88-1.45x, from 4 MiB 1.05-1.73x. Over a real network, which carries less this way,
/// the balance may lie higher.
pub const BLOCKS_MAX_BYTES: usize = 1 << 20;

/// Regular all-to-alls whose blocks (the bytes a rank sends each rank) are below this size go
/// over the stripes (`ACCORD_HIER_ALLTOALL_BLOCK_BYTES`, alike on every rank): `R` times fewer
/// messages between hosts, but three more copies of the buffer (and scratch three times its
/// size); larger ones take one schedule over every rank. What the stripes save is messages, so
/// where they stop paying is a block size rather than a buffer size: measured over network
/// namespaces of two ranks each on 16 CPUs against that schedule, they took 0.43-0.76x its
/// time up to 64 KiB a rank (2 x 2, 3 x 2 and 4 x 2 ranks); over 4 x 2 0.63-0.89x at 128 KiB,
/// 0.81, 0.73 and 0.89x at 160, 192 and 224 KiB (blocks of 20-28 KiB), 0.93-1.15x at 256 KiB
/// (32 KiB); over 3 x 2 0.75x at 160 KiB (blocks of 27 KiB), 1.10, 1.19 and 1.01-1.49x at 192,
/// 224 and 256 KiB (32-43 KiB); over 2 x 2 0.72x at 64 KiB (16 KiB), 0.93x at 128 KiB (32 KiB)
/// and 1.07x at 192 KiB (48 KiB). More ranks per host were not measured.
pub const ALLTOALL_MAX_BLOCK_BYTES: usize = 32 << 10;

/// Whether a regular all-to-all across hosts of `block_bytes` per pair of ranks goes over the
/// stripes (see [`ALLTOALL_MAX_BLOCK_BYTES`]).
pub fn alltoall_on_stripes(block_bytes: usize) -> bool {
    block_bytes < crate::config::get().hier_alltoall_block_bytes
}

impl Hierarchy {
    /// The hierarchy of rank `me` of `comm`, placed by `world`.
    pub(super) fn new(comm: &Communicator, world: Arc<ShmWorld>, me: usize) -> Hierarchy {
        let stripe = Self::stripe_of(comm, &world, me);
        let leaders = match &stripe {
            Some(s) => (s.index == 0).then(|| s.comm.clone()),
            None => world
                .leaders
                .contains(&me)
                .then(|| comm.step_child(&world.leaders, u64::MAX, "leaders", 0x5348_4d4c)),
        };
        Hierarchy {
            world,
            leaders,
            stripe,
            me,
            size: comm.size(),
        }
    }

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
        let everyone: Vec<usize> = (0..comm.size()).collect();
        Some(Stripe {
            comm: comm.step_child(&members, u64::MAX - 1, &label, 0x5354_5250 + index as u64),
            index,
            per_host,
            slots: blocks::stripe_slots(&world.host_of, hosts),
            flat: comm.step_child(&everyone, u64::MAX - 2, "flat", 0x464c_4154),
        })
    }
}

impl HostEngine for Hierarchy {
    fn name(&self) -> &'static str {
        "shared memory within hosts, TCP between leaders or stripes"
    }

    fn supports(&self, op: &Op) -> bool {
        match &op.coll {
            // Whatever the counts (unequal ones, and all-to-all-v, take one schedule inside the
            // engine): a choice by this rank's own counts would send ranks that disagree down
            // different paths.
            Collective::AllGather { .. } | Collective::ReduceScatter { .. } => {
                self.stripe.is_some()
            }
            Collective::AllToAll { .. } => self.stripe.is_some(),
            Collective::Barrier => true,
            coll => self.world.supports(coll, &op.fp),
        }
    }

    fn run(&self, call: &Call<'_>, op: &Op, input: Option<&[u8]>, output: &mut [u8]) -> Result<()> {
        let (world, leaders, me) = (&*self.world, self.leaders.as_ref(), self.me);
        let host = world.host_of[me];
        let leader = world.leaders[host];
        let deadline = call.deadline();
        match op.coll {
            Collective::AllReduce { count } => {
                let esz = call.dtype.size();
                if (self.stripe.as_ref())
                    .is_some_and(|s| allreduce_striped(count * esz, count, s.per_host))
                {
                    return self.striped_allreduce(call, op, deadline, input, output, count);
                }
                let out = output.as_mut_ptr();
                let inp = input.map_or(out as *const u8, <[u8]>::as_ptr);
                // Sum-like partial results per host; Avg is finished once, over the world.
                world.host_allreduce(call, deadline, inp, out, count)?;
                let step = Op {
                    coll: Collective::AllReduce { count },
                    reduce: Some(blocks::sum_like(call.op)),
                    in_place: true,
                    ..op.clone()
                };
                // Every rank reduces its host's sums over its own stripe (the same sums in the
                // same order on every stripe): no step inside the host after it, and every rank
                // hears of a disagreement between hosts from its own stripe; while the host's
                // copies together stay below the striping size (each stripe carries one).
                let whole = (self.stripe.as_ref())
                    .filter(|s| allreduce_whole_on_stripes(count * esz, s.per_host));
                if let Some(s) = whole {
                    s.comm.run_as(&step, None, output, deadline)?;
                } else {
                    if me == leader {
                        leaders
                            .expect("leader communicator")
                            .run_as(&step, None, output, deadline)?;
                    }
                    world.host_broadcast(call, deadline, output.as_mut_ptr(), count, 0)?;
                }
                dtype::finalize(call.dtype, call.op, output, self.size);
                Ok(())
            }
            Collective::Broadcast { count, root } => {
                let out = output.as_mut_ptr();
                let root_host = world.host_of[root];
                // Every host compares the call inside first: a host whose ranks disagree fails
                // before its leader joins the leaders' step, whose failure then reaches the
                // other hosts too, instead of their ranks returning while these fail.
                match host == root_host {
                    true => {
                        world.host_broadcast(call, deadline, out, count, world.local_index(root))?
                    }
                    false => world.host_barrier(call, deadline)?,
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
                        .run_as(&step, None, output, deadline)?;
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
            Collective::ReduceScatter { ref counts } | Collective::AllGather { ref counts } => {
                let input = input.ok_or_else(|| no_input(call))?;
                let block = counts[0];
                let unequal = counts.iter().any(|&c| c != block);
                if unequal
                    || counts.len() * block * call.dtype.size()
                        >= crate::config::get().hier_blocks_bytes
                {
                    return self.flat_blocks(call, op, deadline, input, output);
                }
                match op.coll {
                    Collective::ReduceScatter { .. } => {
                        self.reduce_scatter(call, op, deadline, input, output, block)
                    }
                    _ => self.allgather(call, op, deadline, input, output, block),
                }
            }
            Collective::AllToAll {
                ref send_counts, ..
            } => {
                let input = input.ok_or_else(|| no_input(call))?;
                let block = send_counts[0];
                let regular = op.kind() == crate::fingerprint::OpKind::AllToAll;
                match regular && alltoall_on_stripes(block * call.dtype.size()) {
                    true => self.alltoall(call, op, deadline, input, output, block),
                    false => self.flat_blocks(call, op, deadline, input, output),
                }
            }
            Collective::Barrier => {
                // The host's ranks compare the call and meet; then every rank meets its stripe
                // (once that is done, every rank of every host has arrived), or where there
                // are no stripes the leaders meet; then the host's ranks meet again, so that
                // they leave within a shared-memory step of each other. Stripes end at
                // different times: without the last step a host's ranks left up to a network
                // message apart, which a collective timed after a barrier pays in its first
                // step inside the host (one flat schedule over every rank as well).
                world.host_barrier(call, deadline)?;
                match &self.stripe {
                    Some(s) => s.comm.run_as(op, None, output, deadline)?,
                    None if me == leader => leaders
                        .expect("leader communicator")
                        .run_as(op, None, output, deadline)?,
                    None => {}
                }
                world.host_barrier(call, deadline)
            }
            _ => Err(Error::Unsupported(format!(
                "internal: {} on the hierarchical path",
                call.fp
            ))),
        }
    }
}

/// Reduce-scatter, allgather and all-to-all always have a send buffer (the op's checks require
/// one).
fn no_input(call: &Call<'_>) -> Error {
    Error::Unsupported(format!(
        "internal: {} on the hierarchical path without a send buffer",
        call.fp
    ))
}
