//! `accord doctor` as a user runs it: the built binary, its exit code, its report and its JSON.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

fn doctor(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_accord"));
    c.arg("doctor")
        .args(args)
        .env_remove("ACCORD_TOKEN")
        .env_remove("ACCORD_TOKEN_FILE")
        .env_remove("ACCORD_TRANSPORT");
    c
}

fn run(c: &mut Command) -> (Output, String, String) {
    let out = c.output().expect("accord doctor runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (_, stdout, stderr) = run(&mut doctor(&all));
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

fn have_gpu_driver() -> bool {
    json(&["--no-selftest"])["sections"]["gpu"]["cuda_driver"]["found"] == true
}

#[test]
fn this_host_is_ready_for_cpu_runs_and_the_self_test_passes() {
    let (out, stdout, stderr) = run(&mut doctor(&[]));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Ready for CPU runs of 8 ranks"), "{stdout}");
    for line in ["2 ranks, shared memory", "2 ranks, TCP"] {
        let l = stdout
            .lines()
            .find(|l| l.contains(line))
            .unwrap_or_default();
        assert!(
            l.trim_start().starts_with("ok") && l.contains("right"),
            "{stdout}"
        );
    }
    if !have_gpu_driver() {
        assert!(
            stdout.contains("no GPU: CUDA driver library not found"),
            "{stdout}"
        );
        assert!(stdout.contains("2 ranks, GPU") && stdout.contains("no GPU (see above)"));
    }
}

#[test]
fn json_has_every_section_and_a_schema_version() {
    let j = json(&["-n", "4"]);
    assert_eq!(j["schema"], 1);
    assert_eq!(j["command"], "doctor");
    assert_eq!(j["ok"], true, "{j:#}");
    assert_eq!(j["np"], 4);
    assert_eq!(j["failures"].as_array().map(Vec::len), Some(0));
    let s = &j["sections"];
    for (section, check) in [
        ("transports", "shared_memory"),
        ("transports", "dev_shm"),
        ("transports", "tcp_loopback"),
        ("resources", "cpus"),
        ("resources", "memory"),
        ("resources", "open_files"),
        ("token", "token"),
        ("gpu", "cuda_driver"),
        ("gpu", "nccl"),
        ("selftest", "shm"),
        ("selftest", "tcp"),
        ("selftest", "gpu"),
    ] {
        let c = &s[section][check];
        assert!(
            c["status"].is_string() && c["summary"].is_string(),
            "{section}.{check}: {j:#}"
        );
    }
    assert_eq!(s["transports"]["tcp_loopback"]["usable"], true);
    assert_eq!(s["selftest"]["tcp"]["passed"], true);
    assert_eq!(s["selftest"]["tcp"]["transport"], "tcp");
    assert!(s["resources"]["open_files"]["needed"].as_u64().unwrap() > 4);
    if !have_gpu_driver() {
        assert_eq!(s["gpu"]["cuda_driver"]["status"], "info");
        assert_eq!(s["selftest"]["gpu"]["status"], "skip");
    }
}

#[test]
fn gpu_required_fails_without_a_gpu_and_names_it() {
    if have_gpu_driver() {
        eprintln!("skipped: this machine has a CUDA driver");
        return;
    }
    let (out, stdout, stderr) = run(&mut doctor(&["--gpu", "--no-selftest"]));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("CUDA driver: no GPU: CUDA driver library not found"),
        "{stderr}"
    );
    assert!(stdout.contains("Not ready"), "{stdout}");
}

#[test]
fn a_token_file_that_cannot_be_read_fails_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("accord-doctor-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("no-such-token");
    let open = dir.join("open-token");
    std::fs::write(&open, "s3cret-token-value").unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    for (path, why) in [(&missing, "cannot open"), (&open, "too open")] {
        let (out, stdout, stderr) = run(doctor(&["--no-selftest"]).env("ACCORD_TOKEN_FILE", path));
        assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
        let named = format!("ACCORD_TOKEN_FILE={}", path.display());
        assert!(stderr.contains(&named) && stderr.contains(why), "{stderr}");
        assert!(!stdout.contains("s3cret") && !stderr.contains("s3cret"));
    }
    // A readable, owner-only file passes.
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (out, stdout, _) = run(doctor(&["--no-selftest"]).env("ACCORD_TOKEN_FILE", &open));
    assert!(out.status.success(), "{stdout}");
    assert!(!stdout.contains("s3cret"), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_open_file_limit_too_low_for_the_world_fails() {
    let mut c = doctor(&["--no-selftest", "-n", "100"]);
    // SAFETY: one system call between fork and exec on a local struct.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 128,
                rlim_max: 128,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            Ok(())
        });
    }
    let (out, stdout, stderr) = run(&mut c);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("open files: soft limit 128") && stderr.contains("100 ranks need"),
        "{stderr}"
    );
    assert!(
        stdout.contains("ask for a higher `nofile` limit"),
        "{stdout}"
    );
}
