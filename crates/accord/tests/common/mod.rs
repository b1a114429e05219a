//! Helpers for the tests that start ranks as processes of their own.
// Each test binary uses some of them.
#![allow(dead_code)]

use accord::auth::Token;
use accord::rendezvous::StoreServer;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port that was free a moment ago on loopback (for a store the test starts later).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// How a rank ended: exit code and stderr. A child still running after `limit` is killed.
pub fn finish(mut c: Child, limit: Duration) -> (Option<i32>, String) {
    let end = Instant::now() + limit;
    while c.try_wait().unwrap().is_none() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let o = c.wait_with_output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// This test binary re-executed as rank `rank` of `world`: it runs the test `rank_main`, joins
/// the store at `store` (hosted by the test) with `token`, on host id `host`, with a 30 s
/// deadline and whatever transport the hosts call for. Callers add what the rank does and where
/// its output goes.
pub fn rank_command(
    rank: usize,
    world: usize,
    store: SocketAddr,
    token: &str,
    host: &str,
) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["rank_main", "--exact", "--nocapture", "--test-threads=1"])
        .env("ACCORD_RANK", rank.to_string())
        .env("ACCORD_WORLD_SIZE", world.to_string())
        .env("ACCORD_STORE", store.to_string())
        .env("ACCORD_STORE_EXTERNAL", "1")
        .env("ACCORD_TOKEN", token)
        .env("ACCORD_TIMEOUT", "30")
        .env("ACCORD_HOST_ID", host)
        .env_remove("ACCORD_TRANSPORT");
    c
}

/// The token of the stores [`spawn`] hosts.
const TOKEN: &str = "shm-test-token";

/// Start `n` ranks of this binary running `scenario` (its `rank_main` reads
/// `SHM_TEST_SCENARIO`), with a store hosted here; `host(r)` gives each rank's simulated host
/// id, `extra` more variables. Ranks' stdout is kept for [`collect`].
pub fn spawn(
    scenario: &str,
    n: usize,
    host: impl Fn(usize) -> String,
    extra: &[(&str, &str)],
) -> (StoreServer, Vec<Child>) {
    spawn_ranks(("SHM_TEST_SCENARIO", scenario), n, host, extra, false)
}

/// [`spawn`] with the variable naming the scenario (`(variable, scenario)`), and with each
/// rank's stdin a pipe the test holds where `stdin` says so.
pub fn spawn_ranks(
    (var, scenario): (&str, &str),
    n: usize,
    host: impl Fn(usize) -> String,
    extra: &[(&str, &str)],
    stdin: bool,
) -> (StoreServer, Vec<Child>) {
    let server = StoreServer::bind("127.0.0.1:0", Token::new(TOKEN)).unwrap();
    let children = (0..n)
        .map(|r| {
            let mut c = rank_command(r, n, server.addr(), TOKEN, &host(r));
            c.env(var, scenario)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            if stdin {
                c.stdin(Stdio::piped());
            }
            for (k, v) in extra {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect();
    (server, children)
}

/// Wait for every child (killing those still running after `limit`); their exit codes and
/// stdout.
pub fn collect(children: Vec<Child>, limit: Duration) -> Vec<(Option<i32>, String)> {
    let end = Instant::now() + limit;
    let mut out = Vec::new();
    for mut c in children {
        loop {
            if c.try_wait().unwrap().is_some() || Instant::now() > end {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let o = c.wait_with_output().unwrap();
        out.push((
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        ));
    }
    out
}

/// Every rank exited 0 after printing `RANK-OK`.
pub fn all_ok(res: &[(Option<i32>, String)]) {
    for (r, (code, out)) in res.iter().enumerate() {
        assert_eq!(*code, Some(0), "rank {r} failed:\n{out}");
        assert!(out.contains("RANK-OK"), "rank {r} did not finish:\n{out}");
    }
}

/// [`spawn`] `n` ranks running `scenario`, wait up to `limit` for them ([`collect`]), and assert
/// [`all_ok`]: every rank exited 0 after printing `RANK-OK` (a failing rank is reported with its
/// stdout). The store lives until every rank has ended.
pub fn run_ok(
    scenario: &str,
    n: usize,
    host: impl Fn(usize) -> String,
    extra: &[(&str, &str)],
    limit: Duration,
) {
    let (_server, children) = spawn(scenario, n, host, extra);
    all_ok(&collect(children, limit));
}
