//! Collectives across hosts: shared memory inside each host, the host leaders' communicator
//! (TCP) between them.

use super::*;

impl ShmWorld {
    /// Shared memory inside each host, the leaders' communicator (TCP) between hosts.
    pub(super) fn hierarchical(
        &self,
        comm: &Communicator,
        leaders: Option<&Communicator>,
        call: &ShmCall<'_>,
        coll: &Collective,
        input: Option<&[u8]>,
        output: &mut [u8],
    ) -> Result<()> {
        let me = comm.rank();
        let host = self.host_of[me];
        let leader = self.leaders[host];
        let deadline = Instant::now() + call.timeout;
        let local = |f: &dyn Fn(&Ctx<'_>) -> Result<()>| -> Result<()> {
            match &self.group {
                Some(g) => {
                    let _serial = g.lock.lock().unwrap_or_else(|p| p.into_inner());
                    f(&self.ctx(g, call, deadline))
                }
                None => Ok(()),
            }
        };
        match *coll {
            Collective::AllReduce { count } => {
                let out = output.as_mut_ptr();
                let inp = input.map_or(out as *const u8, <[u8]>::as_ptr);
                if self.group.is_none() && !std::ptr::eq(inp, out) {
                    // SAFETY: both buffers hold count elements (checked by the caller).
                    unsafe { std::ptr::copy(inp, out, count * call.dtype.size()) };
                }
                // Sum-like partial results per host; Avg is finished once, over the world.
                local(&|c| c.allreduce(inp, out, count, false, None, self.small))?;
                if me == leader {
                    let op = if call.op == ReduceOp::Avg {
                        ReduceOp::Sum
                    } else {
                        call.op
                    };
                    let l = leaders.expect("leader communicator");
                    let coll = Collective::AllReduce { count };
                    l.run_as(call.fp, coll, call.dtype, Some(op), None, output)?;
                }
                let out = output.as_mut_ptr();
                local(&|c| c.broadcast(out, count, 0))?;
                dtype::finalize(call.dtype, call.op, output, comm.size());
                Ok(())
            }
            Collective::Broadcast { count, root } => {
                let out = output.as_mut_ptr();
                let root_host = self.host_of[root];
                let local_idx = |r: usize| {
                    self.group
                        .as_ref()
                        .and_then(|g| g.members.iter().position(|&m| m == r))
                        .unwrap_or(0)
                };
                if host == root_host {
                    local(&|c| c.broadcast(out, count, local_idx(root)))?;
                }
                if me == leader {
                    // The world call's fingerprint names the world root: leaders whose ranks
                    // disagree on it (even on a root of the same host) fail here.
                    let l = leaders.expect("leader communicator");
                    let coll = Collective::Broadcast {
                        count,
                        root: root_host,
                    };
                    l.run_as(call.fp, coll, call.dtype, None, None, output)?;
                }
                if host != root_host {
                    let out = output.as_mut_ptr();
                    local(&|c| c.broadcast(out, count, 0))?;
                } else {
                    // The root's host had its data first; it waits for its leader's step, so
                    // that a disagreement between hosts fails every rank, not only the leaders.
                    local(&|c| c.barrier_call())?;
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
