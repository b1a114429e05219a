//! From "I am one of N processes" to a working [`Communicator`]: rendezvous through the store,
//! then connect the transport.

use crate::comm::{timeout_from_env, Communicator, Resources};
use crate::error::{Error, Result};
use crate::rendezvous::{self, InitMethod, Rendezvous};
use crate::shm_coll::ShmWorld;
use crate::transport::hybrid::{shm_p2p_enabled, HybridTransport};
use crate::transport::shm::{host_id, shm_enabled, ShmGroup};
use crate::transport::tcp::{TcpOptions, TcpTransport};
use crate::transport::wire::PROTOCOL;
use crate::transport::{Directory, Mailbox, Transport};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Join the job described by the environment (`env://`): `accord run`, torchrun, mpirun or Slurm
/// variables. See [`crate::rendezvous`] for the variables read.
pub fn init() -> Result<Communicator> {
    init_with("env://", None, None)
}

/// Join a job through `url` (`env://`, `tcp://host:port`, `file:///shared/path`). `rank` and
/// `world_size` override the environment.
pub fn init_with(
    url: &str,
    rank: Option<usize>,
    world_size: Option<usize>,
) -> Result<Communicator> {
    init_with_timeout(url, rank, world_size, timeout_from_env())
}

/// Like [`init_with`] with an explicit deadline for every later call. Joining has its own
/// deadline: `ACCORD_JOIN_TIMEOUT`, else the shorter of `timeout` and
/// [`DEFAULT_JOIN_TIMEOUT`](crate::rendezvous::init::DEFAULT_JOIN_TIMEOUT).
pub fn init_with_timeout(
    url: &str,
    rank: Option<usize>,
    world_size: Option<usize>,
    timeout: Duration,
) -> Result<Communicator> {
    let method = InitMethod::parse(url)?;
    let rdv = rendezvous::init(&method, rank, world_size, Some(timeout))?;
    from_rendezvous(rdv, timeout)
}

/// How long the store's host keeps serving after it failed to connect to its peers.
const STORE_LINGER: Duration = Duration::from_secs(3);

/// Connect the transport for a finished rendezvous and wrap it in a communicator that keeps the
/// store (and, on the hosting rank, the store server) alive.
pub fn from_rendezvous(rdv: Rendezvous, timeout: Duration) -> Result<Communicator> {
    let book = rdv.store.with_prefix("accord/tcp");
    let opts = TcpOptions {
        timeout,
        form_deadline: Some(rdv.join_deadline),
        // Ranks of other host names on the same CPUs (network namespaces) copy on them too.
        lanes: crate::transport::tcp::lanes_for(rdv.local_world_size.max(rdv.cpu_sharing_ranks)),
        ..TcpOptions::default()
    };
    let tcp = match TcpTransport::connect(rdv.rank, rdv.world_size, &rdv.token, &book, opts) {
        Ok(t) => t,
        Err(e) => {
            if rdv.server.is_some() {
                // The others may still be finding out which rank is gone (through the store,
                // or by dialling it): closing the store now would leave them only "the store
                // is shutting down" to report.
                std::thread::sleep(STORE_LINGER);
            }
            return Err(e);
        }
    };
    let (transport, shm) = match after_mesh(&rdv, tcp, timeout) {
        Ok(t) => t,
        Err(e) => {
            if rdv.server.is_some() {
                // The others may still be reading what differs, or finding out who is gone.
                std::thread::sleep(STORE_LINGER);
            }
            return Err(e);
        }
    };
    let resources = Resources {
        shm,
        rendezvous: Some(rdv),
        ..Resources::default()
    };
    let comm = Communicator::with_resources(transport, resources);
    comm.set_timeout(timeout);
    Ok(comm)
}

/// What a rank has once start-up is over: its transport and its host's shared-memory world.
type Joined = (Arc<dyn Transport>, Option<Arc<ShmWorld>>);

/// Once every rank is known to be there (a rank that ends before it connects is named by the
/// mesh, within the join deadline): the settings check, placement and shared memory, where a
/// rank that ends is named by the mesh too. The transport, and the host's shared-memory world.
fn after_mesh(rdv: &Rendezvous, tcp: Arc<TcpTransport>, timeout: Duration) -> Result<Joined> {
    let store = Watched {
        store: rdv.store.with_prefix(""),
        mailbox: tcp.mailbox(),
        size: rdv.world_size,
    };
    check_alike(&store, rdv.rank, rdv.world_size, timeout)?;
    let mut transport: Arc<dyn Transport> = tcp.clone();
    let Some(w) = shm_world(&store, rdv, &transport, timeout)? else {
        return Ok((transport, None));
    };
    // Point-to-point traffic (and every collective that runs a message schedule) between
    // ranks of this host goes through shared-memory rings; TCP stays for the other hosts,
    // aborts and liveness.
    let p2p = agree(&store, rdv, "p2p", shm_p2p_enabled(), timeout)?;
    if let Some(g) = w.group.as_ref().filter(|_| p2p) {
        transport = HybridTransport::new(tcp, g.ring_area(), timeout)?;
    }
    Ok((transport, Some(Arc::new(w))))
}

/// Placement and this host's shared-memory group. Every rank publishes its host id (or that it
/// wants TCP only: `ACCORD_TRANSPORT=tcp` on any rank turns shared memory off for all); ranks
/// with equal ids share memory. `None` when shared memory is off or no two ranks share a host.
fn shm_world(
    store: &Watched,
    rdv: &Rendezvous,
    transport: &Arc<dyn Transport>,
    timeout: Duration,
) -> Result<Option<ShmWorld>> {
    let store = store.within("accord/shm");
    let me = if shm_enabled() {
        host_id()
    } else {
        String::new()
    };
    store.put(&format!("host/{}", rdv.rank), me.as_bytes())?;
    let keys: Vec<String> = (0..rdv.world_size).map(|r| format!("host/{r}")).collect();
    let hosts: Vec<String> = store
        .get_all(&keys, timeout)?
        .into_iter()
        .map(|v| String::from_utf8_lossy(&v).into_owned())
        .collect();
    if hosts.iter().any(String::is_empty) {
        return Ok(None);
    }
    let shared = (0..hosts.len()).any(|r| hosts[..r].contains(&hosts[r]));
    if !shared {
        return Ok(None);
    }
    let mut group = ShmGroup::join(&store, rdv.rank, &hosts, timeout)?;
    if let Some(g) = group.as_mut() {
        g.watch_mailbox(transport.clone(), (0..rdv.world_size).collect());
    }
    Ok(Some(ShmWorld::new(group, &hosts)))
}

/// How soon a wait for other ranks' keys first looks whether the mesh lost one of them; the
/// wait doubles up to [`WATCH_SLICE_MAX`] (every look asks the store for all its keys again).
const WATCH_SLICE: Duration = Duration::from_millis(50);
const WATCH_SLICE_MAX: Duration = Duration::from_secs(1);

/// The store as the ranks see it once their mesh has formed: a wait for keys others publish
/// ends as soon as the mesh reports a rank lost (its process ended, its connection broke),
/// naming that rank, instead of when the operation timeout (minutes) passes.
struct Watched<'a> {
    store: crate::rendezvous::StoreClient,
    mailbox: &'a Mailbox,
    size: usize,
}

impl<'a> Watched<'a> {
    /// The same watch over the namespace `prefix`.
    fn within(&self, prefix: &str) -> Watched<'a> {
        Watched {
            store: self.store.with_prefix(prefix),
            ..*self
        }
    }

    /// A rank the mesh lost, and why: one whose process ended or connection broke before one
    /// that closed its communicator (which it does when its own start-up failed, often because
    /// of the first).
    fn lost(&self) -> Option<Error> {
        let lost = |left: bool| {
            (0..self.size).find_map(|rank| {
                let cause = self.mailbox.lost(rank)?;
                (self.mailbox.left(rank) == left).then_some(Error::PeerLost { rank, cause })
            })
        };
        lost(false).or_else(|| lost(true))
    }
}

impl Directory for Watched<'_> {
    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.store.set(key, value)
    }

    fn get_all(&self, keys: &[String], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let deadline = Instant::now() + timeout;
        let mut slice = WATCH_SLICE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let missing = match self.store.multi_get_or_missing(keys, left.min(slice)) {
                Ok(Ok(values)) => return Ok(values),
                Ok(Err(missing)) => missing,
                // The store's host may be gone because a rank the mesh lost made it fail.
                Err(e) => return Err(self.lost().unwrap_or(e)),
            };
            if let Some(e) = self.lost() {
                // A rank that published everything and then finished is no reason to fail:
                // what it published is there now.
                return match self.store.multi_get_or_missing(keys, Duration::ZERO)? {
                    Ok(values) => Ok(values),
                    Err(_) => Err(e),
                };
            }
            if Instant::now() >= deadline {
                return Err(self.store.timed_out("multi_get", timeout, missing));
            }
            slice = (slice * 2).min(WATCH_SLICE_MAX);
        }
    }

    fn wait_all(&self, keys: &[String], timeout: Duration) -> Result<()> {
        self.get_all(keys, timeout).map(drop)
    }
}

/// Every rank publishes its frames' format version and the settings all ranks must share
/// ([`crate::config::Config::shared`]); rank 0 compares them and publishes a verdict the others
/// read (one key each, where reading everyone's would move `N^2` values through the store).
/// Ranks of another build, or that set one of them differently, would misread each other's
/// frames or take paths that never meet, so every rank fails here naming the first difference.
fn check_alike(store: &Watched, rank: usize, size: usize, timeout: Duration) -> Result<()> {
    let store = store.within("accord/alike");
    let mut mine = vec![("frame format", PROTOCOL.to_string())];
    mine.extend(crate::config::get().shared());
    let line: String = mine.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    store.put(&rank.to_string(), line.as_bytes())?;
    if rank == 0 {
        let keys: Vec<String> = (0..size).map(|r| r.to_string()).collect();
        let all: Vec<String> = store
            .get_all(&keys, timeout)?
            .into_iter()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .collect();
        let verdict = match first_difference(&all) {
            None => String::new(),
            Some(d) if d.name == "frame format" => format!(
                "Prank {} speaks frame format {} and rank {} format {}: every rank must run \
                 the same Accord release",
                d.ranks.0, d.values.0, d.ranks.1, d.values.1
            ),
            Some(d) => format!(
                "I{} is {} on rank {} and {} on rank {}: every rank must set it alike",
                d.name, d.values.0, d.ranks.0, d.values.1, d.ranks.1
            ),
        };
        store.put("verdict", verdict.as_bytes())?;
    }
    let verdict = store.get_all(&["verdict".to_string()], timeout)?.remove(0);
    let verdict = String::from_utf8_lossy(&verdict).into_owned();
    match verdict.split_at(verdict.len().min(1)) {
        // Alike, but every rank failed to read the same profile the same way.
        ("", _) => match &crate::config::get().tuner_profile {
            Some(Err(e)) => Err(Error::invalid(format!("ACCORD_TUNER_PROFILE: {e}"))),
            _ => Ok(()),
        },
        ("P", why) => Err(Error::Protocol(why.to_string())),
        (_, why) => Err(Error::invalid(why)),
    }
}

/// Where two ranks' published settings first differ.
#[derive(Debug, PartialEq)]
struct Difference {
    name: String,
    /// The lowest rank, and the lowest rank that differs from it.
    ranks: (usize, usize),
    values: (String, String),
}

/// The first setting (in publication order) on which some rank differs from rank 0; each entry
/// of `all` is one rank's `name=value` lines.
fn first_difference(all: &[String]) -> Option<Difference> {
    let parse = |s: &str| -> Vec<(String, String)> {
        s.lines()
            .map(|l| l.split_once('=').unwrap_or((l, "")))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let ranks: Vec<Vec<(String, String)>> = all.iter().map(|s| parse(s)).collect();
    let first = ranks.first()?;
    for (name, value) in first {
        for (r, theirs) in ranks.iter().enumerate().skip(1) {
            let got = theirs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str());
            if got != Some(value.as_str()) {
                return Some(Difference {
                    name: name.clone(),
                    ranks: (0, r),
                    values: (value.clone(), got.unwrap_or("unknown").to_string()),
                });
            }
        }
    }
    None
}

/// Whether every rank says `yes` to `what`: settings that change the transport or the cost model
/// must be the same everywhere, whatever each rank's environment says.
fn agree(
    store: &Watched,
    rdv: &Rendezvous,
    what: &str,
    yes: bool,
    timeout: Duration,
) -> Result<bool> {
    let store = store.within("accord/agree");
    store.put(
        &format!("{what}/{}", rdv.rank),
        if yes { b"1" } else { b"0" },
    )?;
    let keys: Vec<String> = (0..rdv.world_size).map(|r| format!("{what}/{r}")).collect();
    Ok(store
        .get_all(&keys, timeout)?
        .iter()
        .all(|v| v.as_slice() == b"1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_setting_a_rank_sets_otherwise_is_named() {
        let rank = |stripe: &str| format!("frame format=2\nACCORD_HIER_STRIPE_BYTES={stripe}\n");
        assert_eq!(first_difference(&[rank("65536"), rank("65536")]), None);
        let d = first_difference(&[rank("65536"), rank("65536"), rank("1024")]).unwrap();
        assert_eq!(d.name, "ACCORD_HIER_STRIPE_BYTES");
        assert_eq!(d.ranks, (0, 2));
        assert_eq!(d.values, ("65536".to_string(), "1024".to_string()));
        let old = "frame format=1\n".to_string();
        let d = first_difference(&[rank("1"), old]).unwrap();
        assert_eq!(
            (d.name.as_str(), d.values.1.as_str()),
            ("frame format", "1")
        );
        assert_eq!(first_difference(&[]), None);
    }
}
