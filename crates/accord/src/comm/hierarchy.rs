//! Collectives across hosts, composed from the engines: shared memory inside each host
//! ([`ShmWorld`]'s host steps), the host leaders' communicator (TCP) between them.

use super::*;
use crate::engine::HostEngine;
use crate::op::Call;
use crate::shm_coll::ShmWorld;

/// Allreduce and broadcast over hosts: `world` places the ranks, `leaders` is the communicator
/// of the lowest rank of each host (present on leaders only).
pub(super) struct Hierarchy {
    pub world: Arc<ShmWorld>,
    pub leaders: Option<Communicator>,
    /// This rank and the world size.
    pub me: usize,
    pub size: usize,
}

impl HostEngine for Hierarchy {
    fn name(&self) -> &'static str {
        "shared memory within hosts, TCP between leaders"
    }

    fn supports(&self, op: &Op) -> bool {
        self.world.supports(&op.coll, &op.fp)
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
                if me == leader {
                    let reduce = match call.op {
                        ReduceOp::Avg => ReduceOp::Sum,
                        op => op,
                    };
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
            _ => Err(Error::Unsupported(format!(
                "internal: {} on the hierarchical path",
                call.fp
            ))),
        }
    }
}
