//! Looking at a message before receiving it (MPI's `Probe` and `Iprobe`): what a receive from a
//! peer with a tag would take, so that the receiver can size its buffer.

use super::*;

/// What a message waiting to be received holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageInfo {
    /// Its element type (as the sender passed it).
    pub dtype: DataType,
    /// Its number of elements.
    pub count: usize,
}

impl Communicator {
    /// Wait for the message from `peer` with `tag` that a receive posted now would take, and
    /// say what it holds without taking it (MPI's `Probe`). The probe stands in line with the
    /// receives: it sees the message after those that receives posted before it will take, and
    /// the next receive posted after it takes the message it saw. Host messages only.
    pub fn probe(&self, peer: usize, tag: u32) -> Result<MessageInfo> {
        self.peek(peer, tag, true)
            .map(|m| m.expect("a waiting probe has its message"))
    }

    /// [`Communicator::probe`] without waiting: `None` when receives posted earlier are not
    /// done yet or the message has not arrived (MPI's `Iprobe`).
    pub fn iprobe(&self, peer: usize, tag: u32) -> Result<Option<MessageInfo>> {
        self.peek(peer, tag, false)
    }

    fn peek(&self, peer: usize, tag: u32, wait: bool) -> Result<Option<MessageInfo>> {
        self.host_only("probe")?;
        self.check_rank("source", peer)?;
        self.check_poison()?;
        // A place in the receives' line, given up when this returns: the message stays first
        // in the mailbox for the next receive.
        let turn = self.inner.turns.take(Side::Recv, peer, tag);
        let now = Instant::now();
        let deadline = now + self.timeout();
        if !wait && !turn.wait(now) {
            return Ok(None);
        }
        self.await_turn(&turn, "probe", DataType::U8, 0, deadline)?;
        let call = self.p2p_call(DataType::U8, 0, tag);
        let src = self.inner.ranks[peer];
        let mailbox = self.inner.transport.mailbox();
        if !wait && !mailbox.has_frames(src, call.comm_id, call.seq) {
            mailbox.pump_once(src);
        }
        if !wait && !mailbox.has_frames(src, call.comm_id, call.seq) {
            return Ok(None);
        }
        // Point-to-point lanes match frames by key alone: any message's first frame comes.
        let frame = match mailbox.take(src, call.comm_id, call.seq, &call.fp, deadline, 0) {
            Ok(f) => f,
            Err(e) => {
                let mut e = self.routed(call).wait_error(e, vec![peer]);
                if let Error::Timeout { op, .. } = &mut e {
                    *op = format!("probe(tag {tag})");
                }
                return Err(self.fail(e));
            }
        };
        let (dtype, total, offset) = (frame.env.fp.dtype, frame.total_len, frame.offset);
        mailbox.put_back(src, frame);
        if offset != 0 {
            return Err(Error::Protocol(format!(
                "probe from rank {peer} (tag {tag}): the next frame starts at byte {offset}, not \
                 at a message's start"
            )));
        }
        Ok(Some(MessageInfo {
            dtype,
            count: total as usize / dtype.size(),
        }))
    }
}
