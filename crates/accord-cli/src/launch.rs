//! `accord run`: start a store, spawn N ranks with the rendezvous variables, prefix their output,
//! and stop everyone as soon as one rank fails.
//!
//! Each rank leads its own process group, and when the job ends, fails or is interrupted, the
//! launcher stops every rank's whole group (the rank and the children it forked): the signal
//! it received, or SIGTERM, then SIGKILL after a grace period or on a second signal. SIGINT, SIGTERM and SIGHUP to the
//! launcher are passed on to every group and, once the ranks are stopped, raised again so the
//! launcher ends as signalled. Ranks die with the launcher even when it is killed outright: each
//! has SIGKILL as its parent-death signal, and a watchdog process kills their groups.

mod guard;
mod output;
mod rank;
mod signals;

use accord::auth::Token;
use accord::rendezvous::{init::INIT_PREFIX, mark_exited, StoreClient, StoreServer};
use guard::Guard;
use output::Output;
use rank::Rank;
use signals::Handlers;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

/// What to launch.
pub struct Launch {
    /// Number of ranks.
    pub n: usize,
    /// Program and its arguments.
    pub program: Vec<String>,
    /// Extra environment for every rank.
    pub env: Vec<(String, String)>,
    /// Prefix each output line with `[rank] `.
    pub prefix: bool,
    /// Which CPUs each rank may run on.
    pub bind: Binding,
}

/// CPU binding of the ranks, as `mpirun --bind-to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Binding {
    /// `cpu` when the ranks fill or outnumber the CPUs, else `none`.
    Auto,
    /// Each rank on one logical CPU, spread evenly over the CPUs the launcher may use (rank `r`
    /// of `n` on the `r * k / n`-th of `k`). On SMT hosts two ranks may share a physical core.
    Cpu,
    /// No binding: the scheduler places the ranks.
    None,
}

/// The CPU for each rank, or `None` for no binding. When ranks fill or outnumber the CPUs,
/// ranks left to the scheduler sometimes share a core while another is idle, and every
/// collective then waits for the crowded core (4 ranks on 2 cores ran 3:1 at times: 10 us
/// instead of 6.5-7 us per small allgather; 2 unbound ranks on 2 cores, in one run of three,
/// shared a core and every small allgather took 105 us instead of 0.2). Spreading them evenly
/// fixes that, and with as many ranks as CPUs gives each its own core (as mpirun binds two
/// ranks); with fewer ranks than CPUs the scheduler has room, and multithreaded ranks keep it.
/// `--bind-to none` leaves placement to the scheduler.
fn placement(bind: Binding, n: usize) -> Option<Vec<usize>> {
    let cpus = accord::transport::cpus::allowed();
    let on = match bind {
        Binding::Cpu => true,
        Binding::Auto => n >= cpus.len(),
        Binding::None => false,
    };
    if on && cpus.is_empty() {
        eprintln!("accord run: cannot read this process's CPU affinity; ranks are not bound");
    }
    (on && !cpus.is_empty()).then(|| (0..n).map(|r| cpus[r * cpus.len() / n]).collect())
}

/// How a rank ended, in words: `exit status 3`, `signal 9 (SIGKILL)`.
pub fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit status {code}");
    }
    match status.signal() {
        Some(sig) => {
            // SAFETY: strsignal returns a pointer to a static (or thread-local) string.
            let name = unsafe { std::ffi::CStr::from_ptr(libc::strsignal(sig)) };
            format!("signal {sig} ({})", name.to_string_lossy())
        }
        None => "an unknown status".into(),
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(29500)
}

/// Run the job; returns the launcher's exit code.
pub fn run(job: Launch) -> i32 {
    if job.n == 0 || job.program.is_empty() {
        eprintln!("accord run: need -n N >= 1 and a program to run");
        return 2;
    }
    let token = Token::random();
    let server = match StoreServer::bind("127.0.0.1:0", token.clone()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("accord run: cannot start the rendezvous store: {e}");
            return 1;
        }
    };
    let store = server.addr().to_string();
    // Ranks still joining learn at once when a rank's process ends before it joined (they
    // register under ACCORD_STORE_PREFIX where the launcher's environment sets it).
    let prefix = std::env::var("ACCORD_STORE_PREFIX")
        .map(|p| p.trim().to_string())
        .unwrap_or_else(|_| INIT_PREFIX.to_string());
    let joining = StoreClient::connect(&store, &token, Duration::from_secs(5))
        .map(|c| c.with_prefix(&prefix))
        .ok();
    let master_port = free_port().to_string();
    // Names this job's flight records (see `accord::observe`).
    let job_id = match std::env::var("ACCORD_JOB_ID") {
        Ok(j) if !j.trim().is_empty() => j,
        _ => format!(
            "run{}-{}",
            std::process::id(),
            store.replace([':', '.'], "-")
        ),
    };
    let signals = Handlers::install();
    let _subreaper = rank::adopt_orphans();
    let guard = Guard::start(job.n)
        .map_err(|e| {
            eprintln!(
                "accord run: cannot start the watchdog ({e}); if the launcher is killed, \
                 children that ranks forked may outlive it"
            )
        })
        .ok();

    let cpus = placement(job.bind, job.n);
    let mut ranks: Vec<Rank> = Vec::with_capacity(job.n);
    let mut output = Output::new(job.prefix);
    let mut ending = None;
    for rank in 0..job.n {
        let mut cmd = Command::new(&job.program[0]);
        cmd.args(&job.program[1..])
            .env("ACCORD_RANK", rank.to_string())
            .env("ACCORD_WORLD_SIZE", job.n.to_string())
            .env("ACCORD_LOCAL_RANK", rank.to_string())
            .env("ACCORD_LOCAL_WORLD_SIZE", job.n.to_string())
            .env("ACCORD_STORE", &store)
            .env("ACCORD_STORE_EXTERNAL", "1")
            .env("ACCORD_TOKEN", token.as_str())
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", job.n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", job.n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", &master_port)
            .env("ACCORD_JOB_ID", &job_id)
            .envs(job.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(cpus) = &cpus {
            // Just long enough for this CPU's bit; the kernel reads the rest as clear.
            let mut mask = vec![0u64; cpus[rank] / 64 + 1];
            mask[cpus[rank] / 64] |= 1 << (cpus[rank] % 64);
            let bytes = mask.len() * 8;
            // SAFETY: between fork and exec the closure makes one system call on memory
            // prepared before the fork. Best effort: a rank that cannot be bound runs unbound.
            unsafe {
                cmd.pre_exec(move || {
                    libc::syscall(libc::SYS_sched_setaffinity, 0, bytes, mask.as_ptr());
                    Ok(())
                });
            }
        }
        match Rank::spawn(rank, cmd, guard.as_ref()) {
            Ok(mut r) => {
                output.pump(rank, r.take_stdout(), false);
                output.pump(rank, r.take_stderr(), true);
                ranks.push(r);
            }
            Err(e) => {
                eprintln!(
                    "accord run: cannot start rank {rank} ({}): {e}",
                    job.program[0]
                );
                ending = Some(Ending::Failed(127));
                break;
            }
        }
    }
    let ending = ending.unwrap_or_else(|| supervise(&mut ranks, &signals, joining.as_ref()));
    if let Ending::Failed(_) = ending {
        collect_flight_records(&mut ranks, &job_id);
    }

    // Whatever the ending, stop what is left of every rank's group: the ranks still running,
    // and the children of the ranks that exited.
    let sig = match ending {
        Ending::Signalled(sig) => sig,
        _ => libc::SIGTERM,
    };
    let mut again = None;
    rank::stop_all(&mut ranks, sig, guard.as_ref(), || {
        again = again.or(signals.take());
        again.is_some()
    });
    if let Some(g) = guard {
        g.dismiss();
    }
    for rank in output.finish(DRAIN) {
        eprintln!(
            "accord run: rank {rank}'s output is still held open by a process outside its \
             process group; not waiting for it"
        );
    }
    drop(server);
    match (ending, again.or(signals.take())) {
        (Ending::Signalled(sig), _) | (_, Some(sig)) => signals.reraise(sig),
        (Ending::Done, None) => 0,
        (Ending::Failed(code), None) => code,
    }
}

/// After a rank failed: ask the ranks still running for their flight records (the others
/// wrote theirs when they failed or heard of the failure), give them a moment, and say where
/// the records are.
fn collect_flight_records(ranks: &mut [Rank], job_id: &str) {
    if accord::observe::entries() == 0 {
        return;
    }
    for r in ranks.iter_mut() {
        r.ask_for_record();
    }
    let dir = accord::observe::flight_dir();
    let job = accord::observe::job_id_of(job_id);
    let prefix = format!("accord-flight-{job}-rank");
    let written = || {
        std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                    .count()
            })
            .unwrap_or(0)
    };
    // Until every rank's record is there (a busy machine may take a while to schedule the
    // ranks' dumps), or a bounded time: a rank that cannot write one must not hold the job.
    let until = std::time::Instant::now() + RECORD_WAIT;
    let mut count = written();
    while count < ranks.len() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
        count = written();
    }
    if count > 0 {
        eprintln!(
            "accord run: flight records of {count} rank(s) are in {}; `accord analyze {} --job \
             {job}` says which rank is behind and who waited for whom",
            dir.display(),
            dir.display()
        );
    }
}

/// How long a failed job's ranks get to write their flight records before they are stopped.
const RECORD_WAIT: Duration = Duration::from_secs(2);

/// How long the launcher waits for the ranks' output pipes to close once every rank's process
/// group is stopped; only a process that left its rank's group can still hold them.
const DRAIN: Duration = Duration::from_secs(1);

/// How a job ended.
#[derive(Clone, Copy)]
enum Ending {
    /// Every rank exited successfully.
    Done,
    /// A rank failed (or could not start); the launcher's exit code.
    Failed(i32),
    /// The launcher received this signal.
    Signalled(libc::c_int),
}

/// Wait until every rank has exited, one fails, or the launcher receives a signal. Each rank that
/// exits is recorded in the init namespace `joining`, for the ranks still joining.
fn supervise(ranks: &mut [Rank], signals: &Handlers, joining: Option<&StoreClient>) -> Ending {
    let mut live = ranks.len();
    while live > 0 {
        if let Some(sig) = signals.take() {
            eprintln!(
                "accord run: received {}, passing it on to all ranks",
                signals::name(sig)
            );
            return Ending::Signalled(sig);
        }
        let mut progressed = false;
        for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
            match r.exited() {
                Ok(Some(status)) => {
                    if let Some(ns) = joining {
                        let _ = mark_exited(ns, r.rank, &describe(status));
                    }
                    live -= 1;
                    progressed = true;
                    if !status.success() {
                        let others = match live {
                            0 => String::new(),
                            n => format!("; stopping the other {n} rank(s)"),
                        };
                        eprintln!(
                            "accord run: rank {} failed with {}{others}",
                            r.rank,
                            describe(status)
                        );
                        let code = status
                            .code()
                            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
                        return Ending::Failed(if code == 0 { 1 } else { code });
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("accord run: cannot wait for rank {}: {e}", r.rank);
                    return Ending::Failed(1);
                }
            }
        }
        if !progressed {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ending::Done
}
