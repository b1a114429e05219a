//! Rendezvous: the key-value store ranks use to find each other, and the init methods.
//!
//! # The store
//!
//! A [`StoreServer`] is a small in-memory key-value map served over TCP; a [`StoreClient`]
//! talks to it. Every connection starts with the job-token handshake of [`crate::auth`]
//! (role [`Store`](crate::auth::Role::Store)): a process that does not know the token is refused
//! with [`Error::Unauthorized`](crate::Error::Unauthorized) and nothing it sent is acted on. With
//! the empty token (none configured) anyone can prove it, so nothing is authenticated; [`init()`]
//! warns about it (see [`token`]).
//!
//! Connections that have not proved the token yet are bounded by
//! [`HandshakeLimits`](crate::auth::HandshakeLimits) (default: 128 at once, 5 seconds each;
//! [`StoreServer::bind_with_limits`] sets others). The accept thread runs all their handshakes
//! on non-blocking sockets, so a stranger costs one descriptor and no thread; one that arrives
//! while the limit is reached is closed at once (logged, at most once a second), and one that
//! has not finished the whole handshake within the deadline of being accepted is closed then,
//! however it paces its bytes. A client turned away retries until its own timeout. An
//! authenticated client gets a thread of its own for as long as it stays connected.
//!
//! | operation | meaning |
//! |---|---|
//! | [`set`](StoreClient::set) | store a value, wake waiters |
//! | [`get`](StoreClient::get) / [`get_timeout`](StoreClient::get_timeout) | value of a key, **waiting** until it is set |
//! | [`try_get`](StoreClient::try_get) | value if set now |
//! | [`wait`](StoreClient::wait) / [`wait_timeout`](StoreClient::wait_timeout) | wait until all keys are set |
//! | [`multi_get`](StoreClient::multi_get) | wait for and fetch several keys in one round trip |
//! | [`add`](StoreClient::add) | atomic counter (stored as decimal text) |
//! | [`compare_set`](StoreClient::compare_set) | atomic compare-and-swap (`None` = "key absent") |
//! | [`delete`](StoreClient::delete), [`num_keys`](StoreClient::num_keys), [`check`](StoreClient::check) | housekeeping |
//!
//! Waiting never blocks other clients, nor other threads sharing one client (each concurrent
//! request gets its own pooled connection). A timeout is an
//! [`Error::Timeout`](crate::Error::Timeout) naming the keys still missing. Keys are UTF-8, at
//! most [`protocol::MAX_KEY_BYTES`]; values at most [`protocol::MAX_VALUE_BYTES`].
//! [`StoreClient::with_prefix`] gives a handle whose keys live under `prefix/`, so several jobs
//! or communicators can share one store. `StoreClient` implements
//! [`AddressBook`](crate::transport::AddressBook) with keys `{prefix}/addr/{rank}`, and
//! [`Directory`](crate::transport::Directory) (set, multi-get, wait) for shared memory's join.
//!
//! ```
//! use accord::auth::Token;
//! use accord::rendezvous::{StoreClient, StoreServer};
//! use std::time::Duration;
//!
//! let server = StoreServer::bind("127.0.0.1:0", Token::new("secret"))?;
//! let store = StoreClient::connect(&server.addr().to_string(), &Token::new("secret"),
//!                                  Duration::from_secs(5))?;
//! store.set("greeting", b"hello")?;
//! assert_eq!(store.get("greeting")?, b"hello");
//! assert_eq!(store.add("joined", 1)?, 1);
//! # Ok::<(), accord::Error>(())
//! ```
//!
//! # Init methods
//!
//! [`init()`] is the single entry point; it returns a [`Rendezvous`] (rank, world size, local
//! rank, the store client and — on the hosting rank — the server). `rank`, `world_size` and
//! `timeout` passed to it override the environment.
//!
//! - **`env://`** — everything from environment variables. Rank 0 hosts the store at the given
//!   address (listening on it) unless `ACCORD_STORE_EXTERNAL=1`; the others connect, retrying
//!   until the join deadline, so start order does not matter.
//! - **`tcp://host:port`** — the store address is in the URL, rank and world size are passed to
//!   [`init()`] (or come from the variables below). Same hosting rule as `env://`.
//! - **`file:///path`** — rank 0 starts a store on a free port (listening on every interface)
//!   and atomically writes `host:port` to `path` (write to a temporary file, then rename). The
//!   host written is `ACCORD_STORE_HOST` if set, else the source address of this machine's
//!   default route, else `127.0.0.1`. Other ranks poll the file until the join deadline
//!   (re-reading it if the address in it does not answer, e.g. a stale file) and connect. Rank 0
//!   removes the file when its [`Rendezvous`] is dropped. `path` must be on a filesystem all
//!   ranks share.
//!
//! When rank 0 hosts the store, a host name in the address makes it listen on every interface;
//! an IP address is listened on exactly (every interface if it is not local, e.g. behind NAT).
//!
//! After connecting, every rank registers under `accord/init/` (or `ACCORD_STORE_PREFIX`): it
//! claims `rank/{r}` with a compare-and-swap (a second process with the same rank gets a clear
//! error), checks that the world size agrees, counts itself in `joined`, and waits for all ranks.
//! Local rank and local world size come from the launcher's variables where set, else from the
//! host names the ranks registered. What the world publishes afterwards (listening addresses,
//! host identities, settings, and keys set through [`crate::Communicator::store`]) lives under
//! `ACCORD_STORE_PREFIX` too where it is set (at the store's root otherwise), so several worlds
//! can share one external store, each under its own prefix.
//!
//! Joining (connecting and registering) has its own deadline, `ACCORD_JOIN_TIMEOUT` (default the
//! shorter of [`init::DEFAULT_JOIN_TIMEOUT`] and the timeout): a rank that dies before it
//! registers cannot be told from a slow starter, so this bounds how long the others wait for it.
//! When it passes, every rank fails with an [`Error::Timeout`](crate::Error::Timeout) naming the
//! same missing ranks, and a rank arriving later is told it came too late. [`mark_exited`] lets a
//! launcher (`accord run` does) record a rank whose process ended, so the others fail at once
//! with [`Error::PeerLost`](crate::Error::PeerLost) naming it. When the store's host dies, the
//! others' store requests fail at once with `PeerLost` naming rank 0 (see [`client`]).
//!
//! ## Environment variables
//!
//! | what | variables, first family whose rank variable is set wins |
//! |---|---|
//! | rank, world size, local rank, local world size | `ACCORD_RANK`, `ACCORD_WORLD_SIZE`, `ACCORD_LOCAL_RANK`, `ACCORD_LOCAL_WORLD_SIZE` |
//! | (torchrun) | `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE` |
//! | (Open MPI) | `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE` |
//! | (MPICH / Intel MPI) | `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`, `MPI_LOCALNRANKS` |
//! | (Slurm) | `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID` |
//! | store address (`env://`) | `ACCORD_STORE=host:port`, else `MASTER_ADDR` + `MASTER_PORT` — needed under MPI and Slurm too |
//! | token | `ACCORD_TOKEN`, else `ACCORD_TOKEN_FILE` (a file only its owner may read); empty if neither is set; every process must agree |
//! | an external store runs already | `ACCORD_STORE_EXTERNAL=1` |
//! | timeout | `ACCORD_TIMEOUT` (seconds, may be fractional; default 300) |
//! | join deadline | `ACCORD_JOIN_TIMEOUT` (seconds; default the shorter of 60 and the timeout) |
//! | `file://` advertised host | `ACCORD_STORE_HOST` |
//! | namespace of the world's keys (one per world sharing a store) | `ACCORD_STORE_PREFIX` (default: the init keys under `accord/init`, the rest at the root) |
//!
//! [`EnvConfig::from_vars`] and [`init_with_vars`] read variables through a closure, so they can
//! be tested (or fed by an embedding runtime) without touching the process environment.

pub mod client;
pub mod init;
mod join;
pub mod protocol;
pub mod server;
pub mod token;

pub use client::StoreClient;
pub use init::{init, init_with_vars, EnvConfig, InitMethod, Rendezvous};
pub use join::mark_exited;
pub use server::StoreServer;
