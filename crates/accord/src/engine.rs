//! Host engines: what runs a checked collective on host memory.
//!
//! A communicator holds an ordered list of engines and gives each call to the first that
//! [`HostEngine::supports`] it; what none supports runs as a schedule over the transport (see
//! `comm::host`), the engine every communicator has. Today's list, when the world was
//! bootstrapped with shared memory: [`crate::shm_coll::ShmWorld`] for worlds on one host, or
//! the hierarchy (shared memory inside each host, the host leaders or stripes over TCP) for
//! worlds across hosts. Device buffers have their own engines ([`crate::gpu`]).

use crate::error::Result;
use crate::op::{Call, Op};

/// An engine for collectives on host memory.
pub(crate) trait HostEngine: Send + Sync {
    /// How `ACCORD_EXPLAIN` names it.
    fn name(&self) -> &'static str;

    /// Whether it runs `op`. Every rank must answer the same for the same call: the answer may
    /// depend only on what the ranks agree on (the op's fingerprint and shape, the placement).
    fn supports(&self, op: &Op) -> bool;

    /// Run `op` as `call`. `input == None` is in place (the output holds the input). Buffers
    /// have exactly the lengths the op needs on this rank.
    fn run(&self, call: &Call<'_>, op: &Op, input: Option<&[u8]>, output: &mut [u8]) -> Result<()>;
}
