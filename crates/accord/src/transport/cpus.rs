//! How many CPUs the ranks of one host can use together, agreed through the store.
//!
//! A rank bound to one CPU (by `accord run`, mpirun or Slurm) sees one CPU in its own affinity
//! mask, so no rank can tell alone whether its peers share CPUs with it. Every rank publishes
//! what it sees (`publish`): its mask, the CPU quota of its cgroup, and the host's online
//! CPUs; every rank then computes `usable_together` from the same published values, so all
//! reach the same answer. The union of the masks can overstate what runs at once (masks {0},
//! {0}, {1, 2} give three CPUs to three ranks, two of which share one); that costs speed only.

/// This process's view: `mask;quota;online`. The mask is comma-separated hex words of the
/// affinity (empty if the kernel would not say), the quota the cgroup's CPU limit rounded up
/// (empty if none), `online` the host's online CPUs.
pub(crate) fn publish() -> String {
    let quota = cgroup_quota().map_or(String::new(), |q| q.to_string());
    format!("{};{quota};{}", mask_hex(), online())
}

/// CPUs the publishing ranks can use together: the union of their masks (the largest online
/// count where a mask is unknown), capped by the smallest quota.
pub(crate) fn usable_together(published: &[Vec<u8>]) -> usize {
    let mut union: Vec<u64> = Vec::new();
    let mut unknown = 0usize;
    let mut quota = usize::MAX;
    for p in published {
        let text = String::from_utf8_lossy(p);
        let mut fields = text.split(';');
        let (mask, q, on) = (
            fields.next().unwrap_or(""),
            fields.next().unwrap_or(""),
            fields.next().unwrap_or(""),
        );
        let words: Option<Vec<u64>> = mask
            .split(',')
            .map(|w| u64::from_str_radix(w.trim(), 16).ok())
            .collect();
        match words {
            Some(w) if !mask.trim().is_empty() => {
                union.resize(union.len().max(w.len()), 0);
                for (u, w) in union.iter_mut().zip(&w) {
                    *u |= w;
                }
            }
            _ => unknown = unknown.max(on.trim().parse().unwrap_or(1)),
        }
        if let Ok(q) = q.trim().parse::<usize>() {
            quota = quota.min(q);
        }
    }
    let in_masks: usize = union.iter().map(|w| w.count_ones() as usize).sum();
    in_masks.max(unknown).min(quota).max(1)
}

/// Words in the affinity masks read here: 65,536 CPUs (the kernel's may be larger than
/// `cpu_set_t`).
const MASK_WORDS: usize = 1024;

/// This process's affinity mask, lowest CPUs first, or `None` if the kernel would not say.
fn affinity_words() -> Option<Vec<u64>> {
    let mut mask = vec![0u64; MASK_WORDS];
    // SAFETY: the kernel writes at most the given number of bytes into `mask`.
    let got = unsafe {
        libc::syscall(
            libc::SYS_sched_getaffinity,
            0,
            MASK_WORDS * 8,
            mask.as_mut_ptr(),
        )
    };
    (got > 0).then(|| {
        mask.truncate((got as usize).div_ceil(8));
        mask
    })
}

/// The CPUs this process may run on (empty if the kernel would not say).
pub fn allowed() -> Vec<usize> {
    let mask = affinity_words().unwrap_or_default();
    (0..mask.len() * 64)
        .filter(|&c| mask[c / 64] & (1 << (c % 64)) != 0)
        .collect()
}

/// The affinity mask as hex words, lowest CPUs first; empty if unknown.
fn mask_hex() -> String {
    let words = affinity_words().unwrap_or_default();
    let hex: Vec<String> = words.iter().map(|w| format!("{w:x}")).collect();
    hex.join(",")
}

/// CPUs this host lets its processes use: online CPUs, capped by this process's cgroup quota.
pub(crate) fn usable_here() -> usize {
    let quota = cgroup_quota().unwrap_or(usize::MAX);
    online().min(quota).max(1)
}

fn online() -> usize {
    // SAFETY: plain sysconf query.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).unwrap_or(1)
}

/// The CPU limit of this process's cgroup (v2 `cpu.max`, or v1 `cpu.cfs_quota_us` over
/// `cpu.cfs_period_us`) anywhere up its hierarchy, rounded up; `None` if unlimited or unknown.
fn cgroup_quota() -> Option<usize> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut best: Option<usize> = None;
    for line in groups.lines() {
        // "0::/path" (v2) or "N:cpu,cpuacct:/path" (v1).
        let mut f = line.splitn(3, ':');
        let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
        let v2 = ctrl.is_empty();
        if !v2 && !ctrl.split(',').any(|c| c == "cpu") {
            continue;
        }
        let root = if v2 {
            "/sys/fs/cgroup".to_string()
        } else {
            format!("/sys/fs/cgroup/{ctrl}")
        };
        let mut dir = std::path::PathBuf::from(format!("{root}{path}"));
        loop {
            let q = if v2 {
                quota_v2(&std::fs::read_to_string(dir.join("cpu.max")).unwrap_or_default())
            } else {
                let q = std::fs::read_to_string(dir.join("cpu.cfs_quota_us")).unwrap_or_default();
                let p = std::fs::read_to_string(dir.join("cpu.cfs_period_us")).unwrap_or_default();
                quota_v2(&format!("{} {}", q.trim(), p.trim()))
            };
            if let Some(q) = q {
                best = Some(best.map_or(q, |b| b.min(q)));
            }
            // Up to the mount point, which is also read: inside a cgroup namespace it is the
            // container's own group.
            if dir.as_os_str().len() <= root.len() || !dir.pop() || !dir.starts_with(&root) {
                break;
            }
        }
    }
    best
}

/// `"<quota> <period>"` (microseconds) as CPUs, rounded up; `None` for `max`, -1 or garbage.
fn quota_v2(text: &str) -> Option<usize> {
    let mut f = text.split_whitespace();
    let quota: i64 = f.next()?.parse().ok()?;
    let period: i64 = f.next()?.parse().ok()?;
    (quota > 0 && period > 0).then(|| (quota as u64).div_ceil(period as u64).max(1) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn together(v: &[&str]) -> usize {
        let p: Vec<Vec<u8>> = v.iter().map(|s| s.as_bytes().to_vec()).collect();
        usable_together(&p)
    }

    #[test]
    fn ranks_pool_their_masks_and_respect_the_smallest_quota() {
        // Two ranks bound to CPU 0 and CPU 65: two CPUs between them.
        assert_eq!(together(&["1;;2", "0,2;;2"]), 2);
        // Overlapping masks count once.
        assert_eq!(together(&["3;;8", "6;;8"]), 3);
        // Bound ranks in a container limited to 2 CPUs: the quota caps the union.
        assert_eq!(together(&["1;2;16", "2;2;16", "4;2;16", "8;2;16"]), 2);
        // A rank that could not read its mask: the host's online CPUs stand in.
        assert_eq!(together(&["1;;4", ";;4"]), 4);
        assert_eq!(together(&["zz"]), 1);
        assert_eq!(together(&[]), 1);
    }

    #[test]
    fn this_process_publishes_a_readable_view() {
        let mine = publish();
        assert_eq!(mine.split(';').count(), 3, "{mine}");
        // The published mask names exactly the CPUs this process may use.
        let cpus = allowed();
        assert!(!cpus.is_empty());
        assert_eq!(together(&[&format!("{};;", mask_hex())]), cpus.len());
        let n = together(&[&mine]);
        assert!(n >= 1 && n <= online().max(1), "{mine} -> {n}");
    }

    #[test]
    fn cgroup_limits_read_as_whole_cpus() {
        assert_eq!(quota_v2("max 100000"), None);
        assert_eq!(quota_v2("200000 100000"), Some(2));
        assert_eq!(quota_v2("150000 100000"), Some(2));
        assert_eq!(quota_v2("50000 100000"), Some(1));
        assert_eq!(quota_v2("-1 100000"), None);
        assert_eq!(quota_v2(""), None);
    }
}
