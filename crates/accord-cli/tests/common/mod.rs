//! What the multi-process test files share: the `accord` binary and the `rank_check` example
//! cargo builds for them. Each test file uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The `accord` binary of this build.
pub fn accord() -> Command {
    Command::new(env!("CARGO_BIN_EXE_accord"))
}

/// The `rank_check` example, which cargo builds next to the test's profile directory.
pub fn rank_check() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().unwrap().parent().unwrap();
    let p = profile.join("examples").join("rank_check");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --examples -p accord-cli`",
        p.display()
    );
    p
}

/// Output bytes as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
