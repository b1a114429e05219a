//! The collectives users call. Each builds its [`Op`] from the buffers once
//! ([`Communicator::collective`]) and runs it on the engine the buffers' memory calls for.

use super::*;

impl Communicator {
    /// Wait until every rank has entered the barrier. On a communicator of several GPUs per
    /// process ([`Communicator::attach_devices`]) the barrier runs on the device and is waited
    /// for.
    pub fn barrier(&self) -> Result<()> {
        if !self.inner.host_side {
            return self.device_barrier();
        }
        self.on_host(&Op::barrier(), None, &mut [])
    }

    /// Copy `root`'s buffer into every rank's: in place (`buf`), or out of place
    /// (`(send, recv)`: the root's `send` lands in every rank's `recv`; other ranks' `send` is
    /// not read).
    pub fn broadcast<'a>(&self, buf: impl AsInOut<'a>, root: usize) -> Result<Completion> {
        let (send, recv) = buf.into_in_out();
        self.collective(OpKind::Broadcast, None, Some(root), send, recv)
    }

    /// Reduce every rank's buffer with `op`; every rank gets the result. In place (`buf`) or
    /// out of place (`(send, recv)`).
    pub fn all_reduce<'a>(&self, buf: impl AsInOut<'a>, op: ReduceOp) -> Result<Completion> {
        let (send, recv) = buf.into_in_out();
        self.collective(OpKind::AllReduce, Some(op), None, send, recv)
    }

    /// Prefix reduction (MPI's `Scan`): rank `r` gets the reduction with `op` of the buffers of
    /// ranks `0..=r`. In place (`buf`) or out of place (`(send, recv)`). Every operator but
    /// `Avg` (whose divisor would differ per rank).
    pub fn scan<'a>(&self, buf: impl AsInOut<'a>, op: ReduceOp) -> Result<Completion> {
        let (send, recv) = buf.into_in_out();
        self.collective(OpKind::Scan, Some(op), None, send, recv)
    }

    /// Exclusive prefix reduction (MPI's `Exscan`): rank `r` gets the reduction of the buffers
    /// of ranks `0..r`. Rank 0 has no such prefix: its output is left as it was (its buffer,
    /// in place).
    pub fn exscan<'a>(&self, buf: impl AsInOut<'a>, op: ReduceOp) -> Result<Completion> {
        let (send, recv) = buf.into_in_out();
        self.collective(OpKind::ExScan, Some(op), None, send, recv)
    }

    /// Reduce every rank's buffer with `op` into `root`'s. In place (`buf`: other ranks' is
    /// left unchanged) or out of place (`(send, recv)`: other ranks may pass an empty `recv`).
    pub fn reduce<'a>(
        &self,
        buf: impl AsInOut<'a>,
        op: ReduceOp,
        root: usize,
    ) -> Result<Completion> {
        let (send, recv) = buf.into_in_out();
        self.collective(OpKind::Reduce, Some(op), Some(root), send, recv)
    }

    /// Rank `i`'s `send` lands in block `i` of every rank's `recv`: equal blocks, or the blocks
    /// of [`crate::Parts`]`::new(recv, &counts)` (allgatherv; every rank passes the same counts).
    pub fn all_gather<'s, 'r>(
        &self,
        send: impl AsSend<'s>,
        recv: impl AsRecv<'r>,
    ) -> Result<Completion> {
        let (send, recv) = (send.into_send(), recv.into_recv());
        self.collective(OpKind::AllGather, None, None, Some(send), recv)
    }

    /// Like [`Communicator::all_gather`], only `root`'s `recv` is filled (other ranks may pass
    /// an empty one).
    pub fn gather<'s, 'r>(
        &self,
        send: impl AsSend<'s>,
        recv: impl AsRecv<'r>,
        root: usize,
    ) -> Result<Completion> {
        let (send, recv) = (send.into_send(), recv.into_recv());
        self.collective(OpKind::Gather, None, Some(root), Some(send), recv)
    }

    /// Block `i` of `root`'s `send` lands in rank `i`'s `recv`: equal blocks, or those of
    /// [`crate::Parts`]`::new(send, &counts)` (scatterv). Other ranks may pass an empty `send`.
    pub fn scatter<'s, 'r>(
        &self,
        send: impl AsSend<'s>,
        recv: impl AsRecv<'r>,
        root: usize,
    ) -> Result<Completion> {
        let (send, recv) = (send.into_send(), recv.into_recv());
        self.collective(OpKind::Scatter, None, Some(root), Some(send), recv)
    }

    /// Reduce every rank's `send` with `op`; block `i` of the result lands in rank `i`'s
    /// `recv`: equal blocks, or those of [`crate::Parts`]`::new(send, &counts)`.
    pub fn reduce_scatter<'s, 'r>(
        &self,
        send: impl AsSend<'s>,
        recv: impl AsRecv<'r>,
        op: ReduceOp,
    ) -> Result<Completion> {
        let (send, recv) = (send.into_send(), recv.into_recv());
        self.collective(OpKind::ReduceScatter, Some(op), None, Some(send), recv)
    }

    /// Block `j` of `send` goes to rank `j`; block `j` of `recv` comes from rank `j`. Equal
    /// blocks, or this rank's own counts on both sides (alltoallv):
    /// `all_to_all(Parts::new(&send, &to_each), Parts::new(&mut recv, &from_each))`.
    pub fn all_to_all<'s, 'r>(
        &self,
        send: impl AsSend<'s>,
        recv: impl AsRecv<'r>,
    ) -> Result<Completion> {
        let (send, recv) = (send.into_send(), recv.into_recv());
        self.collective(OpKind::AllToAll, None, None, Some(send), recv)
    }

    /// Check a call into its [`Op`] and run it where its buffers live. Inlined, with the op's
    /// checks, into each operation: the kind is then a constant and the checks fold (they are
    /// on the path of every small call).
    #[inline(always)]
    fn collective(
        &self,
        kind: OpKind,
        reduce: Option<ReduceOp>,
        root: Option<usize>,
        send: Option<SendBuf<'_>>,
        recv: RecvBuf<'_>,
    ) -> Result<Completion> {
        let dtype = recv.dtype;
        if let Some(s) = &send {
            elements(format_args!("{kind}: send buffer"), s.byte_len(), s.dtype)?;
            if s.dtype != dtype {
                return Err(Error::invalid(format!(
                    "{kind}: the send buffer holds {} but the receive buffer {dtype}",
                    s.dtype
                )));
            }
        }
        elements(
            format_args!("{kind}: receive buffer"),
            recv.byte_len(),
            dtype,
        )?;
        let req = crate::op::Request {
            kind,
            dtype,
            reduce,
            root,
            send: send.as_ref().map(SendBuf::extent),
            recv: recv.extent(),
        };
        let op = Op::new(req, self.rank(), self.size())?;
        match (send.map(|s| s.data), recv.data) {
            (None, RecvData::Host(out)) => self.on_host(&op, None, out).map(|_| Completion::done()),
            (Some(SendData::Host(i)), RecvData::Host(out)) => {
                self.on_host(&op, Some(i), out).map(|_| Completion::done())
            }
            (None, RecvData::Device(out, stream)) => self.on_device(&op, None, out, stream),
            (Some(SendData::Device(inp, _)), RecvData::Device(out, stream)) => {
                self.on_device(&op, Some(inp), out, stream)
            }
            _ => Err(Error::invalid(format!(
                "{kind}: one buffer is in host memory and the other on a GPU; pass both in the \
                 same memory"
            ))),
        }
    }
}
