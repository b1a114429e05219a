//! Start-up under `accord run`: the launcher tells the ranks still joining when a rank's process
//! ended before it joined, so they fail at once naming it instead of waiting for their join
//! deadline.

mod common;

use common::rank_check;
use std::process::Command;
use std::time::{Duration, Instant};

/// Rank 2 ends with success before it calls init (so the launcher does not stop the job); ranks
/// 0 and 1, whose join deadline is 60 s, name it within seconds.
#[test]
fn a_rank_that_ends_before_joining_is_named_at_once() {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_accord"))
        .args(["run", "-n", "3", "--", "sh", "-c"])
        .arg(r#"if [ "$ACCORD_RANK" = 2 ]; then exit 0; fi; exec "$0" ops"#)
        .arg(rank_check())
        .env("ACCORD_TIMEOUT", "60")
        .env("ACCORD_JOIN_TIMEOUT", "60")
        .output()
        .unwrap();
    let took = start.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(took < Duration::from_secs(20), "took {took:?}: {err}");
    // The first rank to fail stops the other, which may not get to print.
    assert!(
        err.contains(
            "init failed: rank 2 is lost: its process ended (exit status 0) before it joined"
        ),
        "{err}"
    );
}
