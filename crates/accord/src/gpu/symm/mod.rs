//! The symmetric heap: device buffers every rank of a host maps, so kernels read and write a
//! peer's buffer directly (what PyTorch's SymmetricMemory and nvmath-python's symmetric heap
//! give), and the channels kernels use over them.
//!
//! [`crate::Communicator::alloc_symmetric`] is collective over the communicator. Every rank asks
//! for the same size (a mismatch is an error naming every rank's size, on every rank, before
//! anything is allocated); the size is rounded up to the allocation granularity. Each rank
//! allocates on its own GPU and maps the buffers of the ranks on its host
//! ([`SymmetricBuffer::peers`]); ranks on other hosts take part in the size check only.
//!
//! How memory crosses processes (`alloc`): the driver's virtual memory management
//! (`cuMemCreate` with a POSIX file-descriptor handle, exported, passed over a Unix socket with
//! `SCM_RIGHTS` and imported by each peer) where every rank's device supports it, else CUDA IPC
//! handles (`ACCORD_SYMMETRIC=ipc` forces them). The sockets (`fdpass`) connect each pair of
//! ranks of a host once per communicator, authenticated with the job's token. A driver without
//! the calls makes the feature fail with [`Error::Unsupported`] saying why; nothing else is
//! affected.
//!
//! [`SymmetricBuffer::free`] is collective too: peers unmap first, then every rank meets, then
//! each releases its own memory, so no rank frees memory a peer still uses. Dropping a buffer
//! without freeing it releases this rank's mappings without meeting the others (fine for VMM
//! memory, which lives until its last mapping goes; IPC memory should be freed).
//!
//! `registry`: every buffer of the heap is also registered (its number, the same on every rank,
//! and every rank's mapping) in a table on each device engine of the communicator, so Accord's
//! own collectives take arrays of the heap zero-copy: peers read them where they lie.
//!
//! `channels`: [`MemoryChannels`] over a symmetric buffer, the device handles of
//! `<accord/channel.cuh>` (one `accord::MemoryChannel` per rank). Beside the buffer they own a
//! small symmetric region per rank: a counter of each peer's signals (peers increment it
//! through their mapping), a count of the waits done on each peer, and an error word where a
//! kernel's wait that ran out of time records the peer that never signalled;
//! [`MemoryChannels::check`] turns that record into [`Error::Timeout`] naming the peer.

mod alloc;
mod channels;
mod fdpass;
pub(crate) mod registry;

pub use channels::MemoryChannels;

use crate::error::{Error, Result};
use crate::gpu::cuda::{CuContext, CuDevicePtr, CuIpcMemHandle, Driver};
use crate::gpu::link::HostLink;
use alloc::Sharing;
use fdpass::{LocalMesh, PAYLOAD};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The ranks of this host, connected for passing memory, of one communicator.
pub(crate) struct LocalGroup {
    link: Arc<dyn HostLink>,
    cu: &'static Driver,
    ctx: usize,
    ordinal: usize,
    me: usize,
    size: usize,
    /// Ranks of this host, this one included, ascending.
    local: Vec<usize>,
    mesh: LocalMesh,
    /// Steps taken over the mesh: every rank of the host counts the same.
    step: AtomicU64,
    comm: String,
    /// Why VMM sharing is unavailable on this rank, if it is.
    no_vmm: Option<String>,
}

impl LocalGroup {
    /// Connect the ranks of each host of `link`'s communicator. Collective over it.
    pub(crate) fn join(
        link: Arc<dyn HostLink>,
        (cu, ctx): (&'static Driver, usize),
        ordinal: usize,
        comm: &str,
    ) -> Result<Arc<LocalGroup>> {
        let (me, size, timeout) = (link.rank(), link.size(), link.timeout());
        let hosts = link.all_gather_i64(&[host_id()])?;
        let local: Vec<usize> = (0..size).filter(|&r| hosts[r] == hosts[me]).collect();
        let store = link.store("symm").ok_or_else(|| {
            alloc::unsupported("the communicator has no rendezvous store to meet its local ranks")
        })?;
        let token = store.token().clone();
        let mesh = LocalMesh::connect(me, &local, &store, comm, &token, timeout, comm)?;
        let forced = crate::config::get().symmetric_ipc;
        let no_vmm = match forced {
            true => Some("ACCORD_SYMMETRIC=ipc".to_string()),
            false => alloc::vmm_unsupported(cu, ordinal),
        };
        Ok(Arc::new(LocalGroup {
            link,
            cu,
            ctx,
            ordinal,
            me,
            size,
            local,
            mesh,
            step: AtomicU64::new(0),
            comm: comm.to_string(),
            no_vmm,
        }))
    }

    /// The ranks whose buffers this rank maps: those of its host, itself included.
    pub(crate) fn peers(&self) -> &[usize] {
        &self.local
    }

    fn current(&self) -> Result<()> {
        self.cu.make_current(self.ctx as CuContext)
    }

    /// Allocate `bytes` on every rank and map the buffers of this host's ranks. Collective.
    pub(crate) fn alloc(self: &Arc<Self>, bytes: usize) -> Result<SymmetricBuffer> {
        // Sizes and sharing modes first: a mismatch fails every rank before any allocation.
        let ipc_only = i64::from(self.no_vmm.is_some());
        let all = self.link.all_gather_i64(&[bytes as i64, ipc_only])?;
        let sizes: Vec<i64> = all.chunks(2).map(|c| c[0]).collect();
        if sizes.iter().any(|&s| s != sizes[0]) {
            let each: Vec<String> = sizes
                .iter()
                .enumerate()
                .map(|(r, s)| format!("rank {r} asked for {s}"))
                .collect();
            return Err(Error::invalid(format!(
                "alloc_symmetric: every rank must ask for the same size, but {} bytes",
                each.join(", ")
            )));
        }
        let sharing = match all.chunks(2).any(|c| c[1] != 0) {
            true => Sharing::Ipc,
            false => Sharing::Vmm,
        };
        self.current()?;
        let len = match sharing {
            Sharing::Vmm => alloc::rounded(self.cu, self.ordinal, bytes)?,
            // cuMemAlloc rounds internally; keep 2 MiB steps so sizes match VMM's.
            Sharing::Ipc => bytes.max(1).div_ceil(2 << 20) * (2 << 20),
        };
        let step = self.step.fetch_add(1, Ordering::Relaxed);
        let mut payload = [0u8; PAYLOAD];
        payload[..8].copy_from_slice(&(len as u64).to_le_bytes());
        let (ptr, received) = match sharing {
            Sharing::Vmm => {
                let (ptr, fd) = alloc::create(self.cu, self.ordinal, len)?;
                let got = self
                    .mesh
                    .exchange(step, &payload, Some(&fd), self.link.timeout());
                (ptr, got.inspect_err(|_| alloc::unmap(self.cu, ptr, len)))
            }
            Sharing::Ipc => {
                let (ptr, h) = alloc::ipc_create(self.cu, len)?;
                payload[8..72].copy_from_slice(&h.reserved);
                let got = self
                    .mesh
                    .exchange(step, &payload, None, self.link.timeout());
                (ptr, got.inspect_err(|_| alloc::ipc_free(self.cu, ptr)))
            }
        };
        let mut buf = SymmetricBuffer {
            group: self.clone(),
            ptr,
            len,
            requested: bytes,
            sharing,
            peers: BTreeMap::new(),
            freed: false,
        };
        for (r, msg) in received? {
            let theirs = u64::from_le_bytes(msg.payload[..8].try_into().expect("8 bytes"));
            if theirs != len as u64 {
                return Err(Error::invalid(format!(
                    "alloc_symmetric: local rank {r} allocated {theirs} bytes, this rank {len}"
                )));
            }
            let p = match sharing {
                Sharing::Vmm => {
                    let fd = msg.fd.ok_or_else(|| {
                        Error::Protocol(format!("local rank {r} sent no descriptor"))
                    })?;
                    alloc::import(self.cu, self.ordinal, fd, len)?
                }
                Sharing::Ipc => {
                    let mut h = CuIpcMemHandle { reserved: [0; 64] };
                    h.reserved.copy_from_slice(&msg.payload[8..72]);
                    alloc::ipc_open(self.cu, h)?
                }
            };
            buf.peers.insert(r, p);
        }
        if self.size <= registry::RANKS {
            let mut bases = [0u64; registry::RANKS];
            for &r in &self.local {
                bases[r] = buf.peer_ptr(r).unwrap_or(0);
            }
            registry::add(&self.comm, step, ptr, len, bases);
        }
        Ok(buf)
    }
}

/// A buffer of the symmetric heap: this rank's memory and the mapping of every peer's on this
/// host. See the [module docs](self).
pub struct SymmetricBuffer {
    group: Arc<LocalGroup>,
    ptr: CuDevicePtr,
    len: usize,
    requested: usize,
    sharing: Sharing,
    /// Peer rank -> its buffer as mapped here.
    peers: BTreeMap<usize, CuDevicePtr>,
    freed: bool,
}

impl std::fmt::Debug for SymmetricBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("sharing", &self.sharing)
            .field("peers", &self.peers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl SymmetricBuffer {
    /// This rank's buffer (a device pointer on [`SymmetricBuffer::device`]).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Its length in bytes: the size asked for, rounded up to the allocation granularity.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes (never: allocations are at least one granule).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size every rank asked for.
    pub fn requested(&self) -> usize {
        self.requested
    }

    /// The GPU ordinal the buffer lives on.
    pub fn device(&self) -> usize {
        self.group.ordinal
    }

    /// Rank `rank`'s buffer as mapped in this process (this rank's own for `rank == self`);
    /// `None` for a rank of another host.
    pub fn peer_ptr(&self, rank: usize) -> Option<u64> {
        match rank == self.group.me {
            true => Some(self.ptr),
            false => self.peers.get(&rank).copied(),
        }
    }

    /// The ranks whose buffers are mapped here (this host's, this rank included).
    pub fn peers(&self) -> &[usize] {
        self.group.peers()
    }

    /// Whether memory crosses processes as VMM file descriptors (`"vmm"`) or IPC handles
    /// (`"ipc"`).
    pub fn sharing(&self) -> &'static str {
        match self.sharing {
            Sharing::Vmm => "vmm",
            Sharing::Ipc => "ipc",
        }
    }

    pub(crate) fn group(&self) -> &Arc<LocalGroup> {
        &self.group
    }

    /// Free the buffer on every rank (collective): peers' mappings go first, then the ranks
    /// meet, then each releases its own memory.
    pub fn free(mut self) -> Result<()> {
        self.release_peers();
        let met = self.group.link.all_gather_i64(&[self.len as i64]);
        self.release_own();
        met.map(|_| ())
    }

    fn release_peers(&mut self) {
        // Out of the kernels' tables before any mapping goes.
        registry::remove(self.ptr);
        let g = &self.group;
        if g.current().is_err() {
            return;
        }
        for (_, p) in std::mem::take(&mut self.peers) {
            match self.sharing {
                Sharing::Vmm => alloc::unmap(g.cu, p, self.len),
                Sharing::Ipc => alloc::ipc_close(g.cu, p),
            }
        }
    }

    fn release_own(&mut self) {
        if std::mem::replace(&mut self.freed, true) {
            return;
        }
        let g = &self.group;
        if g.current().is_err() {
            return;
        }
        match self.sharing {
            Sharing::Vmm => alloc::unmap(g.cu, self.ptr, self.len),
            Sharing::Ipc => alloc::ipc_free(g.cu, self.ptr),
        }
    }
}

/// Released without meeting the others (see the [module docs](self)).
impl Drop for SymmetricBuffer {
    fn drop(&mut self) {
        self.release_peers();
        self.release_own();
    }
}

/// This host, as a number every process on it computes alike: its name and boot id.
/// `ACCORD_HOST_ID` overrides it, as it does for shared memory.
pub(crate) fn host_id() -> i64 {
    if let Some(id) = &crate::config::get().host_id {
        return fnv(id.bytes());
    }
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    fnv(name.trim().bytes().chain([0]).chain(boot.trim().bytes()))
}

fn fnv(bytes: impl Iterator<Item = u8>) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

impl LocalGroup {
    pub(crate) fn rank(&self) -> usize {
        self.me
    }

    pub(crate) fn device(&self) -> usize {
        self.ordinal
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    pub(crate) fn driver(&self) -> (&'static Driver, usize) {
        (self.cu, self.ctx)
    }

    pub(crate) fn comm(&self) -> &str {
        &self.comm
    }

    pub(crate) fn link(&self) -> &Arc<dyn HostLink> {
        &self.link
    }
}
