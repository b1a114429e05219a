//! Shared memory between the ranks of one host: segments, cross-process futex waits, liveness.
//!
//! # Segments
//!
//! Every local rank creates one anonymous segment with `memfd_create` and publishes
//! `pid fd bytes` in a [`Directory`] (the rendezvous store). Peers map it by opening
//! `/proc/<pid>/fd/<fd>`, so the segment never has a name in `/dev/shm`: once every local rank
//! has mapped every segment (a barrier through the directory), each rank closes its descriptor
//! and the memory lives exactly as long as the mappings. A normal exit, a panic or `kill -9` therefore leaves nothing behind.
//!
//! A segment is a header page (this rank's arrival counter, its waiter count, and per staging
//! half the fingerprint of the call that last wrote it) followed by two staging halves of
//! [`ShmGroup::half_bytes`] each. Collectives alternate halves chunk by chunk; see
//! the shared-memory collectives (`shm_coll`) for why two halves make one barrier per chunk enough to reuse them safely.
//!
//! # Waiting
//!
//! A rank "arrives" by incrementing its counter (a 32-bit word in the shared mapping) and waking
//! waiters with `FUTEX_WAKE` — a *shared* futex (no `FUTEX_PRIVATE_FLAG`), since the waiters are
//! other processes. Waiting for a peer's counter spins for a bounded time
//! (`ACCORD_SHM_SPIN_US`, 50 us; none beyond a few dozen polls when the local ranks outnumber
//! the CPUs they may use together, where the awaited peer usually needs the very core the
//! waiter holds), then yields the core
//! (`ACCORD_SHM_YIELD_US`, 0.5 ms; 5 ms when crowded), then sleeps in `FUTEX_WAIT` in slices of
//! at most 10 ms. Between slices it checks, in this order: an abort or lost-peer notice from the
//! TCP side channel (every rank keeps its TCP connections, which also carry aborts), whether the
//! peer process still exists (a pidfd, else `kill(pid, 0)`), and the call's deadline. A dead peer
//! is reported as [`Error::PeerLost`] naming its rank within about 10 ms of the wait reaching
//! the sleeping stage. The peers' process ids also go to the side channel's wait records
//! ([`crate::transport::waits`]), so that a timeout sees a stopped peer in `/proc` at once.
//!
//! # Reading peers' memory
//!
//! At join every rank checks that it can `process_vm_readv` from every peer (reading a word
//! the peer wrote into its own header) and the group agrees; if any pair cannot (EPERM under
//! a stricter ptrace policy, ENOSYS), single-copy transfers are off for the group and rank 0
//! says so once on stderr. `ACCORD_SHM_CMA=0` skips the probe.
//!
//! # Host identity
//!
//! Ranks share memory when they publish the same host id: `ACCORD_HOST_ID` if set (tests use it
//! to simulate several hosts on one machine), else the host name and the kernel boot id.

use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FINGERPRINT_WIRE_LEN};
use crate::transport::cpus;
use crate::transport::{Directory, Transport};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of the header page at the start of every segment.
const HEADER: usize = 4096;
const OFF_ARRIVE: usize = 0;
const OFF_WAITERS: usize = 64;
/// Per half: sequence number (u64) then the fingerprint bytes.
const OFF_FP: usize = 256;
const FP_SLOT: usize = 64;
/// The region this rank exposes for single-copy reads: address (u64) then length (u64).
const OFF_REGION: usize = 512;
/// This process's address of its own segment, read by peers to probe `process_vm_readv`.
const OFF_SELF: usize = 576;
/// Point-to-point doorbell of this rank: senders bump it after writing into one of its rings.
pub(crate) const OFF_BELL: usize = 640;
/// Nonzero while this rank's ring receiver sleeps on the doorbell.
pub(crate) const OFF_BELL_SLEEP: usize = 704;

/// Default size of one point-to-point ring (`ACCORD_SHM_RING_BYTES`).
pub const DEFAULT_RING_BYTES: usize = crate::config::DEFAULT_SHM_RING_BYTES;

/// Default size of one staging half (`ACCORD_SHM_CHUNK_BYTES`).
pub const DEFAULT_HALF_BYTES: usize = crate::config::DEFAULT_SHM_HALF_BYTES;

/// This machine's identity for placement: `ACCORD_HOST_ID`, else host name + boot id.
pub fn host_id() -> String {
    if let Some(h) = &crate::config::get().host_id {
        return h.clone();
    }
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    format!("{name}/{boot}")
}

/// Whether `ACCORD_TRANSPORT` allows shared memory (`tcp` forbids it).
pub fn shm_enabled() -> bool {
    crate::config::get().shm
}

/// One mapped segment.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all access goes through atomics or through the
// collective protocol that gives each byte range a single writer at a time.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len come from a successful mmap and nothing refers to them any more.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// A descriptor closed when dropped.
struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: we own this descriptor.
        unsafe { libc::close(self.0) };
    }
}

/// Bytes of each rank's segment in a group of `local_ranks` ranks: the header page, two
/// staging halves, then one point-to-point ring per local sender.
pub fn segment_bytes(local_ranks: usize) -> usize {
    let cfg = crate::config::get();
    rings_offset(cfg.shm_half_bytes) + local_ranks * cfg.shm_ring_bytes
}

/// Where a segment's rings start: after the header and two staging halves of `half` bytes,
/// page aligned.
fn rings_offset(half: usize) -> usize {
    (HEADER + 2 * half).div_ceil(4096) * 4096
}

/// This rank's segment: an anonymous memory file of `len` bytes, mapped.
fn create_segment(len: usize) -> Result<(Fd, Mapping)> {
    // SAFETY: creating an anonymous memory file; close-on-exec.
    let fd = unsafe { libc::memfd_create(c"accord-shm".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(last_os("memfd_create for the shared-memory segment"));
    }
    let own = Fd(fd);
    // SAFETY: sizing our own memfd.
    if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
        return Err(last_os("sizing the shared-memory segment"));
    }
    let mapping = map_fd(fd, len)?;
    Ok((own, mapping))
}

/// Map the segment process `pid` holds as descriptor `fd`, through `/proc` as peers do;
/// `whose` names it in errors (`rank 3's`).
fn open_segment(pid: u32, fd: libc::c_int, len: usize, whose: &str) -> Result<Mapping> {
    let path = std::ffi::CString::new(format!("/proc/{pid}/fd/{fd}")).unwrap();
    // SAFETY: opening a path; the result is checked.
    let pfd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if pfd < 0 {
        return Err(Error::io(
            format!(
                "opening {whose} shared-memory segment {path:?} (set ACCORD_TRANSPORT=tcp if \
                 processes cannot see each other's /proc)"
            ),
            std::io::Error::last_os_error(),
        ));
    }
    let pfd = Fd(pfd);
    map_fd(pfd.0, len)
}

/// Whether this process can do what joining a group of `local_ranks` ranks takes: make its
/// segment at full size, map it a second time through `/proc` as a peer would, and see there
/// what it wrote at both ends (writing them commits the pages, so a size the memory limit
/// cannot hold fails here rather than in the first collective).
pub fn probe_segment(local_ranks: usize) -> Result<()> {
    let len = segment_bytes(local_ranks);
    let (fd, mine) = create_segment(len)?;
    // SAFETY: both offsets lie inside the mapping.
    unsafe {
        *mine.ptr = 0x5a;
        *mine.ptr.add(len - 1) = 0xa5;
    }
    let theirs = open_segment(std::process::id(), fd.0, len, "this process's own")?;
    // SAFETY: both offsets lie inside the mapping.
    let seen = unsafe { (*theirs.ptr, *theirs.ptr.add(len - 1)) };
    match seen == (0x5a, 0xa5) {
        true => Ok(()),
        false => Err(Error::Protocol(
            "a second mapping of a shared-memory segment does not see the first one's writes"
                .into(),
        )),
    }
}

fn last_os(context: &str) -> Error {
    Error::io(context.to_string(), std::io::Error::last_os_error())
}

fn map_fd(fd: libc::c_int, len: usize) -> Result<Mapping> {
    // SAFETY: mapping a file descriptor we own, shared, read-write.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(last_os("mapping a shared-memory segment"));
    }
    Ok(Mapping {
        ptr: p as *mut u8,
        len,
    })
}

/// A peer process we can ask "are you still there?".
pub(crate) struct Peer {
    pid: i32,
    pidfd: Option<libc::c_int>,
}

impl Peer {
    pub(crate) fn open(pid: i32) -> Peer {
        // SAFETY: plain syscall; a failure leaves us with kill(pid, 0).
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        Peer {
            pid,
            pidfd: (fd >= 0).then_some(fd as libc::c_int),
        }
    }

    pub(crate) fn alive(&self) -> bool {
        if let Some(fd) = self.pidfd {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; zero timeout. Readable means the process has exited.
            let r = unsafe { libc::poll(&mut p, 1, 0) };
            return !(r > 0 && p.revents & libc::POLLIN != 0);
        }
        // SAFETY: signal 0 only checks existence.
        let r = unsafe { libc::kill(self.pid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(fd) = self.pidfd {
            // SAFETY: we own this descriptor.
            unsafe { libc::close(fd) };
        }
    }
}

/// How a wait ended badly, before it is turned into an [`Error`] naming the call.
#[derive(Debug)]
pub enum ShmWaitError {
    /// The deadline passed while waiting for these local ranks.
    Timeout(Vec<usize>),
    /// The local rank's process is gone.
    Dead(usize),
    /// The side channel reported an abort or a lost peer.
    Side(Error),
}

/// The ranks of one host that share memory, as seen from one of them.
pub struct ShmGroup {
    /// World ranks of the members, ascending; index = local rank.
    pub members: Vec<usize>,
    /// This process's index in `members`.
    pub me: usize,
    maps: Arc<Vec<Mapping>>,
    peers: Vec<Option<Peer>>,
    half: usize,
    /// Offset of the point-to-point rings in every segment, and the size of one ring.
    ring_base: usize,
    ring_bytes: usize,
    /// This rank's arrival count (the value last published).
    epoch: AtomicU32,
    /// Chunks run so far: selects the staging half.
    chunks: AtomicU64,
    /// How long a wait spins, then how long (in total) it yields, before sleeping.
    spin: Duration,
    yields: Duration,
    /// Spin time of the point-to-point receiver thread (see [`super::hybrid`]).
    ring_spin: Duration,
    /// Where aborts and lost connections of the side channel are reported.
    side: Option<Arc<dyn Fn() -> Option<Error> + Send + Sync>>,
    /// The side channel itself: where waits are recorded and peers asked what they wait for.
    side_transport: Option<Arc<dyn Transport>>,
    /// Per staging half: the epoch every peer must have reached before this rank writes the
    /// half again (`u64::MAX`: none pending). See [`ShmGroup::guard`].
    guards: [AtomicU64; 2],
    /// Whether peers can read this process's memory with `process_vm_readv` (probed at join).
    cma: bool,
    /// Whether more local ranks than cores: waits then yield the core almost at once.
    crowded: bool,
    /// One collective at a time uses the staging areas.
    pub(crate) lock: std::sync::Mutex<()>,
}

impl std::fmt::Debug for ShmGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmGroup")
            .field("members", &self.members)
            .field("me", &self.me)
            .field("half_bytes", &self.half)
            .finish()
    }
}

pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the word lives in a shared mapping that outlives the call; FUTEX_WAIT (shared,
    // no private flag) because the waker is another process.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: as above; wakes every process sleeping on the word.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

/// Copy `len` bytes at `addr` in process `pid` to `dst` with `process_vm_readv`.
fn read_remote(pid: i32, addr: u64, dst: *mut u8, len: usize) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let local = libc::iovec {
            iov_base: unsafe { dst.add(done) }.cast(),
            iov_len: len - done,
        };
        let remote = libc::iovec {
            iov_base: (addr + done as u64) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: `dst` is valid for `len` bytes; the remote range is checked by the kernel.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "process_vm_readv copied nothing",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// `a` has reached `b` in wrapping 32-bit order.
fn reached(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

impl ShmGroup {
    /// Join the shared-memory group of this host: publish this rank's segment in `dir`, map
    /// every local peer's segment, and wait until all of them have mapped this one. `hosts[r]` is the host id of world rank `r` (as
    /// gathered by the caller). Returns `None` when this rank is alone on its host.
    pub fn join(
        dir: &dyn Directory,
        rank: usize,
        hosts: &[String],
        timeout: Duration,
    ) -> Result<Option<ShmGroup>> {
        let members: Vec<usize> = (0..hosts.len())
            .filter(|&r| hosts[r] == hosts[rank])
            .collect();
        if members.len() < 2 {
            return Ok(None);
        }
        let me = members.iter().position(|&r| r == rank).expect("member");
        let cfg = crate::config::get();
        let half = cfg.shm_half_bytes;
        let ring_bytes = cfg.shm_ring_bytes;
        let ring_base = rings_offset(half);
        let len = segment_bytes(members.len());
        let (own, mine) = create_segment(len)?;
        let fd = own.0;
        let pid = std::process::id();
        dir.put(
            &format!("seg/{rank}"),
            format!("{pid} {fd} {len}").as_bytes(),
        )?;

        let keys: Vec<String> = members.iter().map(|r| format!("seg/{r}")).collect();
        let vals = dir.get_all(&keys, timeout)?;
        let mut maps = Vec::with_capacity(members.len());
        let mut peers = Vec::with_capacity(members.len());
        let mut mine = Some(mine);
        for (i, v) in vals.iter().enumerate() {
            if i == me {
                maps.push(mine.take().expect("own mapping"));
                peers.push(None);
                continue;
            }
            let text = String::from_utf8_lossy(v);
            let f: Vec<usize> = text
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            if f.len() != 3 || f[2] != len {
                return Err(Error::Protocol(format!(
                    "rank {} published a shared-memory segment {text:?}; expected `pid fd {len}` \
                     (do all ranks use the same ACCORD_SHM_CHUNK_BYTES and \
                     ACCORD_SHM_RING_BYTES?)",
                    members[i]
                )));
            }
            let whose = format!("rank {}'s", members[i]);
            maps.push(open_segment(f[0] as u32, f[1] as libc::c_int, len, &whose)?);
            peers.push(Some(Peer::open(f[0] as i32)));
        }
        // SAFETY: inside our own header page; peers read it only after the barrier below.
        unsafe { (maps[me].ptr.add(OFF_SELF) as *mut u64).write_volatile(maps[me].ptr as u64) };
        // Everyone has mapped everything before anyone closes its descriptor.
        dir.put(&format!("mapped/{rank}"), b"1")?;
        let keys: Vec<String> = members.iter().map(|r| format!("mapped/{r}")).collect();
        dir.wait_all(&keys, timeout)?;
        drop(own);

        // Single-copy transfers read peers' memory directly; that needs every pair to allow
        // process_vm_readv (same user, no stricter ptrace policy). Probe every peer and agree.
        let want_cma = cfg.shm_cma;
        let mut ok = want_cma;
        let mut why = String::new();
        if want_cma {
            for (i, m) in maps.iter().enumerate() {
                if i == me {
                    continue;
                }
                // SAFETY: inside the peer's header page, written before the barrier.
                let addr = unsafe { (m.ptr.add(OFF_SELF) as *const u64).read_volatile() };
                let mut word = 0u64;
                let pid = peers[i].as_ref().map_or(0, |p: &Peer| p.pid);
                if let Err(e) = read_remote(
                    pid,
                    addr + OFF_SELF as u64,
                    (&mut word as *mut u64).cast(),
                    8,
                ) {
                    ok = false;
                    why = format!("process_vm_readv from rank {}: {e}", members[i]);
                    break;
                }
                if word != addr {
                    ok = false;
                    why = format!("process_vm_readv from rank {} read wrong data", members[i]);
                    break;
                }
            }
        }
        dir.put(&format!("cma/{rank}"), if ok { b"1" } else { b"0" })?;
        let keys: Vec<String> = members.iter().map(|r| format!("cma/{r}")).collect();
        let cma = dir
            .get_all(&keys, timeout)?
            .iter()
            .all(|v| v.as_slice() == b"1");
        if want_cma && !ok && me == 0 {
            eprintln!(
                "accord: single-copy shared-memory transfers are off ({why}); large messages \
                 are staged through the segments instead"
            );
        }

        // Crowded means the local ranks cannot all run at once: more of them than the CPUs
        // they may use together. Ranks bound to one CPU each (`accord run`, mpirun) see one CPU
        // in their own mask, so every rank publishes what it sees and all compute the same
        // answer from the same data, which the protocol needs (crowded barriers are
        // centralized).
        dir.put(&format!("cpus/{rank}"), cpus::publish().as_bytes())?;
        let keys: Vec<String> = members.iter().map(|r| format!("cpus/{r}")).collect();
        let cores = cpus::usable_together(&dir.get_all(&keys, timeout)?);
        let crowded = members.len() > cores;
        let us =
            |set: Option<Duration>, default: u64| set.unwrap_or(Duration::from_micros(default));
        let spin = us(cfg.shm_spin, if crowded { 0 } else { 50 });
        let ring_spin = us(cfg.shm_spin, if crowded { 2 } else { 50 });
        let yields = us(cfg.shm_yield, if crowded { 5000 } else { 500 });
        Ok(Some(ShmGroup {
            members,
            me,
            maps: Arc::new(maps),
            peers,
            half,
            ring_base,
            ring_bytes,
            epoch: AtomicU32::new(0),
            chunks: AtomicU64::new(0),
            spin,
            ring_spin,
            yields,
            side: None,
            side_transport: None,
            guards: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
            cma,
            crowded,
            lock: std::sync::Mutex::new(()),
        }))
    }

    /// Report aborts and lost connections of the side channel (the TCP transport's mailbox)
    /// while waiting, so a failure anywhere ends every wait at once. A rank of another host
    /// that said goodbye does not: having finished its calls, it closed its communicator while
    /// this host still finishes the last one (a rank that leaves too early fails the steps that
    /// wait for it, which report it, or this host's ranks' own waits).
    /// Also tell the side channel the local ranks' process ids, so that a timeout can see a
    /// stopped peer in `/proc`.
    pub fn watch_mailbox(&mut self, side: Arc<dyn Transport>, world: Vec<usize>) {
        for r in 0..self.size() {
            if r != self.me {
                side.mailbox().waits().set_pid(self.members[r], self.pid(r));
            }
        }
        self.side_transport = Some(side.clone());
        let local = self.members.clone();
        self.side = Some(Arc::new(move || {
            let m = side.mailbox();
            if let Some((by, reason)) = m.aborted() {
                return Some(Error::aborted_by(by, &reason));
            }
            for &r in &world {
                if let Some(cause) = m.lost(r) {
                    if local.contains(&r) || !m.left(r) {
                        return Some(Error::PeerLost { rank: r, cause });
                    }
                }
            }
            None
        }));
    }

    /// What the point-to-point rings of [`super::hybrid`] need: the mappings (kept alive by the
    /// returned value too) and where the rings lie.
    pub(crate) fn ring_area(&self) -> RingArea {
        RingArea {
            maps: self.maps.clone(),
            base: self.ring_base,
            ring_bytes: self.ring_bytes,
            members: self.members.clone(),
            me: self.me,
            pids: (0..self.size()).map(|r| self.pid(r)).collect(),
            spin: self.ring_spin,
            crowded: self.crowded,
        }
    }

    /// Number of local ranks.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Bytes of one staging half.
    pub fn half_bytes(&self) -> usize {
        self.half
    }

    fn word(&self, r: usize, off: usize) -> &AtomicU32 {
        // SAFETY: off < HEADER, aligned; the mapping lives as long as self.
        unsafe { &*(self.maps[r].ptr.add(off) as *const AtomicU32) }
    }

    /// Start of local rank `r`'s staging half `h`.
    pub fn stage(&self, r: usize, h: usize) -> *mut u8 {
        // SAFETY: HEADER + h * half is inside the mapping for h < 2.
        unsafe { self.maps[r].ptr.add(HEADER + h * self.half) }
    }

    /// Take the next chunk number; its parity picks the staging half.
    pub fn next_chunk(&self) -> usize {
        (self.chunks.fetch_add(1, Ordering::Relaxed) & 1) as usize
    }

    /// The sequence word of rank `r`'s fingerprint slot for half `h` (8-aligned: the slots
    /// are 64-byte aligned in the header).
    fn fp_seq(&self, r: usize, h: usize) -> (&AtomicU64, *mut u8) {
        // SAFETY: inside the header of a mapping that lives as long as `self`.
        let base = unsafe { self.maps[r].ptr.add(OFF_FP + h * FP_SLOT) };
        (unsafe { &*(base as *const AtomicU64) }, base)
    }

    /// Publish the fingerprint and sequence number of the call now writing half `h`: the
    /// fingerprint first, then the number (release), so that a peer that reads this call's
    /// number reads this call's fingerprint, even while it polls before this rank arrives.
    pub fn put_fp(&self, h: usize, seq: u64, fp: &Fingerprint) {
        let (word, base) = self.fp_seq(self.me, h);
        let b = fp.encode();
        // SAFETY: inside the header; only this rank writes its own slots.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), base.add(8), FINGERPRINT_WIRE_LEN) };
        word.store(seq, Ordering::Release);
    }

    /// The (sequence, fingerprint) local rank `r` published for half `h`; no fingerprint
    /// while the slot is being rewritten (the number changed under the read).
    pub fn get_fp(&self, r: usize, h: usize) -> (u64, Option<Fingerprint>) {
        let (word, base) = self.fp_seq(r, h);
        let seq = word.load(Ordering::Acquire);
        let mut b = [0u8; FINGERPRINT_WIRE_LEN];
        // SAFETY: inside the header; a concurrent rewrite is detected below.
        unsafe { std::ptr::copy_nonoverlapping(base.add(8), b.as_mut_ptr(), FINGERPRINT_WIRE_LEN) };
        std::sync::atomic::fence(Ordering::Acquire);
        match word.load(Ordering::Relaxed) {
            again if again != seq => (again, None),
            _ => (seq, Fingerprint::decode(&b)),
        }
    }

    /// Announce that this rank has finished the current phase; returns the new epoch.
    pub fn arrive(&self) -> u32 {
        let e = self.epoch.load(Ordering::Relaxed).wrapping_add(1);
        self.epoch.store(e, Ordering::Relaxed);
        let w = self.word(self.me, OFF_ARRIVE);
        w.store(e, Ordering::SeqCst);
        if self.word(self.me, OFF_WAITERS).load(Ordering::SeqCst) > 0 {
            futex_wake(w);
        }
        e
    }

    /// Wait until every other local rank has arrived at `epoch`.
    pub fn wait_all(&self, epoch: u32, deadline: Instant) -> Result<(), ShmWaitError> {
        for r in 0..self.size() {
            if r != self.me {
                self.wait_for(r, epoch, deadline)?;
            }
        }
        Ok(())
    }

    /// Wait until local rank `r` has arrived at `epoch`.
    pub fn wait_for(&self, r: usize, epoch: u32, deadline: Instant) -> Result<(), ShmWaitError> {
        let w = self.word(r, OFF_ARRIVE);
        if reached(w.load(Ordering::Acquire), epoch) {
            return Ok(());
        }
        let start = Instant::now();
        let mut i = 0u32;
        // No spinning at all when crowded: a round of PAUSEs before the first clock check
        // costs about a microsecond, while the awaited peer may need this very core.
        while !self.spin.is_zero() {
            if reached(w.load(Ordering::Acquire), epoch) {
                return Ok(());
            }
            i = i.wrapping_add(1);
            if i & 63 == 0 && start.elapsed() >= self.spin {
                break;
            }
            std::hint::spin_loop();
        }
        // Yielding hands the core to a runnable peer (several ranks per core) without the cost
        // of a futex sleep and wake-up.
        while start.elapsed() < self.yields {
            if reached(w.load(Ordering::Acquire), epoch) {
                return Ok(());
            }
            std::thread::yield_now();
        }
        let waiters = self.word(r, OFF_WAITERS);
        loop {
            let v = w.load(Ordering::Acquire);
            if reached(v, epoch) {
                return Ok(());
            }
            if let Some(side) = &self.side {
                if let Some(e) = side() {
                    return Err(ShmWaitError::Side(e));
                }
            }
            if let Some(p) = &self.peers[r] {
                if !p.alive() {
                    return Err(ShmWaitError::Dead(r));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                let mut missing: Vec<usize> = (0..self.size())
                    .filter(|&q| {
                        q != self.me
                            && !reached(self.word(q, OFF_ARRIVE).load(Ordering::Acquire), epoch)
                    })
                    .collect();
                // The rank waited on may itself be waiting for the others (a centralized
                // barrier): name those.
                if missing.len() > 1 {
                    missing.retain(|&q| q != r);
                }
                return Err(ShmWaitError::Timeout(missing));
            }
            waiters.fetch_add(1, Ordering::SeqCst);
            let v = w.load(Ordering::SeqCst);
            if !reached(v, epoch) {
                futex_wait(w, v, (deadline - now).min(Duration::from_millis(10)));
            }
            waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// This rank's current (last published) epoch.
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// Record that peers may read this rank's half `h` until each has arrived at `epoch`.
    pub fn set_guard(&self, h: usize, epoch: u32) {
        self.guards[h].store(epoch as u64, Ordering::Relaxed);
    }

    /// Before writing half `h`: wait until every peer has finished reading what this rank
    /// last put there (usually long done, so a few loads).
    pub fn guard(&self, h: usize, deadline: Instant) -> Result<(), ShmWaitError> {
        let g = self.guards[h].load(Ordering::Relaxed);
        if g != u64::MAX {
            self.wait_all(g as u32, deadline)?;
            self.guards[h].store(u64::MAX, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Whether single-copy reads of peers' buffers (`process_vm_readv`) work in this group.
    pub fn cma(&self) -> bool {
        self.cma
    }

    /// Whether there are more local ranks than cores.
    pub fn crowded(&self) -> bool {
        self.crowded
    }

    /// Expose `len` bytes at `addr` of this process for peers' [`ShmGroup::read_region`].
    pub fn publish_region(&self, addr: *const u8, len: usize) {
        // SAFETY: inside our own header; published to peers by the next arrival.
        unsafe {
            let b = self.maps[self.me].ptr.add(OFF_REGION) as *mut u64;
            b.write_volatile(addr as u64);
            b.add(1).write_volatile(len as u64);
        }
    }

    /// Copy `len` bytes from offset `off` of the region local rank `r` published into `dst`.
    pub fn read_region(&self, r: usize, off: usize, dst: *mut u8, len: usize) -> Result<()> {
        // SAFETY: inside r's header; r wrote it before the arrival we waited for.
        let (addr, total) = unsafe {
            let b = self.maps[r].ptr.add(OFF_REGION) as *const u64;
            (b.read_volatile(), b.add(1).read_volatile() as usize)
        };
        if off + len > total {
            return Err(Error::Protocol(format!(
                "rank {} exposed {total} bytes; asked for {len} at {off}",
                self.members[r]
            )));
        }
        read_remote(self.pid(r), addr + off as u64, dst, len).map_err(|e| {
            if e.raw_os_error() == Some(libc::ESRCH) {
                Error::PeerLost {
                    rank: self.members[r],
                    cause: format!("process {} exited (seen reading its memory)", self.pid(r)),
                }
            } else {
                Error::io(
                    format!(
                        "reading rank {}'s buffer (process_vm_readv)",
                        self.members[r]
                    ),
                    e,
                )
            }
        })
    }

    /// The side channel (TCP transport), once [`ShmGroup::watch_mailbox`] set it.
    pub(crate) fn side_transport(&self) -> Option<&Arc<dyn Transport>> {
        self.side_transport.as_ref()
    }

    /// Pid of local rank `r` (0 for this rank).
    pub fn pid(&self, r: usize) -> i32 {
        self.peers[r].as_ref().map_or(0, |p| p.pid)
    }
}

/// The point-to-point ring area of every local segment: local rank `r`'s segment holds one ring
/// per local sender, at `base + sender * ring_bytes`.
#[derive(Clone)]
pub(crate) struct RingArea {
    maps: Arc<Vec<Mapping>>,
    base: usize,
    /// Bytes of one ring, control block included.
    pub(crate) ring_bytes: usize,
    /// World ranks of the local ranks; index = local rank.
    pub(crate) members: Vec<usize>,
    /// This process's local rank.
    pub(crate) me: usize,
    /// Pid of every local rank (0 for this one).
    pub(crate) pids: Vec<i32>,
    /// How long waits spin before sleeping.
    pub(crate) spin: Duration,
    /// More local ranks than cores.
    pub(crate) crowded: bool,
}

impl RingArea {
    /// Start of the ring in local rank `recv`'s segment that local rank `send` writes.
    pub(crate) fn ring(&self, recv: usize, send: usize) -> *mut u8 {
        // SAFETY: base + send * ring_bytes + ring_bytes <= the segment length for send < members.
        unsafe { self.maps[recv].ptr.add(self.base + send * self.ring_bytes) }
    }

    /// A header word of local rank `r`'s segment.
    pub(crate) fn word(&self, r: usize, off: usize) -> &AtomicU32 {
        // SAFETY: off < HEADER, aligned; the mapping lives as long as self.
        unsafe { &*(self.maps[r].ptr.add(off) as *const AtomicU32) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::{Condvar, Mutex};

    /// A directory in memory: what joining needs from the rendezvous store, without one.
    #[derive(Default)]
    struct MemoryDirectory {
        keys: Mutex<HashMap<String, Vec<u8>>>,
        changed: Condvar,
    }

    impl Directory for MemoryDirectory {
        fn put(&self, key: &str, value: &[u8]) -> Result<()> {
            self.keys.lock().unwrap().insert(key.into(), value.to_vec());
            self.changed.notify_all();
            Ok(())
        }

        fn get_all(&self, keys: &[String], timeout: Duration) -> Result<Vec<Vec<u8>>> {
            let all = |m: &HashMap<String, Vec<u8>>| keys.iter().all(|k| m.contains_key(k));
            let (m, _) = self
                .changed
                .wait_timeout_while(self.keys.lock().unwrap(), timeout, |m| !all(m))
                .unwrap();
            if !all(&m) {
                return Err(Error::Store(format!("{keys:?} not all published")));
            }
            Ok(keys.iter().map(|k| m[k].clone()).collect())
        }

        fn wait_all(&self, keys: &[String], timeout: Duration) -> Result<()> {
            self.get_all(keys, timeout).map(drop)
        }
    }

    #[test]
    fn ranks_of_one_host_join_through_any_directory() {
        let dir = MemoryDirectory::default();
        // Ranks 0 and 2 share a host; rank 1 is elsewhere and stays out.
        let hosts: Vec<String> = ["a", "b", "a"].iter().map(|h| h.to_string()).collect();
        let t = Duration::from_secs(10);
        let groups: Vec<Option<ShmGroup>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    let (dir, hosts) = (&dir, &hosts);
                    s.spawn(move || ShmGroup::join(dir, r, hosts, t).unwrap())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(groups[1].is_none(), "alone on its host");
        for (r, me) in [(0, 0), (2, 1)] {
            let g = groups[r].as_ref().unwrap();
            assert_eq!((g.members.clone(), g.me), (vec![0, 2], me));
            assert_eq!(g.half_bytes(), crate::config::get().shm_half_bytes);
        }
        let err = ShmGroup::join(&MemoryDirectory::default(), 0, &hosts, Duration::ZERO);
        assert!(err.is_err(), "a peer that never publishes fails the join");
    }
}
