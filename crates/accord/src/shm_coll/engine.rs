//! The shared-memory world as a host engine (see [`crate::engine`]).

use super::*;
use crate::engine::HostEngine;

/// Collectives of a world on one host, over its shared-memory group.
impl HostEngine for ShmWorld {
    fn name(&self) -> &'static str {
        "shared memory"
    }

    fn supports(&self, op: &Op) -> bool {
        self.supports(&op.coll, &op.fp)
    }

    fn run(&self, call: &Call<'_>, op: &Op, input: Option<&[u8]>, output: &mut [u8]) -> Result<()> {
        ShmWorld::run(self, call, &op.coll, input, output)
    }
}
