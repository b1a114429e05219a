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
    /// of [`crate::Parts`]`::new(recv, &counts)` (allgatherv; every rank passes the same counts),
    /// or of [`crate::Parts::with_displs`]`(recv, &counts, &displs)`, block `i` at element
    /// `displs[i]` (each rank its own displacements; what lies between blocks is left as it
    /// was).
    pub fn all_gather<'s, 'r>(
        &self,
        send: impl AsSend<'s>,
        recv: impl AsRecv<'r>,
    ) -> Result<Completion> {
        let (send, recv) = (send.into_send(), recv.into_recv());
        self.collective(OpKind::AllGather, None, None, Some(send), recv)
    }

    /// Like [`Communicator::all_gather`], only `root`'s `recv` is filled (other ranks may pass
    /// an empty one; their counts and displacements are not used).
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
    /// [`crate::Parts`]`::new(send, &counts)` (scatterv) or [`crate::Parts::with_displs`]`(send,
    /// &counts, &displs)` (blocks anywhere in `send`, overlapping or not). Other ranks may pass
    /// an empty `send`.
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
    /// `recv`: equal blocks, or those of [`crate::Parts`]`::new(send, &counts)` or
    /// [`crate::Parts::with_displs`]`(send, &counts, &displs)` (this rank's own displacements).
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
    /// `all_to_all(Parts::new(&send, &to_each), Parts::new(&mut recv, &from_each))`. Either side
    /// may be [`crate::Parts::with_displs`] instead (MPI's `sdispls` and `rdispls`): send blocks
    /// may overlap, receive blocks may not, and what lies between receive blocks is left as it
    /// was.
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
        if recv.displs.is_some() || send.as_ref().is_some_and(|s| s.displs.is_some()) {
            return self.displaced(kind, reduce, root, send, recv);
        }
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
            (None, RecvData::Device(out, stream)) => {
                self.on_device(&op, None, out, stream, Default::default())
            }
            (Some(SendData::Device(inp, _)), RecvData::Device(out, stream)) => {
                self.on_device(&op, Some(inp), out, stream, Default::default())
            }
            _ => Err(Error::invalid(format!(
                "{kind}: one buffer is in host memory and the other on a GPU; pass both in the \
                 same memory"
            ))),
        }
    }

    /// [`Communicator::collective`] for buffers with displacements ([`crate::Parts::with_displs`]):
    /// the op is checked on the packed lengths, each side's blocks are checked against its
    /// buffer, and sides whose blocks are not back to back go through a packed copy. Out of
    /// line: calls without displacements never come here.
    #[inline(never)]
    fn displaced(
        &self,
        kind: OpKind,
        reduce: Option<ReduceOp>,
        root: Option<usize>,
        send: Option<SendBuf<'_>>,
        recv: RecvBuf<'_>,
    ) -> Result<Completion> {
        let (me, size) = (self.rank(), self.size());
        // The sides the operation lays out in per-rank blocks.
        let (send_blocks, recv_blocks) = match kind {
            OpKind::AllGather | OpKind::Gather => (false, true),
            OpKind::Scatter | OpKind::ReduceScatter => (true, false),
            OpKind::AllToAll => (true, true),
            _ => (false, false),
        };
        let refuse = |side: &str| {
            Err(Error::invalid(format!(
                "{kind}: displacements were given for the {side} buffer, which {kind} does not \
                 lay out in per-rank blocks"
            )))
        };
        if send.as_ref().is_some_and(|s| s.displs.is_some()) && !send_blocks {
            return refuse("send");
        }
        if recv.displs.is_some() && !recv_blocks {
            return refuse("receive");
        }
        // Lengths as the op sees them: those of the packed blocks where displacements are given.
        let extent = |e: crate::op::Extent<'_>, displs: Option<&[usize]>| match (displs, e.counts) {
            (Some(_), Some(c)) => c.iter().fold(0usize, |a, &n| a.saturating_add(n)),
            _ => e.len,
        };
        let send_ext = send.as_ref().map(|s| crate::op::Extent {
            len: extent(s.extent(), s.displs),
            counts: s.counts,
        });
        let recv_ext = crate::op::Extent {
            len: extent(recv.extent(), recv.displs),
            counts: recv.counts,
        };
        let req = crate::op::Request {
            kind,
            dtype: recv.dtype,
            reduce,
            root,
            send: send_ext,
            recv: recv_ext,
        };
        let op = Op::new(req, me, size)?;
        // Buffers used only at the root are not touched elsewhere: their blocks are not checked.
        let (send_used, recv_used) = match op.coll {
            Collective::Scatter { root, .. } => (root == me, true),
            Collective::Gather { root, .. } => (true, root == me),
            _ => (true, true),
        };
        let name = op.kind();
        let staging = crate::buffer::Staging {
            send: match &send {
                Some(s) => blocks(
                    name,
                    "send",
                    s.counts,
                    s.displs,
                    s.extent().len,
                    size,
                    send_used,
                )?,
                None => None,
            },
            recv: blocks(
                name,
                "receive",
                recv.counts,
                recv.displs,
                recv.extent().len,
                size,
                recv_used,
            )?,
        };
        let esz = op.dtype.size();
        let (send_len, recv_len) = (op.send_len(me), op.recv_len(me));
        match (send.map(|s| s.data), recv.data) {
            (Some(SendData::Host(input)), RecvData::Host(out)) => {
                let packed;
                let input = match staging.send {
                    Some(b) => {
                        packed = b.pack(esz, input);
                        &packed[..]
                    }
                    // Back to back, possibly in a longer buffer: the blocks are its start.
                    None => &input[..(send_len * esz).min(input.len())],
                };
                match staging.recv {
                    Some(b) => {
                        let mut packed = vec![0u8; recv_len * esz];
                        self.on_host(&op, Some(input), &mut packed)?;
                        b.unpack(esz, &packed, out);
                    }
                    None => {
                        let n = (recv_len * esz).min(out.len());
                        self.on_host(&op, Some(input), &mut out[..n])?;
                    }
                }
                Ok(Completion::done())
            }
            (Some(SendData::Device(input, _)), RecvData::Device(out, stream)) => {
                let input = match staging.send {
                    Some(_) => input,
                    None => input.sub(0, send_len.min(input.count()))?,
                };
                let out = match staging.recv {
                    Some(_) => out,
                    None => out.sub(0, recv_len.min(out.count()))?,
                };
                self.on_device(&op, Some(input), out, stream, staging)
            }
            _ => Err(Error::invalid(format!(
                "{kind}: one buffer is in host memory and the other on a GPU; pass both in the \
                 same memory"
            ))),
        }
    }
}

/// Check the displacements of one side of a `v` call (`side`: "send" or "receive") against its
/// buffer of `len` elements: one per rank, and, where the buffer is used on this rank, every
/// non-empty block inside it and receive blocks apart. The blocks to copy through a packed
/// buffer, or `None` where they already lie back to back from the start (or are not used here).
fn blocks<'a>(
    kind: OpKind,
    side: &str,
    counts: Option<&'a [usize]>,
    displs: Option<&'a [usize]>,
    len: usize,
    size: usize,
    used: bool,
) -> Result<Option<crate::buffer::Blocks<'a>>> {
    let (Some(counts), Some(displs)) = (counts, displs) else {
        return Ok(None);
    };
    if displs.len() != size {
        return Err(Error::invalid(format!(
            "{kind}: displs of the {side} buffer has {} entries but the communicator has {size} \
             ranks (one per rank, like counts)",
            displs.len()
        )));
    }
    if !used {
        return Ok(None);
    }
    let mut packed = true;
    let mut at = 0usize;
    for (i, (&c, &d)) in counts.iter().zip(displs).enumerate() {
        packed &= d == at;
        at = at.saturating_add(c);
        if c == 0 {
            continue;
        }
        match d.checked_add(c) {
            Some(end) if end <= len => {}
            _ => {
                return Err(Error::invalid(format!(
                    "{kind}: {side} block {i} (displs[{i}] = {d}, counts[{i}] = {c}: elements \
                     {d}..{}) does not fit in the {side} buffer of {len} elements",
                    d as u128 + c as u128
                )))
            }
        }
    }
    if side == "receive" && !packed {
        // Non-empty blocks in buffer order: each must end where or before the next begins.
        let mut order: Vec<usize> = (0..size).filter(|&i| counts[i] > 0).collect();
        order.sort_unstable_by_key(|&i| (displs[i], i));
        for w in order.windows(2) {
            let (a, b) = (w[0], w[1]);
            if displs[a] + counts[a] > displs[b] {
                return Err(Error::invalid(format!(
                    "{kind}: receive blocks {a} (elements {}..{}) and {b} (elements {}..{}) \
                     overlap; receive blocks must be disjoint (send blocks may overlap)",
                    displs[a],
                    displs[a] + counts[a],
                    displs[b],
                    displs[b] + counts[b]
                )));
            }
        }
    }
    Ok((!packed).then_some(crate::buffer::Blocks { counts, displs }))
}
