//! The host communicator's side of the GPU seam: it is the [`HostLink`] GPU communicators are
//! bootstrapped through and watch their peers with.

use super::Communicator;
use crate::error::{Error, Result};
use crate::gpu::HostLink;
use crate::rendezvous::StoreClient;

use std::time::Duration;

/// The host link of a device engine attached to a communicator: it holds the communicator
/// weakly, since the communicator holds the engine (a strong link would keep both alive
/// forever). Once the communicator is gone, the link answers as a host that failed.
pub(super) struct AttachedHost(pub(super) std::sync::Weak<super::Inner>);

impl AttachedHost {
    fn host(&self) -> Result<Communicator> {
        let inner = self.0.upgrade().ok_or_else(|| {
            Error::invalid("the communicator this device engine was attached to is gone")
        })?;
        Ok(Communicator {
            inner,
            reserved: None,
        })
    }
}

impl HostLink for AttachedHost {
    fn rank(&self) -> usize {
        self.host().map_or(0, |h| h.rank())
    }

    fn size(&self) -> usize {
        self.host().map_or(0, |h| h.size())
    }

    fn timeout(&self) -> Duration {
        self.host()
            .map_or(crate::comm::DEFAULT_TIMEOUT, |h| h.timeout())
    }

    fn all_gather_i64(&self, mine: &[i64]) -> Result<Vec<i64>> {
        HostLink::all_gather_i64(&self.host()?, mine)
    }

    fn broadcast_bytes(&self, buf: &mut [u8], root: usize) -> Result<()> {
        HostLink::broadcast_bytes(&self.host()?, buf, root)
    }

    fn store(&self, prefix: &str) -> Option<StoreClient> {
        HostLink::store(&self.host().ok()?, prefix)
    }

    fn heap_name(&self) -> String {
        self.host().map(|h| h.heap_name()).unwrap_or_default()
    }

    fn members_failure(&self, members: &[usize]) -> Option<Error> {
        match self.host() {
            Ok(h) => h.members_failure(members),
            Err(e) => Some(e),
        }
    }
}

impl HostLink for Communicator {
    fn rank(&self) -> usize {
        Communicator::rank(self)
    }

    fn size(&self) -> usize {
        Communicator::size(self)
    }

    fn timeout(&self) -> Duration {
        Communicator::timeout(self)
    }

    fn all_gather_i64(&self, mine: &[i64]) -> Result<Vec<i64>> {
        let mut all = vec![0i64; mine.len() * Communicator::size(self)];
        self.all_gather(mine, &mut all)?;
        Ok(all)
    }

    fn broadcast_bytes(&self, buf: &mut [u8], root: usize) -> Result<()> {
        self.broadcast(buf, root)?.wait()
    }

    fn store(&self, prefix: &str) -> Option<StoreClient> {
        Communicator::store(self).map(|s| s.with_prefix(prefix))
    }

    fn heap_name(&self) -> String {
        format!("{}/{:x}", self.name(), self.inner.id)
    }

    fn members_failure(&self, members: &[usize]) -> Option<Error> {
        Communicator::members_failure(self, members)
    }
}
