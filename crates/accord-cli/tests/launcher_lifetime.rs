//! `accord run` and the lifetime of its ranks: ranks die with the launcher however it ends,
//! the whole process group of each rank is stopped, and the launcher's signals reach the ranks.
//!
//! Every process a test starts carries a marker of its own in its environment (the launcher, its
//! ranks, their children). A test finds the survivors by that marker rather than by pid, so a
//! reused pid is never mistaken for a survivor, and kills whatever is left when it ends,
//! whatever the outcome.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use std::os::unix::process::{CommandExt, ExitStatusExt};

/// How long the launcher waits between SIGTERM and SIGKILL when it stops a rank.
const GRACE: Duration = Duration::from_secs(3);

/// One `accord run` under test, with its files and its marker.
struct Job {
    dir: PathBuf,
    mark: String,
    launcher: Child,
}

impl Job {
    /// `accord run -n N sh -c SCRIPT`. The script finds its scratch directory in `$DIR`; each
    /// line it appends to `$DIR/ready` counts towards [`Job::wait_ready`]. The launcher leads
    /// its own process group, as a shell's foreground job does, so a test can signal that group
    /// as a terminal would.
    fn start(name: &str, n: usize, script: &str) -> Job {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let mark = format!("{name}-{}-{nanos}", std::process::id());
        let dir = std::env::temp_dir().join(format!("accord-lifetime-{mark}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut launcher = Command::new(env!("CARGO_BIN_EXE_accord"));
        // The launcher keeps ignoring signals its caller ignores (nohup, a background job), as
        // it should; these tests are about the signals it catches, whoever runs them.
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            launcher.pre_exec(|| {
                for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM] {
                    libc::signal(sig, libc::SIG_DFL);
                }
                Ok(())
            });
        }
        let launcher = launcher
            .args(["run", "-n", &n.to_string(), "--", "sh", "-c", script])
            .env("ACCORD_TEST_MARK", &mark)
            .env("DIR", &dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        Job {
            dir,
            mark,
            launcher,
        }
    }

    fn pid(&self) -> i32 {
        self.launcher.id() as i32
    }

    fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// What the launcher printed, for assertion messages.
    fn output(&self) -> String {
        format!(
            "stdout:\n{}\nstderr:\n{}",
            self.file("stdout"),
            self.file("stderr")
        )
    }

    /// Wait (at most 20 s) until the ranks have written `lines` lines to `$DIR/ready`.
    fn wait_ready(&self, lines: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.file("ready").lines().count() < lines {
            assert!(
                Instant::now() < deadline,
                "the ranks never got ready\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The launcher's status if it exits within `within`.
    fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.launcher.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The live (not zombie) processes that carry this job's marker.
    fn survivors(&self) -> Vec<i32> {
        let want = format!("ACCORD_TEST_MARK={}", self.mark);
        let mut found = vec![];
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            // Unreadable (another user's) or gone: not ours. A zombie's environment reads empty.
            let Ok(env) = std::fs::read(entry.path().join("environ")) else {
                continue;
            };
            if env.split(|&b| b == 0).any(|v| v == want.as_bytes()) {
                found.push(pid);
            }
        }
        found
    }

    /// Wait until no process of the job is left, at most `within`; the survivors, with their
    /// command lines, if some are.
    fn wait_gone(&self, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        loop {
            let left = self.survivors();
            if left.is_empty() {
                return vec![];
            }
            if Instant::now() >= deadline {
                return left
                    .iter()
                    .map(|p| {
                        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                        format!("{p} {}", String::from_utf8_lossy(&cmd).replace('\0', " "))
                    })
                    .collect();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, target: i32, sig: libc::c_int) {
        // SAFETY: plain kill(2) on a process or group this test started.
        assert_eq!(
            unsafe { libc::kill(target, sig) },
            0,
            "kill({target}, {sig})"
        );
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.launcher.kill();
        let _ = self.launcher.wait();
        for pid in self.survivors() {
            // SAFETY: the pid carries this job's marker, so this test started it.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Rank 0 is the sleeping program itself; rank 1 is a wrapper that forks it and waits.
const SLEEPERS: &str = r#"
if [ "$ACCORD_RANK" = 0 ]; then echo $$ >> "$DIR/ready"; exec sleep 1000; fi
sleep 1000 &
echo $! >> "$DIR/ready"
wait
"#;

/// Send `sig` to a launcher of sleeping ranks; every process of the job is gone within 2 s.
/// Returns the launcher's status.
fn stop_sleepers(name: &str, sig: libc::c_int) -> ExitStatus {
    let mut job = Job::start(name, 2, SLEEPERS);
    job.wait_ready(2);
    job.signal(job.pid(), sig);
    let status = job.wait_exit(Duration::from_secs(5));
    let left = job.wait_gone(Duration::from_secs(2));
    assert!(
        left.is_empty(),
        "still running 2 s after signal {sig} to the launcher: {left:?}\n{}",
        job.output()
    );
    status.unwrap_or_else(|| panic!("the launcher did not exit\n{}", job.output()))
}

#[test]
fn ranks_die_with_a_killed_launcher() {
    let status = stop_sleepers("sigkill", libc::SIGKILL);
    assert_eq!(status.signal(), Some(libc::SIGKILL));
}

/// SIGKILL to the launcher at random moments of its start: before, while and after it starts
/// the watchdog and ranks that fork. Nothing of the job survives any of them. `ACCORD_SOAK=<n>`
/// runs n times the rounds.
#[test]
fn ranks_die_with_a_launcher_killed_at_any_moment() {
    let soak: usize = accord::testing::soak();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        | 1;
    for round in 0..6 * soak {
        // xorshift: a delay of 0-30 ms, over the launcher's start on a loaded machine.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_micros(seed % 30_000);
        let mut job = Job::start("anytime", 3, "sleep 1000 & wait");
        std::thread::sleep(delay);
        job.signal(job.pid(), libc::SIGKILL);
        assert!(job.wait_exit(Duration::from_secs(5)).is_some());
        let left = job.wait_gone(Duration::from_secs(2));
        assert!(
            left.is_empty(),
            "round {round}, killed {delay:?} after the start: still running: {left:?}\n{}",
            job.output()
        );
    }
}

/// With the watchdog gone too, the parent-death signal still kills the rank processes (not the
/// children they fork: those only the watchdog reaches).
#[test]
fn a_rank_dies_with_its_launcher_without_the_watchdog() {
    let mut job = Job::start(
        "pdeathsig",
        2,
        r#"echo $$ >> "$DIR/ready"; exec sleep 1000"#,
    );
    job.wait_ready(2);
    let guard: Vec<i32> = job
        .survivors()
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| c.trim() == "accord-guard")
        })
        .collect();
    assert_eq!(guard.len(), 1, "one watchdog: {guard:?}");
    job.signal(guard[0], libc::SIGKILL);
    job.signal(job.pid(), libc::SIGKILL);
    assert!(job.wait_exit(Duration::from_secs(5)).is_some());
    let left = job.wait_gone(Duration::from_secs(2));
    assert!(left.is_empty(), "still running: {left:?}\n{}", job.output());
}

#[test]
fn a_hung_up_launcher_stops_its_ranks_and_says_so() {
    let status = stop_sleepers("sighup", libc::SIGHUP);
    assert_eq!(status.signal(), Some(libc::SIGHUP), "{status:?}");
}

#[test]
fn a_terminated_launcher_stops_its_ranks_and_says_so() {
    let status = stop_sleepers("sigterm", libc::SIGTERM);
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
}

/// Ctrl-C signals the terminal's foreground process group: the launcher, but not the ranks,
/// which lead their own groups. The launcher passes the interrupt on.
#[test]
fn an_interrupt_reaches_every_rank() {
    let mut job = Job::start(
        "sigint",
        2,
        r#"trap 'echo "interrupted $ACCORD_RANK"; exit 0' INT
echo >> "$DIR/ready"
while :; do sleep 0.05; done"#,
    );
    job.wait_ready(2);
    job.signal(-job.pid(), libc::SIGINT);
    let status = job.wait_exit(Duration::from_secs(5));
    assert!(
        job.wait_gone(Duration::from_secs(2)).is_empty(),
        "{}",
        job.output()
    );
    let stdout = job.file("stdout");
    for r in 0..2 {
        assert!(
            stdout.contains(&format!("[{r}] interrupted {r}")),
            "{}",
            job.output()
        );
    }
    assert_eq!(
        status.and_then(|s| s.signal()),
        Some(libc::SIGINT),
        "{status:?}\n{}",
        job.output()
    );
}

/// The failed rank's background child holds the rank's output pipes; it is stopped with the
/// rank's group, and the launcher does not wait for it.
#[test]
fn a_failed_rank_s_background_child_is_stopped() {
    let mut job = Job::start(
        "orphan",
        2,
        r#"if [ "$ACCORD_RANK" = 1 ]; then exec sleep 1000; fi
sleep 1000 &
echo $! >> "$DIR/ready"
exit 1"#,
    );
    job.wait_ready(1);
    let status = job.wait_exit(Duration::from_secs(5));
    let left = job.wait_gone(Duration::from_secs(2));
    assert!(left.is_empty(), "still running: {left:?}\n{}", job.output());
    let status = status.unwrap_or_else(|| panic!("the launcher hangs\n{}", job.output()));
    assert_eq!(status.code(), Some(1), "{}", job.output());
    assert!(
        job.file("stderr")
            .contains("rank 0 failed with exit status 1"),
        "{}",
        job.output()
    );
}

#[test]
fn a_rank_that_ignores_sigterm_is_killed_after_the_grace() {
    let mut job = Job::start(
        "ignores-term",
        1,
        r#"trap '' TERM
echo >> "$DIR/ready"
while :; do sleep 0.05; done"#,
    );
    job.wait_ready(1);
    let start = Instant::now();
    job.signal(job.pid(), libc::SIGTERM);
    let status = job.wait_exit(GRACE + Duration::from_secs(5));
    let took = start.elapsed();
    assert!(
        job.wait_gone(Duration::from_secs(2)).is_empty(),
        "{}",
        job.output()
    );
    let status = status.unwrap_or_else(|| panic!("the launcher hangs\n{}", job.output()));
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    // The rank had its grace before the SIGKILL, and the launcher says so.
    assert!(took >= GRACE - Duration::from_millis(500), "took {took:?}");
    let err = job.file("stderr");
    assert!(err.contains("rank 0") && err.contains("SIGKILL"), "{err}");
}

/// A child that leaves its rank's process group (setsid) is out of the launcher's reach, and
/// holds the rank's output pipes open forever; the launcher waits for that output only briefly.
#[test]
fn a_child_outside_the_rank_s_group_does_not_hold_the_launcher() {
    let mut job = Job::start(
        "escaped",
        1,
        r#"setsid sleep 1000 &
echo $! >> "$DIR/ready"
echo done"#,
    );
    job.wait_ready(1);
    let status = job.wait_exit(Duration::from_secs(5));
    let status = status.unwrap_or_else(|| panic!("the launcher hangs\n{}", job.output()));
    assert!(status.success(), "{status:?}\n{}", job.output());
    assert!(job.file("stdout").contains("[0] done"), "{}", job.output());
    assert!(
        job.file("stderr").contains("rank 0"),
        "the launcher should name the rank whose output it stopped waiting for\n{}",
        job.output()
    );
}

#[test]
fn a_second_signal_skips_the_grace() {
    let mut job = Job::start(
        "twice",
        1,
        r#"trap '' INT TERM
echo >> "$DIR/ready"
while :; do sleep 0.05; done"#,
    );
    job.wait_ready(1);
    let start = Instant::now();
    job.signal(-job.pid(), libc::SIGINT);
    std::thread::sleep(Duration::from_millis(300));
    job.signal(-job.pid(), libc::SIGINT);
    let status = job.wait_exit(GRACE + Duration::from_secs(5));
    let took = start.elapsed();
    assert!(
        job.wait_gone(Duration::from_secs(2)).is_empty(),
        "{}",
        job.output()
    );
    assert_eq!(status.and_then(|s| s.signal()), Some(libc::SIGINT));
    assert!(took < GRACE - Duration::from_secs(1), "took {took:?}");
}
