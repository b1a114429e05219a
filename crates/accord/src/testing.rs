//! Helpers for tests and examples: run a world of ranks as threads of this process.
//!
//! ```
//! use accord::{testing::run_world, ReduceOp};
//! let sums = run_world(4, |comm| {
//!     let mut v = [comm.rank() as f32; 3];
//!     comm.all_reduce(&mut v, ReduceOp::Sum).unwrap();
//!     v[0]
//! });
//! assert_eq!(sums, vec![6.0; 4]);
//! ```

use crate::transport::inproc::InProcess;
use crate::Communicator;
use std::time::Duration;

/// Run `f` on `n` ranks (threads) over the in-process transport and collect the results in rank
/// order. Panics in any rank propagate.
pub fn run_world<R: Send>(n: usize, f: impl Fn(Communicator) -> R + Sync) -> Vec<R> {
    run_world_with_timeout(n, Duration::from_secs(60), f)
}

/// Like [`run_world`] with a given per-call timeout.
pub fn run_world_with_timeout<R: Send>(
    n: usize,
    timeout: Duration,
    f: impl Fn(Communicator) -> R + Sync,
) -> Vec<R> {
    let transports = InProcess::world(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = transports
            .into_iter()
            .map(|t| {
                let f = &f;
                s.spawn(move || {
                    let comm = Communicator::new(t);
                    comm.set_timeout(timeout);
                    f(comm)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}
