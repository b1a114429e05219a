//! `accord run`: start a store, spawn N ranks with the rendezvous variables, prefix their output,
//! and stop everyone as soon as one rank fails.

use accord::auth::Token;
use accord::rendezvous::StoreServer;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

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

/// Signal received by the launcher (0 = none), forwarded to the ranks.
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
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

/// Copy `from` to our stdout or stderr line by line with a rank prefix.
fn pump(
    from: impl Read + Send + 'static,
    rank: usize,
    prefix: bool,
    to_err: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let mut out: Vec<u8> = Vec::with_capacity(line.len() + 8);
                    if prefix {
                        out.extend_from_slice(format!("[{rank}] ").as_bytes());
                    }
                    out.extend_from_slice(&line);
                    if !out.ends_with(b"\n") {
                        out.push(b'\n');
                    }
                    // One write per line keeps lines of different ranks from interleaving.
                    let _ = if to_err {
                        std::io::stderr().lock().write_all(&out)
                    } else {
                        std::io::stdout().lock().write_all(&out)
                    };
                }
            }
        }
    })
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
    let master_port = free_port().to_string();
    // SAFETY: the handler only stores into an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }

    let cpus = placement(job.bind, job.n);
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut pumps = Vec::new();
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
            .envs(job.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Each rank leads its own process group so a stop reaches its children too.
        cmd.process_group(0);
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
        match cmd.spawn() {
            Ok(mut c) => {
                pumps.push(pump(c.stdout.take().unwrap(), rank, job.prefix, false));
                pumps.push(pump(c.stderr.take().unwrap(), rank, job.prefix, true));
                children.push(Some(c));
            }
            Err(e) => {
                eprintln!(
                    "accord run: cannot start rank {rank} ({}): {e}",
                    job.program[0]
                );
                stop_all(&mut children);
                return 127;
            }
        }
    }

    let mut code = 0;
    let mut live = job.n;
    while live > 0 {
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            eprintln!("accord run: received signal {sig}, stopping all ranks");
            stop_all(&mut children);
            code = 128 + sig;
            break;
        }
        let mut progressed = false;
        for rank in 0..job.n {
            let Some(child) = children[rank].as_mut() else {
                continue;
            };
            match child.try_wait() {
                Ok(Some(status)) => {
                    children[rank] = None;
                    live -= 1;
                    progressed = true;
                    if !status.success() {
                        eprintln!(
                            "accord run: rank {rank} failed with {}; stopping the other {live} rank(s)",
                            describe(status)
                        );
                        stop_all(&mut children);
                        code = status
                            .code()
                            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
                        if code == 0 {
                            code = 1;
                        }
                        live = 0;
                        break;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("accord run: cannot wait for rank {rank}: {e}");
                }
            }
        }
        if !progressed {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    for p in pumps {
        let _ = p.join();
    }
    drop(server);
    code
}

/// Terminate every live rank: SIGTERM to its process group, SIGKILL after a grace period.
fn stop_all(children: &mut [Option<Child>]) {
    for c in children.iter().flatten() {
        // SAFETY: plain kill(2) on the child's process group.
        unsafe { libc::kill(-(c.id() as i32), libc::SIGTERM) };
    }
    let grace = Instant::now() + Duration::from_secs(3);
    for slot in children.iter_mut() {
        if let Some(c) = slot.as_mut() {
            loop {
                match c.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= grace => {
                        unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
                        let _ = c.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }
        *slot = None;
    }
}
