//! Ranks as separate processes over TCP on loopback: through `accord run`, and started by hand
//! with the environment a launcher would set (to watch the ranks' own failure detection without
//! the launcher stopping them first).

mod common;

use common::{accord, rank_check, text};
use std::ffi::OsStr;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start `n` rank processes of `rank_check MODE` by hand; `env(rank)` adds variables.
fn spawn_world(n: usize, mode: &str, env: impl Fn(usize) -> Vec<(String, String)>) -> Vec<Output> {
    spawn_world_with(n, mode, |r, c| {
        c.envs(env(r));
    })
}

/// [`spawn_world`], with `set(rank, command)` adding to each rank's command.
fn spawn_world_with(n: usize, mode: &str, set: impl Fn(usize, &mut Command)) -> Vec<Output> {
    let store = format!("127.0.0.1:{}", free_port());
    let children: Vec<_> = (0..n)
        .map(|r| {
            let mut c = Command::new(rank_check());
            c.arg(mode)
                .env("ACCORD_RANK", r.to_string())
                .env("ACCORD_WORLD_SIZE", n.to_string())
                .env("ACCORD_STORE", &store)
                .env("ACCORD_TOKEN", "test-token")
                .env("ACCORD_HOST", "127.0.0.1")
                .env("ACCORD_TIMEOUT", "30")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            set(r, &mut c);
            c.spawn().unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

/// `accord run -n N rank_check ops` for several N; `transport` is `ACCORD_TRANSPORT`.
fn every_operation(transport: &str, expect: &str) {
    for n in [1, 2, 3, 4, 5, 7] {
        let out = accord()
            .args(["run", "-n", &n.to_string()])
            .arg(rank_check())
            .arg("ops")
            .env("ACCORD_TRANSPORT", transport)
            .output()
            .unwrap();
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "n={n}: {stdout}\n{}",
            text(&out.stderr)
        );
        for r in 0..n {
            assert!(
                stdout.contains(&format!("[{r}] ok: ")),
                "n={n}: rank {r} missing in\n{stdout}"
            );
        }
        if n > 1 {
            assert!(
                stdout.contains(expect),
                "n={n}: expected {expect:?} in\n{stdout}"
            );
        }
    }
}

#[test]
fn every_operation_through_the_launcher() {
    every_operation("auto", "over shm with shared-memory collectives");
}

#[test]
fn every_operation_over_tcp_only() {
    every_operation("tcp", "ranks over tcp\n");
}

#[test]
fn launcher_names_the_failed_rank_and_stops_the_others() {
    let start = Instant::now();
    let out = accord()
        .args(["run", "-n", "3", "--", "sh", "-c"])
        .arg(r#"echo hello; if [ "$ACCORD_RANK" = 1 ]; then exit 7; fi; sleep 60"#)
        .output()
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(out.status.code(), Some(7));
    let err = text(&out.stderr);
    assert!(err.contains("rank 1 failed with exit status 7"), "{err}");
    // The failed rank's output is complete; the others may be stopped before they print.
    let stdout = text(&out.stdout);
    assert!(stdout.contains("[1] hello"), "{stdout}");
}

#[test]
fn launcher_reports_a_signal() {
    let out = accord()
        .args(["run", "-n", "2", "--", "sh", "-c"])
        .arg(r#"if [ "$ACCORD_RANK" = 0 ]; then kill -9 $$; fi; sleep 60"#)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("rank 0 failed with signal 9"), "{err}");
}

#[test]
fn launcher_passes_rendezvous_variables() {
    let out = accord()
        .args(["run", "-n", "2", "--", "sh", "-c"])
        .arg(r#"echo "r=$ACCORD_RANK/$ACCORD_WORLD_SIZE t=$RANK/$WORLD_SIZE l=$LOCAL_RANK tok=${#ACCORD_TOKEN} store=${ACCORD_STORE%:*}""#)
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("[1] r=1/2 t=1/2 l=1 tok=64 store=127.0.0.1"),
        "{stdout}"
    );
    assert!(stdout.contains("[0] r=0/2 t=0/2 l=0 tok=64"), "{stdout}");
}

#[test]
fn a_killed_rank_is_named_by_every_survivor_promptly() {
    let start = Instant::now();
    let outs = spawn_world(4, "loop", |_| {
        vec![("ACCORD_CHECK_KILL".into(), "2".into())]
    });
    assert!(
        start.elapsed() < Duration::from_secs(25),
        "took {:?}",
        start.elapsed()
    );
    for (r, o) in outs.iter().enumerate() {
        if r == 2 {
            assert!(!o.status.success());
            continue;
        }
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "rank {r}: {err}");
        assert!(err.contains("rank 2"), "rank {r}: {err}");
    }
}

#[test]
fn a_missing_rank_is_named_by_the_timeout() {
    let outs = spawn_world(3, "skip", |_| {
        vec![
            ("ACCORD_CHECK_SKIP".into(), "2".into()),
            ("ACCORD_TIMEOUT".into(), "2".into()),
        ]
    });
    for (r, out) in outs.iter().enumerate().take(2) {
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "rank {r}: {err}");
        assert!(
            err.contains("allreduce(f32 x 16, sum)") && err.contains("rank(s) 2"),
            "rank {r}: {err}"
        );
    }
}

#[test]
fn a_rank_with_the_wrong_token_is_refused() {
    let outs = spawn_world(3, "ops", |r| {
        let mut v = vec![("ACCORD_TIMEOUT".into(), "4".into())];
        if r == 1 {
            v.push(("ACCORD_TOKEN".into(), "not-the-token".into()));
        }
        v
    });
    let err = text(&outs[1].stderr);
    assert_eq!(outs[1].status.code(), Some(2), "{err}");
    assert!(
        err.contains("unauthorized") && err.contains("token"),
        "{err}"
    );
    for r in [0, 2] {
        assert!(
            !outs[r].status.success(),
            "rank {r} must not form a world without rank 1"
        );
    }
}

#[test]
fn a_setting_that_must_be_alike_set_otherwise_on_one_rank_fails_every_rank() {
    // A path across hosts, the layout of a shared-memory broadcast's slots (which gave a
    // reader with larger slots than the root stale bytes), and an algorithm (each stripe
    // between hosts would agree with itself and end with other results than the others).
    for (var, shown, default, other, said) in [
        ("ACCORD_HIER_STRIPE_BYTES", "", "65536", "1048576", ""),
        ("ACCORD_SHM_SLOT_BYTES", "", "65536", "131072", ""),
        (
            "ACCORD_ALGO_ALLREDUCE",
            "ACCORD_ALGO_<OP>",
            "none",
            "ring",
            "allreduce=ring",
        ),
    ] {
        let outs = spawn_world(3, "ops", |r| match r {
            1 => vec![(var.into(), other.into())],
            _ => vec![],
        });
        let (shown, said) = match shown {
            "" => (var, other),
            _ => (shown, said),
        };
        for (r, o) in outs.iter().enumerate() {
            let err = text(&o.stderr);
            assert!(!o.status.success(), "{var}, rank {r}: {err}");
            assert!(
                err.contains(&format!(
                    "{shown} is {default} on rank 0 and {said} on rank 1"
                )),
                "{var}, rank {r}: {err}"
            );
        }
    }
}

/// `ACCORD_TUNER_PROFILE` steers the tuner's choices, which must match on every rank: ranks
/// compare the costs read from it (one rank with a profile fails every rank, naming it), start
/// when all read the same, and all fail naming the file when none can read it.
#[test]
fn ranks_share_the_tuners_calibrated_costs() {
    let profile = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/results/profile_16cpu_vm_m4_ns.json"
    );
    let costs = accord::schedule::calibrated::Calibrated::load(profile)
        .unwrap()
        .describe();
    let set = |p: &str| vec![("ACCORD_TUNER_PROFILE".to_string(), p.to_string())];
    let outs = spawn_world(3, "ops", |r| match r {
        1 => set(profile),
        _ => vec![],
    });
    for (r, o) in outs.iter().enumerate() {
        let err = text(&o.stderr);
        assert!(!o.status.success(), "rank {r}: {err}");
        let want = format!("ACCORD_TUNER_PROFILE is none on rank 0 and {costs} on rank 1");
        assert!(err.contains(&want), "rank {r}: {err}");
    }
    // Alike, they start, and their schedules are chosen with the profile's costs (its TCP
    // alpha, 8.5635 us, where the built-in model says 25).
    let outs = spawn_world(3, "ops", |_| {
        let mut env = set(profile);
        env.push(("ACCORD_TRANSPORT".into(), "tcp".into()));
        env.push(("ACCORD_EXPLAIN".into(), "1".into()));
        env
    });
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r}: {}", text(&o.stderr));
    }
    let explained = text(&outs[0].stderr);
    assert!(explained.contains("(alpha 8.5635 us, "), "{explained}");
    assert!(!explained.contains("(alpha 25 us, "), "{explained}");
    let outs = spawn_world(3, "ops", |_| set("/nonexistent/profile.json"));
    for (r, o) in outs.iter().enumerate() {
        let err = text(&o.stderr);
        assert!(!o.status.success(), "rank {r}: {err}");
        let want = "ACCORD_TUNER_PROFILE: /nonexistent/profile.json: ";
        assert!(err.contains(want), "rank {r}: {err}");
    }
    // A path that is not UTF-8 is not taken for an unset variable.
    use std::os::unix::ffi::OsStrExt;
    let odd = OsStr::from_bytes(b"/tmp/\xffprofile.json");
    let outs = spawn_world_with(3, "ops", |_, c| {
        c.env("ACCORD_TUNER_PROFILE", odd);
    });
    for (r, o) in outs.iter().enumerate() {
        let err = text(&o.stderr);
        assert!(!o.status.success(), "rank {r}: {err}");
        let want = "ACCORD_TUNER_PROFILE: /tmp/\u{fffd}profile.json is not valid UTF-8";
        assert!(err.contains(want), "rank {r}: {err}");
    }
}

#[test]
fn tcp_connections_busy_poll_where_asked() {
    // Every rank sets SO_BUSY_POLL on its connections and runs as before; where the kernel
    // refuses it (to processes without CAP_NET_ADMIN on some kernels, or without busy polling
    // built in), every rank fails to start, naming the variable.
    let outs = spawn_world(3, "ops", |_| {
        vec![
            ("ACCORD_TCP_BUSY_POLL_US".to_string(), "50".to_string()),
            ("ACCORD_TRANSPORT".into(), "tcp".into()),
        ]
    });
    for (r, o) in outs.iter().enumerate() {
        let err = text(&o.stderr);
        let named = err.contains("ACCORD_TCP_BUSY_POLL_US=50: setting SO_BUSY_POLL failed");
        assert!(o.status.success() || named, "rank {r}: {err}");
    }
}

#[test]
fn different_calls_are_a_desync_on_every_rank() {
    let outs = spawn_world(3, "desync", |_| vec![]);
    for (r, o) in outs.iter().enumerate() {
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "rank {r}: {err}");
        assert!(
            err.contains("broadcast(f32 x 1024, root 0)")
                && err.contains("allreduce(f32 x 1024, sum)"),
            "rank {r}: {err}"
        );
    }
}

/// `accord bench ARGS`, which must succeed; its standard output.
fn bench_succeeds(args: &[&str]) -> String {
    let out = accord().arg("bench").args(args).output().unwrap();
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {stdout}\n{}",
        args[0],
        text(&out.stderr)
    );
    stdout
}

#[test]
fn bench_distributed_arrays_checks_before_timing() {
    for (op, want) in [("fft", "round trip error"), ("redistribute", "fraction")] {
        let stdout = bench_succeeds(&[
            op, "-n", "3", "--shape", "7,6,5", "--dtype", "c64", "--iters", "2",
        ]);
        assert!(stdout.contains(want), "{op}: {stdout}");
    }
    let out = accord()
        .args(["bench", "fft", "-n", "2", "--shape", "4,x", "--iters", "1"])
        .output()
        .unwrap();
    assert!(
        !out.status.success() && text(&out.stderr).contains("--shape"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bench_checks_every_operation() {
    // put measures GPU channels only (see bench_put_has_only_a_gpu_form); fft and redistribute
    // take a shape, not sizes (bench_distributed_arrays_checks_before_timing).
    let sized = |op: &&&str| !matches!(**op, "put" | "fft" | "redistribute");
    for &op in accord_cli::OPS.iter().filter(sized) {
        let stdout = bench_succeeds(&[
            op, "-n", "3", "--sizes", "4:64K", "--factor", "16", "--iters", "5",
        ]);
        let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#')).collect();
        assert!(!rows.is_empty(), "{op}: {stdout}");
        for row in rows {
            assert_eq!(
                row.split_whitespace().last(),
                Some("0"),
                "{op}: wrong results in {row}"
            );
        }
    }
}

#[test]
fn bench_copy_has_no_gpu_form() {
    let out = accord()
        .args(["bench", "copy", "--device", "cuda", "--sizes", "4:4"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("copy measures host memory"), "{err}");
}

#[test]
fn bench_put_has_only_a_gpu_form() {
    let out = accord()
        .args(["bench", "put", "--sizes", "4:4"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("use --device cuda"), "{err}");
}

#[test]
fn bench_explain_prints_the_cost_table() {
    let out = accord()
        .args([
            "bench",
            "allreduce",
            "-n",
            "2",
            "--sizes",
            "1M:1M",
            "--iters",
            "3",
            "--explain",
        ])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("ring") && stdout.contains("recursive_doubling"),
        "{stdout}"
    );
}

#[test]
fn sim_predicts_a_thousand_ranks() {
    let out = accord()
        .args(["sim", "allreduce", "-n", "1024", "--sizes", "64M:64M"])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("allreduce on 1024 ranks"), "{stdout}");
    // Exactly one algorithm is marked as the tuner's choice.
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with('*')).count(),
        1,
        "{stdout}"
    );
    let bad = accord()
        .args(["sim", "allreduce", "--model", "carrier-pigeon"])
        .output()
        .unwrap();
    assert!(text(&bad.stderr).contains("unknown cost model"));
}

/// `accord bench --calibrate --network-from DIR` takes its TCP costs from the phases measured
/// elsewhere (DIR/tcp.part, DIR/crowd.part) and measures only shared memory itself; a missing
/// part is named.
#[test]
fn calibration_takes_the_network_from_elsewhere() {
    let dir = std::env::temp_dir().join(format!("accord-network-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = dir.join("profile.json");
    let p = profile.to_str().unwrap();
    let d = dir.to_str().unwrap();
    let missing = accord()
        .args(["bench", "--calibrate", p, "-n", "2", "--network-from", d])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing.stderr).contains("tcp.part"),
        "{}",
        text(&missing.stderr)
    );
    // A network 10x slower than loopback, 20 us + 1 us/KiB.
    let table: Vec<serde_json::Value> = [8.0, 262144.0, 1048576.0]
        .iter()
        .map(|&b: &f64| serde_json::json!([b, 20.0 + b / 1024.0]))
        .collect();
    let part = serde_json::json!({"pingpong": table, "exchange": table, "gamma_us_per_byte": 1e-4});
    std::fs::write(dir.join("tcp.part"), part.to_string()).unwrap();
    let out = accord()
        .args(["bench", "--calibrate", p, "-n", "2", "--network-from", d])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&profile).unwrap())
        .expect("the profile is JSON");
    assert_eq!(v["tcp"]["pingpong"], serde_json::json!(table));
    assert_eq!(v["tcp"]["alpha_us"].as_f64().unwrap(), 20.0 + 8.0 / 1024.0);
    assert!(
        v["shm"]["alpha_us"].as_f64().unwrap() > 0.0,
        "shared memory measured here"
    );
    assert!(v["shm_engine"]["allreduce"]
        .as_array()
        .is_some_and(|t| !t.is_empty()));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `accord bench --calibrate` writes a profile that `accord sim --profile` prices placements
/// with, taking the path Accord takes: the engines inside hosts, allreduce striped from 64 KiB; with
/// `--crowd`, crowded rounds on one machine cost what pairs exchanging at once cost.
#[test]
fn calibrated_profile_prices_hosts_and_ranks_per_host() {
    let dir = std::env::temp_dir().join(format!("accord-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = dir.join("profile.json");
    let p = profile.to_str().unwrap();
    let out = accord()
        .args(["bench", "--calibrate", p, "-n", "2", "--crowd", "4"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let refused = accord()
        .args(["bench", "--calibrate", p, "-n", "2", "--crowd", "3"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(text(&refused.stderr).contains("--crowd needs at least 4 ranks"));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&profile).unwrap())
        .expect("the profile is JSON");
    for link in ["tcp", "shm"] {
        let alpha = v[link]["alpha_us"].as_f64().unwrap();
        let beta = v[link]["beta_us_per_byte"].as_f64().unwrap();
        assert!(alpha > 0.0 && beta > 0.0, "{link}: {alpha} {beta}");
        let sizes: Vec<u64> = v[link]["exchange"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r[0].as_u64().unwrap())
            .collect();
        assert_eq!(sizes.len(), 18, "8 B to 64 MiB: {sizes:?}");
        assert_eq!((sizes[0], sizes[17]), (8, 64 << 20), "{sizes:?}");
        // Every power of two from 4 KiB, so that no price between two timed sizes is guessed
        // across a change in how the transport moves messages.
        assert!(sizes[3..].windows(2).all(|w| w[1] == 2 * w[0]), "{sizes:?}");
    }
    assert!(v["gamma_us_per_byte"].as_f64().unwrap() > 0.0);
    let gamma = v["gamma"].as_array().unwrap();
    assert_eq!(gamma.len(), 4, "{gamma:?}");
    assert!(
        gamma.iter().all(|g| g[1].as_f64().unwrap() > 0.0),
        "{gamma:?}"
    );
    assert_eq!(v["shm_engine"]["allreduce"].as_array().unwrap().len(), 8);
    let crowd = v["tcp"]["crowd"].as_array().unwrap();
    assert_eq!(crowd.len(), 1, "{crowd:?}");
    assert_eq!(crowd[0]["pairs"].as_u64(), Some(2));
    assert_eq!(crowd[0]["exchange"].as_array().unwrap().len(), 18);

    let sim = |args: &[&str]| {
        let out = accord()
            .args(["sim", "allreduce", "--profile", p])
            .args(args)
            .output()
            .unwrap();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let (code, stdout, stderr) = sim(&[
        "-n",
        "16",
        "--per-host",
        "4",
        "--sizes",
        "4K:4M",
        "--factor",
        "4",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("4 host(s) x 4 rank(s)"), "{stdout}");
    let rows: Vec<(usize, f64, &str)> = stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let mut f = l.split_whitespace();
            let b = f.next().unwrap().parse().unwrap();
            let t = f.next().unwrap().parse().unwrap();
            (b, t, l)
        })
        .collect();
    assert_eq!(rows.len(), 6, "{stdout}");
    assert!(rows.windows(2).all(|w| w[1].1 > w[0].1), "{stdout}");
    for &(bytes, _, line) in &rows {
        // Hosts of 4 ranks: leaders below 64 KiB (whole on every stripe on hosts of 2 only).
        let path = match bytes >= 64 << 10 {
            true => "striped between hosts",
            false => "leaders between hosts",
        };
        assert!(line.contains(path), "{stdout}");
    }
    let (code, stdout, _) = sim(&["-n", "2", "--sizes", "4K:4K"]);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("schedule over TCP"), "{stdout}");
    let (code, stdout, stderr) = sim(&["-n", "8", "--one-machine", "--sizes", "4K:4M"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("8 host(s) x 1 rank(s) on one machine"),
        "{stdout}"
    );
    assert!(stdout.contains("crowds of up to 2 pairs"), "{stdout}");

    let (code, _, stderr) = sim(&["-n", "10", "--per-host", "4"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("multiple of --per-host"), "{stderr}");
    std::fs::write(&profile, "{}").unwrap();
    let (code, _, stderr) = sim(&["-n", "2"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("is not an Accord profile"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The CPUs in this process's affinity mask, from `Cpus_allowed_list` of a status file.
fn cpus_allowed(status: &str) -> Vec<usize> {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .trim()
        .to_string();
    list.split(',')
        .flat_map(|part| {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()
        })
        .collect()
}

#[test]
fn launcher_binds_ranks_to_spread_cpus() {
    let mine = cpus_allowed(&std::fs::read_to_string("/proc/self/status").unwrap());
    let k = mine.len();
    // `auto` binds when the ranks fill or outnumber the CPUs, and leaves fewer ranks alone.
    let mut cases = vec![
        (k + 1, "auto", true),
        (k, "auto", true),
        (k + 1, "cpu", true),
        (k + 1, "none", false),
    ];
    if k > 1 {
        cases.push((k - 1, "auto", false));
    }
    for (n, bind, bound) in cases {
        let out = accord()
            .args(["run", "-n", &n.to_string(), "--bind-to", bind, "--"])
            .args([
                "sh",
                "-c",
                "echo cpus $ACCORD_RANK; grep Cpus_allowed_list /proc/self/status",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        for r in 0..n {
            let status: String = stdout
                .lines()
                .filter(|l| l.starts_with(&format!("[{r}] ")))
                .map(|l| format!("{}\n", &l[format!("[{r}] ").len()..]))
                .collect();
            let got = cpus_allowed(&status);
            if bound {
                // Rank r of n on the (r * k / n)-th allowed CPU: one each, evenly spread.
                assert_eq!(
                    got,
                    vec![mine[r * mine.len() / n]],
                    "{bind}: rank {r}: {stdout}"
                );
            } else {
                assert_eq!(got, mine, "{bind}: rank {r}: {stdout}");
            }
        }
    }
}

/// `accord store` takes its token from `ACCORD_TOKEN_FILE` too, and refuses a file that others
/// may read, as every rank does.
#[test]
fn store_reads_a_private_token_file_and_refuses_an_open_one() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("accord-store-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, "a-secret\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open = accord()
        .args(["store", "--port", "0"])
        .env_remove("ACCORD_TOKEN")
        .env("ACCORD_TOKEN_FILE", &file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&open.stderr);
    assert_eq!(open.status.code(), Some(2), "{err}");
    assert!(err.contains("too open"), "{err}");

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut store = accord()
        .args(["store", "--host", "127.0.0.1", "--port", "0"])
        .env_remove("ACCORD_TOKEN")
        .env("ACCORD_TOKEN_FILE", &file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut err = std::io::BufReader::new(store.stderr.take().unwrap());
    std::io::BufRead::read_line(&mut err, &mut line).unwrap();
    let addr = line.trim().rsplit(' ').next().unwrap().to_string();
    let client = accord::rendezvous::StoreClient::connect(
        &addr,
        &accord::auth::Token::new("a-secret"),
        std::time::Duration::from_secs(10),
    );
    let _ = store.kill();
    let _ = store.wait();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(line.contains("listening on"), "{line}");
    client.expect("a client with the file's token is admitted");
}

/// Processes with several TCP connections per pair (`ACCORD_TCP_LANES`, here different on
/// every rank: the higher rank of a pair decides) pass the whole self-test over TCP, whose
/// messages from 256 KiB are dealt over the connections.
#[test]
fn selftest_passes_over_several_connections_per_pair() {
    let out = accord()
        .args(["run", "-n", "3", "sh", "-c"])
        .arg(r#"ACCORD_TCP_LANES=$((ACCORD_RANK + 2)) exec "$0" selftest"#)
        .arg(env!("CARGO_BIN_EXE_accord"))
        .env("ACCORD_TRANSPORT", "tcp")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert_eq!(stdout.matches("every result right").count(), 3, "{stdout}");
}
