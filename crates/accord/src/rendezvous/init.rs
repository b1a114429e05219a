//! Init methods: how a process learns its rank, the world size and where the store is.
//!
//! See the [module documentation](super) for the methods and the environment variables.

use super::join::{self, JoinDeadline};
use super::{token, StoreClient, StoreServer};
use crate::auth::Token;
use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default deadline of store requests and, through [`crate::comm`], of every blocking call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Default deadline of joining (reaching the store and waiting for every rank to register),
/// unless the operation timeout is shorter: a rank that dies before it registers looks like a
/// slow starter, so the others wait this long, not [`DEFAULT_TIMEOUT`], before naming it.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Namespace of the keys written by the rendezvous itself.
pub const INIT_PREFIX: &str = "accord/init";

/// How the processes of a job find each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitMethod {
    /// `env://`: rank, world size and store address from environment variables.
    Env,
    /// `tcp://host:port`: the store is at `host:port`, hosted by rank 0.
    Tcp {
        /// Host name or IP address of rank 0's machine.
        host: String,
        /// Port of the store.
        port: u16,
    },
    /// `file:///path`: rank 0 hosts the store on a free port and writes its address to `path`,
    /// which every rank must be able to read (a shared filesystem).
    File(PathBuf),
}

impl InitMethod {
    /// Parse `env://`, `tcp://host:port` (IPv6 as `tcp://[::1]:port`) or `file:///path`.
    pub fn parse(url: &str) -> Result<InitMethod> {
        let url = url.trim();
        if url == "env://" || url == "env:" || url == "env" {
            return Ok(InitMethod::Env);
        }
        if let Some(rest) = url.strip_prefix("tcp://") {
            let rest = rest.trim_end_matches('/');
            let bad = || {
                Error::invalid(format!(
                    "init method {url:?}: expected tcp://host:port (e.g. tcp://10.0.0.1:29500)"
                ))
            };
            let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port: u16 = port.parse().map_err(|_| bad())?;
            if host.is_empty() {
                return Err(bad());
            }
            return Ok(InitMethod::Tcp {
                host: host.to_string(),
                port,
            });
        }
        if let Some(path) = url.strip_prefix("file://") {
            if path.is_empty() {
                return Err(Error::invalid(format!(
                    "init method {url:?}: expected file:///path/to/shared/file"
                )));
            }
            return Ok(InitMethod::File(PathBuf::from(path)));
        }
        Err(Error::invalid(format!(
            "unknown init method {url:?}: use env://, tcp://host:port or file:///path"
        )))
    }
}

impl std::str::FromStr for InitMethod {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        InitMethod::parse(s)
    }
}

impl std::fmt::Display for InitMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InitMethod::Env => f.write_str("env://"),
            InitMethod::Tcp { host, port } if host.contains(':') => {
                write!(f, "tcp://[{host}]:{port}")
            }
            InitMethod::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
            InitMethod::File(p) => write!(f, "file://{}", p.display()),
        }
    }
}

/// One launcher's naming of rank, world size, local rank and local world size.
struct Family {
    name: &'static str,
    rank: &'static str,
    size: &'static str,
    local_rank: &'static str,
    local_size: Option<&'static str>,
}

/// In order of precedence; the first family whose rank variable is set supplies all four.
const FAMILIES: [Family; 5] = [
    Family {
        name: "Accord",
        rank: "ACCORD_RANK",
        size: "ACCORD_WORLD_SIZE",
        local_rank: "ACCORD_LOCAL_RANK",
        local_size: Some("ACCORD_LOCAL_WORLD_SIZE"),
    },
    Family {
        name: "torchrun",
        rank: "RANK",
        size: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        local_size: Some("LOCAL_WORLD_SIZE"),
    },
    Family {
        name: "Open MPI",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    Family {
        name: "PMI",
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_size: Some("MPI_LOCALNRANKS"),
    },
    Family {
        name: "Slurm",
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        local_size: None,
    },
];

fn all_rank_vars() -> String {
    FAMILIES
        .iter()
        .map(|f| f.rank)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the environment says about this process. Built by [`EnvConfig::from_vars`]; fields are
/// `None` where no variable gave them.
#[derive(Debug, Clone, Default)]
pub struct EnvConfig {
    /// This process's rank.
    pub rank: Option<usize>,
    /// Number of processes.
    pub world_size: Option<usize>,
    /// Rank among the processes on this host.
    pub local_rank: Option<usize>,
    /// Number of processes on this host.
    pub local_world_size: Option<usize>,
    /// Launcher family that supplied the rank (`"Accord"`, `"torchrun"`, `"Open MPI"`, `"PMI"`,
    /// `"Slurm"`).
    pub source: Option<&'static str>,
    /// The world-size variable of that family, when it was not set.
    pub missing_world_var: Option<&'static str>,
    /// Store address `host:port`, from `ACCORD_STORE` or `MASTER_ADDR`:`MASTER_PORT`.
    pub store: Option<String>,
    /// The store-address variables that are missing, when `store` is `None`.
    pub missing_store_vars: Vec<&'static str>,
    /// `ACCORD_TOKEN`, else the contents of the file named by `ACCORD_TOKEN_FILE` (empty when
    /// neither is set).
    pub token: Token,
    /// `ACCORD_STORE_EXTERNAL=1`: a store already runs (e.g. our launcher's); rank 0 must not
    /// host one.
    pub store_external: bool,
    /// `ACCORD_TIMEOUT` in seconds.
    pub timeout: Option<Duration>,
    /// `ACCORD_JOIN_TIMEOUT` in seconds.
    pub join_timeout: Option<Duration>,
    /// `ACCORD_STORE_HOST`: the host name or IP that `file://` writes for others to connect to.
    pub store_host: Option<String>,
    /// `ACCORD_STORE_PREFIX`: namespace of the rendezvous keys (default [`INIT_PREFIX`]).
    pub prefix: Option<String>,
}

fn parse_seconds(var: &str, v: &str) -> Result<Duration> {
    let secs: f64 = v
        .trim()
        .parse()
        .map_err(|_| Error::invalid(format!("{var}={v:?} is not a number of seconds")))?;
    if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
        return Err(Error::invalid(format!(
            "{var}={v:?} must be a positive number of seconds"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_usize(var: &str, v: &str) -> Result<usize> {
    v.trim().parse().map_err(|_| {
        Error::invalid(format!(
            "environment variable {var}={v:?} is not a non-negative integer"
        ))
    })
}

impl EnvConfig {
    /// Read the configuration through `get` (e.g. `|k| std::env::var(k).ok()`), so tests and
    /// embedders can supply variables without touching the process environment. Fails only on
    /// values that are set but unparsable, and on a token file that cannot be read or that
    /// others may read; missing values are reported by [`init()`].
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<EnvConfig> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let mut cfg = EnvConfig::default();
        if let Some(fam) = FAMILIES.iter().find(|f| get(f.rank).is_some()) {
            cfg.source = Some(fam.name);
            cfg.rank = Some(parse_usize(fam.rank, &get(fam.rank).unwrap_or_default())?);
            match get(fam.size) {
                Some(v) => cfg.world_size = Some(parse_usize(fam.size, &v)?),
                None => cfg.missing_world_var = Some(fam.size),
            }
            if let Some(v) = get(fam.local_rank) {
                cfg.local_rank = Some(parse_usize(fam.local_rank, &v)?);
            }
            if let Some(var) = fam.local_size {
                if let Some(v) = get(var) {
                    cfg.local_world_size = Some(parse_usize(var, &v)?);
                }
            }
        }
        if let Some(s) = get("ACCORD_STORE") {
            cfg.store = Some(s.trim().to_string());
        } else {
            match (get("MASTER_ADDR"), get("MASTER_PORT")) {
                (Some(a), Some(p)) => {
                    let port: u16 = p.trim().parse().map_err(|_| {
                        Error::invalid(format!(
                            "environment variable MASTER_PORT={p:?} is not a port"
                        ))
                    })?;
                    let a = a.trim();
                    cfg.store = Some(if a.contains(':') && !a.starts_with('[') {
                        format!("[{a}]:{port}")
                    } else {
                        format!("{a}:{port}")
                    });
                }
                (Some(_), None) => cfg.missing_store_vars = vec!["MASTER_PORT"],
                (None, Some(_)) => cfg.missing_store_vars = vec!["MASTER_ADDR"],
                (None, None) => {
                    cfg.missing_store_vars = vec!["ACCORD_STORE", "MASTER_ADDR", "MASTER_PORT"]
                }
            }
        }
        cfg.token = token::from_vars(get)?;
        cfg.store_external = get("ACCORD_STORE_EXTERNAL").is_some_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        });
        if let Some(v) = get("ACCORD_TIMEOUT") {
            cfg.timeout = Some(parse_seconds("ACCORD_TIMEOUT", &v)?);
        }
        if let Some(v) = get("ACCORD_JOIN_TIMEOUT") {
            cfg.join_timeout = Some(parse_seconds("ACCORD_JOIN_TIMEOUT", &v)?);
        }
        cfg.store_host = get("ACCORD_STORE_HOST").map(|s| s.trim().to_string());
        cfg.prefix = get("ACCORD_STORE_PREFIX").map(|s| s.trim().to_string());
        Ok(cfg)
    }

    /// Read the process environment.
    pub fn from_env() -> Result<EnvConfig> {
        Self::from_vars(|k| std::env::var(k).ok())
    }
}

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
    /// Client of the job's store (root namespace).
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
    let (local_rank, local_world_size) = join::register(
        &client.with_prefix(&prefix),
        rank,
        world_size,
        join,
        server.is_some(),
        cfg.local_rank,
        cfg.local_world_size,
    )?;
    tracing::debug!(
        rank,
        world_size,
        local_rank,
        store = client.addr(),
        hosting = server.is_some(),
        "rendezvous complete"
    );
    Ok(Rendezvous {
        rank,
        world_size,
        local_rank,
        local_world_size,
        store: Arc::new(client),
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

/// Split `host:port` / `[v6]:port`.
fn split_host_port(addr: &str) -> Result<(String, u16)> {
    let bad = || Error::invalid(format!("store address {addr:?} is not host:port"));
    let (h, p) = addr.rsplit_once(':').ok_or_else(bad)?;
    let port = p.parse().map_err(|_| bad())?;
    Ok((
        h.trim_start_matches('[').trim_end_matches(']').to_string(),
        port,
    ))
}

/// Listen for the store at `addr`. An IP address is bound exactly (falling back to every
/// interface when it is not a local address, e.g. behind NAT); a host name binds every interface,
/// since names often resolve to a loopback alias on their own machine.
fn bind_store(addr: &str, token: &Token) -> Result<StoreServer> {
    let (host, port) = split_host_port(addr)?;
    let exact = match host.parse::<IpAddr>() {
        Ok(ip) => {
            let sa = SocketAddr::new(ip, port);
            match StoreServer::bind(&sa.to_string(), token.clone()) {
                Ok(s) => return Ok(s),
                Err(Error::Io {
                    kind: std::io::ErrorKind::AddrNotAvailable,
                    ..
                }) => ip,
                Err(e) => return Err(hosting_error(addr, e)),
            }
        }
        Err(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    let any = match exact {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    StoreServer::bind(&SocketAddr::new(any, port).to_string(), token.clone())
        .map_err(|e| hosting_error(addr, e))
}

fn hosting_error(addr: &str, e: Error) -> Error {
    match e {
        Error::Io {
            kind: std::io::ErrorKind::AddrInUse,
            ..
        } => Error::Store(format!(
            "rank 0 cannot host the store on {addr}: the port is in use. Pick another port, or \
             set ACCORD_STORE_EXTERNAL=1 if a store already runs there"
        )),
        e => e,
    }
}

type Joined = (StoreClient, Option<StoreServer>);

/// Host the store at `addr` (as rank 0) or connect to it. `host_rank`: the rank whose process
/// serves it, if a rank does.
fn host_or_join(
    addr: &str,
    host: bool,
    host_rank: Option<usize>,
    token: &Token,
    deadline: Instant,
    timeout: Duration,
) -> Result<Joined> {
    if host {
        let server = bind_store(addr, token)?;
        let local = server.local_connect_addr().to_string();
        let client = StoreClient::connect_until(&local, token, deadline, timeout, Some(0))?;
        Ok((client, Some(server)))
    } else {
        Ok((
            StoreClient::connect_until(addr, token, deadline, timeout, host_rank)?,
            None,
        ))
    }
}

/// An address of this host that other hosts can probably reach: the source address of the
/// default route (found without sending anything), else loopback.
fn reachable_ip() -> IpAddr {
    let probe = || -> std::io::Result<IpAddr> {
        let s = UdpSocket::bind("0.0.0.0:0")?;
        s.connect("203.0.113.1:9")?;
        Ok(s.local_addr()?.ip())
    };
    match probe() {
        Ok(ip) if !ip.is_unspecified() => ip,
        _ => IpAddr::V4(Ipv4Addr::LOCALHOST),
    }
}

fn host_for_file(
    path: &Path,
    cfg: &EnvConfig,
    token: &Token,
    deadline: Instant,
    timeout: Duration,
) -> Result<(StoreClient, StoreServer)> {
    let server = StoreServer::bind("0.0.0.0:0", token.clone())?;
    let port = server.addr().port();
    let host = match &cfg.store_host {
        Some(h) => h.clone(),
        None => match reachable_ip() {
            IpAddr::V6(ip) => format!("[{ip}]"),
            ip => ip.to_string(),
        },
    };
    let content = format!("{host}:{port}\n");
    let tmp = path.with_file_name(format!(
        ".{}.tmp.{}.{:08x}",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "accord".into()),
        std::process::id(),
        u32::from_le_bytes(crate::auth::random_bytes::<4>())
    ));
    std::fs::write(&tmp, content.as_bytes())
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io(
                format!(
                    "file:// rendezvous: cannot write the store address to {}",
                    path.display()
                ),
                e,
            )
        })?;
    let local = server.local_connect_addr().to_string();
    let client = StoreClient::connect_until(&local, token, deadline, timeout, Some(0))?;
    Ok((client, server))
}

fn join_from_file(
    path: &Path,
    token: &Token,
    deadline: Instant,
    timeout: Duration,
) -> Result<StoreClient> {
    let start = Instant::now();
    let mut last = String::new();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            let addr = text.trim();
            if !addr.is_empty() {
                // Try briefly, then re-read: the file may be stale, from an earlier run.
                let attempt = deadline.min(Instant::now() + Duration::from_secs(2));
                match StoreClient::connect_until(addr, token, attempt, timeout, Some(0)) {
                    Ok(c) => return Ok(c),
                    Err(e @ Error::Unauthorized(_)) => return Err(e),
                    Err(e) => last = format!("; the last attempt to reach {addr} failed: {e}"),
                }
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout {
                op: format!("file:// rendezvous through {}", path.display()),
                seq: 0,
                comm: "world".into(),
                waiting_for: vec![0],
                after: start.elapsed(),
                hint: format!(
                    " — rank 0 writes the store address into that file; is it running, and is \
                     the path on a filesystem every rank shares?{last}"
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(50).min(deadline - now));
    }
}

/// A free TCP port on 127.0.0.1 (for tests and tools; another process may take it first).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("probe for a free port", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io("probe for a free port", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const T: Duration = Duration::from_secs(5);

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn parse_urls() {
        assert_eq!(InitMethod::parse("env://").unwrap(), InitMethod::Env);
        assert_eq!(
            InitMethod::parse("tcp://10.0.0.1:29500").unwrap(),
            InitMethod::Tcp {
                host: "10.0.0.1".into(),
                port: 29500
            }
        );
        let v6 = InitMethod::parse("tcp://[::1]:7").unwrap();
        assert_eq!(
            v6,
            InitMethod::Tcp {
                host: "::1".into(),
                port: 7
            }
        );
        assert_eq!(v6.to_string(), "tcp://[::1]:7");
        assert_eq!(
            InitMethod::parse("file:///tmp/x").unwrap(),
            InitMethod::File("/tmp/x".into())
        );
        for bad in [
            "tcp://host",
            "tcp://:1",
            "tcp://h:99999",
            "file://",
            "udp://x:1",
            "",
        ] {
            assert!(
                matches!(InitMethod::parse(bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn env_accord_family_and_defaults() {
        let c = EnvConfig::from_vars(vars(&[
            ("ACCORD_RANK", "3"),
            ("ACCORD_WORLD_SIZE", "8"),
            ("ACCORD_LOCAL_RANK", "1"),
            ("ACCORD_STORE", "node0:1234"),
            ("ACCORD_TOKEN", "t"),
            ("ACCORD_STORE_EXTERNAL", "1"),
            ("ACCORD_TIMEOUT", "2.5"),
            // Lower-precedence families are ignored.
            ("RANK", "5"),
            ("MASTER_ADDR", "other"),
            ("MASTER_PORT", "1"),
        ]))
        .unwrap();
        assert_eq!(
            (c.rank, c.world_size, c.local_rank, c.source),
            (Some(3), Some(8), Some(1), Some("Accord"))
        );
        assert_eq!(c.store.as_deref(), Some("node0:1234"));
        assert_eq!(c.token, Token::new("t"));
        assert!(c.store_external);
        assert_eq!(c.timeout, Some(Duration::from_millis(2500)));

        let c = EnvConfig::from_vars(vars(&[])).unwrap();
        assert_eq!((c.rank, c.world_size, c.store), (None, None, None));
        assert_eq!(c.token, Token::default());
        assert!(!c.store_external);
    }

    #[test]
    fn env_torchrun_family() {
        let c = EnvConfig::from_vars(vars(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap();
        assert_eq!(
            (c.rank, c.world_size, c.local_rank, c.local_world_size),
            (Some(1), Some(4), Some(1), Some(2))
        );
        assert_eq!(c.source, Some("torchrun"));
        assert_eq!(c.store.as_deref(), Some("10.1.2.3:29500"));
        let c =
            EnvConfig::from_vars(vars(&[("MASTER_ADDR", "::1"), ("MASTER_PORT", "9")])).unwrap();
        assert_eq!(c.store.as_deref(), Some("[::1]:9"));
    }

    #[test]
    fn env_openmpi_pmi_slurm_families() {
        let c = EnvConfig::from_vars(vars(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "6"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
            ("SLURM_PROCID", "9"),
        ]))
        .unwrap();
        assert_eq!(
            (
                c.rank,
                c.world_size,
                c.local_rank,
                c.local_world_size,
                c.source
            ),
            (Some(2), Some(6), Some(0), Some(3), Some("Open MPI"))
        );
        let c = EnvConfig::from_vars(vars(&[("PMI_RANK", "4"), ("PMI_SIZE", "5")])).unwrap();
        assert_eq!(
            (c.rank, c.world_size, c.source),
            (Some(4), Some(5), Some("PMI"))
        );
        let c = EnvConfig::from_vars(vars(&[
            ("SLURM_PROCID", "7"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "3"),
        ]))
        .unwrap();
        assert_eq!(
            (c.rank, c.world_size, c.local_rank, c.source),
            (Some(7), Some(16), Some(3), Some("Slurm"))
        );
    }

    #[test]
    fn env_errors_name_the_variables() {
        let e = EnvConfig::from_vars(vars(&[("RANK", "x")])).unwrap_err();
        assert!(e.to_string().contains("RANK=\"x\""), "{e}");
        let e = EnvConfig::from_vars(vars(&[("ACCORD_TIMEOUT", "-1")])).unwrap_err();
        assert!(e.to_string().contains("ACCORD_TIMEOUT"), "{e}");

        // Slurm gives rank and size but no store address.
        let e = init_with_vars(
            &InitMethod::Env,
            None,
            None,
            Some(T),
            vars(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")]),
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::InvalidArgument(_)));
        assert!(
            msg.contains("ACCORD_STORE") && msg.contains("MASTER_PORT"),
            "{msg}"
        );
        assert!(!msg.contains("the rank"), "{msg}");

        let e = init_with_vars(
            &InitMethod::Env,
            None,
            None,
            Some(T),
            vars(&[("PMI_RANK", "1"), ("MASTER_ADDR", "h")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("PMI_SIZE"), "{e}");
        assert!(e.contains("(MASTER_PORT, since MASTER_ADDR is set"), "{e}");

        let e = init_with_vars(&InitMethod::Env, None, None, Some(T), vars(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ACCORD_RANK") && e.contains("SLURM_PROCID"),
            "{e}"
        );

        let e = init_with_vars(
            &InitMethod::parse("tcp://127.0.0.1:1").unwrap(),
            Some(3),
            Some(2),
            Some(T),
            vars(&[]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("rank 3"), "{e}");
    }

    fn run_ranks(
        method: &InitMethod,
        ranks: &[usize],
        world: usize,
        timeout: Duration,
        env: &'static [(&'static str, &'static str)],
    ) -> Vec<Result<Rendezvous>> {
        let hs: Vec<_> = ranks
            .iter()
            .map(|&r| {
                let m = method.clone();
                std::thread::spawn(move || {
                    init_with_vars(&m, Some(r), Some(world), Some(timeout), vars(env))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    fn check_world(rs: &[Result<Rendezvous>], world: usize) {
        for (r, rv) in rs.iter().enumerate() {
            let rv = rv.as_ref().unwrap();
            assert_eq!((rv.rank, rv.world_size), (r, world));
            assert_eq!(rv.local_rank, r, "all threads share one host");
            assert_eq!(rv.local_world_size, Some(world));
            assert_eq!(rv.hosts_store(), r == 0);
        }
        // They share one store.
        rs[1].as_ref().unwrap().store.set("hello", b"1").unwrap();
        assert_eq!(rs[0].as_ref().unwrap().store.get("hello").unwrap(), b"1");
    }

    #[test]
    fn tcp_four_ranks_as_threads() {
        let port = free_port().unwrap();
        let m = InitMethod::parse(&format!("tcp://127.0.0.1:{port}")).unwrap();
        // Rank 0 last, so the others must retry until the store appears.
        let rs = run_ranks(&m, &[3, 2, 1, 0], 4, T, &[("ACCORD_TOKEN", "job")]);
        let mut rs: Vec<_> = rs.into_iter().collect();
        rs.reverse();
        check_world(&rs, 4);
    }

    #[test]
    fn env_init_with_external_store() {
        let server = StoreServer::bind("127.0.0.1:0", Token::default()).unwrap();
        let addr = server.addr().to_string();
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let env = vars(&[
                        ("ACCORD_STORE", &addr),
                        ("ACCORD_STORE_EXTERNAL", "1"),
                        ("ACCORD_RANK", &r.to_string()),
                        ("ACCORD_WORLD_SIZE", "2"),
                        ("ACCORD_TIMEOUT", "5"),
                    ]);
                    init_with_vars(&InitMethod::Env, None, None, None, env)
                })
            })
            .collect();
        for (r, h) in hs.into_iter().enumerate() {
            let rv = h.join().unwrap().unwrap();
            assert_eq!(rv.rank, r);
            assert!(!rv.hosts_store());
            assert_eq!(rv.store.timeout(), T);
        }
    }

    #[test]
    fn file_three_ranks_as_threads() {
        let dir = std::env::temp_dir().join(format!(
            "accord-file-init-{}-{:08x}",
            std::process::id(),
            u32::from_le_bytes(crate::auth::random_bytes::<4>())
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rdv");
        let m = InitMethod::parse(&format!("file://{}", path.display())).unwrap();
        let rs = run_ranks(&m, &[0, 1, 2], 3, T, &[]);
        check_world(&rs, 3);
        assert!(path.exists());
        assert_eq!(
            rs[0].as_ref().unwrap().rendezvous_file(),
            Some(path.as_path())
        );
        drop(rs);
        assert!(!path.exists(), "rank 0 removes the file");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn file_init_times_out_naming_rank_zero() {
        let path = std::env::temp_dir().join(format!("accord-never-{}", std::process::id()));
        let m = InitMethod::File(path);
        let e = init_with_vars(
            &m,
            Some(1),
            Some(2),
            Some(Duration::from_millis(200)),
            vars(&[]),
        )
        .unwrap_err();
        match e {
            Error::Timeout { waiting_for, .. } => assert_eq!(waiting_for, vec![0]),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn duplicate_rank_detected() {
        let port = free_port().unwrap();
        let m = InitMethod::parse(&format!("tcp://127.0.0.1:{port}")).unwrap();
        let rs = run_ranks(&m, &[0, 1, 1], 3, Duration::from_secs(2), &[]);
        let dup: Vec<_> = rs
            .iter()
            .filter_map(|r| r.as_ref().err())
            .filter(|e| e.to_string().contains("claimed twice"))
            .collect();
        assert_eq!(dup.len(), 1, "{rs:?}");
        // The others time out waiting for rank 2, and say so.
        for r in &rs {
            if let Err(Error::Timeout { waiting_for, .. }) = r {
                assert_eq!(waiting_for, &vec![2]);
            }
        }
    }

    #[test]
    fn world_size_disagreement_detected() {
        let port = free_port().unwrap();
        let m = InitMethod::parse(&format!("tcp://127.0.0.1:{port}")).unwrap();
        let m2 = m.clone();
        let h0 = std::thread::spawn(move || {
            init_with_vars(
                &m2,
                Some(0),
                Some(2),
                Some(Duration::from_secs(2)),
                vars(&[]),
            )
        });
        std::thread::sleep(Duration::from_millis(200));
        let e = init_with_vars(
            &m,
            Some(1),
            Some(3),
            Some(Duration::from_secs(2)),
            vars(&[]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("world size disagreement"), "{e}");
        assert!(h0.join().unwrap().is_err());
    }

    #[test]
    fn join_timeout_variable() {
        let c = EnvConfig::from_vars(vars(&[("ACCORD_JOIN_TIMEOUT", "1.5")])).unwrap();
        assert_eq!(c.join_timeout, Some(Duration::from_millis(1500)));
        for bad in ["0", "-1", "soon"] {
            let e = EnvConfig::from_vars(vars(&[("ACCORD_JOIN_TIMEOUT", bad)])).unwrap_err();
            assert!(e.to_string().contains("ACCORD_JOIN_TIMEOUT"), "{e}");
        }
    }

    fn external_store() -> (StoreServer, String) {
        let server = StoreServer::bind("127.0.0.1:0", Token::new("job")).unwrap();
        let addr = server.addr().to_string();
        (server, addr)
    }

    /// Ranks of a world of `world` as threads on the store at `addr`, with `timeout` and
    /// `ACCORD_JOIN_TIMEOUT=join`.
    fn join_threads(
        addr: &str,
        ranks: &[usize],
        world: usize,
        timeout: Duration,
        join: &str,
    ) -> Vec<std::thread::JoinHandle<Result<Rendezvous>>> {
        ranks
            .iter()
            .map(|&r| {
                let env: Vec<(String, String)> = [
                    ("ACCORD_STORE", addr),
                    ("ACCORD_STORE_EXTERNAL", "1"),
                    ("ACCORD_TOKEN", "job"),
                    ("ACCORD_JOIN_TIMEOUT", join),
                ]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
                std::thread::spawn(move || {
                    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
                    init_with_vars(&InitMethod::Env, Some(r), Some(world), Some(timeout), get)
                })
            })
            .collect()
    }

    #[test]
    fn the_join_deadline_is_not_the_timeout() {
        let (_server, addr) = external_store();
        let t0 = Instant::now();
        let hs = join_threads(&addr, &[0], 2, Duration::from_secs(30), "0.5");
        let e = hs.into_iter().next().unwrap().join().unwrap().unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        match &e {
            Error::Timeout { waiting_for, .. } => assert_eq!(waiting_for, &vec![1], "{e}"),
            e => panic!("{e:?}"),
        }
        assert!(
            e.to_string().contains("ACCORD_JOIN_TIMEOUT, 500.0ms"),
            "{e}"
        );

        // A rank arriving after that is told the others gave up on it.
        let hs = join_threads(&addr, &[1], 2, Duration::from_secs(30), "5");
        let e = hs.into_iter().next().unwrap().join().unwrap().unwrap_err();
        assert!(e.to_string().contains("rank 1 joined too late"), "{e}");
    }

    #[test]
    fn without_a_join_timeout_the_shorter_of_a_minute_and_the_timeout_applies() {
        let (_server, addr) = external_store();
        let t0 = Instant::now();
        let env = vars(&[
            ("ACCORD_STORE", &addr),
            ("ACCORD_STORE_EXTERNAL", "1"),
            ("ACCORD_TOKEN", "job"),
        ]);
        let short = Duration::from_millis(300);
        let e = init_with_vars(&InitMethod::Env, Some(0), Some(2), Some(short), env).unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert_eq!(DEFAULT_JOIN_TIMEOUT, Duration::from_secs(60));
    }

    #[test]
    fn a_rank_whose_process_ended_is_named_at_once() {
        let (_server, addr) = external_store();
        let t0 = Instant::now();
        let hs = join_threads(&addr, &[0, 1], 3, Duration::from_secs(30), "30");
        let launcher = StoreClient::connect(&addr, &Token::new("job"), T).unwrap();
        let ns = launcher.with_prefix(INIT_PREFIX);
        ns.wait_timeout(&["rank/0", "rank/1"], T).unwrap();
        assert!(super::super::mark_exited(&ns, 2, "exit status 0").unwrap());
        // A rank that registered is not marked.
        assert!(!super::super::mark_exited(&ns, 1, "exit status 0").unwrap());
        for h in hs {
            match h.join().unwrap().unwrap_err() {
                Error::PeerLost { rank, cause } => {
                    assert_eq!(rank, 2);
                    assert!(
                        cause.contains("ended (exit status 0) before it joined"),
                        "{cause}"
                    );
                }
                e => panic!("{e:?}"),
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_store_host_that_stops_is_named() {
        let port = free_port().unwrap();
        let m = InitMethod::parse(&format!("tcp://127.0.0.1:{port}")).unwrap();
        let env = &[("ACCORD_TOKEN", "job"), ("ACCORD_JOIN_TIMEOUT", "30")];
        let mut rs = run_ranks(&m, &[0, 1], 2, T, env);
        let r1 = rs.pop().unwrap().unwrap();
        let mut r0 = rs.pop().unwrap().unwrap();
        r0.server.as_mut().unwrap().shutdown();
        let t0 = Instant::now();
        let e = r1
            .store
            .get_timeout("never", Duration::from_secs(20))
            .unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        let addr = format!("127.0.0.1:{port}");
        match &e {
            Error::PeerLost { rank: 0, cause } => assert!(
                cause.contains(&format!("hosts the store at {addr} and is gone")),
                "{cause}"
            ),
            e => panic!("{e:?}"),
        }
        // A new connection is refused at once, not retried for the timeout.
        let t0 = Instant::now();
        let e = r1.store.set("k", "v").unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert!(
            matches!(&e, Error::PeerLost { rank: 0, cause } if cause.contains("refused")),
            "{e:?}"
        );
    }

    #[test]
    fn wrong_token_fails_init() {
        let server = StoreServer::bind("127.0.0.1:0", Token::new("right")).unwrap();
        let url = format!("tcp://{}", server.addr());
        let e = init_with_vars(
            &InitMethod::parse(&url).unwrap(),
            Some(1),
            Some(2),
            Some(T),
            vars(&[("ACCORD_TOKEN", "wrong")]),
        )
        .unwrap_err();
        assert!(matches!(e, Error::Unauthorized(_)), "{e:?}");
    }
}
