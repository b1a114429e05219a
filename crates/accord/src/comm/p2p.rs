//! Point-to-point messages: send and receive, in MPI's non-overtaking order per (peer, tag)
//! (see [`crate::p2p_order`]), blocking or posted now and run later.

use super::*;

impl Communicator {
    /// Send `data` to `peer` with `tag`. Returns once the data is handed to the transport (it
    /// does not wait for the matching receive). Messages to one peer with one tag arrive in
    /// the order they were sent, also when several threads send them.
    pub fn send<T: Element>(&self, data: &[T], peer: usize, tag: u32) -> Result<()> {
        self.send_bytes(as_bytes(data), T::DTYPE, peer, tag)
    }

    /// Receive exactly `buf.len()` elements from `peer` with `tag`: the oldest message with that
    /// tag from `peer` that no receive posted earlier takes.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        self.recv_bytes(as_bytes_mut(buf), T::DTYPE, peer, tag)
    }

    /// Send to `dest` and receive from `source` at once (no deadlock between pairs of ranks that
    /// exchange with each other).
    pub fn sendrecv<T: Element>(
        &self,
        send: &[T],
        dest: usize,
        recv: &mut [T],
        source: usize,
        tag: u32,
    ) -> Result<()> {
        self.send(send, dest, tag)?;
        self.recv(recv, source, tag)
    }

    /// Take this send's place in the order of messages to `peer` with `tag` now, to move the
    /// data later, possibly on another thread, with [`Communicator::send_posted`]: what a
    /// nonblocking send does. Dropping the turn unused gives the place up.
    pub fn post_send(&self, peer: usize, tag: u32) -> Result<Turn> {
        self.check_rank("destination", peer)?;
        Ok(self.inner.turns.take(Side::Send, peer, tag))
    }

    /// Take this receive's place among the receives from `peer` with `tag` (see
    /// [`Communicator::post_send`]); [`Communicator::recv_posted`] moves the data.
    pub fn post_recv(&self, peer: usize, tag: u32) -> Result<Turn> {
        self.check_rank("source", peer)?;
        Ok(self.inner.turns.take(Side::Recv, peer, tag))
    }

    fn p2p_envelope(&self, dtype: DataType, count: usize, tag: u32) -> Envelope {
        Envelope {
            comm: self.inner.id,
            seq: P2P_LANE | tag as u64,
            fp: Fingerprint::new(OpKind::P2p, dtype, count),
        }
    }

    /// Wait for `turn` (a `what` of `dtype x count`) until `deadline`.
    fn await_turn(
        &self,
        turn: &Turn,
        what: &str,
        dtype: DataType,
        count: usize,
        deadline: Instant,
    ) -> Result<()> {
        if turn.wait(deadline) {
            return Ok(());
        }
        Err(Error::Timeout {
            op: format!("{what}({dtype} x {count}, tag {})", turn.tag()),
            seq: 0,
            comm: self.inner.name.clone(),
            waiting_for: vec![turn.peer()],
            after: self.timeout(),
            hint: format!(
                " (behind an earlier {what} with rank {} and tag {} that has not finished)",
                turn.peer(),
                turn.tag()
            ),
        })
    }

    /// Erased [`Communicator::send`].
    pub fn send_bytes(&self, data: &[u8], dtype: DataType, peer: usize, tag: u32) -> Result<()> {
        self.send_posted(self.post_send(peer, tag)?, data, dtype)
    }

    /// Send `data` in the place `turn` took (see [`Communicator::post_send`]).
    pub fn send_posted(&self, turn: Turn, data: &[u8], dtype: DataType) -> Result<()> {
        if turn.side() != Side::Send || !turn.belongs_to(&self.inner.turns) {
            return Err(Error::invalid(
                "send_posted needs a turn from post_send on the same communicator",
            ));
        }
        self.check_poison()?;
        let (peer, tag) = (turn.peer(), turn.tag());
        let count = elements("send buffer", data.len(), dtype)?;
        let env = self.p2p_envelope(dtype, count, tag);
        self.await_turn(&turn, "send", dtype, count, Instant::now() + self.timeout())?;
        if peer == self.rank() {
            let me = self.inner.ranks[peer];
            let mailbox = self.inner.transport.mailbox();
            return crate::transport::for_each_chunk(
                data,
                crate::transport::chunk_bytes(),
                |off, b| {
                    mailbox.deliver_own(
                        me,
                        Frame {
                            env,
                            total_len: data.len() as u64,
                            offset: off as u64,
                            data: b.to_vec(),
                        },
                    );
                    Ok(())
                },
            );
        }
        self.inner
            .transport
            .send(self.inner.ranks[peer], &env, data)
            .map_err(|e| self.fail(e))
    }

    /// Erased [`Communicator::recv`].
    pub fn recv_bytes(&self, buf: &mut [u8], dtype: DataType, peer: usize, tag: u32) -> Result<()> {
        self.recv_posted(self.post_recv(peer, tag)?, buf, dtype)
    }

    /// Receive into `buf` in the place `turn` took (see [`Communicator::post_recv`]). A message
    /// of another size or type is refused with [`Error::InvalidArgument`] and left for a
    /// matching receive.
    pub fn recv_posted(&self, turn: Turn, buf: &mut [u8], dtype: DataType) -> Result<()> {
        if turn.side() != Side::Recv || !turn.belongs_to(&self.inner.turns) {
            return Err(Error::invalid(
                "recv_posted needs a turn from post_recv on the same communicator",
            ));
        }
        self.check_poison()?;
        let (peer, tag) = (turn.peer(), turn.tag());
        let count = elements("receive buffer", buf.len(), dtype)?;
        let env = self.p2p_envelope(dtype, count, tag);
        let mut call = self.call(env.seq, env.fp, dtype, ReduceOp::Sum);
        call.fp = env.fp;
        let deadline = Instant::now() + self.timeout();
        self.await_turn(&turn, "recv", dtype, count, deadline)?;
        exec::receive(&call, peer, buf.as_mut_ptr(), buf.len(), false, deadline, || vec![peer])
            .map_err(|e| match e {
                // A size mismatch on send/recv is an argument error, not a collective desync.
                Error::Desync { mine, theirs, .. } => Error::invalid(format!(
                    "recv from rank {peer} (tag {tag}): this rank posted {mine} but the sender sent {theirs}"
                )),
                e => self.fail(e),
            })
    }

    /// Nonblocking [`Communicator::recv`]: it takes its place among the receives from `peer`
    /// with `tag` now (see [`Communicator::post_recv`]) and runs on a thread of `scope`.
    pub fn irecv<'scope, 'env, T: Element>(
        &self,
        scope: &'scope Scope<'scope, 'env>,
        buf: &'scope mut [T],
        peer: usize,
        tag: u32,
    ) -> Request<'scope> {
        let (comm, turn) = (self.clone(), self.post_recv(peer, tag));
        Request {
            handle: scope.spawn(move || comm.recv_posted(turn?, as_bytes_mut(buf), T::DTYPE)),
        }
    }

    /// Nonblocking [`Communicator::send`]: it takes its place among the messages to `peer`
    /// with `tag` now (see [`Communicator::post_send`]) and runs on a thread of `scope`.
    pub fn isend<'scope, 'env, T: Element>(
        &self,
        scope: &'scope Scope<'scope, 'env>,
        data: &'scope [T],
        peer: usize,
        tag: u32,
    ) -> Request<'scope> {
        let (comm, turn) = (self.clone(), self.post_send(peer, tag));
        Request {
            handle: scope.spawn(move || comm.send_posted(turn?, as_bytes(data), T::DTYPE)),
        }
    }
}
