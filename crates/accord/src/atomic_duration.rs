//! A duration several threads read and any may change (a communicator's timeout).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A [`Duration`] stored as nanoseconds in an atomic; durations past ~584 years saturate.
#[derive(Debug)]
pub(crate) struct AtomicDuration(AtomicU64);

impl AtomicDuration {
    pub(crate) fn new(d: Duration) -> Self {
        AtomicDuration(AtomicU64::new(Self::nanos(d)))
    }

    pub(crate) fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    pub(crate) fn set(&self, d: Duration) {
        self.0.store(Self::nanos(d), Ordering::Relaxed);
    }

    fn nanos(d: Duration) -> u64 {
        d.as_nanos().min(u64::MAX as u128) as u64
    }
}
