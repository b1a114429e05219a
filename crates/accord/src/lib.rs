//! # Accord
//!
//! Collective communication for distributed CPUs and GPUs: point-to-point messages and every
//! collective (broadcast, reduce, allreduce, allgather(v), gather(v), scatter(v),
//! reduce_scatter(v), alltoall(v), scan, exscan, barrier) on host and device memory, in every
//! element type of [`DataType`] (the real numeric types, `bool` and complex), behind one
//! [`Communicator`], with a deadline on every wait and errors that name the rank that is missing
//! and why.
//!
//! This page is the manual: it follows one call through every layer, then lists the
//! transports, the engines, the GPU path, the bootstraps and the environment.
//!
//! ## Quick example
//!
//! Ranks are usually processes started by `accord run -n 4 ./my_program` (or torchrun, mpirun,
//! Slurm), each calling [`init`]. For tests and examples, [`testing::run_world`] runs ranks as
//! threads of one process:
//!
//! ```
//! use accord::{testing::run_world, Parts, ReduceOp};
//!
//! let results = run_world(3, |comm| {
//!     // Every rank contributes its rank number; everyone gets the sum (in place).
//!     let mut grad = vec![comm.rank() as f32; 4];
//!     comm.all_reduce(&mut grad, ReduceOp::Sum).unwrap();
//!
//!     // Out of place: a (send, recv) pair.
//!     let mut max = vec![0.0f32; 4];
//!     comm.all_reduce((&grad, &mut max), ReduceOp::Max).unwrap();
//!
//!     // Rank 0 gathers one value from everyone; rank i sends i + 1 values in the v variant.
//!     let mut all = vec![0u32; if comm.rank() == 0 { 3 } else { 0 }];
//!     comm.gather(&[comm.rank() as u32 * 10], &mut all, 0).unwrap();
//!     let mine = vec![comm.rank() as u8; comm.rank() + 1];
//!     let mut blocks = vec![0u8; 6];
//!     comm.all_gather(&mine, Parts::new(&mut blocks, &[1, 2, 3])).unwrap();
//!     // MPI's displacements: block i at element displs[i], any order, gaps left as they were.
//!     let mut placed = vec![9u8; 7];
//!     let recv = Parts::with_displs(&mut placed, &[1, 2, 3], &[6, 3, 0]);
//!     comm.all_gather(&mine, recv).unwrap();
//!     assert_eq!(placed, [2, 2, 2, 1, 1, 9, 0]);
//!     (grad[0], all, blocks)
//! });
//! assert_eq!(results[0], (3.0, vec![0, 10, 20], vec![0, 1, 1, 2, 2, 2]));
//! assert_eq!(results[2].1, Vec::<u32>::new());
//! ```
//!
//! ## One call, through every layer
//!
//! Follow `comm.all_reduce(&mut grad, ReduceOp::Sum)`:
//!
//! 1. **Buffers** ([`buffer`]). `&mut grad` becomes a [`RecvBuf`]: bytes, an element type and
//!    where the memory is ([`Memory::Host`] here; a [`gpu::DeviceSlice`] would be
//!    [`Memory::Device`] with its stream). A receive buffer alone means in place; a
//!    `(send, recv)` pair, out of place; [`Parts`] adds per-rank counts, and
//!    [`Parts::with_displs`] where each block starts (MPI's displacements: blocks that are not
//!    back to back go through a packed copy, in stream order on a GPU). Every operation takes
//!    its buffers this way, so there is one method per operation for typed slices, erased bytes
//!    ([`SendBuf::bytes`]) and device memory alike.
//! 2. **The op** ([`op`]). [`op::Op::new`] checks the call once against the communicator's rank
//!    and size (reduce operator and dtype, root, count vectors, every buffer's length) and gives
//!    the [`schedule::Collective`] to compute and the call's [`fingerprint::Fingerprint`]:
//!    operation, dtype, count, root and reduce operator, which every frame carries so that ranks
//!    that disagree get [`Error::Desync`] naming both calls instead of wrong data. Rooted
//!    operations also carry zero-byte tokens where no data flows ([`schedule`]'s agreement), so
//!    a rank that wrongly believes it is the root hears it too. Each call takes the next
//!    sequence number of its communicator.
//! 3. **The engine** ([`comm`]). Device buffers go to the device engine attached to the
//!    communicator (below). Host buffers go to the first host engine that supports the op —
//!    shared memory for the ranks of one host, or the hierarchy (shared memory inside each
//!    host, the host leaders or stripes over TCP) when a world spans hosts — and otherwise to
//!    a schedule over the transport, which every communicator has. `ACCORD_EXPLAIN=1` prints
//!    the choice.
//! 4. **The schedule** ([`schedule`]). [`schedule::tuner`] picks an algorithm (ring, recursive
//!    doubling, Rabenseifner, trees, Bruck, pairwise...) from a latency/bandwidth model of the
//!    transport's link kind, built in or measured on the machine (`ACCORD_TUNER_PROFILE`,
//!    [`schedule::calibrated`]; `ACCORD_ALGO_<OP>=name` overrides the choice; `accord bench
//!    --explain` prints the table), and turns (collective, world, rank, algorithm) into a
//!    [`schedule::Schedule`]: plain data, rounds of send / receive / receive-and-reduce / copy
//!    steps over element ranges. Schedules are cached, and [`schedule::check`] proves every
//!    algorithm correct symbolically for every world size up to 16 and uneven counts.
//! 5. **The executor** runs the schedule: sends hand bytes to the transport; receives take
//!    frames from the [`transport::Mailbox`] chunk by chunk, reducing each as it arrives.
//! 6. **The transport** ([`transport`]) moves bytes: [`transport::inproc`] (threads of one
//!    process), [`transport::tcp`] (a full mesh of authenticated connections),
//!    [`transport::hybrid`] (shared-memory rings, [`transport::shm`], to ranks of the same host;
//!    TCP to the others, also for abort notices and liveness).
//! 7. **Failures.** Every wait has a deadline (300 s by default, `ACCORD_TIMEOUT` or
//!    [`Communicator::set_timeout`]); a timeout names the rank that stalls the call, following
//!    what the ranks it waited for are blocked on in turn. A lost connection fails the calls
//!    waiting on it at once, and any failure poisons the communicator and is broadcast to the
//!    peers (naming the rank that gave up), so nobody waits for a rank that has given up.
//!
//! ## Transports and engines
//!
//! | layer | what | where it runs |
//! |---|---|---|
//! | transport | in-process | threads of one process (tests) |
//! | transport | TCP | any ranks; authenticated with the job's token |
//! | transport | shared-memory rings + TCP | ranks of one host (memfd segments, futex waits) + other hosts |
//! | host engine | shared-memory collectives | allreduce, reduce, broadcast, allgather, reduce_scatter, alltoall, barrier on one host |
//! | host engine | hierarchy | allreduce, broadcast, reduce-scatter, allgather, alltoall, barrier across hosts |
//! | host engine | schedules | everything, over any transport |
//! | device engine | NCCL | every collective and message on GPU memory |
//!
//! Point-to-point messages with one (peer, tag) keep their order ([`Turn`]), also between
//! threads and nonblocking calls; [`Communicator::probe`] says what the next one holds before
//! it is received. [`Communicator::spawn`] runs any operation in the background
//! in the place in the communicator's order it took when spawned; [`Communicator::split`] and
//! [`Communicator::subgroup`] make sub-communicators; [`Communicator::close`] ends one (the
//! world's closes its connections, and peers waiting for it are told).
//!
//! ## The GPU path
//!
//! [`Communicator::attach_device`] attaches a GPU to a communicator; it is collective (the
//! device engine's ranks meet over the communicator). From then on every operation accepts
//! device buffers ([`gpu::DeviceSlice`], on the communicator's stream or [`SendBuf::device`] /
//! [`RecvBuf::device`] on yours), enqueues the work and returns a [`Completion`] that completes
//! on the stream, as NCCL's calls do. CUDA and NCCL are loaded at run time, so Accord builds
//! and runs without them; the optional driver symbols (VMM, IPC) make only the features that
//! need them unsupported when missing. A watchdog per device engine aborts it on a timeout, an
//! asynchronous engine error, a desync between ranks' calls (found by comparing fingerprint
//! hashes the ranks publish) or a peer the host communicator saw die. See [`gpu`].
//!
//! Beside the engine, [`Communicator::alloc_symmetric`] gives device memory every rank of the
//! host maps (the symmetric heap, [`gpu::symm`], no NCCL needed), and
//! [`Communicator::memory_channels`] the per-peer channels kernels use through
//! `<accord/channel.cuh>` (put, signal, wait, LL packets; every wait bounded by the timeout).
//! [`gpu::cuda::nvrtc`] compiles such kernels at run time and [`gpu::cuda::Kernel`] launches
//! them. The guide is `docs/gpu_channels.md`.
//!
//! ## Distributed arrays
//! [`distributed`] moves arrays split into boxes between layouts ([`distributed::Redistribute`])
//! and runs a distributed FFT on them ([`distributed::DistributedFft`]), on host and device
//! memory, over any communicator.
//! ## Seeing what the ranks do
//!
//! Every communicator keeps a flight record of its last calls, written on failures, abort
//! notices, `SIGUSR1` and request, and readable with [`Communicator::flight_record`];
//! [`Communicator::metrics`] counts calls, bytes, errors and time blocked; `ACCORD_TRACE`
//! records a Chrome-trace timeline per rank. `accord analyze` reads the ranks' records
//! together. See [`observe`] and `docs/observability.md`.
//!
//! ## Bootstrapping
//!
//! [`init`] reads the environment (`env://`): Accord's own `ACCORD_*` variables set by
//! `accord run`, torchrun's `RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`, OpenMPI's
//! `OMPI_COMM_WORLD_*`, PMI and Slurm. [`init_with`] takes `tcp://host:port` or `file:///path`.
//! Ranks meet through a small key-value store ([`rendezvous`]) and prove knowledge of a shared
//! token ([`auth`]) on every connection.
//!
//! ## From C, C++ and Python
//!
//! The `accord-c` crate is a C ABI over [`Communicator`] (`libaccord`, `<accord.h>`) with a
//! header-only C++ wrapper shaped like RAFT's `comms_t` (`<accord/comms.hpp>`); the Python
//! package (`crates/accord-py`, `python/`) wraps the same communicator and lends it to C and
//! C++ extensions. Guides: `docs/c_and_cxx.md`, `python/README.md`.
//!
//! ## Environment
//!
//! Every tunable is read once into a typed [`Config`]; the table of variables, types and
//! defaults is the [`config`] module's documentation.
#![warn(missing_docs)]

mod atomic_duration;
pub mod auth;
mod blame;
mod bootstrap;
pub mod buffer;
pub mod comm;
pub mod config;
pub mod distributed;
pub mod dtype;
mod engine;
pub mod error;
mod exec;
pub mod fingerprint;
pub mod gpu;
pub mod observe;
pub mod op;
mod p2p_order;
pub mod rendezvous;
pub mod schedule;
mod scratch;
mod shm_coll;
pub mod testing;
pub mod transport;

pub use bootstrap::{from_rendezvous, init, init_with, init_with_timeout};
pub use buffer::{AsInOut, AsRecv, AsSend, Memory, Parts, RecvBuf, SendBuf};
pub use comm::{Communicator, Completion, MessageInfo, Request};
pub use config::Config;
pub use dtype::{DataType, Element, ReduceOp};
pub use error::{Error, Result};
pub use p2p_order::Turn;
pub use shm_coll::copy_streaming;
