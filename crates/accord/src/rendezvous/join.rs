//! Joining: every rank registers in the init namespace and waits for the others until the join
//! deadline.
//!
//! A rank claims `rank/{r}` with its host, pid and a nonce. A rank that will never claim its key
//! gets a *tombstone* there instead, so that every rank waiting learns it at once, from the same
//! answer that would have brought the registrations:
//!
//! - `!exited|<how>`, written by `accord run` when a rank's process ends ([`mark_exited`]);
//! - `!absent|`, written by the first rank whose join deadline passes, for every rank still
//!   missing.
//!
//! Everyone then fails naming the same ranks, whatever order their own deadlines would have come
//! in. A rank that hosts the store keeps serving until the others have read the verdict (or a
//! short grace has passed), so that they do not see its store vanish instead.

use super::StoreClient;
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

const EXITED: &str = "!exited|";
const ABSENT: &str = "!absent|";
/// Most time the store's host waits for the others to read a failed rendezvous's verdict.
const VERDICT_GRACE: Duration = Duration::from_secs(2);

/// When joining started and how long it may take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JoinDeadline {
    pub start: Instant,
    pub timeout: Duration,
}

impl JoinDeadline {
    fn left(&self) -> Duration {
        (self.start + self.timeout).saturating_duration_since(Instant::now())
    }
}

/// Record in the init namespace `ns` that `rank`'s process ended (`how`, e.g. `exit status 0`),
/// unless it has registered: ranks still joining then fail at once naming it, instead of
/// waiting for the join deadline. `true` when the tombstone was written.
pub fn mark_exited(ns: &StoreClient, rank: usize, how: &str) -> Result<bool> {
    let tomb = format!("{EXITED}{how}");
    let now = ns.compare_set(&format!("rank/{rank}"), None, tomb.as_bytes())?;
    Ok(now.as_deref() == Some(tomb.as_bytes()))
}

/// What a `rank/{r}` key holds.
enum Entry {
    /// A registration: the host name of the rank.
    Joined(String),
    /// The rank's process ended before it joined, as the launcher described it.
    Exited(String),
    /// Some rank's join deadline passed while this one was missing.
    Absent,
}

impl Entry {
    fn parse(v: &[u8]) -> Entry {
        let s = String::from_utf8_lossy(v);
        if let Some(how) = s.strip_prefix(EXITED) {
            Entry::Exited(how.to_string())
        } else if s.starts_with(ABSENT) {
            Entry::Absent
        } else {
            Entry::Joined(s.split('|').next().unwrap_or_default().to_string())
        }
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success (we
    // also stop at the buffer's end).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown-host".into();
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// The CPU budget this process draws on: its kernel (the boot id, the same in every container
/// and network namespace of a machine) and its control group (the cgroup namespace and path: a
/// container's own, with its own quota or cpuset). Processes of one machine in one control
/// group share its CPUs whatever their host names. Empty where the kernel is unknown.
pub(crate) fn cpu_budget() -> String {
    let Ok(boot) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") else {
        return String::new();
    };
    let ns = std::fs::read_link("/proc/self/ns/cgroup")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    // The groups that hold CPUs: v2's one hierarchy ("0::/path"), v1's cpu and cpuset.
    let groups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let cpu: Vec<&str> = groups
        .lines()
        .filter(|l| {
            let ctrl = l.split(':').nth(1).unwrap_or_default();
            ctrl.is_empty() || ctrl.split(',').any(|c| c.starts_with("cpu"))
        })
        .collect();
    // The entry's fields are separated by `|`.
    format!("{}/{ns}/{}", boot.trim(), cpu.join(";")).replace('|', ";")
}

/// Where a registered rank stands among the others.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Neighbours {
    /// Rank and number of processes on this host (the launcher's, where it said).
    pub local_rank: usize,
    pub local_world_size: Option<usize>,
    /// Processes drawing on this one's CPU budget ([`cpu_budget`]), whatever their host names.
    /// `None` where it is unknown.
    pub sharing_cpus: Option<usize>,
}

/// Register this rank in the init namespace `ns` and wait for everyone until `join`'s deadline.
/// `hosting`: this process serves the store.
pub(crate) fn register(
    ns: &StoreClient,
    rank: usize,
    world_size: usize,
    join: JoinDeadline,
    hosting: bool,
    env_local_rank: Option<usize>,
    env_local_size: Option<usize>,
) -> Result<Neighbours> {
    let host = hostname();
    let pid = std::process::id();
    let nonce = u64::from_le_bytes(crate::auth::random_bytes::<8>());
    let budget = cpu_budget();
    let me = format!("{host}|{pid}|{nonce:016x}|{budget}");
    let describe = |v: &[u8]| {
        let s = String::from_utf8_lossy(v);
        let mut parts = s.split('|');
        format!(
            "host {}, pid {}",
            parts.next().unwrap_or("?"),
            parts.next().unwrap_or("?")
        )
    };

    let ws = world_size.to_string();
    let agreed = ns.compare_set("world_size", None, ws.as_bytes())?;
    if agreed.as_deref() != Some(ws.as_bytes()) {
        return Err(Error::invalid(format!(
            "world size disagreement: rank {rank} was started with world size {world_size} but \
             another rank registered world size {}; every process must be given the same world \
             size",
            agreed
                .map(|v| String::from_utf8_lossy(&v).into_owned())
                .unwrap_or_default()
        )));
    }
    let key = format!("rank/{rank}");
    let owner = ns.compare_set(&key, None, me.as_bytes())?;
    if owner.as_deref() != Some(me.as_bytes()) {
        let owner = owner.unwrap_or_default();
        return Err(match Entry::parse(&owner) {
            Entry::Absent => Error::Timeout {
                op: "rendezvous".into(),
                seq: 0,
                comm: "world".into(),
                waiting_for: vec![],
                after: join.start.elapsed(),
                hint: format!(
                    " — rank {rank} joined too late: the join deadline (ACCORD_JOIN_TIMEOUT) of \
                     a rank that started earlier passed while it was missing, and the others \
                     gave up; start every rank within that time of the first"
                ),
            },
            Entry::Exited(how) => Error::invalid(format!(
                "rank {rank} is recorded in the store at {} as a process that ended ({how}); a \
                 store reused from an earlier run keeps its ranks",
                ns.addr()
            )),
            Entry::Joined(_) => Error::invalid(format!(
                "rank {rank} is claimed twice: by this process ({}) and by another ({}); every \
                 process needs its own rank — check the rank variables (ACCORD_RANK, RANK, ...) \
                 or the rank passed to init(); a store reused from an earlier run also keeps its \
                 ranks",
                describe(me.as_bytes()),
                describe(&owner)
            )),
        });
    }
    let joined = ns.add("joined", 1)?;
    if joined > world_size as i64 {
        return Err(Error::invalid(format!(
            "{joined} processes joined a world of size {world_size}"
        )));
    }

    let keys: Vec<String> = (0..world_size).map(|r| format!("rank/{r}")).collect();
    let values = match ns.multi_get_or_missing(&keys, join.left())? {
        Ok(values) => values,
        Err(missing) => {
            // This rank's deadline came first: tell everyone, then read what the keys hold now
            // (a rank may have registered just in time).
            for k in &missing {
                ns.compare_set(k, None, ABSENT.as_bytes())?;
            }
            ns.multi_get(&keys, Duration::from_secs(5))?
        }
    };
    let entries: Vec<Entry> = values.iter().map(|v| Entry::parse(v)).collect();
    if let Some(e) = verdict(ns, &entries, join) {
        let others = entries
            .iter()
            .enumerate()
            .filter(|(r, e)| *r != rank && matches!(e, Entry::Joined(_)))
            .count();
        if hosting {
            await_readers(ns, others as i64);
        } else {
            let _ = ns.add("verdict_read", 1);
        }
        return Err(e);
    }
    let hosts: Vec<&str> = entries
        .iter()
        .map(|e| match e {
            Entry::Joined(h) => h.as_str(),
            _ => "",
        })
        .collect();
    let mine = hosts[rank];
    let local_rank =
        env_local_rank.unwrap_or_else(|| hosts[..rank].iter().filter(|h| **h == mine).count());
    let local_size = env_local_size.or(Some(hosts.iter().filter(|h| **h == mine).count()));
    let budget_of = |v: &Vec<u8>| {
        String::from_utf8_lossy(v)
            .split('|')
            .nth(3)
            .map(str::to_owned)
    };
    let sharing_cpus = (!budget.is_empty()).then(|| {
        values
            .iter()
            .filter(|v| budget_of(v).as_deref() == Some(&budget))
            .count()
    });
    Ok(Neighbours {
        local_rank,
        local_world_size: local_size,
        sharing_cpus,
    })
}

/// The error of a rendezvous some rank will never join, naming those ranks; `None` when every
/// rank joined.
fn verdict(ns: &StoreClient, entries: &[Entry], join: JoinDeadline) -> Option<Error> {
    let missing: Vec<usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| !matches!(e, Entry::Joined(_)))
        .map(|(r, _)| r)
        .collect();
    if missing.is_empty() {
        return None;
    }
    let joined = entries.len() - missing.len();
    let exited = entries.iter().enumerate().find_map(|(r, e)| match e {
        Entry::Exited(how) => Some((r, how)),
        _ => None,
    });
    if let Some((rank, how)) = exited {
        let list: Vec<String> = missing.iter().map(usize::to_string).collect();
        return Some(Error::PeerLost {
            rank,
            cause: format!(
                "its process ended ({how}) before it joined the rendezvous ({joined} of {} ranks \
                 joined the store at {}; missing: rank(s) {})",
                entries.len(),
                ns.addr(),
                list.join(", ")
            ),
        });
    }
    Some(Error::Timeout {
        op: "rendezvous".into(),
        seq: 0,
        comm: "world".into(),
        waiting_for: missing,
        after: join.start.elapsed(),
        hint: format!(
            " — {joined} of {} ranks joined the store at {} within the join deadline \
             (ACCORD_JOIN_TIMEOUT, {:.1?}); the others have not started, ended before joining, \
             or cannot reach the store",
            entries.len(),
            ns.addr(),
            join.timeout
        ),
    })
}

/// On the store's host: keep serving until `readers` ranks have read a failed verdict, or the
/// grace has passed.
fn await_readers(ns: &StoreClient, readers: i64) {
    let until = Instant::now() + VERDICT_GRACE;
    while Instant::now() < until {
        match ns.try_get("verdict_read") {
            Ok(Some(v)) if String::from_utf8_lossy(&v).parse::<i64>().unwrap_or(0) >= readers => {
                return
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => return,
        }
    }
}
