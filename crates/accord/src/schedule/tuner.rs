//! Algorithm selection from a cost model.

use super::{algorithms, Algorithm, Collective};

/// Latency/bandwidth model of a transport.
#[derive(Debug, Clone, Copy)]
pub struct CostModel {
    /// Per-message latency.
    pub alpha_us: f64,
    /// Per-byte transfer time.
    pub beta_us_per_byte: f64,
    /// Per-byte reduction time.
    pub gamma_us_per_byte: f64,
}

impl CostModel {
    /// TCP preset.
    pub fn tcp() -> Self {
        CostModel {
            alpha_us: 30.0,
            beta_us_per_byte: 1e-3,
            gamma_us_per_byte: 2e-4,
        }
    }
    /// Shared-memory preset.
    pub fn shm() -> Self {
        Self::tcp()
    }
    /// In-process preset.
    pub fn inproc() -> Self {
        Self::tcp()
    }
}

/// Pick the algorithm for `coll`.
pub fn select(coll: &Collective, _world: usize, _elem_size: usize, _m: &CostModel) -> Algorithm {
    algorithms::applicable(coll)
        .first()
        .copied()
        .unwrap_or(Algorithm::Direct)
}

/// Cost table.
pub fn explain(coll: &Collective, world: usize, elem_size: usize, m: &CostModel) -> String {
    format!("{}", select(coll, world, elem_size, m))
}
