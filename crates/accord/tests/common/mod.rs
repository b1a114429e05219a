//! Helpers for the tests that start ranks as processes of their own.
// Each test binary uses some of them.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::{Child, Command};
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
