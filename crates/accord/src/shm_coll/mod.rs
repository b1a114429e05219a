//! Collectives over shared memory, for the ranks of one host, and the steps inside each host of
//! the hierarchical ones (`comm::hierarchy`) when a world spans hosts.
//!
//! These bypass the message schedules: every rank copies its contribution into its own staging
//! area ([`ShmGroup::stage`]), everyone meets at a barrier (arrival counters in shared memory,
//! see [`crate::transport::shm`]), and then each rank reads its peers' staging areas directly.
//!
//! - **allreduce**: small messages (at most `ACCORD_SHM_SMALL_BYTES`, default 16 KiB): one
//!   barrier, then every rank reduces the whole vector from every staging area (same order on
//!   every rank, so every rank gets identical bits). Larger ones: each rank stages the slices
//!   its peers reduce, then reduces *its* slice from its own input and every peer's staging
//!   area, a piece at a time that stays in L1 while it is staged, reduced and copied to the
//!   output; a second barrier, then everyone gathers the peers' reduced slices. Messages
//!   larger than a staging half are pipelined chunk by chunk.
//! - **reduce**: the large-message allreduce where only the root gathers (small ones with
//!   more ranks than cores: see below).
//! - **broadcast**: root-driven, no barrier. The root copies a chunk into a slot and arrives;
//!   readers wait for the root's counter alone, copy out and arrive. Messages larger than a
//!   staging half cycle through both halves as a ring of `ACCORD_SHM_SLOT_BYTES` (64 KiB)
//!   slots, so the root can run a whole ring ahead of the slowest reader.
//! - **allgather**, **reduce_scatter**, **alltoall**: one barrier per chunk.
//! - **single copy** (`ACCORD_SHM_CMA_BYTES`, off by default): from that many bytes broadcast
//!   and allgather readers copy straight out of the owner's user buffer with
//!   `process_vm_readv` (probed at join; off for the whole group if any pair cannot).
//! - Copies into user buffers of at least `ACCORD_SHM_STREAM_BYTES` (2 MiB) use
//!   non-temporal stores (allgather: from 8x that output size, for peers' blocks).
//!
//! **Oversubscription.** With more local ranks than cores, barriers and small allreduces and
//! reduces are centralized on local rank 0 (see `Ctx::barrier`, `Ctx::allreduce_central`), so
//! each waiter depends on one peer having run rather than on all of them, and waits yield
//! the core at once instead of spinning.
//!
//! **Reusing staging safely.** Chunks alternate between two staging halves (the chunk counter
//! runs on across calls and is advanced identically on every rank). Each rank arrives the same
//! number of times per call, so arrival counts (epochs) agree across ranks. After using half
//! `h`, a rank records a *guard*: the epoch every peer must have reached before it writes `h`
//! again (after a barrier, the peers' next arrival; after publishing a broadcast chunk, that
//! chunk's epoch, at which readers arrive once they have copied it). Writing a half first waits
//! for its guard, which is normally already met.
//!
//! **Desync detection.** With the first chunk of a call, every rank writes the call's sequence
//! number and fingerprint next to its staging half; after the first barrier each rank compares
//! every peer's with its own and reports [`Error::Desync`] naming the peer. Every collective
//! passes such a barrier before any rank returns (a broadcast too, though its readers need only
//! the root), so ranks that disagree on a root or a count all fail instead of returning
//! different data. Across hosts the steps between hosts carry the world call's fingerprint, and
//! a broadcast's root host waits for its leader, for the same reason.

use crate::blame;
use crate::dtype::{self, ReduceOp};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::op::{Call, Op};
use crate::schedule::Collective;
use crate::transport::shm::{ShmGroup, ShmWaitError};
use crate::transport::waits::{Blocked, WaitGuard};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod engine;
mod host_steps;

/// The placement of a world over hosts, and this host's shared-memory group.
#[derive(Debug)]
pub struct ShmWorld {
    /// This host's group (`None` when this rank is alone on its host).
    pub group: Option<ShmGroup>,
    /// Host index of every world rank (hosts numbered by their lowest rank).
    pub host_of: Vec<usize>,
    /// Lowest world rank of every host: the leaders of hierarchical collectives.
    pub leaders: Vec<usize>,
    small: usize,
    /// From this many bytes, broadcast and allgather copy straight between user buffers.
    cma_bytes: usize,
    /// From this many bytes, copies out of staging use non-temporal stores.
    stream_bytes: usize,
    /// Slot size of pipelined broadcasts (`ACCORD_SHM_SLOT_BYTES`).
    slot_bytes: usize,
}

impl ShmWorld {
    /// Placement from every rank's host id.
    pub fn new(group: Option<ShmGroup>, hosts: &[String]) -> ShmWorld {
        let mut leaders: Vec<usize> = Vec::new();
        let host_of = (0..hosts.len())
            .map(
                |r| match leaders.iter().position(|&l| hosts[l] == hosts[r]) {
                    Some(i) => i,
                    None => {
                        leaders.push(r);
                        leaders.len() - 1
                    }
                },
            )
            .collect();
        let cfg = crate::config::get();
        ShmWorld {
            group,
            host_of,
            leaders,
            small: cfg.shm_small_bytes,
            cma_bytes: cfg.shm_cma_bytes,
            stream_bytes: cfg.shm_stream_bytes,
            slot_bytes: cfg.shm_slot_bytes,
        }
    }

    /// Whether the whole world shares one host.
    pub fn single_host(&self) -> bool {
        self.leaders.len() == 1
    }

    /// Whether `coll` (of kind described by `fp`) runs on the shared-memory path.
    pub(crate) fn supports(&self, coll: &Collective, fp: &Fingerprint) -> bool {
        use crate::fingerprint::OpKind as K;
        if self.single_host() {
            if self.group.is_none() {
                return false;
            }
            return match coll {
                Collective::AllReduce { .. }
                | Collective::Broadcast { .. }
                | Collective::Reduce { .. }
                | Collective::Barrier => true,
                Collective::AllGather { counts } | Collective::ReduceScatter { counts } => {
                    counts.windows(2).all(|w| w[0] == w[1])
                }
                Collective::AllToAll { .. } => fp.kind == K::AllToAll,
                _ => false,
            };
        }
        matches!(
            coll,
            Collective::AllReduce { .. } | Collective::Broadcast { .. }
        )
    }

    /// Run a collective [`ShmWorld::supports`] on this host's group. `input == None` is in
    /// place. Worlds spanning hosts compose these steps with the leaders' communicator above
    /// this layer.
    pub(crate) fn run(
        &self,
        call: &Call<'_>,
        coll: &Collective,
        input: Option<&[u8]>,
        output: &mut [u8],
    ) -> Result<()> {
        let inp = input.map_or(output.as_ptr(), <[u8]>::as_ptr);
        let out = output.as_mut_ptr();
        let g = self.group.as_ref().expect("single host implies a group");
        let _serial = g.lock.lock().unwrap_or_else(|p| p.into_inner());
        let c = self.ctx(g, call, call.deadline());
        match *coll {
            Collective::AllReduce { count } => c.allreduce(inp, out, count, true, None, self.small),
            Collective::Reduce { count, root } => {
                c.allreduce(inp, out, count, true, Some(root), self.small)
            }
            Collective::Broadcast { count, root } => c.broadcast(out, count, root),
            Collective::AllGather { ref counts } => c.allgather(inp, out, counts[0]),
            Collective::ReduceScatter { ref counts } => c.reduce_scatter(inp, out, counts[0], true),
            Collective::AllToAll {
                ref send_counts, ..
            } => c.alltoall(inp, out, send_counts[0]),
            Collective::Barrier => c.allgather(inp, out, 0),
            _ => Err(Error::Unsupported(format!(
                "internal: {} on the shared-memory path",
                call.fp
            ))),
        }
    }

    /// The engine of a world on one host, if this rank shares it with others.
    pub(crate) fn single_host_engine(
        self: &Arc<Self>,
    ) -> Option<Arc<dyn crate::engine::HostEngine>> {
        (self.single_host() && self.group.is_some())
            .then(|| self.clone() as Arc<dyn crate::engine::HostEngine>)
    }

    /// The state of one call on `g` with this world's thresholds.
    fn ctx<'a>(&self, g: &'a ShmGroup, call: &'a Call<'a>, deadline: Instant) -> Ctx<'a> {
        Ctx {
            g,
            call,
            deadline,
            cma: if g.cma() { self.cma_bytes } else { usize::MAX },
            stream: self.stream_bytes,
            slot: self.slot_bytes,
        }
    }
}

/// One call on one host's group.
struct Ctx<'a> {
    g: &'a ShmGroup,
    call: &'a Call<'a>,
    deadline: Instant,
    /// Single-copy threshold in bytes (`usize::MAX`: never).
    cma: usize,
    /// From this many bytes, copies into user buffers bypass the caches.
    stream: usize,
    /// Slot size of a pipelined broadcast.
    slot: usize,
}

/// Copy `len` bytes; when `stream`, with non-temporal stores so that filling a destination
/// larger than the caches does not first read it into them (x86_64; plain copy elsewhere).
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`].
unsafe fn copy_out(src: *const u8, dst: *mut u8, len: usize, stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if stream && len >= 4096 && std::arch::is_x86_feature_detected!("avx512f") {
        return stream_copy_avx512(src, dst, len);
    }
    #[cfg(target_arch = "x86_64")]
    if stream && len >= 4096 {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let head = dst.align_offset(16).min(len);
        std::ptr::copy_nonoverlapping(src, dst, head);
        let (mut s, mut d) = (src.add(head), dst.add(head));
        let mut left = len - head;
        while left >= 64 {
            let a = _mm_loadu_si128(s as *const __m128i);
            let b = _mm_loadu_si128(s.add(16) as *const __m128i);
            let c = _mm_loadu_si128(s.add(32) as *const __m128i);
            let e = _mm_loadu_si128(s.add(48) as *const __m128i);
            _mm_stream_si128(d as *mut __m128i, a);
            _mm_stream_si128(d.add(16) as *mut __m128i, b);
            _mm_stream_si128(d.add(32) as *mut __m128i, c);
            _mm_stream_si128(d.add(48) as *mut __m128i, e);
            s = s.add(64);
            d = d.add(64);
            left -= 64;
        }
        std::ptr::copy_nonoverlapping(s, d, left);
        _mm_sfence();
        return;
    }
    let _ = stream;
    std::ptr::copy_nonoverlapping(src, dst, len);
}

/// Copy `src` into `dst` (same length) the way the shared-memory collectives fill large
/// outputs: non-temporal stores where the CPU has them, so the destination is not read into
/// the caches first. `accord bench copy` times it to measure the memory floor of large rows.
///
/// # Panics
/// If the lengths differ.
pub fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_streaming: length mismatch");
    // SAFETY: two distinct slices of the same length (`&mut` cannot alias `&`).
    unsafe { copy_out(src.as_ptr(), dst.as_mut_ptr(), src.len(), true) }
}

/// [`copy_out`]'s streaming copy with 64-byte non-temporal stores, prefetching the source
/// ahead: the source is usually a slot another core just wrote, and its lines arrive faster
/// when asked for early (one 64 MiB broadcast on the 2-core VM: 3.3 -> 2.7 ms in a two-thread
/// model of the ring; a full line per store also beats four 16-byte ones).
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]; the CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_copy_avx512(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{
        _mm512_loadu_si512, _mm512_stream_si512, _mm_prefetch, _mm_sfence, _MM_HINT_T0,
    };
    const AHEAD: usize = 2048;
    let head = dst.align_offset(64).min(len);
    std::ptr::copy_nonoverlapping(src, dst, head);
    let (mut s, mut d) = (src.add(head), dst.add(head));
    let mut left = len - head;
    while left >= 256 {
        if left >= 256 + AHEAD {
            for k in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(s.add(AHEAD + 64 * k) as *const i8);
            }
        }
        for k in 0..4 {
            let v = _mm512_loadu_si512(s.add(64 * k) as *const _);
            _mm512_stream_si512(d.add(64 * k) as *mut _, v);
        }
        s = s.add(256);
        d = d.add(256);
        left -= 256;
    }
    std::ptr::copy_nonoverlapping(s, d, left);
    _mm_sfence();
}

/// Most bytes per chunk of the collectives other than allreduce ([`Ctx::span`]).
const SPAN_BYTES: usize = 256 << 10;

/// Bytes of our own slice an allreduce stages, reduces and copies out in one go: small enough
/// to stay in L1 between the three steps.
const PIECE_BYTES: usize = 16 << 10;

/// `(start, len)` of part `i` when `m` elements are split into `n` near-equal parts.
fn part(m: usize, n: usize, i: usize) -> (usize, usize) {
    let base = m / n;
    let rem = m % n;
    (i * base + i.min(rem), base + usize::from(i < rem))
}

impl<'a> Ctx<'a> {
    fn n(&self) -> usize {
        self.g.size()
    }

    fn me(&self) -> usize {
        self.g.me
    }

    fn esz(&self) -> usize {
        self.call.dtype.size()
    }

    /// Bytes of a staging half that the collectives other than allreduce use per chunk: they
    /// copy more than they compute, and chunks past L2 cost them more than the extra barriers
    /// of smaller ones. Allreduce uses whole halves.
    fn span(&self) -> usize {
        self.g.half_bytes().min(SPAN_BYTES)
    }

    /// Record, until the guard is dropped, that this call waits for local ranks `local`.
    fn blocked(&self, local: impl Iterator<Item = usize>) -> Option<WaitGuard<'a>> {
        let t = self.g.side_transport()?;
        Some(t.mailbox().waits().enter(Blocked {
            comm: self.call.comm_id,
            seq: self.call.seq,
            ranks: local.map(|r| self.g.members[r]).collect(),
            gave_up: false,
        }))
    }

    fn error(&self, e: ShmWaitError) -> Error {
        match e {
            ShmWaitError::Timeout(missing) => {
                // World ranks: the shared-memory path serves world communicators only.
                let world: Vec<usize> = missing.iter().map(|&r| self.g.members[r]).collect();
                let mut hint = " (shared memory)".to_string();
                let mut waiting_for = world.clone();
                if let Some(t) = self.g.side_transport() {
                    let c = self.call;
                    let finding = blame::diagnose(&**t, c.comm_id, c.seq, &world, c.timeout);
                    if finding == blame::Finding::Aborted {
                        if let Some(e) = crate::exec::aborted(&**t) {
                            return e;
                        }
                    }
                    hint.push_str(&blame::describe(&finding, &|w| format!("rank {w}")));
                    let culprits = finding.culprits();
                    if !culprits.is_empty() {
                        waiting_for = culprits;
                    }
                }
                Error::Timeout {
                    op: self.call.fp.to_string(),
                    seq: self.call.seq,
                    comm: self.call.comm_name.to_string(),
                    waiting_for,
                    after: self.call.timeout,
                    hint,
                }
            }
            ShmWaitError::Dead(r) => Error::PeerLost {
                rank: self.g.members[r],
                cause: format!(
                    "process {} exited (seen while waiting in shared memory)",
                    self.g.pid(r)
                ),
            },
            ShmWaitError::Side(e) => e,
        }
    }

    /// Take the next staging half; with the call's first chunk, publish its fingerprint.
    fn begin(&self, first: bool) -> Result<usize> {
        let h = self.g.next_chunk();
        // Usually met at once; a longer wait is recorded for peers that ask.
        let soon = (Instant::now() + Duration::from_millis(20)).min(self.deadline);
        if self.g.guard(h, soon).is_err() {
            let me = self.me();
            let _blocked = self.blocked((0..self.n()).filter(|&r| r != me));
            self.g.guard(h, self.deadline).map_err(|e| self.error(e))?;
        }
        if first {
            self.g.put_fp(h, self.call.seq, &self.call.fp);
        }
        Ok(h)
    }

    /// Wait for local rank `r` to reach epoch `e`. A slow wait also looks at the call `r`
    /// published for half `h`: a different call with the same sequence number is a desync,
    /// reported at once instead of when the deadline passes (the peer may be waiting for us
    /// in a collective with another waiting pattern).
    fn wait_peer(&self, r: usize, e: u32, h: usize) -> Result<()> {
        // Recorded from the first slice on, for peers that ask what this rank waits for.
        let mut blocked = None;
        loop {
            let until = (Instant::now() + Duration::from_millis(20)).min(self.deadline);
            match self.g.wait_for(r, e, until) {
                Ok(()) => return Ok(()),
                Err(ShmWaitError::Timeout(m)) => {
                    if blocked.is_none() {
                        blocked = self.blocked(std::iter::once(r));
                    }
                    let (seq, fp) = self.g.get_fp(r, h);
                    // An unwritten slot reads as op #0 with no fingerprint: not a desync.
                    if seq == self.call.seq && fp.is_some_and(|f| f != self.call.fp) {
                        self.check_fp(r, h)?;
                    }
                    if Instant::now() >= self.deadline {
                        return Err(self.error(ShmWaitError::Timeout(m)));
                    }
                }
                Err(e) => return Err(self.error(e)),
            }
        }
    }

    /// [`Ctx::wait_peer`] for every other local rank.
    fn wait_peers(&self, e: u32, h: usize) -> Result<()> {
        for r in 0..self.n() {
            if r != self.me() {
                self.wait_peer(r, e, h)?;
            }
        }
        Ok(())
    }

    /// The call's fingerprint against local rank `p`'s for half `h`.
    fn check_fp(&self, p: usize, h: usize) -> Result<()> {
        let (seq, fp) = self.g.get_fp(p, h);
        if seq != self.call.seq || fp != Some(self.call.fp) {
            let theirs = match fp {
                Some(f) if seq == self.call.seq => f.to_string(),
                Some(f) => format!("{f} as op #{seq}"),
                None => format!("an unknown operation as op #{seq}"),
            };
            return Err(Error::Desync {
                me: self.g.members[self.me()],
                mine: self.call.fp.to_string(),
                peer: self.g.members[p],
                theirs,
                comm: self.call.comm_name.to_string(),
                seq: self.call.seq,
            });
        }
        Ok(())
    }

    /// Arrive and wait for every peer; after the call's first barrier, compare fingerprints.
    ///
    /// With more ranks than cores the barrier is centralized: local rank 0 waits for every
    /// arrival, checks every fingerprint and arrives last; the others wait on rank 0's counter
    /// alone. Each waiter then needs one peer to have run instead of all of them, and rank 0
    /// (the usual root) leaves the barrier first. Otherwise every rank waits for every other,
    /// which costs one cache-line transfer instead of two.
    fn barrier(&self, h: usize, first: bool) -> Result<()> {
        let e = if self.g.crowded() {
            if self.me() == 0 {
                let e = self.g.epoch().wrapping_add(1);
                self.wait_peers(e, h)?;
                if first {
                    for p in 1..self.n() {
                        self.check_fp(p, h)?;
                    }
                }
                self.g.arrive()
            } else {
                let e = self.g.arrive();
                self.wait_peer(0, e, h)?;
                if first {
                    self.check_fp(0, h)?;
                }
                e
            }
        } else {
            let e = self.g.arrive();
            self.wait_peers(e, h)?;
            if first {
                for p in 0..self.n() {
                    if p != self.me() {
                        self.check_fp(p, h)?;
                    }
                }
            }
            e
        };
        // Peers read half h after this barrier and before their next arrival.
        self.g.set_guard(h, e.wrapping_add(1));
        Ok(())
    }

    /// A barrier that is a whole call (begins a half, checks fingerprints).
    fn barrier_call(&self) -> Result<()> {
        let h = self.begin(true)?;
        self.barrier(h, true)
    }

    /// Small allreduce (`root == None`) or reduce with more ranks than cores: everyone stages
    /// its input and arrives; local rank 0 reduces (in rank order) into its staging and
    /// arrives; the ranks that want the result copy it. Every rank waits for one peer only.
    fn allreduce_central(
        &self,
        inp: *const u8,
        out: *mut u8,
        bytes: usize,
        world: usize,
        root: Option<usize>,
    ) -> Result<()> {
        let (n, me) = (self.n(), self.me());
        let wants = !matches!(root, Some(r) if r != me);
        let h = self.begin(true)?;
        let acc = self.stage(0, h, 0);
        if me == 0 {
            let e = self.g.epoch().wrapping_add(1);
            self.wait_peers(e, h)?;
            for p in 1..n {
                self.check_fp(p, h)?;
            }
            // Reduce into our output, or into our staging when we do not want the result.
            let dst = if wants { out } else { acc };
            // SAFETY: dst and inp hold `bytes` (a staging half fits them); they may be the
            // same buffer.
            unsafe { std::ptr::copy(inp, dst, bytes) };
            for p in 1..n {
                self.reduce(dst, self.stage(p, h, 0), bytes);
            }
            self.finalize(dst, bytes, world);
            if wants && root != Some(0) {
                // SAFETY: out is not staging; peers read the result after our arrival.
                unsafe { std::ptr::copy_nonoverlapping(out, acc, bytes) };
            }
            let e = self.g.arrive();
            self.g.set_guard(h, e.wrapping_add(1));
        } else {
            // SAFETY: `bytes` fit a staging half.
            unsafe { std::ptr::copy_nonoverlapping(inp, self.stage(me, h, 0), bytes) };
            let e = self.g.arrive();
            self.wait_peer(0, e, h)?;
            self.check_fp(0, h)?;
            if wants {
                // SAFETY: as above.
                unsafe { std::ptr::copy_nonoverlapping(acc, out, bytes) };
            }
            // Rank 0 read our input before it arrived.
            self.g.set_guard(h, e);
        }
        Ok(())
    }

    fn stage(&self, r: usize, h: usize, byte_off: usize) -> *mut u8 {
        // SAFETY: callers keep byte_off + len within half_bytes.
        unsafe { self.g.stage(r, h).add(byte_off) }
    }

    /// Number of chunks of `total` elements at `per` elements per chunk (at least one).
    fn chunks(total: usize, per: usize) -> usize {
        total.div_ceil(per.max(1)).max(1)
    }

    /// Chunk `k` (of `per` elements) of a `total`-element pass: claim a staging half, let `fill`
    /// write this rank's part of it (given the half, the chunk's first element and its length),
    /// then meet the peers, so that every rank's part is readable. Returns (half, first, length).
    fn staged_chunk(
        &self,
        k: usize,
        per: usize,
        total: usize,
        fill: impl FnOnce(usize, usize, usize),
    ) -> Result<(usize, usize, usize)> {
        let off = k * per;
        let m = per.min(total - off.min(total));
        let h = self.begin(k == 0)?;
        fill(h, off, m);
        self.barrier(h, k == 0)?;
        Ok((h, off, m))
    }

    /// `dst op= src` over `bytes` bytes.
    fn reduce(&self, dst: *mut u8, src: *const u8, bytes: usize) {
        if bytes == 0 {
            return;
        }
        // SAFETY: both ranges are valid for `bytes` and do not overlap (different staging
        // areas, or a staging area and the caller's buffer).
        let (d, s) = unsafe {
            (
                std::slice::from_raw_parts_mut(dst, bytes),
                std::slice::from_raw_parts(src, bytes),
            )
        };
        dtype::reduce_into(self.call.dtype, self.call.op, d, s);
    }

    fn finalize(&self, dst: *mut u8, bytes: usize, world: usize) {
        if self.call.op == ReduceOp::Avg && bytes > 0 {
            // SAFETY: valid for `bytes`, exclusively ours during this step.
            let d = unsafe { std::slice::from_raw_parts_mut(dst, bytes) };
            dtype::finalize(self.call.dtype, self.call.op, d, world);
        }
    }

    /// Allreduce (`root == None`) or reduce to local rank `root`. `finish`: apply Avg's division
    /// (false when a later stage finishes it). Up to `small` bytes take the one-barrier path.
    fn allreduce(
        &self,
        inp: *const u8,
        out: *mut u8,
        count: usize,
        finish: bool,
        root: Option<usize>,
        small: usize,
    ) -> Result<()> {
        let (n, me, esz) = (self.n(), self.me(), self.esz());
        let world = if finish { n } else { 1 };
        let per = (self.g.half_bytes() / esz).max(1);
        if count * esz <= small && count <= per && self.g.crowded() {
            return self.allreduce_central(inp, out, count * esz, world, root);
        }
        if count * esz <= small && count <= per && root.is_none() {
            let h = self.begin(true)?;
            let bytes = count * esz;
            // SAFETY: count elements fit a staging half; `inp` holds count elements.
            unsafe { std::ptr::copy_nonoverlapping(inp, self.stage(me, h, 0), bytes) };
            self.barrier(h, true)?;
            // SAFETY: out holds count elements; staging 0 is not `out`.
            unsafe { std::ptr::copy_nonoverlapping(self.stage(0, h, 0), out, bytes) };
            for p in 1..n {
                self.reduce(out, self.stage(p, h, 0), bytes);
            }
            self.finalize(out, bytes, world);
            return Ok(());
        }
        // As for allgather: results well beyond the caches bypass them (16 MiB: 1.91 -> 1.82 ms,
        // 64 MiB: 9.1 -> 8.6 ms at N = 2; at 4 MiB it loses).
        let stream = count * esz >= self.stream.saturating_mul(8);
        let wants = !matches!(root, Some(r) if r != me);
        // Elements per piece of our slice: staged, reduced and copied out while in L1.
        let piece = (PIECE_BYTES / esz).max(1);
        for k in 0..Self::chunks(count, per) {
            let (h, off, m) = self.staged_chunk(k, per, count, |h, off, m| {
                // Only the peers' slices: ours is staged piece by piece as it is reduced.
                for p in (0..n).filter(|&p| p != me) {
                    let (s, l) = part(m, n, p);
                    // SAFETY: slice p of this chunk is inside the input and the staging half.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            inp.add((off + s) * esz),
                            self.stage(me, h, s * esz),
                            l * esz,
                        )
                    }
                }
            })?;
            let (s, l) = part(m, n, me);
            for i in (0..l).step_by(piece) {
                let (at, len) = ((s + i) * esz, piece.min(l - i) * esz);
                let mine = self.stage(me, h, at);
                // SAFETY: this piece of our slice, inside the input, the output and the half;
                // peers read our slice of the half only after the next barrier.
                unsafe { std::ptr::copy_nonoverlapping(inp.add(off * esz + at), mine, len) };
                for p in (0..n).filter(|&p| p != me) {
                    self.reduce(mine, self.stage(p, h, at), len);
                }
                self.finalize(mine, len, world);
                if wants {
                    // SAFETY: as above.
                    unsafe { copy_out(mine, out.add(off * esz + at), len, stream) };
                }
            }
            self.barrier(h, false)?;
            if wants {
                for p in (0..n).filter(|&p| p != me) {
                    let (s, l) = part(m, n, p);
                    // SAFETY: slice p of this chunk, inside both buffers.
                    unsafe {
                        copy_out(
                            self.stage(p, h, s * esz),
                            out.add((off + s) * esz),
                            l * esz,
                            stream,
                        )
                    };
                }
            }
        }
        Ok(())
    }

    /// The root fills its staging half, one barrier (where every rank checks every rank's
    /// fingerprint, so ranks that disagree on the root all fail), readers copy out. Larger
    /// ones pipeline through a ring of slots after that barrier; from `cma` bytes readers copy
    /// straight out of the root's buffer instead.
    fn broadcast(&self, buf: *mut u8, count: usize, root: usize) -> Result<()> {
        let (me, esz) = (self.me(), self.esz());
        let bytes = count * esz;
        if bytes >= self.cma && self.n() > 1 {
            return self.broadcast_direct(buf, bytes, root);
        }
        if bytes > self.span() {
            return self.broadcast_ring(buf, bytes, root);
        }
        let h = self.begin(true)?;
        if me == root {
            // SAFETY: `bytes` fit a staging half.
            unsafe { std::ptr::copy_nonoverlapping(buf, self.stage(me, h, 0), bytes) };
        }
        // A barrier, not a wait for the root alone: a rank that wrongly believes it is the
        // root would otherwise return at once with its own data. The barrier keeps the root's
        // half readable until every reader's next arrival.
        self.barrier(h, true)?;
        if me != root {
            // SAFETY: as above; the root filled its half before arriving.
            unsafe { std::ptr::copy_nonoverlapping(self.stage(root, h, 0), buf, bytes) };
        }
        Ok(())
    }

    /// A broadcast larger than a half: both halves form a ring of slots; the root may run up
    /// to a ring's length ahead of the slowest reader, so neither side waits on every chunk.
    fn broadcast_ring(&self, buf: *mut u8, bytes: usize, root: usize) -> Result<()> {
        let me = self.me();
        let h = self.begin(true)?;
        // Every rank checks every fingerprint before the root writes a slot (see `broadcast`).
        self.barrier(h, true)?;
        // The second half's guard may name the readers' next arrival (after a barrier), which
        // comes only once they read chunk 0: the root waits for it when it first writes there.
        let h2 = self.g.next_chunk();
        let span = self.span();
        let per_half = span / self.slot.clamp(64, span);
        let slot = (span / per_half.max(1)) / 64 * 64;
        let slots = 2 * per_half;
        let e0 = self.g.epoch();
        let stream = bytes >= self.stream;
        let n = bytes.div_ceil(slot);
        for j in 0..n {
            let off = j * slot;
            let len = slot.min(bytes - off);
            let e = e0.wrapping_add(j as u32 + 1);
            let i = j % slots;
            let (half, at_off) = if i < per_half {
                (h, i * slot)
            } else {
                (h2, (i - per_half) * slot)
            };
            if me == root {
                if j >= slots {
                    let done = e0.wrapping_add((j - slots) as u32 + 1);
                    self.wait_peers(done, h)?;
                } else if i == per_half {
                    self.g.guard(h2, self.deadline).map_err(|e| self.error(e))?;
                }
                // SAFETY: the slot lies inside a staging half; off + len inside buf.
                unsafe {
                    std::ptr::copy_nonoverlapping(buf.add(off), self.stage(me, half, at_off), len)
                };
                self.g.arrive();
            } else {
                self.wait_peer(root, e, h)?;
                if j == 0 {
                    self.check_fp(root, h)?;
                }
                // SAFETY: as above.
                unsafe { copy_out(self.stage(root, half, at_off), buf.add(off), len, stream) };
                self.g.arrive();
            }
        }
        if me == root {
            // Readers arrive at the last epoch after reading the last slot, in order.
            let last = self.g.epoch();
            self.g.set_guard(h, last);
            self.g.set_guard(h2, last);
        }
        Ok(())
    }

    /// Single copy: the root exposes its buffer and arrives; every reader copies it with
    /// `process_vm_readv` and arrives; the root returns once all readers have.
    fn broadcast_direct(&self, buf: *mut u8, bytes: usize, root: usize) -> Result<()> {
        let me = self.me();
        let h = self.begin(true)?;
        // Every rank checks every fingerprint first (see `broadcast`).
        self.barrier(h, true)?;
        if me == root {
            self.g.publish_region(buf, bytes);
            let e = self.g.arrive();
            self.g.set_guard(h, e);
            return self.g.wait_all(e, self.deadline).map_err(|e| self.error(e));
        }
        let e = self.g.epoch().wrapping_add(1);
        self.wait_peer(root, e, h)?;
        self.check_fp(root, h)?;
        let r = self.g.read_region(root, 0, buf, bytes);
        // Arrive even after a failed read: the root must not wait for us until its deadline.
        self.g.arrive();
        r
    }

    /// Every rank's `block` elements land in block `r` of `out`. Also the barrier (`block == 0`).
    fn allgather(&self, inp: *const u8, out: *mut u8, block: usize) -> Result<()> {
        let (n, me, esz) = (self.n(), self.me(), self.esz());
        if block * esz * n >= self.cma && n > 1 && block > 0 {
            return self.allgather_direct(inp, out, block * esz);
        }
        let per = (self.span() / esz).max(1);
        // Outputs well beyond the caches: peers' blocks bypass them. Measured on the 2-core VM
        // (N = 2): from 16 MiB (8x the broadcast threshold) this wins, at 4 MiB it loses.
        let stream = block * esz * n >= self.stream.saturating_mul(8);
        // Our own block: with outputs that fit the caches, copied in the fill, while the chunk
        // is still in cache from the staging copy and before waiting for the peers (N = 2:
        // 1 MiB 28.5 -> 25.9 us, 4 MiB 110 -> 101 us); larger ones after the barrier, as
        // before (2 % better there).
        let own = |off: usize, m: usize| {
            // SAFETY: block `me` of out has room for m elements at off; the input may alias it
            // (in place), hence `copy`.
            unsafe {
                std::ptr::copy(
                    inp.add(off * esz),
                    out.add((me * block + off) * esz),
                    m * esz,
                )
            }
        };
        for k in 0..Self::chunks(block, per) {
            let (h, off, m) = self.staged_chunk(k, per, block, |h, off, m| {
                // SAFETY: m elements from off are inside the input and fit a staging half.
                unsafe {
                    std::ptr::copy_nonoverlapping(inp.add(off * esz), self.stage(me, h, 0), m * esz)
                }
                if !stream {
                    own(off, m);
                }
            })?;
            for p in 0..n {
                if p == me {
                    if stream {
                        own(off, m);
                    }
                    continue;
                }
                // SAFETY: block p of out has room for these m elements at off.
                unsafe {
                    let dst = out.add((p * block + off) * esz);
                    copy_out(self.stage(p, h, 0), dst, m * esz, stream);
                }
            }
        }
        Ok(())
    }

    /// Single copy: every rank exposes its input, one barrier, every rank reads every peer's
    /// block straight into its output, and a second barrier keeps the inputs alive until then.
    fn allgather_direct(&self, inp: *const u8, out: *mut u8, bytes: usize) -> Result<()> {
        let (n, me) = (self.n(), self.me());
        let h = self.begin(true)?;
        self.g.publish_region(inp, bytes);
        self.barrier(h, true)?;
        let mut res = Ok(());
        // Start with the next rank so that not everyone reads rank 0 at once.
        for i in 1..n {
            let p = (me + i) % n;
            // SAFETY: block p of out has room for `bytes`.
            res = self
                .g
                .read_region(p, 0, unsafe { out.add(p * bytes) }, bytes);
            if res.is_err() {
                break;
            }
        }
        // SAFETY: my block of out; `inp` may alias it (in place).
        unsafe { std::ptr::copy(inp, out.add(me * bytes), bytes) };
        let e = self.g.arrive();
        let w = self.g.wait_all(e, self.deadline).map_err(|e| self.error(e));
        res.and(w)
    }

    /// Staging layout shared by reduce_scatter and alltoall: block `q`'s chunk at `q * m`.
    fn scatter_in(&self, inp: *const u8, h: usize, block: usize, off: usize, m: usize) {
        let esz = self.esz();
        for q in 0..self.n() {
            if q != self.me() {
                // SAFETY: block q of the input, m elements from off; n * m fits the half.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        inp.add((q * block + off) * esz),
                        self.stage(self.me(), h, q * m * esz),
                        m * esz,
                    )
                };
            }
        }
    }

    /// Block `r` of every rank's input, reduced, lands in local rank `r`'s `out`. `finish`: apply
    /// Avg's division (false when a later stage finishes it).
    fn reduce_scatter(
        &self,
        inp: *const u8,
        out: *mut u8,
        block: usize,
        finish: bool,
    ) -> Result<()> {
        let (n, me, esz) = (self.n(), self.me(), self.esz());
        let per = (self.span() / (esz * n)).max(1);
        for k in 0..Self::chunks(block, per) {
            let (h, off, m) = self.staged_chunk(k, per, block, |h, off, m| {
                self.scatter_in(inp, h, block, off, m)
            })?;
            let dst = unsafe { out.add(off * esz) };
            // SAFETY: my block's chunk of the input; out has room for m elements at off.
            unsafe { std::ptr::copy(inp.add((me * block + off) * esz), dst, m * esz) };
            for p in 0..n {
                if p != me {
                    self.reduce(dst, self.stage(p, h, me * m * esz), m * esz);
                }
            }
            if finish {
                self.finalize(dst, m * esz, n);
            }
        }
        Ok(())
    }

    fn alltoall(&self, inp: *const u8, out: *mut u8, block: usize) -> Result<()> {
        let (n, me, esz) = (self.n(), self.me(), self.esz());
        let per = (self.span() / (esz * n)).max(1);
        for k in 0..Self::chunks(block, per) {
            let (h, off, m) = self.staged_chunk(k, per, block, |h, off, m| {
                self.scatter_in(inp, h, block, off, m)
            })?;
            for p in 0..n {
                // SAFETY: block p of out, m elements at off.
                unsafe {
                    let dst = out.add((p * block + off) * esz);
                    if p == me {
                        std::ptr::copy(inp.add((me * block + off) * esz), dst, m * esz);
                    } else {
                        std::ptr::copy_nonoverlapping(self.stage(p, h, me * m * esz), dst, m * esz);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_copy_matches_the_source_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for len in [0, 1, 63, 64, 255, 4095, 4096, 4097, 65_537] {
            for (so, d_off) in [(0, 0), (1, 0), (0, 3), (5, 17), (64, 1)] {
                let mut dst = vec![0xAAu8; len + d_off + 8];
                copy_streaming(&mut dst[d_off..d_off + len], &src[so..so + len]);
                assert_eq!(
                    &dst[d_off..d_off + len],
                    &src[so..so + len],
                    "{len} {so} {d_off}"
                );
                assert!(dst[..d_off].iter().all(|&b| b == 0xAA), "before {len}");
                assert!(dst[d_off + len..].iter().all(|&b| b == 0xAA), "after {len}");
            }
        }
    }
}
