//! Point-to-point messages: send and receive, in MPI's non-overtaking order per (peer, tag)
//! (see [`crate::p2p_order`]), blocking or posted now and run later.

use super::*;
use crate::observe::Route;

impl Communicator {
    /// Send `data` to `peer` with `tag`. Host data: returns once the data is handed to the
    /// transport (it does not wait for the matching receive); messages to one peer with one tag
    /// arrive in the order they were sent, also when several threads send them. Device data is
    /// enqueued on its stream (tag 0 only).
    pub fn send<'a>(&self, data: impl AsSend<'a>, peer: usize, tag: u32) -> Result<Completion> {
        let data = data.into_send();
        match data.data {
            SendData::Host(_) => {
                self.send_posted(self.post_send(peer, tag)?, data)?;
                Ok(Completion::done())
            }
            SendData::Device(d, stream) => {
                self.check_rank("destination", peer)?;
                no_device_tag(tag)?;
                self.on_device_p2p(OpKind::P2p, d, (peer, tag, false), |g| {
                    g.send(d, peer, stream)
                })
            }
        }
    }

    /// Receive exactly as many elements as `buf` holds from `peer` with `tag`: the oldest
    /// message with that tag from `peer` that no receive posted earlier takes. Device buffers
    /// are filled on their stream (tag 0 only).
    pub fn recv<'a>(&self, buf: impl AsRecv<'a>, peer: usize, tag: u32) -> Result<Completion> {
        let buf = buf.into_recv();
        match buf.data {
            RecvData::Host(_) => {
                self.recv_posted(self.post_recv(peer, tag)?, buf)?;
                Ok(Completion::done())
            }
            RecvData::Device(d, stream) => {
                self.check_rank("source", peer)?;
                no_device_tag(tag)?;
                self.on_device_p2p(OpKind::P2p, d, (peer, tag, true), |g| {
                    g.recv(d, peer, stream)
                })
            }
        }
    }

    /// Send to `dest` and receive from `source` at once (no deadlock between pairs of ranks that
    /// exchange with each other).
    pub fn sendrecv<'s, 'r>(
        &self,
        send: impl AsSend<'s>,
        dest: usize,
        recv: impl AsRecv<'r>,
        source: usize,
        tag: u32,
    ) -> Result<Completion> {
        let (send, recv) = (send.into_send(), recv.into_recv());
        match (send.data, recv.data) {
            (SendData::Device(s, _), RecvData::Device(r, stream)) => {
                self.check_rank("destination", dest)?;
                self.check_rank("source", source)?;
                no_device_tag(tag)?;
                self.on_device_p2p(OpKind::SendRecv, s, (dest, tag, false), |g| {
                    g.sendrecv(s, dest, r, source, stream)
                })
            }
            (SendData::Host(_), data @ RecvData::Host(_)) => {
                self.send(send, dest, tag)?;
                self.recv(RecvBuf { data, ..recv }, source, tag)
            }
            _ => Err(Error::invalid(
                "sendrecv: one buffer is in host memory and the other on a GPU; pass both in \
                 the same memory",
            )),
        }
    }

    /// Enqueue point-to-point work on device buffers (`enqueue`), recorded in the flight
    /// record as `kind` with `buf`'s size and `(peer, tag, receive)`.
    fn on_device_p2p(
        &self,
        kind: OpKind,
        buf: crate::gpu::DeviceSlice,
        peer_tag_recv: (usize, u32, bool),
        enqueue: impl FnOnce(&crate::gpu::GpuCommunicator) -> Result<crate::gpu::GpuRequest>,
    ) -> Result<Completion> {
        self.check_poison()?;
        let g = self.device_engine()?;
        let bytes = buf.count() * buf.dtype().size();
        let rec = self.record_p2p(kind, buf.dtype(), bytes, peer_tag_recv);
        let r = enqueue(g);
        if r.is_ok() {
            // The record names the engine, as a device collective's does.
            self.record_route(rec, Route::Device);
        }
        self.record_end(rec, &r);
        Ok(Completion::device(r?))
    }

    /// Take this send's place in the order of messages to `peer` with `tag` now, to move the
    /// data later, possibly on another thread, with [`Communicator::send_posted`]: what a
    /// nonblocking send does. Dropping the turn unused gives the place up.
    pub fn post_send(&self, peer: usize, tag: u32) -> Result<Turn> {
        self.host_only("send")?;
        self.check_rank("destination", peer)?;
        Ok(self.inner.turns.take(Side::Send, peer, tag))
    }

    /// Take this receive's place among the receives from `peer` with `tag` (see
    /// [`Communicator::post_send`]); [`Communicator::recv_posted`] moves the data.
    pub fn post_recv(&self, peer: usize, tag: u32) -> Result<Turn> {
        self.host_only("recv")?;
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

    /// A point-to-point message's call on this communicator: its lane and fingerprint.
    pub(super) fn p2p_call(&self, dtype: DataType, count: usize, tag: u32) -> crate::op::Call<'_> {
        let env = self.p2p_envelope(dtype, count, tag);
        crate::op::Call {
            comm_id: env.comm,
            comm_name: &self.inner.name,
            seq: env.seq,
            fp: env.fp,
            dtype,
            op: ReduceOp::Sum,
            timeout: self.timeout(),
            until: None,
        }
    }

    /// Wait for `turn` (a `what` of `dtype x count`) until `deadline`.
    pub(super) fn await_turn(
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

    /// Send `data` in the place `turn` took (see [`Communicator::post_send`]).
    pub fn send_posted<'a>(&self, turn: Turn, data: impl AsSend<'a>) -> Result<()> {
        let data = data.into_send();
        let dtype = data.dtype;
        let SendData::Host(data) = data.data else {
            return Err(Error::invalid("send_posted takes host memory"));
        };
        if turn.side() != Side::Send || !turn.belongs_to(&self.inner.turns) {
            return Err(Error::invalid(
                "send_posted needs a turn from post_send on the same communicator",
            ));
        }
        self.check_poison()?;
        let (peer, tag) = (turn.peer(), turn.tag());
        let count = elements("send buffer", data.len(), dtype)?;
        let rec = self.record_p2p(OpKind::P2p, dtype, data.len(), (peer, tag, false));
        let span = self.trace_begin();
        let r = self.send_in_turn(&turn, dtype, count, data);
        self.record_end(rec, &r);
        if let Some(span) = span {
            let fp = crate::fingerprint::Fingerprint::new(OpKind::P2p, dtype, count);
            let name = format!("send to {peer} (tag {tag})");
            self.trace_end(span, (name, None), &fp, Route::Unknown, &r);
        }
        r
    }

    /// The body of [`Communicator::send_posted`], its arguments checked.
    fn send_in_turn(&self, turn: &Turn, dtype: DataType, count: usize, data: &[u8]) -> Result<()> {
        let (peer, tag) = (turn.peer(), turn.tag());
        let env = self.p2p_envelope(dtype, count, tag);
        self.await_turn(turn, "send", dtype, count, Instant::now() + self.timeout())?;
        if peer == self.rank() {
            let me = self.inner.ranks[peer];
            let mailbox = self.inner.transport.mailbox();
            return crate::transport::for_each_chunk(
                data,
                crate::transport::chunk_bytes(),
                |off, b| {
                    mailbox.deliver_own(
                        me,
                        Frame::new(env, data.len() as u64, off as u64, b.to_vec()),
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

    /// Receive into `buf` in the place `turn` took (see [`Communicator::post_recv`]). A message
    /// of another size or type is refused with [`Error::InvalidArgument`] and left for a
    /// matching receive.
    pub fn recv_posted<'a>(&self, turn: Turn, buf: impl AsRecv<'a>) -> Result<()> {
        let buf = buf.into_recv();
        let dtype = buf.dtype;
        let RecvData::Host(buf) = buf.data else {
            return Err(Error::invalid("recv_posted takes host memory"));
        };
        if turn.side() != Side::Recv || !turn.belongs_to(&self.inner.turns) {
            return Err(Error::invalid(
                "recv_posted needs a turn from post_recv on the same communicator",
            ));
        }
        self.check_poison()?;
        let (peer, tag) = (turn.peer(), turn.tag());
        let count = elements("receive buffer", buf.len(), dtype)?;
        let rec = self.record_p2p(OpKind::P2p, dtype, buf.len(), (peer, tag, true));
        let span = self.trace_begin();
        let routed = self.routed(self.p2p_call(dtype, count, tag));
        let deadline = Instant::now() + self.timeout();
        let r = self.await_turn(&turn, "recv", dtype, count, deadline).and_then(|()| {
            let copy = exec::Delivery::Copy;
            exec::receive(&routed, peer, buf.as_mut_ptr(), buf.len(), copy, deadline, None, || {
                vec![peer]
            })
            .map_err(|e| match e {
                // A size mismatch on send/recv is an argument error, not a collective desync.
                Error::Desync { mine, theirs, .. } => Error::invalid(format!(
                    "recv from rank {peer} (tag {tag}): this rank posted {mine} but the sender sent {theirs}"
                )),
                e => self.fail(e),
            })
        });
        self.record_end(rec, &r);
        if let Some(span) = span {
            let fp = crate::fingerprint::Fingerprint::new(OpKind::P2p, dtype, count);
            let name = format!("recv from {peer} (tag {tag})");
            self.trace_end(span, (name, None), &fp, Route::Unknown, &r);
        }
        r
    }

    /// Nonblocking [`Communicator::recv`] of host memory: it takes its place among the
    /// receives from `peer` with `tag` now (see [`Communicator::post_recv`]) and runs on a thread
    /// of `scope`.
    pub fn irecv<'scope, 'env>(
        &self,
        scope: &'scope Scope<'scope, 'env>,
        buf: impl AsRecv<'scope> + Send + 'scope,
        peer: usize,
        tag: u32,
    ) -> Request<'scope> {
        let (comm, turn) = (self.clone(), self.post_recv(peer, tag));
        Request {
            handle: scope.spawn(move || comm.recv_posted(turn?, buf)),
        }
    }

    /// Nonblocking [`Communicator::send`] of host memory: it takes its place among the messages
    /// to `peer` with `tag` now (see [`Communicator::post_send`]) and runs on a thread of
    /// `scope`.
    pub fn isend<'scope, 'env>(
        &self,
        scope: &'scope Scope<'scope, 'env>,
        data: impl AsSend<'scope> + Send + 'scope,
        peer: usize,
        tag: u32,
    ) -> Request<'scope> {
        let (comm, turn) = (self.clone(), self.post_send(peer, tag));
        Request {
            handle: scope.spawn(move || comm.send_posted(turn?, data)),
        }
    }
}

/// Device messages have no tags (NCCL matches them by order alone).
fn no_device_tag(tag: u32) -> Result<()> {
    match tag {
        0 => Ok(()),
        t => Err(Error::invalid(format!(
            "tag {t}: messages between device buffers are matched by order alone; use tag 0"
        ))),
    }
}
