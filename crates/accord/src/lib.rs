//! # Accord
//!
//! Collective communication for distributed CPUs and GPUs: point-to-point messages and every
//! collective (broadcast, reduce, allreduce, allgather(v), gather(v), scatter(v),
//! reduce_scatter(v), alltoall(v), barrier) behind one [`Communicator`], with deadlines on every
//! wait and errors that name the rank that is missing and why.
//!
//! ## Quick example
//!
//! Ranks are usually processes started by `accord run -n 4 ./my_program` (or torchrun, mpirun,
//! Slurm), each calling [`init`]. For tests and examples, [`testing::run_world`] runs ranks as
//! threads of one process:
//!
//! ```
//! use accord::{testing::run_world, ReduceOp};
//!
//! let results = run_world(3, |comm| {
//!     // Every rank contributes its rank number; everyone gets the sum.
//!     let mut grad = vec![comm.rank() as f32; 4];
//!     comm.all_reduce(&mut grad, ReduceOp::Sum).unwrap();
//!
//!     // Rank 0 gathers one value from everyone.
//!     let mut all = vec![0u32; if comm.rank() == 0 { 3 } else { 0 }];
//!     comm.gather(&[comm.rank() as u32 * 10], &mut all, 0).unwrap();
//!     (grad[0], all)
//! });
//! assert_eq!(results[0], (3.0, vec![0, 10, 20]));
//! assert_eq!(results[2], (3.0, vec![]));
//! ```
//!
//! ## Design
//!
//! One collective call on host memory travels through these layers:
//!
//! 1. **[`Communicator`]** validates the buffers and stamps the call with its
//!    [`fingerprint::Fingerprint`] (operation, dtype, count, root, reduce op) and a sequence number.
//! 2. Ranks of one host run the common collectives on **shared staging memory**
//!    ([`shm_coll`]: every rank reduces its slice reading its peers' data directly, barriers on
//!    shared counters, fingerprints compared in shared memory); across hosts allreduce and
//!    broadcast are hierarchical (shared memory inside a host, the host leaders over TCP).
//! 3. Everything else follows a **schedule**: [`schedule::tuner`] picks an algorithm from a
//!    latency/bandwidth cost model (`ACCORD_ALGO_<OP>=name` overrides it; `accord bench
//!    --explain` prints the table), and [`schedule`] turns (collective, world, rank, algorithm)
//!    into a [`schedule::Schedule`]: plain data — rounds of send / receive / receive-and-reduce /
//!    copy steps over element ranges. Schedules are cached, and [`schedule::check`] proves each
//!    algorithm correct symbolically for every world size up to 16 and uneven counts.
//! 4. **The executor** runs a schedule on a transport, reducing chunks as they arrive.
//! 5. **[`transport`]** moves bytes: [`transport::inproc`] (threads of one process, used by most
//!    tests), [`transport::tcp`] (a full mesh of authenticated connections), and
//!    [`transport::hybrid`] (shared-memory rings, [`transport::shm`], to ranks of the same host;
//!    TCP to the others, also for abort notices and liveness). Frames land in a
//!    [`transport::Mailbox`], which bounds what a peer may leave there untaken.
//!
//! Device memory goes through [`gpu::GpuCommunicator`]: NCCL, loaded at run time, bootstrapped
//! over a host communicator, with a watchdog that aborts NCCL on a timeout, an asynchronous
//! error, a desync between ranks' calls or a peer the host communicator saw die.
//!
//! Every frame carries the call's fingerprint, so ranks that disagree about what they are doing
//! get an [`Error::Desync`] naming both calls instead of wrong data; rooted operations begin
//! with a zero-byte agreement so that a rank that wrongly believes it is the root hears it too.
//! Point-to-point messages with one (peer, tag) keep their order ([`Turn`]). Every wait has a deadline
//! (300 s by default, `ACCORD_TIMEOUT` or [`Communicator::set_timeout`]); a timeout names the
//! rank that stalls the call, following what the ranks it waited for are blocked on in turn
//! ([`blame`]). A lost connection fails the calls waiting on it at once, and any failure
//! is broadcast to the peers so that nobody waits for a rank that has given up.
//!
//! ## Bootstrapping
//!
//! [`init`] reads the environment (`env://`): Accord's own `ACCORD_*` variables set by
//! `accord run`, torchrun's `RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`, OpenMPI's
//! `OMPI_COMM_WORLD_*`, PMI and Slurm. [`init_with`] takes `tcp://host:port` or `file:///path`.
//! Ranks meet through a small key-value store ([`rendezvous`]) and prove knowledge of a shared
//! token ([`auth`]) on every connection.
#![warn(missing_docs)]

mod atomic_duration;
pub mod auth;
mod blame;
mod bootstrap;
pub mod buffer;
pub mod comm;
pub mod config;
pub mod dtype;
mod engine;
pub mod error;
mod exec;
pub mod fingerprint;
pub mod gpu;
pub mod op;
mod p2p_order;
pub mod rendezvous;
pub mod schedule;
mod shm_coll;
pub mod testing;
pub mod transport;

pub use bootstrap::{from_rendezvous, init, init_with, init_with_timeout};
pub use buffer::{AsInOut, AsRecv, AsSend, Memory, Parts, RecvBuf, SendBuf};
pub use comm::{Communicator, Completion, Request};
pub use config::Config;
pub use dtype::{DataType, Element, ReduceOp};
pub use error::{Error, Result};
pub use p2p_order::Turn;
pub use shm_coll::copy_streaming;
