//! What this process may use: CPUs (affinity and cgroup quota), memory (cgroup limit), and
//! open files (each rank holds a socket per peer).

use super::report::{bytes, Check, Section, Status};
use std::path::PathBuf;

pub fn section(np: usize) -> Section {
    Section {
        id: "resources",
        title: "Resources",
        checks: vec![cpus(np), memory(np), open_files(np)],
    }
}

fn cpus(np: usize) -> Check {
    let affinity = accord::transport::cpus::allowed().len();
    // SAFETY: plain sysconf query.
    let online = usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).unwrap_or(0);
    let quota = cgroup_limit(
        "cpu.max",
        "cpu",
        &["cpu.cfs_quota_us", "cpu.cfs_period_us"],
        parse_cpu_quota,
    );
    let usable = match (affinity, &quota) {
        (0, None) => online,
        (0, Some((q, _))) => online.min(q.ceil() as usize),
        (a, None) => a,
        (a, Some((q, _))) => a.min(q.ceil() as usize),
    }
    .max(1);
    let quota_text = match &quota {
        Some((q, file)) => format!("cgroup quota {q:.2} CPUs ({})", file.display()),
        None => "no cgroup CPU quota".into(),
    };
    let affinity_text = match affinity {
        0 => "affinity unknown".to_string(),
        a => format!("affinity {a} of {online} online"),
    };
    let summary = format!("{usable} usable: {affinity_text}, {quota_text}");
    let status = if np > usable {
        Status::Warn
    } else {
        Status::Ok
    };
    let mut check = Check::new("cpus", "CPUs", status, summary)
        .fact("online", online)
        .fact("affinity", affinity)
        .fact("cgroup_quota", quota.as_ref().map(|(q, _)| *q))
        .fact(
            "cgroup_quota_file",
            quota.as_ref().map(|(_, f)| f.display().to_string()),
        )
        .fact("usable", usable);
    if np > usable {
        check = check.note(format!(
            "{np} ranks on {usable} CPUs share cores: `accord run` then binds one rank per CPU, \
             and waits yield sooner; expect slower collectives than with one core per rank"
        ));
    }
    check
}

/// `max 100000` -> none; `150000 100000` -> 1.5 CPUs.
fn parse_cpu_quota(text: &str) -> Option<f64> {
    let mut f = text.split_whitespace();
    let quota: f64 = f.next()?.parse().ok()?;
    let period: f64 = f.next()?.parse().ok()?;
    (quota > 0.0 && period > 0.0).then_some(quota / period)
}

/// Limits at or above this are "unlimited" (cgroup v1 writes `LONG_MAX` rounded to a page).
const NO_MEMORY_LIMIT: u64 = 1 << 60;

fn memory(np: usize) -> Check {
    let limit = cgroup_limit("memory.max", "memory", &["memory.limit_in_bytes"], |t| {
        t.trim()
            .parse::<u64>()
            .ok()
            .filter(|&v| v < NO_MEMORY_LIMIT)
    });
    let (total, available) = meminfo();
    let shm = super::transports::segment_bytes(np) * np as u64;
    let room = match &limit {
        Some((l, _)) => (*l).min(available.unwrap_or(u64::MAX)),
        None => available.unwrap_or(u64::MAX),
    };
    let mut summary = match &limit {
        Some((l, file)) => format!("cgroup limit {} ({})", bytes(*l), file.display()),
        None => "no cgroup memory limit".into(),
    };
    if let (Some(t), Some(a)) = (total, available) {
        summary.push_str(&format!("; {} of {} available", bytes(a), bytes(t)));
    }
    let status = if shm > room / 2 {
        Status::Warn
    } else {
        Status::Ok
    };
    let mut check = Check::new("memory", "memory", status, summary)
        .fact("cgroup_limit_bytes", limit.as_ref().map(|(l, _)| *l))
        .fact(
            "cgroup_limit_file",
            limit.as_ref().map(|(_, f)| f.display().to_string()),
        )
        .fact("total_bytes", total)
        .fact("available_bytes", available)
        .fact("shared_memory_bytes", shm);
    if status == Status::Warn {
        check = check.note(format!(
            "{np} ranks' shared-memory segments take {}, more than half of the {} left",
            bytes(shm),
            bytes(room)
        ));
    }
    check
}

/// `MemTotal` and `MemAvailable` from `/proc/meminfo`, in bytes.
fn meminfo() -> (Option<u64>, Option<u64>) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kib| kib * 1024)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// The tightest limit of this process's cgroup and its ancestors: the v2 file `v2`, or the
/// v1 `controller`'s files `v1` (read in order and joined by a space), parsed by `parse`.
/// Returns the limit and the file it came from.
fn cgroup_limit<T: PartialOrd + Copy>(
    v2: &str,
    controller: &str,
    v1: &[&str],
    parse: impl Fn(&str) -> Option<T>,
) -> Option<(T, PathBuf)> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut best: Option<(T, PathBuf)> = None;
    for line in groups.lines() {
        // "0::/path" (v2) or "N:cpu,cpuacct:/path" (v1).
        let mut f = line.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        let is_v2 = ctrls.is_empty();
        if !is_v2 && !ctrls.split(',').any(|c| c == controller) {
            continue;
        }
        let root = PathBuf::from(if is_v2 {
            "/sys/fs/cgroup".to_string()
        } else {
            format!("/sys/fs/cgroup/{ctrls}")
        });
        let mut dir = root.join(path.trim_start_matches('/'));
        // Up to the mount point: inside a cgroup namespace the path may not exist below it,
        // and a parent's limit binds too.
        loop {
            let (file, text) = if is_v2 {
                let file = dir.join(v2);
                let text = std::fs::read_to_string(&file).ok();
                (file, text)
            } else {
                let parts: Option<Vec<String>> = v1
                    .iter()
                    .map(|f| {
                        std::fs::read_to_string(dir.join(f))
                            .ok()
                            .map(|s| s.trim().to_string())
                    })
                    .collect();
                (dir.join(v1[0]), parts.map(|p| p.join(" ")))
            };
            if let Some(v) = text.as_deref().and_then(&parse) {
                if best.as_ref().is_none_or(|(b, _)| v < *b) {
                    best = Some((v, file));
                }
            }
            if dir == root || !dir.pop() || !dir.starts_with(&root) {
                break;
            }
        }
    }
    best
}

/// Descriptors a rank of `np` holds: one TCP connection and one process handle (pidfd) per
/// peer on the host, plus a margin for the store connection, the listener, standard streams
/// and the libraries the program loads.
pub fn fds_per_rank(np: usize) -> u64 {
    2 * np.saturating_sub(1) as u64 + 32
}

/// Descriptors `accord run -n np` holds: a store connection and two output pipes per rank.
pub fn fds_for_launcher(np: usize) -> u64 {
    3 * np as u64 + 32
}

fn open_files(np: usize) -> Check {
    // SAFETY: a plain-data struct the call fills in.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: RLIMIT_NOFILE into a local struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Check::new(
            "open_files",
            "open files",
            Status::Warn,
            format!("cannot read the limit: {}", std::io::Error::last_os_error()),
        );
    }
    // rlim_t is u64 on Linux.
    let as_u64 = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
    let (soft, hard) = (as_u64(lim.rlim_cur), as_u64(lim.rlim_max));
    let need = fds_per_rank(np).max(fds_for_launcher(np));
    let soft_n = soft.unwrap_or(u64::MAX);
    // The launcher's share grows fastest, so it bounds the world size.
    let max_ranks = soft.map(|s| s.saturating_sub(fds_for_launcher(0)) / 3);
    let show = |v: Option<u64>| v.map_or("unlimited".to_string(), |v| v.to_string());
    let summary = format!(
        "soft limit {}, hard {}: {np} ranks need about {need} (enough for {} ranks)",
        show(soft),
        show(hard),
        max_ranks.map_or("any number of".to_string(), |m| m.to_string())
    );
    let status = if soft_n < need {
        Status::Fail
    } else {
        Status::Ok
    };
    let mut check = Check::new("open_files", "open files", status, summary)
        .fact("soft", soft)
        .fact("hard", hard)
        .fact("needed", need)
        .fact("max_ranks", max_ranks)
        .note(
            "each rank holds a connection and a process handle per peer, plus a few; \
             `accord run` holds three descriptors per rank",
        );
    if status == Status::Fail {
        check = check.note(if hard.unwrap_or(u64::MAX) >= need {
            format!("raise it before the run: `ulimit -n {}`", show(hard))
        } else {
            format!(
                "the hard limit {} is below {need} too: ask for a higher `nofile` limit \
                 (/etc/security/limits.conf, or the container's --ulimit nofile=)",
                show(hard)
            )
        });
    }
    check
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_quotas_read_as_fractions_of_cpus() {
        assert_eq!(parse_cpu_quota("150000 100000"), Some(1.5));
        assert_eq!(parse_cpu_quota("max 100000"), None);
        assert_eq!(parse_cpu_quota("-1 100000"), None);
    }

    #[test]
    fn descriptors_grow_with_the_world() {
        assert!(fds_per_rank(8) < fds_per_rank(64));
        assert_eq!(fds_for_launcher(8), 56);
        assert_eq!(fds_per_rank(1), 32);
    }

    #[test]
    fn this_process_reports_its_limits() {
        let c = open_files(8);
        assert!(c.facts.contains_key("soft") && c.facts.contains_key("max_ranks"));
        let m = memory(8);
        assert!(m.facts["shared_memory_bytes"].as_u64().unwrap() > 0);
        let c = cpus(1);
        assert!(c.facts["usable"].as_u64().unwrap() >= 1);
    }
}
