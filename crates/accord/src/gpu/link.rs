//! What the GPU layer needs from the host communicator that bootstraps it.
//!
//! The GPU layer does not know the host communicator's type: it meets the other processes,
//! reaches the rendezvous store and learns that a process is gone through this trait, which the
//! host communicator implements (`comm/device.rs`).

use crate::error::{Error, Result};
use crate::rendezvous::StoreClient;
use std::time::Duration;

/// The host side of a GPU communicator: collective exchange of small values, the store, and
/// liveness of the other processes. Ranks here are host ranks (one per process).
pub(crate) trait HostLink: Send + Sync {
    /// This process's host rank.
    fn rank(&self) -> usize;

    /// Number of processes.
    fn size(&self) -> usize;

    /// The host communicator's deadline for blocking calls (initialisation uses it too).
    fn timeout(&self) -> Duration;

    /// Every process's `mine` (all the same length), concatenated in rank order. Collective.
    fn all_gather_i64(&self, mine: &[i64]) -> Result<Vec<i64>>;

    /// `root`'s `buf` into every process's `buf`. Collective.
    fn broadcast_bytes(&self, buf: &mut [u8], root: usize) -> Result<()>;

    /// The rendezvous store under `prefix`, if the host was bootstrapped through one.
    fn store(&self, prefix: &str) -> Option<StoreClient>;

    /// The name of the communicator's symmetric heap (unique in this process), through which
    /// Accord's kernels recognise the heap's arrays.
    fn heap_name(&self) -> String;

    /// Without waiting: a world abort, or a lost connection to one of `members` (host ranks),
    /// as the host already knows it.
    fn members_failure(&self, members: &[usize]) -> Option<Error>;
}
