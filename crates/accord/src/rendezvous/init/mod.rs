//! Init methods: how a process learns its rank, the world size and where the store is.
//!
//! See the [module documentation](super) for the methods and the environment variables.

mod env;
mod method;
mod reach_store;
#[cfg(test)]
mod tests;

pub use env::EnvConfig;
pub use method::InitMethod;

use super::join::{self, JoinDeadline};
use super::{token, StoreClient, StoreServer};
use crate::auth::Token;
use crate::error::{Error, Result};
use env::all_rank_vars;
use reach_store::{host_for_file, host_or_join, join_from_file};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default deadline of store requests and, through [`crate::comm`], of every blocking call.
pub const DEFAULT_TIMEOUT: Duration = crate::config::DEFAULT_TIMEOUT;

/// Default deadline of joining (reaching the store and waiting for every rank to register),
/// unless the operation timeout is shorter: a rank that dies before it registers looks like a
/// slow starter, so the others wait this long, not [`DEFAULT_TIMEOUT`], before naming it.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Namespace of the keys written by the rendezvous itself.
pub const INIT_PREFIX: &str = "accord/init";

/// The result of a rendezvous: who this process is, and a connection to the job's store.
///
/// Keep it alive for as long as the job uses the store: on rank 0 it owns the store server (when
/// rank 0 hosts it), and dropping it stops the store for everyone.
#[derive(Debug)]
pub struct Rendezvous {
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// Number of processes in the job.
    pub world_size: usize,
    /// Rank among the processes on this host: from the launcher's variable where set, else
    /// computed from the host names every rank registered (ordered by rank).
    pub local_rank: usize,
    /// Number of processes on this host: from the launcher's variable where set, else computed
    /// from the registered host names. `None` only where it could not be determined.
    pub local_world_size: Option<usize>,
    /// Number of processes drawing on this one's CPUs, whatever their host names: on the same
    /// kernel in the same control group (network namespaces of one machine; not containers,
    /// whose control groups are their own). `None` where unknown.
    pub cpu_sharing_ranks: Option<usize>,
    /// Client of the job's store, in this world's namespace: `ACCORD_STORE_PREFIX` where that
    /// is set, else the root. What the world keeps there (addresses, placement, settings) is
    /// never seen by another world on the store under another prefix.
    pub store: Arc<StoreClient>,
    /// The store server, on the rank that hosts it.
    pub server: Option<StoreServer>,
    /// The job's token, for authenticating peer connections.
    pub token: Token,
    /// When joining must be over: connecting to the peers that registered is still part of it.
    pub join_deadline: Instant,
    file_guard: Option<FileGuard>,
}

/// Removes the `file://` rendezvous file when rank 0 is done.
#[derive(Debug)]
struct FileGuard(PathBuf);

impl Drop for FileGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Rendezvous with the other processes of the job — the single entry point.
///
/// `rank`, `world_size` and `timeout` override what the environment says (see the
/// [module documentation](super)); `timeout` defaults to `ACCORD_TIMEOUT` or 300 s and is the
/// default deadline of later store requests. Joining — reaching the store and waiting for every
/// rank to register — has its own deadline: `ACCORD_JOIN_TIMEOUT`, else the shorter of
/// [`DEFAULT_JOIN_TIMEOUT`] and `timeout`.
pub fn init(
    method: &InitMethod,
    rank: Option<usize>,
    world_size: Option<usize>,
    timeout: Option<Duration>,
) -> Result<Rendezvous> {
    init_with_vars(method, rank, world_size, timeout, |k| std::env::var(k).ok())
}

/// [`init()`] with the environment read through `get` instead of the process environment.
pub fn init_with_vars(
    method: &InitMethod,
    rank: Option<usize>,
    world_size: Option<usize>,
    timeout: Option<Duration>,
    get: impl Fn(&str) -> Option<String>,
) -> Result<Rendezvous> {
    let cfg = EnvConfig::from_vars(get)?;
    let timeout = timeout.or(cfg.timeout).unwrap_or(DEFAULT_TIMEOUT);
    let join = JoinDeadline {
        start: Instant::now(),
        timeout: cfg
            .join_timeout
            .unwrap_or_else(|| DEFAULT_JOIN_TIMEOUT.min(timeout)),
    };
    let deadline = join.start + join.timeout;
    let rank = rank.or(cfg.rank);
    let world_size = world_size.or(cfg.world_size);

    let mut missing = Vec::new();
    if rank.is_none() {
        missing.push(format!("the rank (one of {})", all_rank_vars()));
    }
    if world_size.is_none() {
        missing.push(match (cfg.missing_world_var, cfg.source) {
            (Some(var), Some(src)) => {
                format!("the world size ({var}, since the rank came from {src}'s variables)")
            }
            _ => "the world size (ACCORD_WORLD_SIZE or WORLD_SIZE, ...)".to_string(),
        });
    }
    if *method == InitMethod::Env && cfg.store.is_none() {
        missing.push(match cfg.missing_store_vars.as_slice() {
            [one] => {
                let other = if *one == "MASTER_PORT" {
                    "MASTER_ADDR"
                } else {
                    "MASTER_PORT"
                };
                format!(
                    "the store address ({one}, since {other} is set; or ACCORD_STORE=host:port)"
                )
            }
            _ => "the store address (ACCORD_STORE=host:port, or MASTER_ADDR and MASTER_PORT)"
                .to_string(),
        });
    }
    if !missing.is_empty() {
        let how = if *method == InitMethod::Env {
            "set the environment variables"
        } else {
            "pass rank and world_size to init() or set the environment variables"
        };
        return Err(Error::invalid(format!(
            "{method} init is missing {}; {how}",
            missing.join(", and ")
        )));
    }
    let (rank, world_size) = (rank.unwrap_or(0), world_size.unwrap_or(0));
    if world_size == 0 || rank >= world_size {
        return Err(Error::invalid(format!(
            "rank {rank} is not in a world of size {world_size}: ranks run from 0 to world_size - 1"
        )));
    }
    let token = cfg.token.clone();
    if token == Token::default() {
        token::warn_unauthenticated();
    }
    let mut file_guard = None;
    let past_join_deadline = |e| on_join_deadline(e, join.timeout);
    let (client, server) = match method {
        InitMethod::Env => {
            let addr = cfg.store.clone().unwrap_or_default();
            host_or_join(
                &addr,
                rank == 0 && !cfg.store_external,
                (!cfg.store_external).then_some(0),
                &token,
                deadline,
                timeout,
            )
            .map_err(past_join_deadline)?
        }
        InitMethod::Tcp { host, port } => {
            let addr = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            host_or_join(
                &addr,
                rank == 0 && !cfg.store_external,
                (!cfg.store_external).then_some(0),
                &token,
                deadline,
                timeout,
            )
            .map_err(past_join_deadline)?
        }
        InitMethod::File(path) => {
            if rank == 0 {
                let (c, s) = host_for_file(path, &cfg, &token, deadline, timeout)
                    .map_err(past_join_deadline)?;
                file_guard = Some(FileGuard(path.clone()));
                (c, Some(s))
            } else {
                let c =
                    join_from_file(path, &token, deadline, timeout).map_err(past_join_deadline)?;
                (c, None)
            }
        }
    };
    let prefix = cfg
        .prefix
        .clone()
        .unwrap_or_else(|| INIT_PREFIX.to_string());
    let placed = join::register(
        &client.with_prefix(&prefix),
        rank,
        world_size,
        join,
        server.is_some(),
        cfg.local_rank,
        cfg.local_world_size,
    )?;
    let local_rank = placed.local_rank;
    tracing::debug!(
        rank,
        world_size,
        local_rank,
        store = client.addr(),
        hosting = server.is_some(),
        "rendezvous complete"
    );
    // Everything the world keeps in the store after joining lives in the world's namespace, so
    // that worlds sharing an external store under different prefixes never read each other's
    // addresses or settings. The default prefix keeps the root.
    let world = if prefix.trim_matches('/') == INIT_PREFIX {
        ""
    } else {
        prefix.as_str()
    };
    Ok(Rendezvous {
        rank,
        world_size,
        local_rank,
        local_world_size: placed.local_world_size,
        cpu_sharing_ranks: placed.sharing_cpus,
        store: Arc::new(client.with_prefix(world)),
        server,
        token,
        join_deadline: deadline,
        file_guard,
    })
}

impl Rendezvous {
    /// Whether this process hosts the store.
    pub fn hosts_store(&self) -> bool {
        self.server.is_some()
    }

    /// The `file://` rendezvous file this process will remove on drop, if any.
    pub fn rendezvous_file(&self) -> Option<&Path> {
        self.file_guard.as_ref().map(|g| g.0.as_path())
    }
}

/// Say which deadline a timeout while reaching the store was.
fn on_join_deadline(e: Error, join_timeout: Duration) -> Error {
    match e {
        Error::Timeout {
            op,
            seq,
            comm,
            waiting_for,
            after,
            hint,
        } => Error::Timeout {
            op,
            seq,
            comm,
            waiting_for,
            after,
            hint: format!("{hint} (join deadline: ACCORD_JOIN_TIMEOUT, {join_timeout:.1?})"),
        },
        e => e,
    }
}

/// A free TCP port on 127.0.0.1 (for tests and tools; another process may take it first).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("probe for a free port", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io("probe for a free port", e))
}
