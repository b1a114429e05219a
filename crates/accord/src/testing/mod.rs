//! Helpers for tests and examples: run a world of ranks as threads of this process, and
//! [`conformance`], the suite every engine's tests run against a sequential reference.
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

pub mod conformance;

use crate::auth::Token;
use crate::transport::inproc::InProcess;
use crate::transport::tcp::{MemoryAddressBook, TcpOptions, TcpTransport};
use crate::transport::Transport;
use crate::Communicator;
use std::sync::Arc;
use std::time::Duration;

/// Repetition multiplier of randomized and fault tests: `ACCORD_SOAK=<n>` (at least 1; 1 when
/// unset), for a longer run than CI's.
pub fn soak() -> usize {
    crate::config::get().soak
}

/// How many collectives this process enqueued on Accord's own GPU kernels (not NCCL): tests
/// under `ACCORD_GPU_ENGINE=auto` tell which engine ran a call by whether this grew.
pub fn gpu_kernel_calls() -> u64 {
    crate::gpu::own::calls()
}

/// How many calls of Accord's GPU kernels in this process took this rank's input or output
/// zero-copy (an array of the symmetric heap, which peers read where it lies); tests check that
/// zero-copy happened.
pub fn gpu_zero_copy_calls() -> u64 {
    crate::gpu::own::zero_copy_calls()
}

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
    let transports = InProcess::world(n)
        .into_iter()
        .map(|t| t as Arc<dyn Transport>)
        .collect();
    run_world_on(transports, timeout, f)
}

/// Like [`run_world_with_timeout`] over TCP on loopback: every rank has its own
/// [`TcpTransport`], connected through an in-memory address book.
pub fn run_tcp_world<R: Send>(
    n: usize,
    timeout: Duration,
    f: impl Fn(Communicator) -> R + Sync,
) -> Vec<R> {
    run_tcp_world_with_lanes(n, 1, timeout, f)
}

/// [`run_tcp_world`] with `lanes` connections per pair of ranks (see [`TcpOptions::lanes`]).
pub fn run_tcp_world_with_lanes<R: Send>(
    n: usize,
    lanes: usize,
    timeout: Duration,
    f: impl Fn(Communicator) -> R + Sync,
) -> Vec<R> {
    let book = Arc::new(MemoryAddressBook::new());
    let token = Token::new("testing");
    let transports = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (book, token) = (book.clone(), token.clone());
                s.spawn(move || {
                    let opts = TcpOptions {
                        lanes,
                        ..TcpOptions::loopback(Duration::from_secs(30))
                    };
                    TcpTransport::connect(rank, n, &token, &*book, opts).expect("TCP world")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap() as Arc<dyn Transport>)
            .collect()
    });
    run_world_on(transports, timeout, f)
}

/// Run `f` on one thread per transport, each with a communicator over it.
pub fn run_world_on<R: Send>(
    transports: Vec<Arc<dyn Transport>>,
    timeout: Duration,
    f: impl Fn(Communicator) -> R + Sync,
) -> Vec<R> {
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
