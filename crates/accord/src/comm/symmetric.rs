//! The symmetric heap of a communicator (see [`crate::gpu::symm`]).
//!
//! The heap needs a GPU per rank but no device engine: ranks sharing one GPU (which NCCL
//! refuses) can use it too. It uses the attached device, or the one named with
//! [`Communicator::alloc_symmetric_on`]; the first call fixes it for the communicator.

use super::*;
use crate::gpu::symm::{LocalGroup, MemoryChannels, SymmetricBuffer};

impl Communicator {
    /// `bytes` on this rank's GPU that every rank of this host maps (collective: every rank asks
    /// for the same size), on the attached device ([`Communicator::attach_device`]).
    pub fn alloc_symmetric(&self, bytes: usize) -> Result<SymmetricBuffer> {
        let device = self.attached_device().ok_or_else(|| {
            Error::invalid(
                "alloc_symmetric needs a GPU: attach one (attach_device) or name it with \
                 alloc_symmetric_on(device, bytes)",
            )
        })?;
        self.alloc_symmetric_on(device, bytes)
    }

    /// [`Communicator::alloc_symmetric`] on GPU `device` (this process's ordinal), with or
    /// without a device engine attached.
    pub fn alloc_symmetric_on(&self, device: usize, bytes: usize) -> Result<SymmetricBuffer> {
        self.local_group(device)?.alloc(bytes)
    }

    /// The ranks whose symmetric buffers this rank maps: those of its host, itself included.
    /// `None` before the first allocation.
    pub fn symmetric_peers(&self) -> Option<Vec<usize>> {
        let slot = self
            .inner
            .symmetric
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        slot.as_ref().map(|g| g.peers().to_vec())
    }

    /// Channels from `buf` to the same buffer on every peer of this host, for kernels
    /// (collective).
    pub fn memory_channels(&self, buf: &SymmetricBuffer) -> Result<MemoryChannels> {
        MemoryChannels::new(buf)
    }

    fn local_group(&self, device: usize) -> Result<Arc<LocalGroup>> {
        self.host_only("alloc_symmetric")?;
        let mut slot = self
            .inner
            .symmetric
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(g) = slot.as_ref() {
            return match g.device() == device {
                true => Ok(g.clone()),
                false => Err(Error::invalid(format!(
                    "this communicator's symmetric heap is on GPU {}; it cannot also use GPU \
                     {device}",
                    g.device()
                ))),
            };
        }
        let cu = crate::gpu::cuda::driver()?;
        let ctx = cu.primary_context(device)?;
        // Weak: the communicator holds the group.
        let link: Arc<dyn crate::gpu::HostLink> =
            Arc::new(super::device::AttachedHost(Arc::downgrade(&self.inner)));
        let name = crate::gpu::HostLink::heap_name(self);
        let g = LocalGroup::join(link, (cu, ctx as usize), device, &name)?;
        *slot = Some(g.clone());
        Ok(g)
    }
}
