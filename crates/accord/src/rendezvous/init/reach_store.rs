//! Reaching the job's store: rank 0 hosts it (or a store runs already) and every rank connects,
//! directly or through the address rank 0 writes into a `file://` rendezvous file.

use super::EnvConfig;
use crate::auth::Token;
use crate::error::{Error, Result};
use crate::rendezvous::{StoreClient, StoreServer};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

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

pub(super) type Joined = (StoreClient, Option<StoreServer>);

/// Host the store at `addr` (as rank 0) or connect to it. `host_rank`: the rank whose process
/// serves it, if a rank does.
pub(super) fn host_or_join(
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

pub(super) fn host_for_file(
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

pub(super) fn join_from_file(
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
