//! The executor: runs one rank's [`Schedule`] on a [`Transport`].
//!
//! It resolves [`Span`]s to bytes, hands sends to the transport, takes incoming frames from the
//! mailbox chunk by chunk (reducing each chunk as it arrives, so the network and the reduction
//! overlap), and turns every way a wait can end badly into an [`Error`] that names the call and the
//! ranks involved.

use crate::blame;
use crate::dtype;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::op::Call;
use crate::schedule::{Buf, Schedule, Span, Step};
use crate::transport::placement::Posted;
use crate::transport::{Envelope, Transport, WaitError, P2P_LANE};
use std::time::Instant;

/// A call and the route its messages take: the transport and this communicator's ranks on it.
pub(crate) struct Routed<'a> {
    pub call: Call<'a>,
    pub transport: &'a dyn Transport,
    /// Communicator rank -> transport rank.
    pub ranks: &'a [usize],
    /// Communicator rank -> the rank errors name (a step's communicator names its caller's).
    pub shown_as: Option<&'a [usize]>,
    /// This rank in the communicator.
    pub me: usize,
}

impl<'a> std::ops::Deref for Routed<'a> {
    type Target = Call<'a>;
    fn deref(&self) -> &Call<'a> {
        &self.call
    }
}

/// The caller's memory for one call. `input` may equal `output` (an in-place call); the executor
/// only ever touches them through raw pointers for that reason.
pub(crate) struct Buffers {
    pub input: *const u8,
    pub input_len: usize,
    pub output: *mut u8,
    pub output_len: usize,
}

impl Routed<'_> {
    /// Communicator rank `c` as errors name it.
    fn shown(&self, c: usize) -> usize {
        self.shown_as.map_or(c, |s| s[c])
    }

    fn envelope(&self) -> Envelope {
        Envelope {
            comm: self.comm_id,
            seq: self.seq,
            fp: self.fp,
        }
    }

    /// Turn a failed wait on `peer` into an error naming the call. A timeout names the rank
    /// that stalls the call, found by following what `waiting_for` are blocked on in turn
    /// ([`crate::blame`]).
    pub fn wait_error(&self, err: WaitError, waiting_for: Vec<usize>) -> Error {
        let shown = |c: usize| self.shown(c);
        match err {
            WaitError::Timeout { elsewhere } => {
                let mut hint = match elsewhere.first() {
                    Some(seq) => format!(
                        "; rank {} has sent data for op #{seq} instead (did it skip or add a call?)",
                        shown(waiting_for.first().copied().unwrap_or(0))
                    ),
                    None => String::new(),
                };
                let world: Vec<usize> = waiting_for.iter().map(|&c| self.ranks[c]).collect();
                let finding =
                    blame::diagnose(self.transport, self.comm_id, self.seq, &world, self.timeout);
                if finding == blame::Finding::Aborted {
                    if let Some(e) = aborted(self.transport) {
                        return e;
                    }
                }
                let member = |w: usize| self.ranks.iter().position(|&r| r == w);
                hint.push_str(&blame::describe(&finding, &|w| match member(w) {
                    Some(c) => format!("rank {}", shown(c)),
                    None => format!("world rank {w}"),
                }));
                // Culprits outside this communicator are named by the hint alone.
                let culprits: Option<Vec<usize>> =
                    finding.culprits().into_iter().map(member).collect();
                // Only receives wait here; a point-to-point one is named like `recv`'s own
                // timeouts, by its tag.
                let (op, seq) = if self.seq & P2P_LANE != 0 {
                    let tag = self.seq & !P2P_LANE;
                    let (dtype, count) = (self.fp.dtype, self.fp.count);
                    (format!("recv({dtype} x {count}, tag {tag})"), 0)
                } else {
                    (self.fp.to_string(), self.seq)
                };
                Error::Timeout {
                    op,
                    seq,
                    comm: self.comm_name.to_string(),
                    waiting_for: (culprits.filter(|c| !c.is_empty()).unwrap_or(waiting_for))
                        .into_iter()
                        .map(shown)
                        .collect(),
                    after: self.timeout,
                    hint,
                }
            }
            // PeerLost names a world rank, like the transports' own errors.
            WaitError::Lost { cause } => Error::PeerLost {
                rank: waiting_for
                    .first()
                    .map_or(0, |&r| self.ranks.get(r).copied().unwrap_or(r)),
                cause,
            },
            WaitError::Mismatch { src, theirs } => Error::Desync {
                me: shown(self.me),
                mine: self.fp.shown_beside(&theirs),
                peer: (self.ranks.iter().position(|&r| r == src)).map_or(src, shown),
                theirs: theirs.shown_beside(&self.fp),
                comm: self.comm_name.to_string(),
                seq: self.seq,
            },
            WaitError::Aborted { by, reason } => Error::aborted_by(by, &reason),
        }
    }
}

/// The abort notice this rank heard, as an error.
pub(crate) fn aborted(t: &dyn Transport) -> Option<Error> {
    t.mailbox()
        .aborted()
        .map(|(by, reason)| Error::aborted_by(by, &reason))
}

/// Resolved memory of the three buffers.
struct Memory<'m> {
    bufs: &'m Buffers,
    tmp: Vec<u8>,
    esz: usize,
}

impl Drop for Memory<'_> {
    /// The scratch is kept for this thread's next schedule ([`crate::scratch`]).
    fn drop(&mut self) {
        crate::scratch::SCHEDULES.give_back(std::mem::take(&mut self.tmp));
    }
}

impl Memory<'_> {
    /// Byte range of `span`, bounds-checked (a failure here is a bug in an algorithm, reported as
    /// an error rather than memory corruption).
    fn range(&mut self, span: Span) -> Result<(*mut u8, usize)> {
        let (base, len) = match span.buf {
            Buf::In => (self.bufs.input as *mut u8, self.bufs.input_len),
            Buf::Out => (self.bufs.output, self.bufs.output_len),
            Buf::Tmp => (self.tmp.as_mut_ptr(), self.tmp.len()),
        };
        let start = span.off * self.esz;
        let bytes = span.len * self.esz;
        if start + bytes > len {
            return Err(Error::Unsupported(format!(
                "internal: schedule step touches {span:?} outside a buffer of {len} bytes"
            )));
        }
        // SAFETY: start + bytes <= len, the buffer's length in bytes.
        Ok((unsafe { base.add(start) }, bytes))
    }
}

/// Run `sched` for `call` over `bufs`.
pub(crate) fn execute(call: &Routed<'_>, sched: &Schedule, bufs: &Buffers) -> Result<()> {
    let esz = call.dtype.size();
    let mut mem = Memory {
        bufs,
        // Schedules write scratch before they read it (the checker's values start unset).
        tmp: crate::scratch::SCHEDULES.take(sched.tmp_len * esz),
        esz,
    };
    // Set at the first wait (a call that never waits does not read the clock).
    let mut deadline = None;
    let env = call.envelope();
    let traced = crate::observe::trace::enabled();
    for (no, round) in sched.rounds.iter().enumerate() {
        let began = if traced {
            crate::observe::clock::precise_ns()
        } else {
            0
        };
        // Destinations posted before the round's sends: a peer that sends at once (an
        // exchange) has its frames read straight into them while this rank writes its own.
        let mut early = post_early(call, &mut mem, round)?;
        // Sends whose bytes the round does not write go on in the background (a transport
        // that deals large messages over several connections) while the round receives;
        // they end with the round.
        let mut sending = Vec::new();
        for step in round {
            if let Step::Send { peer, src } = *step {
                let (p, n) = mem.range(src)?;
                // SAFETY: in bounds (`range`); the buffers outlive the call, and a send that
                // goes on in the background reads bytes nothing writes before it ends.
                let data = unsafe { std::slice::from_raw_parts(p, n) };
                let to = call.ranks[peer];
                match written_in_round(&mut mem, round, (p, n))? {
                    true => call.transport.send(to, &env, data)?,
                    false => {
                        let s = call.transport.send_start(to, &env, data)?;
                        // One that finished (every small one) needs no place in the list.
                        if !s.is_done() {
                            sending.push(s);
                        }
                    }
                }
            }
        }
        for (i, step) in round.iter().enumerate() {
            match *step {
                Step::Send { .. } => {}
                Step::Recv { peer, dst } | Step::RecvReduce { peer, dst, .. } => {
                    let (p, n) = mem.range(dst)?;
                    let into = match *step {
                        Step::RecvReduce { src, .. } => {
                            let (s, m) = mem.range(src)?;
                            if m != n {
                                return Err(Error::Unsupported(format!(
                                    "internal: schedule reduces {src:?} into {dst:?}"
                                )));
                            }
                            Delivery::Reduce(s)
                        }
                        _ => Delivery::Copy,
                    };
                    let deadline = *deadline.get_or_insert_with(|| call.deadline());
                    let posted = early
                        .iter()
                        .position(|(step, _)| *step == i)
                        .map(|at| early.swap_remove(at).1);
                    receive(call, peer, p, n, into, deadline, posted, || {
                        pending_peers(&round[i..])
                    })?;
                }
                Step::Copy { src, dst } => {
                    let (s, n) = mem.range(src)?;
                    let (d, m) = mem.range(dst)?;
                    debug_assert_eq!(n, m);
                    if s != d {
                        // SAFETY: both ranges are in bounds; `copy` tolerates overlap.
                        unsafe { std::ptr::copy(s, d, n.min(m)) };
                    }
                }
                Step::Reduce { src, dst } => {
                    let (s, n) = mem.range(src)?;
                    let (d, m) = mem.range(dst)?;
                    // Overlapping operands (possible only in place) go through a copy.
                    let overlap = overlaps((s, n), (d, m));
                    // SAFETY: both ranges are in bounds; the copy is made before the
                    // destination is borrowed, and otherwise the two ranges are disjoint.
                    let copy =
                        overlap.then(|| unsafe { std::slice::from_raw_parts(s, n) }.to_vec());
                    let src_slice = match &copy {
                        Some(c) => c.as_slice(),
                        None => unsafe { std::slice::from_raw_parts(s, n) },
                    };
                    let dst_slice = unsafe { std::slice::from_raw_parts_mut(d, m) };
                    dtype::reduce_into(call.dtype, call.op, dst_slice, src_slice);
                }
                Step::Finalize { dst } => {
                    let (d, m) = mem.range(dst)?;
                    // SAFETY: in bounds; nothing else refers to this range during the step.
                    let dst_slice = unsafe { std::slice::from_raw_parts_mut(d, m) };
                    dtype::finalize(call.dtype, call.op, dst_slice, call.ranks.len());
                }
            }
        }
        for s in sending {
            s.wait()?;
        }
        if traced {
            trace_round(no, round, esz, began);
        }
    }
    Ok(())
}

/// Post the destinations of the receives of `round` that [`early_receives`] finds, where
/// [`places`] says: by step index.
fn post_early<'t>(
    call: &Routed<'t>,
    mem: &mut Memory<'_>,
    round: &[Step],
) -> Result<Vec<(usize, Posted<'t>)>> {
    let mailbox = call.transport.mailbox();
    Ok(early_receives(mem, round, |n| places(Delivery::Copy, n))?
        .into_iter()
        .map(|e| {
            let src = call.ranks[e.peer];
            let posted = mailbox.post(src, call.comm_id, call.seq, &call.fp, e.dst, e.len);
            (e.step, posted)
        })
        .collect())
}

/// A receive of a round whose destination may be posted before the round's sends.
struct EarlyReceive {
    step: usize,
    peer: usize,
    dst: *mut u8,
    len: usize,
}

/// The receives of `round` whose destinations may be posted before its sends: those that copy
/// a message in place, of a length `wanted` accepts, and are their peer's first in the round (a
/// later one's message comes after the earlier's), where no other step of the round touches
/// those bytes (a send reading them, a copy before the receive).
fn early_receives(
    mem: &mut Memory<'_>,
    round: &[Step],
    wanted: impl Fn(usize) -> bool,
) -> Result<Vec<EarlyReceive>> {
    // Most rounds (every round of a small call) have no receive long enough: nothing to scan.
    let long = |s: &Step| matches!(*s, Step::Recv { dst, .. } if wanted(dst.len * mem.esz));
    if !round.iter().any(long) {
        return Ok(Vec::new());
    }
    let mut early = Vec::new();
    let mut heard: Vec<usize> = Vec::new();
    for (i, step) in round.iter().enumerate() {
        let (peer, into) = match *step {
            Step::Recv { peer, dst } => (peer, Some(dst)),
            Step::RecvReduce { peer, .. } => (peer, None),
            _ => continue,
        };
        if heard.contains(&peer) {
            continue;
        }
        heard.push(peer);
        let Some(dst) = into else { continue };
        let (at, len) = mem.range(dst)?;
        // The length first: the scan of the round is for the few receives large enough.
        if wanted(len) && !touched_by_others(mem, round, i, (at, len))? {
            early.push(EarlyReceive {
                step: i,
                peer,
                dst: at,
                len,
            });
        }
    }
    Ok(early)
}

/// Whether a step of `round` other than step `me` reads or writes any of the bytes at `at`.
fn touched_by_others(
    mem: &mut Memory<'_>,
    round: &[Step],
    me: usize,
    at: (*mut u8, usize),
) -> Result<bool> {
    for (j, step) in round.iter().enumerate() {
        if j == me {
            continue;
        }
        for span in [read_by(step), written_by(step)].into_iter().flatten() {
            if overlaps(mem.range(span)?, at) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Whether a step of `round` writes any of the bytes at `at`.
fn written_in_round(mem: &mut Memory<'_>, round: &[Step], at: (*mut u8, usize)) -> Result<bool> {
    for span in round.iter().filter_map(written_by) {
        if overlaps(mem.range(span)?, at) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The bytes `step` reads besides those it writes.
fn read_by(step: &Step) -> Option<Span> {
    match *step {
        Step::Send { src, .. }
        | Step::RecvReduce { src, .. }
        | Step::Copy { src, .. }
        | Step::Reduce { src, .. } => Some(src),
        Step::Recv { .. } | Step::Finalize { .. } => None,
    }
}

/// The bytes `step` writes.
fn written_by(step: &Step) -> Option<Span> {
    match *step {
        Step::Recv { dst, .. }
        | Step::RecvReduce { dst, .. }
        | Step::Copy { dst, .. }
        | Step::Reduce { dst, .. }
        | Step::Finalize { dst } => Some(dst),
        Step::Send { .. } => None,
    }
}

/// Whether two byte ranges share a byte.
fn overlaps((a, n): (*mut u8, usize), (b, m): (*mut u8, usize)) -> bool {
    (a as usize) < b as usize + m && (b as usize) < a as usize + n
}

/// A round of a schedule on the timeline: whom it sent to and received from, how much.
#[cold]
fn trace_round(no: usize, round: &[Step], esz: usize, began: u64) {
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    for s in round {
        match *s {
            Step::Send { peer, src } => sends.push([peer, src.len * esz]),
            Step::Recv { peer, dst } | Step::RecvReduce { peer, dst, .. } => {
                recvs.push([peer, dst.len * esz])
            }
            _ => {}
        }
    }
    crate::observe::trace::step(
        || format!("round {no}"),
        began,
        serde_json::json!({"send [peer, bytes]": sends, "recv [peer, bytes]": recvs}),
    );
}

/// Peers of the receives from `steps` onwards, deduplicated, for timeout messages.
fn pending_peers(steps: &[Step]) -> Vec<usize> {
    let mut peers = Vec::new();
    for s in steps {
        if let Step::Recv { peer, .. } | Step::RecvReduce { peer, .. } = *s {
            if !peers.contains(&peer) {
                peers.push(peer);
            }
        }
    }
    peers
}

/// The size that decides whether a wait polls: the larger of this message and the call's
/// per-rank count (a pipelined call's pieces stream like one large message).
fn message_bytes(call: &Routed<'_>, len: usize) -> usize {
    let per_rank = (call.fp.count as usize).saturating_mul(call.fp.dtype.size());
    len.max(per_rank)
}

/// Receives of a whole message into one destination from this size let frames be read
/// straight into it ([`crate::transport::placement`]); a transport reads there only frames of
/// at least 32 KiB.
const PLACE_MIN_BYTES: usize = 32 << 10;

/// What a receive does with a message's bytes.
#[derive(Clone, Copy)]
pub(crate) enum Delivery {
    /// Copies them to the destination.
    Copy,
    /// Reduces them with the `len` bytes at this operand (which may be the destination) into
    /// the destination, chunk by chunk: the operand's chunk is copied while the message's
    /// chunk is in cache, instead of the whole operand in a pass of its own before.
    Reduce(*const u8),
}

/// Whether a receive of `len` bytes delivered `into` its destination posts it, so that frames
/// may be read straight into it: one that copies, from [`PLACE_MIN_BYTES`]. (A point-to-point
/// receive of another size than the next message leaves it for another receive: frames of
/// another size are never placed, nor any after them; see [`crate::transport::placement`].)
fn places(into: Delivery, len: usize) -> bool {
    matches!(into, Delivery::Copy) && len >= PLACE_MIN_BYTES
}

/// Receive one message of exactly `len` bytes from communicator rank `peer` into `dst`, copying
/// or reducing chunk by chunk; `posted` is the destination's posting where it was made before
/// (else it is made here where [`places`] says). `waiting_for` lists the ranks to name if the
/// deadline passes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn receive(
    call: &Routed<'_>,
    peer: usize,
    dst: *mut u8,
    len: usize,
    into: Delivery,
    deadline: Instant,
    posted: Option<Posted<'_>>,
    waiting_for: impl Fn() -> Vec<usize>,
) -> Result<()> {
    let src = call.ranks[peer];
    let mailbox = call.transport.mailbox();
    let mut got = 0usize;
    // Frames that arrive from now on may be read straight into the destination.
    let _posted = posted.or_else(|| {
        places(into, len).then(|| mailbox.post(src, call.comm_id, call.seq, &call.fp, dst, len))
    });
    loop {
        let frame = mailbox
            .take(
                src,
                call.comm_id,
                call.seq,
                &call.fp,
                deadline,
                message_bytes(call, len),
            )
            .map_err(|e| match e {
                WaitError::Timeout { .. } => {
                    // Peers whose data for this call already waits here are not missing.
                    let mut missing = waiting_for();
                    missing.retain(|&p| {
                        p == peer || !mailbox.has_frames(call.ranks[p], call.comm_id, call.seq)
                    });
                    call.wait_error(e, missing)
                }
                e => call.wait_error(e, vec![peer]),
            })?;
        if let Err(e) = check_frame(call, peer, &frame.env.fp, frame.total_len, len) {
            if got == 0 && call.seq & P2P_LANE != 0 {
                // A point-to-point message of another size or type stays for a receive
                // that matches it; nothing of it was taken.
                mailbox.put_back(src, frame);
            }
            return Err(e);
        }
        let off = frame.offset as usize;
        if off != got || off + frame.len() > len {
            return Err(Error::Protocol(format!(
                "rank {peer} sent a chunk at {off}+{} while {got} of {len} bytes had arrived",
                frame.len()
            )));
        }
        // Only a receive that copies posts its destination: a placed frame is in place.
        if frame.placed > 0 && !matches!(into, Delivery::Copy) {
            return Err(Error::Protocol(format!(
                "internal: a chunk from rank {peer} was placed for a receive that reduces"
            )));
        }
        // SAFETY: off + data.len() <= len, the destination's length; a reader may still be
        // writing other frames of the message into the destination, never this chunk.
        let d = unsafe { std::slice::from_raw_parts_mut(dst.add(off), frame.data.len()) };
        match into {
            Delivery::Copy => d.copy_from_slice(&frame.data),
            Delivery::Reduce(operand) => {
                if operand != dst.cast_const() {
                    // SAFETY: the operand holds `len` bytes too; `copy` tolerates overlap.
                    unsafe { std::ptr::copy(operand.add(off), d.as_mut_ptr(), d.len()) };
                }
                dtype::reduce_into(call.dtype, call.op, d, &frame.data);
            }
        }
        got += frame.len();
        mailbox.payloads().recycle(frame.data);
        if got == len {
            return Ok(());
        }
    }
}

/// A frame's fingerprint and size must match this rank's call: otherwise the ranks disagree on
/// what they are doing, which is reported as a desync naming both calls.
fn check_frame(
    call: &Routed<'_>,
    peer: usize,
    theirs: &Fingerprint,
    total: u64,
    want: usize,
) -> Result<()> {
    let (me, peer) = (call.shown(call.me), call.shown(peer));
    if *theirs != call.fp {
        return Err(Error::Desync {
            me,
            mine: call.fp.shown_beside(theirs),
            peer,
            theirs: theirs.shown_beside(&call.fp),
            comm: call.comm_name.to_string(),
            seq: call.seq,
        });
    }
    if total as usize != want {
        let esz = call.dtype.size() as u64;
        return Err(Error::Desync {
            me,
            mine: format!(
                "{} expecting {} elements from rank {peer}",
                call.fp,
                want as u64 / esz
            ),
            peer,
            theirs: format!("{} sending {} elements", theirs, total / esz),
            comm: call.comm_name.to_string(),
            seq: call.seq,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The steps and peers [`early_receives`] picks in `round`, over an input and an output of
    /// 64 elements of 4 bytes (the same buffer where `in_place`) and a scratch of 64.
    fn picked(round: &[Step], in_place: bool) -> Vec<(usize, usize)> {
        picked_if(round, in_place, |_| true)
    }

    /// [`picked`] among the receives of lengths `wanted` accepts.
    fn picked_if(round: &[Step], in_place: bool, wanted: fn(usize) -> bool) -> Vec<(usize, usize)> {
        let mut input = vec![0u8; 256];
        let mut output = vec![0u8; 256];
        let out = output.as_mut_ptr();
        let bufs = Buffers {
            input: if in_place { out } else { input.as_mut_ptr() },
            input_len: 256,
            output: out,
            output_len: 256,
        };
        let mut mem = Memory {
            bufs: &bufs,
            tmp: vec![0u8; 256],
            esz: 4,
        };
        let early = early_receives(&mut mem, round, wanted).unwrap();
        early.into_iter().map(|e| (e.step, e.peer)).collect()
    }

    fn span(buf: Buf, off: usize) -> Span {
        Span::new(buf, off, 16)
    }

    #[test]
    fn an_exchange_posts_its_receive_before_its_send() {
        let round = [
            Step::Send {
                peer: 1,
                src: span(Buf::In, 0),
            },
            Step::Recv {
                peer: 1,
                dst: span(Buf::Out, 16),
            },
            Step::Recv {
                peer: 2,
                dst: span(Buf::Out, 32),
            },
        ];
        assert_eq!(picked(&round, false), [(1, 1), (2, 2)]);
        // Receives of 64 bytes where only longer ones are wanted.
        assert_eq!(picked_if(&round, false, |n| n > 64), []);
    }

    #[test]
    fn bytes_another_step_of_the_round_touches_are_not_posted() {
        // In place, the send reads the bytes the receive writes.
        let round = [
            Step::Send {
                peer: 1,
                src: span(Buf::In, 16),
            },
            Step::Recv {
                peer: 1,
                dst: span(Buf::Out, 16),
            },
        ];
        assert_eq!(picked(&round, true), []);
        assert_eq!(picked(&round, false), [(1, 1)]);
        // A copy reads the destination first; a reduction writes part of it.
        let copy = [
            Step::Copy {
                src: Span::new(Buf::Out, 20, 4),
                dst: span(Buf::Tmp, 0),
            },
            Step::Recv {
                peer: 3,
                dst: span(Buf::Out, 16),
            },
        ];
        assert_eq!(picked(&copy, false), []);
        let reduce = [
            Step::Recv {
                peer: 3,
                dst: span(Buf::Out, 16),
            },
            Step::Reduce {
                src: span(Buf::Tmp, 0),
                dst: Span::new(Buf::Out, 30, 4),
            },
        ];
        assert_eq!(picked(&reduce, false), []);
    }

    #[test]
    fn only_a_peers_first_receive_of_the_round_is_posted() {
        let round = [
            Step::Recv {
                peer: 1,
                dst: span(Buf::Out, 0),
            },
            Step::Recv {
                peer: 1,
                dst: span(Buf::Out, 16),
            },
            Step::RecvReduce {
                peer: 2,
                src: span(Buf::In, 0),
                dst: span(Buf::Out, 32),
            },
            Step::Recv {
                peer: 2,
                dst: span(Buf::Out, 48),
            },
        ];
        assert_eq!(picked(&round, false), [(0, 1)]);
    }
}
