//! Helpers for the tests that start ranks as processes of their own.

use std::process::Child;
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
