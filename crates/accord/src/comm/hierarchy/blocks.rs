//! Reduce-scatter and allgather across hosts, over the stripes: every rank's block travels the
//! network once, in the stripe of its owner's local index, and the hosts' shared memory does
//! the rest.
//!
//! With `H` hosts of `R` ranks each, stripe `i` is local rank `i` of every host. A
//! **reduce-scatter** orders the input by stripe (segment `i` holds, host by host, the blocks
//! of the stripe-`i` ranks), reduce-scatters the segments inside the host (local rank `i` gets
//! its host's partial sums of segment `i`), then reduce-scatters that segment over its stripe,
//! which leaves every rank its own block. An **allgather** runs the other way round: the
//! stripe gathers its `H` blocks, the host gathers its `R` segments, and the blocks are put
//! back in world order. Each host sends `(H - 1) / H` of the data once, in `R` streams at
//! once, where one schedule over all ranks would pass blocks through other hosts' ranks.
//!
//! An **all-to-all** regroups every rank's blocks by the stripe of their destination, exchanges
//! the segments inside the host (local rank `i` collects its host's blocks for stripe `i`), and
//! each stripe sends one message per pair of hosts carrying `R` ranks' blocks, `R` times fewer
//! messages than one schedule over all ranks; its copies pay off for small blocks only.

use super::*;
use crate::scratch;

/// Pieces of a pipelined striped allreduce.
pub(super) const PIECES: usize = 4;

/// Striped allreduces of at least this many bytes are pipelined in four pieces
/// (`ACCORD_HIER_PIPELINE_BYTES`, alike on every rank). Measured over network namespaces on
/// 16 CPUs against the same calls unpipelined: 2 x 2 ranks 0.93-0.98x the time at 4 MiB,
/// 0.80-0.88x at 16 MiB, 0.73-0.77x at 64 MiB; 4 x 2 ranks (eight ranks and their threads on
/// the 16 CPUs) 1.22-1.28x at 4 MiB, 1.10-1.16x at 16 MiB, 0.95-0.98x at 64 MiB. Hosts with
/// CPUs of their own gain from a lower limit.
pub const PIPELINE_MIN_BYTES: usize = 32 << 20;

/// How a striped allreduce cuts its vector: `pieces` pieces of `per_host` slices of `block`
/// elements; this rank's slice starts `mine` bytes into each piece.
struct Pieces {
    pieces: usize,
    block: usize,
    piece_bytes: usize,
    mine: usize,
}

/// Run `f` on `bytes` bytes of this thread's kept scratch (contents unspecified).
fn with_scratch<T>(bytes: usize, f: impl FnOnce(&mut [u8]) -> Result<T>) -> Result<T> {
    let mut v = scratch::HIERARCHY.take(bytes);
    let r = f(&mut v);
    scratch::HIERARCHY.give_back(v);
    r
}

/// Where every world rank's block sits when blocks are ordered by stripe.
pub(super) fn stripe_slots(host_of: &[usize], hosts: usize) -> Vec<usize> {
    let mut seen = vec![0usize; hosts];
    host_of
        .iter()
        .map(|&h| {
            let local = seen[h];
            seen[h] += 1;
            local * hosts + h
        })
        .collect()
}

impl Hierarchy {
    /// A reduce-scatter or allgather too large for the stripes ([`super::BLOCKS_MAX_BYTES`]) or
    /// of unequal blocks, or an all-to-all too large for them or of the v variant: one schedule
    /// over every rank, after the host's ranks and then each stripe have compared the call.
    /// Every path of the hierarchy starts with a step inside the host and then one on this
    /// rank's stripe (stripe 0 is the leaders'), so ranks whose calls put them on different
    /// paths meet there and fail with a desync, without waiting for each other in a cycle.
    pub(super) fn flat_blocks(
        &self,
        call: &Call<'_>,
        op: &Op,
        deadline: Instant,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<()> {
        let s = self.stripe.as_ref().expect("supports checked the stripes");
        self.world.host_barrier(call, deadline)?;
        let agree = Op {
            coll: Collective::Barrier,
            ..op.clone()
        };
        s.comm.run_as(&agree, None, &mut [], deadline)?;
        s.flat.run_as(op, Some(input), output, deadline)
    }

    /// Reduce-scatter of `block` elements per rank (see the module docs).
    pub(super) fn reduce_scatter(
        &self,
        call: &Call<'_>,
        op: &Op,
        deadline: Instant,
        input: &[u8],
        output: &mut [u8],
        block: usize,
    ) -> Result<()> {
        let s = self.stripe.as_ref().expect("supports checked the stripes");
        let bytes = block * call.dtype.size();
        let hosts = s.hosts();
        with_scratch((self.size + hosts) * bytes, |scratch| {
            let (by_stripe, partial) = scratch.split_at_mut(self.size * bytes);
            s.order_by_stripe(input, by_stripe, bytes);
            let (from, into) = (by_stripe.as_ptr(), partial.as_mut_ptr());
            self.world
                .host_reduce_scatter(call, deadline, from, into, hosts * block)?;
            let step = Op {
                coll: Collective::ReduceScatter {
                    counts: vec![block; hosts],
                },
                reduce: Some(sum_like(call.op)),
                in_place: false,
                ..op.clone()
            };
            s.comm.run_as(&step, Some(partial), output, deadline)
        })?;
        dtype::finalize(call.dtype, call.op, output, self.size);
        Ok(())
    }

    /// All-to-all of `block` elements per pair over the stripes: the host regroups its ranks'
    /// blocks by the stripe of their destination (a shared-memory all-to-all of segments), each
    /// stripe sends one message per pair of hosts carrying the blocks of all `R` ranks of the
    /// host (where one schedule over every rank sends `R` messages of one block), and the
    /// blocks are put back in world order.
    pub(super) fn alltoall(
        &self,
        call: &Call<'_>,
        op: &Op,
        deadline: Instant,
        input: &[u8],
        output: &mut [u8],
        block: usize,
    ) -> Result<()> {
        let s = self.stripe.as_ref().expect("supports checked the stripes");
        let bytes = block * call.dtype.size();
        let (hosts, per_host, n) = (s.hosts(), s.per_host, self.size);
        with_scratch(3 * n * bytes, |scratch| {
            let (by_stripe, rest) = scratch.split_at_mut(n * bytes);
            let (mid, send) = rest.split_at_mut(n * bytes);
            // Segment `i`: the blocks for the ranks of stripe `i`, host by host.
            s.order_by_stripe(input, by_stripe, bytes);
            // Local rank `i` gets segment `i` of every local rank `j`, at `j`: `mid[j * H + h]`
            // is `j`'s block for rank `i` of host `h`.
            let (from, into) = (by_stripe.as_ptr(), mid.as_mut_ptr());
            self.world
                .host_alltoall(call, deadline, from, into, hosts * block)?;
            // One message to each host `h`: every local rank's block for it, by local rank.
            for j in 0..per_host {
                for h in 0..hosts {
                    send[(h * per_host + j) * bytes..][..bytes]
                        .copy_from_slice(&mid[(j * hosts + h) * bytes..][..bytes]);
                }
            }
            let counts = vec![per_host * block; hosts];
            let step = Op {
                coll: Collective::AllToAll {
                    send_counts: counts.clone(),
                    recv_counts: counts,
                },
                ..op.clone()
            };
            // From host `h`: its local ranks' blocks for this rank, at `h * R + j`.
            s.comm.run_as(&step, Some(send), mid, deadline)?;
            for (r, &slot) in s.slots.iter().enumerate() {
                let (j, h) = (slot / hosts, slot % hosts);
                output[r * bytes..][..bytes]
                    .copy_from_slice(&mid[(h * per_host + j) * bytes..][..bytes]);
            }
            Ok(())
        })
    }

    /// Allreduce of `count` elements, striped (see [`super`]): the host reduce-scatters, the
    /// stripes allreduce a slice each, the host allgathers. Slices are equal, so a count that
    /// does not divide evenly is worked on in scratch padded with zeros (reduced, then dropped).
    ///
    /// From [`PIPELINE_MIN_BYTES`] (`ACCORD_HIER_PIPELINE_BYTES`) the vector is cut into
    /// [`PIECES`] pieces that go through the three steps in turn: a thread runs each piece's
    /// allreduce between hosts while this one reduce-scatters the next piece and gathers the
    /// one before inside the host, so the network and shared memory work at once.
    pub(super) fn striped_allreduce(
        &self,
        call: &Call<'_>,
        op: &Op,
        deadline: Instant,
        input: Option<&[u8]>,
        output: &mut [u8],
        count: usize,
    ) -> Result<()> {
        let s = self.stripe.as_ref().expect("caller checked the stripe");
        let esz = call.dtype.size();
        let pieces = allreduce_pieces(count * esz);
        let block = count.div_ceil(pieces * s.per_host);
        tracing::debug!(stripe = s.index, block, pieces, "striped allreduce");
        let plan = Pieces {
            pieces,
            block,
            piece_bytes: s.per_host * block * esz,
            mine: s.index * block * esz,
        };
        if plan.pieces * plan.piece_bytes == count * esz {
            let out = output.as_mut_ptr();
            let inp = input.map_or(out.cast_const(), <[u8]>::as_ptr);
            self.striped_pieces(call, op, deadline, &plan, inp, out)?;
        } else {
            with_scratch(plan.pieces * plan.piece_bytes, |work| {
                let used = count * esz;
                work[..used].copy_from_slice(input.unwrap_or(output));
                work[used..].fill(0);
                let base = work.as_mut_ptr();
                self.striped_pieces(call, op, deadline, &plan, base, base)?;
                output.copy_from_slice(&work[..used]);
                Ok(())
            })?;
        }
        dtype::finalize(call.dtype, call.op, output, self.size);
        Ok(())
    }

    /// The three steps of [`Self::striped_allreduce`] on every piece of `work`, reading the
    /// contributions from `inp` (which may be `work`: in place).
    fn striped_pieces(
        &self,
        call: &Call<'_>,
        op: &Op,
        deadline: Instant,
        plan: &Pieces,
        inp: *const u8,
        work: *mut u8,
    ) -> Result<()> {
        let s = self.stripe.as_ref().expect("caller checked the stripe");
        let step = Op {
            coll: Collective::AllReduce { count: plan.block },
            reduce: Some(sum_like(call.op)),
            in_place: true,
            ..op.clone()
        };
        let block_bytes = plan.block * call.dtype.size();
        // SAFETY (all three): piece k lies inside `work` and `inp`, which hold `pieces` pieces;
        // this rank's slice of a piece is its own until the host gathers it.
        let reduce_scatter = |k: usize| {
            let at = k * plan.piece_bytes;
            let (from, mine) = unsafe { (inp.add(at), work.add(at + plan.mine)) };
            self.world
                .host_reduce_scatter(call, deadline, from, mine, plan.block)
        };
        let between_hosts = |k: usize, work: usize| {
            let mine = (work + k * plan.piece_bytes + plan.mine) as *mut u8;
            let slice = unsafe { std::slice::from_raw_parts_mut(mine, block_bytes) };
            s.comm.run_as(&step, None, slice, deadline)
        };
        let gather = |k: usize| {
            let piece = unsafe { work.add(k * plan.piece_bytes) };
            let own = unsafe { piece.add(plan.mine) } as *const u8;
            self.world
                .host_allgather(call, deadline, own, piece, plan.block)
        };
        if plan.pieces == 1 {
            reduce_scatter(0)?;
            between_hosts(0, work as usize)?;
            return gather(0);
        }
        let work_at = work as usize;
        std::thread::scope(|scope| {
            let (to_net, pending) = std::sync::mpsc::channel::<usize>();
            let (net_done, done) = std::sync::mpsc::channel::<Result<()>>();
            scope.spawn(move || {
                for k in pending {
                    let r = between_hosts(k, work_at);
                    let failed = r.is_err();
                    if net_done.send(r).is_err() || failed {
                        break;
                    }
                }
            });
            let wait = || match done.recv() {
                Ok(r) => r,
                Err(_) => Err(Error::Unsupported(
                    "internal: the striped allreduce's network thread ended early".into(),
                )),
            };
            let r = (|| {
                for k in 0..plan.pieces {
                    reduce_scatter(k)?;
                    let _ = to_net.send(k);
                    if k > 0 {
                        wait()?;
                        gather(k - 1)?;
                    }
                }
                wait()?;
                gather(plan.pieces - 1)
            })();
            drop(to_net);
            if let Err(e) = &r {
                // The network thread may be waiting for peers that will not come: end its
                // wait now rather than at the deadline (the world fails with `e` anyway).
                s.comm.abort(&format!("the striped allreduce failed: {e}"));
            }
            r
        })
    }

    /// Allgather of `block` elements per rank (see the module docs).
    pub(super) fn allgather(
        &self,
        call: &Call<'_>,
        op: &Op,
        deadline: Instant,
        input: &[u8],
        output: &mut [u8],
        block: usize,
    ) -> Result<()> {
        let s = self.stripe.as_ref().expect("supports checked the stripes");
        let bytes = block * call.dtype.size();
        let hosts = s.hosts();
        let segment = hosts * bytes;
        // First inside the host, as every path of the hierarchy (see `flat_blocks`).
        self.world.host_barrier(call, deadline)?;
        with_scratch(self.size * bytes, |by_stripe| {
            let step = Op {
                coll: Collective::AllGather {
                    counts: vec![block; hosts],
                },
                in_place: false,
                ..op.clone()
            };
            // The stripe's blocks land in this rank's own segment, which the host step then
            // reads in place.
            let mine = &mut by_stripe[s.index * segment..][..segment];
            s.comm.run_as(&step, Some(input), mine, deadline)?;
            let at = by_stripe.as_mut_ptr();
            // SAFETY: segment `index` lies inside the scratch of `size` blocks.
            let own = unsafe { at.add(s.index * segment) } as *const u8;
            self.world
                .host_allgather(call, deadline, own, at, hosts * block)?;
            s.order_by_rank(by_stripe, output, bytes);
            Ok(())
        })
    }
}

/// The operator of a partial reduction: an average is summed, and divided once at the end.
pub(super) fn sum_like(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Avg => ReduceOp::Sum,
        op => op,
    }
}

#[cfg(test)]
mod tests {
    use super::stripe_slots;

    #[test]
    fn stripe_slots_order_blocks_by_local_index_then_host() {
        // Hosts of consecutive ranks: stripe 0 is ranks 0, 2, 4; stripe 1 is ranks 1, 3, 5.
        assert_eq!(stripe_slots(&[0, 0, 1, 1, 2, 2], 3), [0, 3, 1, 4, 2, 5]);
        // Round-robin placement: host 0 has ranks 0, 2; host 1 has 1, 3.
        assert_eq!(stripe_slots(&[0, 1, 0, 1], 2), [0, 1, 2, 3]);
        let mut slots = stripe_slots(&[1, 0, 0, 1, 2, 2, 2, 1, 0], 3);
        slots.sort_unstable();
        assert_eq!(slots, (0..9).collect::<Vec<_>>(), "every slot used once");
    }
}
