//! The steps inside one host that collectives spanning several hosts are built from (see
//! `comm::hierarchy`): each runs on this host's group, serialised with its other calls; on a
//! rank alone on its host the reduce-scatter, allgather and all-to-all copy its one block, the
//! others do nothing.

use super::*;

impl ShmWorld {
    fn on_host(
        &self,
        call: &Call<'_>,
        deadline: Instant,
        f: &dyn Fn(&Ctx<'_>) -> Result<()>,
    ) -> Result<()> {
        match &self.group {
            Some(g) => {
                let _serial = g.lock.lock().unwrap_or_else(|p| p.into_inner());
                f(&self.ctx(g, call, deadline))
            }
            None => Ok(()),
        }
    }

    /// On a rank alone on its host, its own `bytes` from `inp` are the host's result in `out`.
    fn alone(&self, inp: *const u8, out: *mut u8, bytes: usize) {
        if self.group.is_none() && !std::ptr::eq(inp, out) {
            // SAFETY: alone, the step's input and output are this rank's one part of `bytes`
            // (checked by the caller); `copy` tolerates overlap.
            unsafe { std::ptr::copy(inp, out, bytes) };
        }
    }

    /// Reduce the host's `count` elements from `inp` into every local rank's `out`, without the
    /// operator's final step (an average is finished once, over the world).
    pub(crate) fn host_allreduce(
        &self,
        call: &Call<'_>,
        deadline: Instant,
        inp: *const u8,
        out: *mut u8,
        count: usize,
    ) -> Result<()> {
        self.alone(inp, out, count * call.dtype.size());
        self.on_host(call, deadline, &|c| {
            c.allreduce(inp, out, count, false, None, self.small)
        })
    }

    /// Copy `count` elements of `out` from the local rank `root` (an index into this host's
    /// group) to every local rank.
    pub(crate) fn host_broadcast(
        &self,
        call: &Call<'_>,
        deadline: Instant,
        out: *mut u8,
        count: usize,
        root: usize,
    ) -> Result<()> {
        self.on_host(call, deadline, &|c| c.broadcast(out, count, root))
    }

    /// Reduce block `i` (of `block` elements) of every local rank's `inp` into local rank `i`'s
    /// `out`, without the operator's final step.
    pub(crate) fn host_reduce_scatter(
        &self,
        call: &Call<'_>,
        deadline: Instant,
        inp: *const u8,
        out: *mut u8,
        block: usize,
    ) -> Result<()> {
        self.alone(inp, out, block * call.dtype.size());
        self.on_host(call, deadline, &|c| {
            c.reduce_scatter(inp, out, block, false)
        })
    }

    /// Every local rank's `block` elements from `inp` land in block `i` (its local index) of
    /// every local rank's `out`.
    pub(crate) fn host_allgather(
        &self,
        call: &Call<'_>,
        deadline: Instant,
        inp: *const u8,
        out: *mut u8,
        block: usize,
    ) -> Result<()> {
        self.alone(inp, out, block * call.dtype.size());
        self.on_host(call, deadline, &|c| c.allgather(inp, out, block))
    }

    /// Block `i` (of `block` elements) of local rank `j`'s `inp` lands in block `j` of local rank
    /// `i`'s `out`.
    pub(crate) fn host_alltoall(
        &self,
        call: &Call<'_>,
        deadline: Instant,
        inp: *const u8,
        out: *mut u8,
        block: usize,
    ) -> Result<()> {
        self.alone(inp, out, block * call.dtype.size());
        self.on_host(call, deadline, &|c| c.alltoall(inp, out, block))
    }

    /// Wait for every local rank (comparing fingerprints, like every step).
    pub(crate) fn host_barrier(&self, call: &Call<'_>, deadline: Instant) -> Result<()> {
        self.on_host(call, deadline, &|c| c.barrier_call())
    }

    /// The index of world rank `r` in this host's group (0 when alone).
    pub(crate) fn local_index(&self, r: usize) -> usize {
        self.group
            .as_ref()
            .and_then(|g| g.members.iter().position(|&m| m == r))
            .unwrap_or(0)
    }
}
