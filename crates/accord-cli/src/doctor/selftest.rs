//! Short real runs: `accord bench allreduce` on 2 local ranks over shared memory, over TCP,
//! and on GPU memory when there is a GPU. Each checks every result and is stopped at a
//! deadline, so a hang reads as a failure rather than a stuck doctor.

use super::report::{bytes, Check, Section, Status};
use serde_json::Value;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Deadline of each CPU run (two of them: about 10 s at most in all).
const CPU_BUDGET: Duration = Duration::from_secs(5);
/// Deadline of the GPU run: a first run compiles Accord's kernels and starts NCCL.
const GPU_BUDGET: Duration = Duration::from_secs(40);

/// What one run is.
struct Run {
    id: &'static str,
    name: &'static str,
    /// `ACCORD_TRANSPORT` for the ranks (`None`: unset).
    transport: Option<&'static str>,
    device: &'static str,
    budget: Duration,
    /// Whether the transport the ranks report is the one this run is about.
    expect: fn(&str) -> bool,
    /// How a failure counts.
    failure: Status,
}

/// `self_cmd` starts this command line again (see `main_with`); `gpus` visible devices.
pub fn section(self_cmd: &[String], gpus: usize, gpu_required: bool, skip: bool) -> Section {
    let mut checks = Vec::new();
    let runs = [
        Run {
            id: "shm",
            name: "2 ranks, shared memory",
            transport: None,
            device: "cpu",
            budget: CPU_BUDGET,
            expect: |t| t.starts_with("shm"),
            failure: Status::Fail,
        },
        Run {
            id: "tcp",
            name: "2 ranks, TCP",
            transport: Some("tcp"),
            device: "cpu",
            budget: CPU_BUDGET,
            expect: |t| t == "tcp",
            failure: Status::Fail,
        },
        Run {
            id: "gpu",
            name: "2 ranks, GPU",
            transport: None,
            device: "cuda",
            budget: GPU_BUDGET,
            expect: |t| t == "cuda",
            // A GPU is not needed for CPU runs unless asked for.
            failure: if gpu_required {
                Status::Fail
            } else {
                Status::Warn
            },
        },
    ];
    for run in &runs {
        let skipped = |why: String| Check::new(run.id, run.name, Status::Skipped, why);
        checks.push(if skip {
            skipped("not run (--no-selftest)".into())
        } else if run.id == "shm" && !accord::config::get().shm {
            skipped("ACCORD_TRANSPORT=tcp turns shared memory off".into())
        } else if run.device == "cuda" && gpus == 0 {
            skipped("no GPU (see above)".into())
        } else {
            execute(self_cmd, run)
        });
    }
    Section {
        id: "selftest",
        title: "Self-test",
        checks,
    }
}

fn execute(self_cmd: &[String], run: &Run) -> Check {
    let json = std::env::temp_dir().join(format!(
        "accord-doctor-{}-{}.json",
        std::process::id(),
        run.id
    ));
    let mut cmd = Command::new(&self_cmd[0]);
    cmd.args(&self_cmd[1..])
        .args([
            "bench",
            "allreduce",
            "-n",
            "2",
            "--sizes",
            "8:1M",
            "--factor",
            "32",
        ])
        .args(["--iters", "5", "--device", run.device, "--json"])
        .arg(&json)
        // The ranks' own deadline: a stuck rank says what it waited for before it is stopped.
        .env("ACCORD_TIMEOUT", run.budget.as_secs().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match run.transport {
        Some(t) => cmd.env("ACCORD_TRANSPORT", t),
        None => cmd.env_remove("ACCORD_TRANSPORT"),
    };
    let start = Instant::now();
    let outcome = match cmd.spawn() {
        Ok(child) => wait(child, run.budget),
        Err(e) => Err(format!("cannot start {}: {e}", self_cmd[0])),
    };
    let secs = start.elapsed().as_secs_f64();
    let doc = std::fs::read_to_string(&json)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok());
    let _ = std::fs::remove_file(&json);
    let fail = |why: String| {
        Check::new(run.id, run.name, run.failure, why)
            .fact("passed", false)
            .fact("seconds", secs)
    };
    if let Err(e) = outcome {
        return fail(e);
    }
    let Some(doc) = doc else {
        return fail(format!("the run wrote no readable {}", json.display()));
    };
    let transport = doc["transport"].as_str().unwrap_or_default().to_string();
    if !(run.expect)(&transport) {
        return fail(format!(
            "the ranks ran over {transport:?}, not what was asked"
        ));
    }
    let rows = doc["rows"].as_array().cloned().unwrap_or_default();
    let wrong: u64 = rows.iter().filter_map(|r| r["wrong"].as_u64()).sum();
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return fail("the run reported no rows".into());
    };
    if wrong > 0 {
        return fail(format!("{wrong} wrong result element(s)"));
    }
    let size = |r: &Value| bytes(r["bytes"].as_u64().unwrap_or(0));
    Check::new(
        run.id,
        run.name,
        Status::Ok,
        format!(
            "allreduce {} to {} right over {transport} in {secs:.1} s; {} in {:.1} us, {} at \
             {:.2} GB/s bus bandwidth",
            size(first),
            size(last),
            size(first),
            first["time_us"].as_f64().unwrap_or(0.0),
            size(last),
            last["busbw_gbps"].as_f64().unwrap_or(0.0),
        ),
    )
    .fact("passed", true)
    .fact("seconds", secs)
    .fact("transport", transport)
    .fact("rows", rows)
}

/// Wait for `child` until `budget` has passed, then stop it (SIGTERM, which the launcher
/// passes on to its ranks; SIGKILL two seconds later). `Err` says how it failed, with the
/// end of its output.
fn wait(mut child: Child, budget: Duration) -> Result<(), String> {
    let drain = |p: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut p) = p {
                let _ = p.read_to_string(&mut s);
            }
            s
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + budget;
    let mut stopped = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) if !stopped => {
                // SAFETY: signalling our own child, which has not been reaped.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
                stopped = true;
            }
            Ok(None) if Instant::now() < deadline + Duration::from_secs(2) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            _ => {
                let _ = child.kill();
                break child.wait().ok();
            }
        }
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    let tail: Vec<&str> = err
        .lines()
        .chain(out.lines())
        .filter(|l| !l.is_empty())
        .collect();
    let tail = tail[tail.len().saturating_sub(3)..].join(" | ");
    match status {
        _ if stopped => Err(format!(
            "did not finish within {} s and was stopped{}",
            budget.as_secs(),
            if tail.is_empty() {
                String::new()
            } else {
                format!(": {tail}")
            }
        )),
        Some(s) if s.success() => Ok(()),
        Some(s) => Err(format!("{}: {tail}", crate::launch::describe(s))),
        None => Err("cannot wait for the run".into()),
    }
}
