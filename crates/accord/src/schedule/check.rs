//! Symbolic checker for schedules.
//!
//! [`verify`] builds every rank's schedule for a call and runs them all together on symbolic
//! data, following the execution semantics of [`super`] exactly: at the start of a round a rank
//! posts all of the round's sends (reading its buffers as they are then) onto per-pair FIFO
//! queues, then performs the other steps in order, a receive waiting until its queue has a
//! message. Ranks are advanced in turn until all finish; if none can move while some are
//! unfinished, the schedules deadlock.
//!
//! Each element holds a symbolic value: the multiset of contributions it is made of (source rank,
//! source element index) and how many times it was finalized. Copies and receives copy values,
//! reductions take the multiset union, and reducing an already finalized value is an error. At
//! the end every meaningful output element must hold exactly the expected contributions, each
//! once, finalized exactly once for reductions and never otherwise. Along the way the checker
//! rejects out-of-bounds spans (against [`Collective::in_len`], [`Collective::out_len`] and
//! `tmp_len`), writes to `In`, sends to oneself or to ranks outside the world, message length
//! mismatches, overlapping copies and messages nobody receives.

use super::{algorithms, Algorithm, Buf, Collective, Schedule, Span, Step};
use std::collections::VecDeque;
use std::fmt;

/// Check `algo` for `coll` on a world of `world` ranks; the error explains the first problem
/// (which rank, which element, what it holds and what it should hold).
pub fn verify(coll: &Collective, world: usize, algo: Algorithm) -> Result<(), String> {
    verify_each(&vec![coll.clone(); world], algo)
}

/// Like [`verify`] with a separate collective per rank (rank `r` calls `colls[r]`), for calls
/// whose arguments legitimately differ between ranks, such as all-to-all-v counts.
pub fn verify_each(colls: &[Collective], algo: Algorithm) -> Result<(), String> {
    let scheds = build_all(colls, algo)?;
    Sim::new(colls, scheds, false).run()
}

/// Like [`verify`], but with each rank's `In` and `Out` the same memory (an in-place call). Only
/// meaningful where `In` and `Out` have the same length (allreduce, reduce).
pub fn verify_in_place(coll: &Collective, world: usize, algo: Algorithm) -> Result<(), String> {
    let colls = vec![coll.clone(); world];
    let scheds = build_all(&colls, algo)?;
    Sim::new(&colls, scheds, true).run()
}

/// Check hand-made (or modified) schedules: `scheds[r]` is rank `r`'s part of `colls[r]`.
pub fn verify_schedules(colls: &[Collective], scheds: Vec<Schedule>) -> Result<(), String> {
    verify_given(colls, scheds, false)
}

/// [`verify_schedules`] with each rank's `In` and `Out` the same memory (see
/// [`verify_in_place`]).
pub fn verify_schedules_in_place(
    colls: &[Collective],
    scheds: Vec<Schedule>,
) -> Result<(), String> {
    verify_given(colls, scheds, true)
}

fn verify_given(colls: &[Collective], scheds: Vec<Schedule>, in_place: bool) -> Result<(), String> {
    if colls.len() != scheds.len() {
        return Err(format!(
            "{} collectives for {} schedules",
            colls.len(),
            scheds.len()
        ));
    }
    Sim::new(colls, scheds, in_place).run()
}

fn build_all(colls: &[Collective], algo: Algorithm) -> Result<Vec<Schedule>, String> {
    let p = colls.len();
    (0..p)
        .map(|r| algorithms::build(&colls[r], p, r, algo).map_err(|e| format!("rank {r}: {e}")))
        .collect()
}

/// The symbolic content of one element.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Val {
    /// Never written.
    Unset,
    /// Contributions (sorted, with repetition) and the number of finalizations.
    Data { parts: Vec<(u32, u32)>, fin: u32 },
    /// A reduction involved a value that was already finalized.
    ReducedFinal,
}

impl Val {
    fn of(rank: usize, idx: usize) -> Val {
        Val::Data {
            parts: vec![(rank as u32, idx as u32)],
            fin: 0,
        }
    }

    fn all_ranks(p: usize, idx: usize, fin: u32) -> Val {
        Val::ranks(0..p, idx, fin)
    }

    /// Element `idx` of each rank in `ranks`, reduced.
    fn ranks(ranks: std::ops::Range<usize>, idx: usize, fin: u32) -> Val {
        Val::Data {
            parts: ranks.map(|q| (q as u32, idx as u32)).collect(),
            fin,
        }
    }

    fn reduce(&self, other: &Val) -> Val {
        match (self, other) {
            (Val::Data { parts: a, fin: 0 }, Val::Data { parts: b, fin: 0 }) => {
                let mut parts = a.clone();
                parts.extend_from_slice(b);
                parts.sort_unstable();
                Val::Data { parts, fin: 0 }
            }
            (Val::Data { .. }, Val::Data { .. })
            | (Val::ReducedFinal, _)
            | (_, Val::ReducedFinal) => Val::ReducedFinal,
            _ => Val::Unset,
        }
    }

    fn finalize(&mut self) {
        if let Val::Data { fin, .. } = self {
            *fin += 1;
        }
    }
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Val::Unset => f.write_str("nothing (never written)"),
            Val::ReducedFinal => f.write_str("a value reduced after it was finalized"),
            Val::Data { parts, fin } => {
                f.write_str("{")?;
                for (i, (r, e)) in parts.iter().enumerate() {
                    let sep = if i > 0 { ", " } else { "" };
                    write!(f, "{sep}rank {r}[{e}]")?;
                }
                write!(f, "}} finalized {fin}x")
            }
        }
    }
}

/// One rank's progress and memory.
struct RankSim {
    sched: Schedule,
    round: usize,
    step: usize,
    posted: bool,
    /// `In`, `Out`, `Tmp`.
    mem: [Vec<Val>; 3],
    /// In-place call: `In` reads `Out`.
    aliased: bool,
}

impl RankSim {
    fn finished(&self) -> bool {
        self.round >= self.sched.rounds.len()
    }

    fn slot(&self, b: Buf) -> usize {
        match b {
            Buf::In if self.aliased => 1,
            Buf::In => 0,
            Buf::Out => 1,
            Buf::Tmp => 2,
        }
    }

    fn check(&self, s: Span) -> Result<(), String> {
        let len = self.mem[self.slot(s.buf)].len();
        match s.off.checked_add(s.len) {
            Some(end) if end <= len => Ok(()),
            _ => Err(format!(
                "{s:?} is out of bounds ({:?} holds {len} elements)",
                s.buf
            )),
        }
    }

    fn writable(&self, s: Span) -> Result<(), String> {
        if s.buf == Buf::In {
            return Err(format!("writes to the read-only input {s:?}"));
        }
        self.check(s)
    }

    fn read(&self, s: Span) -> Vec<Val> {
        self.mem[self.slot(s.buf)][s.off..s.off + s.len].to_vec()
    }

    fn write(&mut self, s: Span, vals: Vec<Val>) {
        let b = self.slot(s.buf);
        self.mem[b][s.off..s.off + s.len].clone_from_slice(&vals);
    }

    fn reduce_into(&mut self, s: Span, vals: &[Val]) {
        let b = self.slot(s.buf);
        for (d, v) in self.mem[b][s.off..s.off + s.len].iter_mut().zip(vals) {
            *d = d.reduce(v);
        }
    }

    /// Two spans in the same memory that overlap; `identical_ok` allows a no-op copy.
    fn overlap(&self, a: Span, b: Span, identical_ok: bool) -> bool {
        let same = self.slot(a.buf) == self.slot(b.buf);
        let hit = a.off < b.off + b.len && b.off < a.off + a.len;
        same && hit && !(identical_ok && a.off == b.off && a.len == b.len)
    }
}

/// All ranks plus the messages in flight.
struct Sim<'a> {
    colls: &'a [Collective],
    ranks: Vec<RankSim>,
    /// `queues[from * p + to]`.
    queues: Vec<VecDeque<Vec<Val>>>,
}

impl<'a> Sim<'a> {
    fn new(colls: &'a [Collective], scheds: Vec<Schedule>, aliased: bool) -> Self {
        let p = colls.len();
        let ranks = scheds
            .into_iter()
            .enumerate()
            .map(|(r, sched)| {
                let coll = &colls[r];
                let input: Vec<Val> = (0..coll.in_len(r)).map(|i| Val::of(r, i)).collect();
                let mut out = vec![Val::Unset; coll.out_len(r)];
                if let Collective::Broadcast { root, .. } = coll {
                    if *root == r {
                        out = (0..out.len()).map(|i| Val::of(r, i)).collect();
                    }
                }
                if aliased {
                    out.clone_from(&input);
                }
                let tmp = vec![Val::Unset; sched.tmp_len];
                RankSim {
                    sched,
                    round: 0,
                    step: 0,
                    posted: false,
                    mem: [input, out, tmp],
                    aliased,
                }
            })
            .collect();
        Sim {
            colls,
            ranks,
            queues: vec![VecDeque::new(); p * p],
        }
    }

    fn run(mut self) -> Result<(), String> {
        check_counts(self.colls)?;
        let p = self.ranks.len();
        loop {
            let mut moved = false;
            for r in 0..p {
                moved |= self.advance(r)?;
            }
            if self.ranks.iter().all(RankSim::finished) {
                break;
            }
            if !moved {
                return Err(self.deadlock());
            }
        }
        for (i, q) in self.queues.iter().enumerate() {
            if !q.is_empty() {
                return Err(format!(
                    "rank {} sent {} message(s) to rank {} that were never received",
                    i / p,
                    q.len(),
                    i % p
                ));
            }
        }
        (0..p).try_for_each(|r| self.check_result(r))
    }

    /// Run rank `r` as far as it can go; whether it did anything.
    fn advance(&mut self, r: usize) -> Result<bool, String> {
        let mut moved = false;
        while !self.ranks[r].finished() {
            let (round, at) = (self.ranks[r].round, self.ranks[r].step);
            let ctx = |i: usize, s: &Step, e: String| {
                format!("rank {r}, round {round}, step {i} ({s:?}): {e}")
            };
            if !self.ranks[r].posted {
                let steps = self.ranks[r].sched.rounds[round].clone();
                for (i, s) in steps.iter().enumerate() {
                    if let Step::Send { peer, src } = *s {
                        self.post(r, peer, src).map_err(|e| ctx(i, s, e))?;
                    }
                }
                self.ranks[r].posted = true;
                moved = true;
            }
            let Some(s) = self.ranks[r].sched.rounds[round].get(at).copied() else {
                let rk = &mut self.ranks[r];
                (rk.round, rk.step, rk.posted) = (round + 1, 0, false);
                continue;
            };
            match self.exec(r, &s) {
                Ok(true) => {
                    self.ranks[r].step += 1;
                    moved = true;
                }
                Ok(false) => return Ok(moved),
                Err(e) => return Err(ctx(at, &s, e)),
            }
        }
        Ok(moved)
    }

    fn post(&mut self, r: usize, peer: usize, src: Span) -> Result<(), String> {
        let p = self.ranks.len();
        if peer == r || peer >= p {
            return Err(format!("sends to rank {peer} (world of {p})"));
        }
        self.ranks[r].check(src)?;
        let msg = self.ranks[r].read(src);
        self.queues[r * p + peer].push_back(msg);
        Ok(())
    }

    /// Perform one non-send step; `Ok(false)` if it must wait for a message.
    fn exec(&mut self, r: usize, s: &Step) -> Result<bool, String> {
        let p = self.ranks.len();
        let rk = &self.ranks[r];
        match *s {
            Step::Send { .. } => {}
            Step::Recv { peer, dst } | Step::RecvReduce { peer, dst, .. } => {
                if peer == r || peer >= p {
                    return Err(format!("receives from rank {peer} (world of {p})"));
                }
                rk.writable(dst)?;
                if let Step::RecvReduce { src, .. } = *s {
                    rk.check(src)?;
                    if src.len != dst.len {
                        return Err("operand and destination lengths differ".into());
                    }
                    if rk.overlap(src, dst, true) {
                        return Err("operand and destination overlap".into());
                    }
                }
                let Some(msg) = self.queues[peer * p + r].pop_front() else {
                    return Ok(false);
                };
                if msg.len() != dst.len {
                    return Err(format!(
                        "message from rank {peer} has {} elements, expected {}",
                        msg.len(),
                        dst.len
                    ));
                }
                let rk = &mut self.ranks[r];
                match *s {
                    Step::RecvReduce { src, .. } => {
                        let own = rk.read(src);
                        rk.write(dst, own);
                        rk.reduce_into(dst, &msg);
                    }
                    _ => rk.write(dst, msg),
                }
            }
            Step::Copy { src, dst } | Step::Reduce { src, dst } => {
                rk.check(src)?;
                rk.writable(dst)?;
                if src.len != dst.len {
                    return Err("source and destination lengths differ".into());
                }
                let is_copy = matches!(s, Step::Copy { .. });
                if rk.overlap(src, dst, is_copy) {
                    return Err("source and destination overlap".into());
                }
                let vals = rk.read(src);
                let rk = &mut self.ranks[r];
                if is_copy {
                    rk.write(dst, vals);
                } else {
                    rk.reduce_into(dst, &vals);
                }
            }
            Step::Finalize { dst } => {
                rk.writable(dst)?;
                let b = rk.slot(dst.buf);
                let rk = &mut self.ranks[r];
                rk.mem[b][dst.off..dst.off + dst.len]
                    .iter_mut()
                    .for_each(Val::finalize);
            }
        }
        Ok(true)
    }

    fn deadlock(&self) -> String {
        let stuck: Vec<String> = self
            .ranks
            .iter()
            .enumerate()
            .filter(|(_, rk)| !rk.finished())
            .map(|(r, rk)| {
                let s = rk.sched.rounds[rk.round][rk.step];
                format!("rank {r} in round {} waits on {s:?}", rk.round)
            })
            .collect();
        format!("deadlock: {}", stuck.join("; "))
    }

    fn check_result(&self, r: usize) -> Result<(), String> {
        let out = &self.ranks[r].mem[1];
        for (i, want) in expected(self.colls, r).into_iter().enumerate() {
            let Some(want) = want else { continue };
            if out[i] != want {
                return Err(format!(
                    "rank {r}, Out[{i}]: got {}, expected {want}",
                    out[i]
                ));
            }
        }
        Ok(())
    }
}

/// All-to-all counts must agree pairwise: what `a` sends to `b` is what `b` expects from `a`.
fn check_counts(colls: &[Collective]) -> Result<(), String> {
    for (a, ca) in colls.iter().enumerate() {
        for (b, cb) in colls.iter().enumerate() {
            if let (
                Collective::AllToAll { send_counts, .. },
                Collective::AllToAll { recv_counts, .. },
            ) = (ca, cb)
            {
                if send_counts[b] != recv_counts[a] {
                    return Err(format!(
                        "bad test input: rank {a} sends {} elements to rank {b}, which expects {}",
                        send_counts[b], recv_counts[a]
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Prefix sums: where each block starts.
fn offsets(counts: &[usize]) -> Vec<usize> {
    let mut at = 0;
    counts
        .iter()
        .map(|c| {
            at += c;
            at - c
        })
        .collect()
}

/// What rank `r`'s `Out` must hold at the end (`None`: unspecified).
fn expected(colls: &[Collective], r: usize) -> Vec<Option<Val>> {
    let p = colls.len();
    let coll = &colls[r];
    let n = coll.out_len(r);
    match coll {
        Collective::Barrier => vec![],
        Collective::Broadcast { root, .. } => (0..n).map(|i| Some(Val::of(*root, i))).collect(),
        Collective::Reduce { root, .. } if *root != r => vec![None; n],
        Collective::Reduce { .. } | Collective::AllReduce { .. } => {
            (0..n).map(|i| Some(Val::all_ranks(p, i, 1))).collect()
        }
        Collective::Gather { root, .. } if *root != r => vec![],
        Collective::AllGather { counts } | Collective::Gather { counts, .. } => counts
            .iter()
            .enumerate()
            .flat_map(|(q, &c)| (0..c).map(move |k| Some(Val::of(q, k))))
            .collect(),
        Collective::Scatter { counts, root } => {
            let off = offsets(counts)[r];
            (0..n).map(|k| Some(Val::of(*root, off + k))).collect()
        }
        Collective::ReduceScatter { counts } => {
            let off = offsets(counts)[r];
            (0..n)
                .map(|k| Some(Val::all_ranks(p, off + k, 1)))
                .collect()
        }
        Collective::Scan {
            exclusive: true, ..
        } if r == 0 => vec![None; n],
        Collective::Scan { exclusive, .. } => {
            let upto = if *exclusive { r } else { r + 1 };
            (0..n).map(|i| Some(Val::ranks(0..upto, i, 1))).collect()
        }
        Collective::AllToAll { recv_counts, .. } => (0..p)
            .flat_map(|q| {
                let from = match &colls[q] {
                    Collective::AllToAll { send_counts, .. } => offsets(send_counts)[r],
                    _ => 0,
                };
                (0..recv_counts[q]).map(move |k| Some(Val::of(q, from + k)))
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests;
