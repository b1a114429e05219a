//! Point-to-point messages through shared memory between the ranks of one host, TCP to the rest.
//!
//! Everything that runs message schedules (send/recv, gather/scatter and their `_v` variants,
//! alltoallv, sub-communicators, nonblocking requests) goes through [`Transport::send`] and the
//! [`Mailbox`]. [`HybridTransport`] routes a message to a peer on this host through a byte ring in
//! the peer's shared-memory segment and everything else through the [`TcpTransport`], and both
//! deliver into the same mailbox.
//!
//! # Rings
//!
//! Every local rank's segment (see [`super::shm`]) ends with one single-producer,
//! single-consumer ring per local sender. A ring is a control block — the bytes ever written
//! (`head`, stored by the sender), the bytes ever consumed (`tail`, stored by the receiver), a
//! futex word the receiver bumps after consuming and a flag saying a sender sleeps on it —
//! followed by the data area. A message travels as frames of at most a quarter of the ring (and
//! at most [`chunk_bytes`]), each the same 72-byte [`Header`] TCP uses (envelope, fingerprint,
//! `offset`, `total_len`) followed by the payload, padded to 8 bytes; frames wrap around the end
//! of the data area. The sender publishes a frame by storing `head` (release), so a frame is
//! never seen half written, even if the sender is killed while writing it. Threads of one process
//! take turns on a ring through a per-peer lock.
//!
//! # Receiving
//!
//! A thread waiting in [`Mailbox::take`] polls the incoming rings itself for `ACCORD_SHM_SPIN_US`
//! (the shared-memory spin time, 50 us) before it sleeps: a short message then costs no thread
//! hand-over at all. Behind it, one receiver thread per rank drains every incoming ring into the
//! mailbox, so senders progress whatever the application does. When a pass finds nothing it
//! sleeps in `FUTEX_WAIT` on this rank's *doorbell*, a word in its segment header that senders
//! increment after every frame (waking the receiver when it announced that it sleeps). When
//! local ranks outnumber cores, waiting application threads sleep at once and the receiver
//! thread spins briefly (2 us) instead, so the cores go to the ranks that have work.
//!
//! # Flow control and failures
//!
//! A sender facing a full ring waits — spinning, then sleeping on the ring's futex word in slices
//! of at most 10 ms — for the receiver thread, which always drains, so sends never deadlock on
//! each other. Between slices it checks for an abort or lost-peer notice in the mailbox, whether
//! the receiving process still exists, and the transport's timeout.
//!
//! The TCP connections stay: they carry aborts to every peer and report a peer whose process
//! ended (`peer_lost`). Since a peer's last frames may still be in its ring when its connection
//! is seen closing, the mailbox drains the rings (a flush hook) before it reports a source lost.
//!
//! `ACCORD_SHM_P2P=0` keeps point-to-point traffic on TCP; `ACCORD_SHM_RING_BYTES` sets the ring
//! size (default 512 KiB per ordered pair of local ranks).

use super::shm::{futex_wait, futex_wake, Peer, RingArea, OFF_BELL, OFF_BELL_SLEEP};
use super::tcp::TcpTransport;
use super::waits::{Answer, Blocked};
use super::wire::{FrameKind, Header, HEADER_LEN};
use super::{chunk_bytes, for_each_chunk, Envelope, Frame, LinkKind, Mailbox, Transport};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes of a ring's control block.
const CTRL: usize = 256;
const R_HEAD: usize = 0;
const R_TAIL: usize = 64;
const R_FREED: usize = 128;
const R_WAITING: usize = 132;
/// Longest single futex sleep, so liveness, aborts and deadlines are checked regularly.
const SLICE: Duration = Duration::from_millis(10);

/// Whether point-to-point traffic between local ranks uses the rings (`ACCORD_SHM_P2P`, on by
/// default).
pub fn shm_p2p_enabled() -> bool {
    crate::config::get().shm_p2p
}

fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// One ring, as seen through a mapping.
struct Ring {
    base: *mut u8,
    cap: usize,
}

impl Ring {
    fn new(area: &RingArea, recv: usize, send: usize) -> Ring {
        Ring {
            base: area.ring(recv, send),
            cap: area.ring_bytes - CTRL,
        }
    }

    fn u64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: inside the control block, 8-aligned (rings start page-aligned).
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    fn u32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    /// Copy `src` into the data area at stream position `pos`, wrapping around its end.
    ///
    /// # Safety
    /// The bytes `[pos, pos + len)` must be free (written by this sender, not yet published).
    unsafe fn put(&self, pos: u64, src: &[u8]) {
        let data = self.base.add(CTRL);
        let off = (pos % self.cap as u64) as usize;
        let first = src.len().min(self.cap - off);
        std::ptr::copy_nonoverlapping(src.as_ptr(), data.add(off), first);
        std::ptr::copy_nonoverlapping(src.as_ptr().add(first), data, src.len() - first);
    }

    /// Copy from stream position `pos` into `dst`, wrapping around the data area's end.
    ///
    /// # Safety
    /// The bytes `[pos, pos + len)` must be published and not yet consumed.
    unsafe fn get(&self, pos: u64, dst: &mut [u8]) {
        let data = self.base.add(CTRL);
        let off = (pos % self.cap as u64) as usize;
        let first = dst.len().min(self.cap - off);
        std::ptr::copy_nonoverlapping(data.add(off), dst.as_mut_ptr(), first);
        std::ptr::copy_nonoverlapping(data, dst.as_mut_ptr().add(first), dst.len() - first);
    }
}

/// The receiving side, shared by the receiver thread and the mailbox's flush hook.
struct Receiver {
    area: RingArea,
    /// Rings this rank reads, by local sender (`None` for itself); the lock makes one drainer at
    /// a time. A ring that delivered a malformed frame is abandoned (`true`).
    rings: Mutex<Vec<Option<(Ring, bool)>>>,
}

// SAFETY: the raw pointers point into shared mappings kept alive by `area`; access to the rings
// is serialized by the mutex and synchronized with the senders through the atomics.
unsafe impl Send for Receiver {}
unsafe impl Sync for Receiver {}

impl Receiver {
    /// Move every complete frame from the incoming rings into `mailbox`; whether any moved.
    fn drain(&self, mailbox: &Mailbox, block: bool) -> bool {
        let mut rings = match self.rings.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if !block => return false,
            Err(std::sync::TryLockError::WouldBlock) => {
                self.rings.lock().unwrap_or_else(|e| e.into_inner())
            }
        };
        let mut any = false;
        for (s, slot) in rings.iter_mut().enumerate() {
            let Some((ring, broken)) = slot else { continue };
            if *broken {
                continue;
            }
            let src = self.area.members[s];
            let head = ring.u64(R_HEAD).load(Ordering::Acquire);
            let mut tail = ring.u64(R_TAIL).load(Ordering::Relaxed);
            while tail < head {
                let mut hb = [0u8; HEADER_LEN];
                // SAFETY: [tail, head) is published by the sender.
                unsafe { ring.get(tail, &mut hb) };
                let h = match Header::decode(&hb, src as u32) {
                    Ok(h) if h.kind == FrameKind::Data => h,
                    Ok(h) => {
                        *broken = true;
                        mailbox.peer_lost(src, format!("unexpected {:?} frame in a ring", h.kind));
                        break;
                    }
                    Err(e) => {
                        *broken = true;
                        mailbox.peer_lost(src, e.to_string());
                        break;
                    }
                };
                let len = h.chunk_len as usize;
                let size = pad8(HEADER_LEN + len) as u64;
                if size > head - tail {
                    *broken = true;
                    mailbox.peer_lost(src, "a ring frame overruns the published bytes");
                    break;
                }
                let mut data = vec![0u8; len];
                // SAFETY: as above; the frame lies within [tail, head).
                unsafe { ring.get(tail + HEADER_LEN as u64, &mut data) };
                tail += size;
                ring.u64(R_TAIL).store(tail, Ordering::Release);
                let freed = ring.u32(R_FREED);
                freed.fetch_add(1, Ordering::SeqCst);
                if ring.u32(R_WAITING).load(Ordering::SeqCst) != 0 {
                    futex_wake(freed);
                }
                mailbox.deliver(src, Frame::new(h.env, h.total_len, h.offset, data));
                any = true;
            }
        }
        any
    }
}

/// A transport that uses shared-memory rings for peers on this host and TCP for the others. See
/// the [module documentation](self).
pub struct HybridTransport {
    tcp: Arc<TcpTransport>,
    mailbox: Arc<Mailbox>,
    area: RingArea,
    /// World rank -> local rank, for peers on this host.
    local: Vec<Option<usize>>,
    /// Per local rank: this rank's ring in its segment, with the lock its writers take turns on.
    out: Vec<Option<Mutex<Ring>>>,
    /// Per local rank: its process, to notice its death while waiting for ring space.
    procs: Vec<Option<Peer>>,
    timeout: Duration,
    name: &'static str,
    /// Every rank of the world is on this host.
    all_local: bool,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

// SAFETY: see `Receiver`; the outgoing rings are used under their mutexes.
unsafe impl Send for HybridTransport {}
unsafe impl Sync for HybridTransport {}

impl std::fmt::Debug for HybridTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridTransport")
            .field("rank", &self.tcp.rank())
            .field("local", &self.area.members)
            .finish_non_exhaustive()
    }
}

impl HybridTransport {
    /// Route messages to the ranks of `area` through its rings and to every other rank through
    /// `tcp`; start this rank's receiver thread. `timeout` bounds a wait for ring space.
    pub(crate) fn new(
        tcp: Arc<TcpTransport>,
        area: RingArea,
        timeout: Duration,
    ) -> Result<Arc<HybridTransport>> {
        let size = tcp.size();
        let mut local = vec![None; size];
        for (i, &r) in area.members.iter().enumerate() {
            local[r] = Some(i);
            // A local peer's data comes through its ring: waits poll the rings, not its socket.
            tcp.set_read_by_waiters(r, false);
        }
        let me = area.me;
        let n = area.members.len();
        // Start from whatever a previous use of the segment left: only the counters matter, and
        // each ring's receiver and sender agree on them from the first frame.
        let out = (0..n)
            .map(|r| (r != me).then(|| Mutex::new(Ring::new(&area, r, me))))
            .collect();
        let procs = (0..n)
            .map(|r| (r != me).then(|| Peer::open(area.pids[r])))
            .collect();
        let recv = Arc::new(Receiver {
            rings: Mutex::new(
                (0..n)
                    .map(|s| (s != me).then(|| (Ring::new(&area, me, s), false)))
                    .collect(),
            ),
            area: area.clone(),
        });
        let mailbox = tcp.mailbox_arc();
        let hook = recv.clone();
        // Waiting receivers poll the rings themselves for a while (not when ranks outnumber
        // cores: the core is better left to the sender).
        let poll = if area.crowded {
            Duration::ZERO
        } else {
            area.spin
        };
        mailbox.set_flush(
            Box::new(move |m, block| {
                hook.drain(m, block);
            }),
            poll,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (recv, mailbox, stop) = (recv.clone(), mailbox.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("accord-shm-rx{}", tcp.rank()))
                .spawn(move || receive_loop(&recv, &mailbox, &stop))
                .map_err(|e| Error::io("starting the shared-memory receiver thread", e))?
        };
        let all_local = n == size;
        let name = if all_local { "shm" } else { "tcp+shm" };
        Ok(Arc::new(HybridTransport {
            tcp,
            mailbox,
            area,
            local,
            out,
            procs,
            timeout,
            name,
            all_local,
            stop,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// The TCP transport underneath (remote peers, aborts, liveness).
    pub fn tcp(&self) -> &Arc<TcpTransport> {
        &self.tcp
    }

    /// Write one frame into local rank `l`'s ring, waiting for space until the deadline.
    fn put_frame(&self, peer: usize, l: usize, hdr: &[u8], body: &[u8]) -> Result<()> {
        let ring = self.out[l].as_ref().expect("ring to a peer");
        let ring = ring.lock().unwrap_or_else(|e| e.into_inner());
        let need = pad8(HEADER_LEN + body.len()) as u64;
        let head = ring.u64(R_HEAD).load(Ordering::Relaxed);
        let free = |r: &Ring| r.cap as u64 - (head - r.u64(R_TAIL).load(Ordering::Acquire));
        if free(&ring) < need {
            self.wait_space(peer, l, &ring, need, &free)?;
        }
        // SAFETY: [head, head + need) is free: the receiver has consumed everything before it.
        unsafe {
            ring.put(head, hdr);
            ring.put(head + HEADER_LEN as u64, body);
        }
        ring.u64(R_HEAD).store(head + need, Ordering::Release);
        let bell = self.area.word(l, OFF_BELL);
        bell.fetch_add(1, Ordering::SeqCst);
        if self.area.word(l, OFF_BELL_SLEEP).load(Ordering::SeqCst) != 0 {
            futex_wake(bell);
        }
        Ok(())
    }

    fn wait_space(
        &self,
        peer: usize,
        l: usize,
        ring: &Ring,
        need: u64,
        free: &dyn Fn(&Ring) -> u64,
    ) -> Result<()> {
        let start = Instant::now();
        let deadline = start + self.timeout;
        while start.elapsed() < self.area.spin {
            if free(ring) >= need {
                return Ok(());
            }
            if self.area.crowded {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let freed = ring.u32(R_FREED);
        let waiting = ring.u32(R_WAITING);
        // Recorded for peers that ask what this rank waits for.
        let _blocked = self.mailbox.waits().enter(Blocked {
            comm: 0,
            seq: 0,
            ranks: vec![peer],
            gave_up: false,
        });
        loop {
            waiting.store(1, Ordering::SeqCst);
            let v = freed.load(Ordering::SeqCst);
            if free(ring) >= need {
                waiting.store(0, Ordering::SeqCst);
                return Ok(());
            }
            let now = Instant::now();
            futex_wait(freed, v, deadline.saturating_duration_since(now).min(SLICE));
            waiting.store(0, Ordering::SeqCst);
            if free(ring) >= need {
                return Ok(());
            }
            if let Some((by, reason)) = self.mailbox.aborted() {
                return Err(Error::aborted_by(by, &reason));
            }
            if let Some(cause) = self.mailbox.lost(peer) {
                return Err(Error::PeerLost { rank: peer, cause });
            }
            if let Some(p) = &self.procs[l] {
                if !p.alive() {
                    let cause = format!(
                        "process {} exited (seen sending to it through shared memory)",
                        self.area.pids[l]
                    );
                    self.mailbox.peer_lost(peer, cause.clone());
                    return Err(Error::PeerLost { rank: peer, cause });
                }
            }
            if Instant::now() >= deadline {
                let cause = format!(
                    "rank {peer} accepted no data for {:.1?} (its shared-memory ring stayed \
                     full; is it stuck?)",
                    self.timeout
                );
                self.mailbox.peer_lost(peer, cause.clone());
                return Err(Error::PeerLost { rank: peer, cause });
            }
        }
    }
}

fn receive_loop(recv: &Receiver, mailbox: &Mailbox, stop: &AtomicBool) {
    let me = recv.area.me;
    let bell = recv.area.word(me, OFF_BELL);
    let sleeping = recv.area.word(me, OFF_BELL_SLEEP);
    // Waiting receivers poll the rings themselves (see `HybridTransport::new`); a polling
    // receiver thread as well would only take cores from them. When ranks outnumber cores the
    // application threads do not poll and this thread spins briefly instead.
    let spin = if recv.area.crowded {
        recv.area.spin
    } else {
        Duration::ZERO
    };
    let mut idle = Instant::now();
    let mut i = 0u32;
    while !stop.load(Ordering::Relaxed) {
        if recv.drain(mailbox, true) {
            idle = Instant::now();
            continue;
        }
        i = i.wrapping_add(1);
        if i & 15 != 0 || idle.elapsed() < spin {
            if recv.area.crowded {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        sleeping.store(1, Ordering::SeqCst);
        let v = bell.load(Ordering::SeqCst);
        if !recv.drain(mailbox, true) && !stop.load(Ordering::SeqCst) {
            futex_wait(bell, v, Duration::from_millis(100));
        }
        sleeping.store(0, Ordering::SeqCst);
        idle = Instant::now();
    }
}

impl Transport for HybridTransport {
    fn rank(&self) -> usize {
        self.tcp.rank()
    }

    fn size(&self) -> usize {
        self.tcp.size()
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn link(&self) -> LinkKind {
        // With ranks on several hosts, the slowest links are TCP.
        if self.all_local {
            LinkKind::SharedMemory
        } else {
            LinkKind::Tcp
        }
    }

    fn send_start<'a>(
        &'a self,
        peer: usize,
        env: &Envelope,
        data: &'a [u8],
    ) -> Result<super::Sending<'a>> {
        match self.local.get(peer).copied() {
            Some(Some(_)) => self.send(peer, env, data).map(|()| super::Sending::done()),
            _ => self.tcp.send_start(peer, env, data),
        }
    }

    fn send(&self, peer: usize, env: &Envelope, data: &[u8]) -> Result<()> {
        let Some(Some(l)) = self.local.get(peer).copied() else {
            return self.tcp.send(peer, env, data);
        };
        if l == self.area.me {
            return Err(Error::invalid(format!(
                "rank {peer} cannot send to itself through the transport"
            )));
        }
        if let Some(cause) = self.mailbox.lost(peer) {
            return Err(Error::PeerLost { rank: peer, cause });
        }
        let quarter = ((self.area.ring_bytes - CTRL) / 4 - HEADER_LEN) / 8 * 8;
        let chunk = chunk_bytes().min(quarter).max(8);
        let total_len = data.len() as u64;
        let src = self.rank() as u32;
        for_each_chunk(data, chunk, |off, bytes| {
            let hdr = Header {
                kind: FrameKind::Data,
                src,
                chunk_len: bytes.len() as u32,
                env: *env,
                total_len,
                offset: off as u64,
                order: 0,
            }
            .encode();
            self.put_frame(peer, l, &hdr, bytes)
        })
    }

    fn mailbox(&self) -> &Mailbox {
        &self.mailbox
    }

    fn abort(&self, by: usize, reason: &str) {
        self.tcp.abort(by, reason);
    }

    fn probe(&self, peers: &[usize], within: Duration) -> Vec<Answer> {
        self.tcp.probe(peers, within)
    }

    fn shutdown(&self) {
        // Every peer, local ones included, has a connection: the goodbyes go there.
        self.tcp.shutdown();
    }
}

impl Drop for HybridTransport {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let bell = self.area.word(self.area.me, OFF_BELL);
        bell.fetch_add(1, Ordering::SeqCst);
        futex_wake(bell);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}
