//! A rank's process and its process group: started so that it dies with the launcher, and
//! stopped as a whole group, children included.

use super::guard::Guard;
use super::signals;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// How long a rank has between the signal that stops it and SIGKILL.
pub const GRACE: Duration = Duration::from_secs(3);

/// How long to wait for a SIGKILLed group to go: only a process stuck in the kernel stays.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// One rank: the process the launcher started, which leads a process group of its own.
pub struct Rank {
    pub rank: usize,
    child: Child,
    /// How the rank process ended, once reaped.
    pub status: Option<ExitStatus>,
    /// No process of the group is left (or none the launcher may signal).
    gone: bool,
}

impl Rank {
    /// Ask the rank's process, if it still runs, to write its flight record (`SIGUSR1`, see
    /// `accord::observe`).
    pub fn ask_for_record(&mut self) {
        if self.status.is_none() && matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: signals a child this launcher started and has not reaped.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGUSR1) };
        }
    }

    /// Start `cmd` as rank `rank`, leading its own process group (so that stopping the group
    /// reaches the children it forks) and with SIGKILL as its parent-death signal.
    ///
    /// The parent-death signal fires when the thread that forked the rank exits, which is the
    /// thread that runs the job and waits for it; it survives the rank's exec, but not the exec
    /// of a set-user-ID program, and the rank's children do not inherit it. The watchdog
    /// (`guard`) covers those; the rank enrols its group there before it execs.
    pub fn spawn(rank: usize, mut cmd: Command, guard: Option<&Guard>) -> io::Result<Rank> {
        // SAFETY: getpid(2).
        let launcher = unsafe { libc::getpid() };
        let enrol = guard.map(Guard::enrol);
        cmd.process_group(0);
        // SAFETY: between fork and exec the closure makes only system calls and builds an error
        // from an errno value; nothing allocates.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // A launcher that died before the prctl above sends no signal; the rank has
                // then been reparented already.
                if libc::getppid() != launcher {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                if let Some(e) = enrol {
                    e.own_group();
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        Ok(Rank {
            rank,
            child,
            status: None,
            gone: false,
        })
    }

    /// The rank's process group id (its pid: it leads the group).
    pub fn pgid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    /// The read end of the rank's stdout pipe.
    pub fn take_stdout(&mut self) -> std::process::ChildStdout {
        self.child
            .stdout
            .take()
            .expect("rank spawned with piped stdout")
    }

    /// The read end of the rank's stderr pipe.
    pub fn take_stderr(&mut self) -> std::process::ChildStderr {
        self.child
            .stderr
            .take()
            .expect("rank spawned with piped stderr")
    }

    /// How the rank process ended, if it has; reaps it.
    pub fn exited(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self.child.try_wait()?;
        }
        Ok(self.status)
    }

    /// Whether the group still has a process: the rank itself, or a child it left.
    fn settle(&mut self, guard: Option<&Guard>) -> bool {
        if self.gone {
            return false;
        }
        match self.exited() {
            Ok(None) => return true,
            Ok(Some(_)) => {}
            // Not ours to wait for (an embedding program reaped it): judge by the group alone.
            Err(_) => {}
        }
        // The launcher is a child subreaper: the group's orphans are its children. Reap the
        // dead ones, or they would count as members for ever. The rank itself, reaped above,
        // is not among them, so its status stays the launcher's to read.
        loop {
            // SAFETY: waitid(2) into a zeroed siginfo_t.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let rc = unsafe {
                libc::waitid(
                    libc::P_PGID,
                    self.pgid() as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG,
                )
            };
            // SAFETY: si_pid is valid for the child-state siginfo waitid fills (0: none ready).
            if rc != 0 || unsafe { info.si_pid() } == 0 {
                break;
            }
        }
        // SAFETY: kill(2) with signal 0 only checks. Once the leader is reaped, the group's id
        // stays reserved while any member lives, so this names the rank's group.
        let live = unsafe { libc::kill(-self.pgid(), 0) } == 0;
        // ESRCH: empty. EPERM: what is left changed user and is out of the launcher's reach.
        if !live {
            self.gone = true;
            if let Some(g) = guard {
                g.forget(self.pgid());
            }
        }
        live
    }

    fn signal_group(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on the rank's group, which `settle` has not found empty.
        unsafe { libc::kill(-self.pgid(), sig) };
    }
}

/// Stop every rank's process group: `sig` (SIGTERM, or the signal the launcher received), then
/// SIGKILL for the groups still there after [`GRACE`], or at once when `hurry` says so (a second
/// signal to the launcher). Bounded: a group that survives SIGKILL is reported and left.
pub fn stop_all(
    ranks: &mut [Rank],
    sig: libc::c_int,
    guard: Option<&Guard>,
    mut hurry: impl FnMut() -> bool,
) {
    for r in ranks.iter_mut() {
        if r.settle(guard) {
            if r.status.is_some() {
                eprintln!(
                    "accord run: rank {} exited, but left processes in its process group; \
                     sending them {}",
                    r.rank,
                    signals::name(sig)
                );
            }
            r.signal_group(sig);
        }
    }
    let deadline = Instant::now() + GRACE;
    while settle_all(ranks, guard) {
        if Instant::now() >= deadline || hurry() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for r in ranks.iter_mut().filter(|r| !r.gone) {
        let what = if r.status.is_none() {
            "is still running"
        } else {
            "exited, but its process group is still running"
        };
        eprintln!(
            "accord run: rank {} {what} {} s after {}; sending SIGKILL to its process group",
            r.rank,
            GRACE.as_secs(),
            signals::name(sig)
        );
        r.signal_group(libc::SIGKILL);
    }
    let deadline = Instant::now() + KILL_WAIT;
    while settle_all(ranks, guard) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    for r in ranks.iter().filter(|r| !r.gone) {
        eprintln!(
            "accord run: rank {}'s process group survived SIGKILL for {KILL_WAIT:?}; leaving it",
            r.rank
        );
    }
}

/// Settle every rank; whether any group still has a process.
fn settle_all(ranks: &mut [Rank], guard: Option<&Guard>) -> bool {
    let mut live = false;
    for r in ranks.iter_mut() {
        live |= r.settle(guard); // every rank, not just up to the first live one
    }
    live
}

/// Make the launcher a child subreaper, so that the children a rank leaves behind come to the
/// launcher when the rank exits, rather than to init, which in many containers never reaps them
/// (a zombie keeps its group alive to `kill`). Returns a guard that clears it again.
pub fn adopt_orphans() -> impl Drop {
    // SAFETY: prctl(2) on this process's own attribute.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            // SAFETY: as above.
            unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 0) };
        }
    }
    Clear
}
