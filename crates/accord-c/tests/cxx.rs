//! The C ABI and the C++ wrapper as their users build them: installed with `install.sh` into a
//! prefix, each program compiled with one gcc/g++ line through pkg-config, run under
//! `accord run` at several world sizes and under mpirun. `tests/cpp/every_collective.cpp`
//! checks every collective and message against a reference computed on each rank;
//! `tests/c/smoke.c` checks that `<accord.h>` is valid C.
//!
//! Needs what `test.sh` builds first: `cargo build --release -p accord-c` (the library) and
//! `-p accord-cli` (the launcher); and gcc, g++, pkg-config (mpirun for the MPI test).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// `target/release` (this test runs from `target/release/deps`).
fn release_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/release")
        .to_path_buf()
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether the tools are here; says why not otherwise (the test then checks nothing).
fn tools(needed: &[&str]) -> bool {
    let missing: Vec<&str> = needed.iter().copied().filter(|t| !have(t)).collect();
    if !missing.is_empty() {
        eprintln!("skipping: {} not installed", missing.join(", "));
    }
    missing.is_empty()
}

/// The install prefix with the built library (installed once per test run).
fn prefix() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let release = release_dir();
        for lib in ["libaccord_c.so", "libaccord_c.a"] {
            assert!(
                release.join(lib).exists(),
                "{lib} is not built: run `cargo build --release -p accord-c` first (test.sh does)"
            );
        }
        let prefix = release.join("tmp").join("accord-c-prefix");
        let _ = std::fs::remove_dir_all(&prefix);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("install.sh");
        let out = Command::new(script)
            .arg(&prefix)
            .env("ACCORD_INSTALL_NO_BUILD", "1")
            .env("CARGO_TARGET_DIR", release.parent().expect("target"))
            .output()
            .expect("run install.sh");
        assert!(out.status.success(), "install.sh failed: {}", text(&out));
        prefix
    })
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Build `source` (relative to the crate) with `compiler` and the pkg-config line users write.
fn build(compiler: &str, source: &str, flags: &str, name: &str) -> PathBuf {
    let out = prefix().join("bin").join(name);
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(source);
    let line = format!(
        "{compiler} {flags} {} $(pkg-config --cflags --libs accord) -o {}",
        src.display(),
        out.display()
    );
    let o = Command::new("sh")
        .args(["-c", &line])
        .env("PKG_CONFIG_PATH", prefix().join("lib/pkgconfig"))
        .output()
        .expect("run the compiler");
    assert!(o.status.success(), "`{line}` failed:\n{}", text(&o));
    out
}

fn every_collective() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        build(
            "g++",
            "tests/cpp/every_collective.cpp",
            "-std=c++17 -O1 -Wall -Wextra -Werror",
            "every_collective",
        )
    })
}

/// `accord run -n N exe args`, bounded.
fn accord_run(n: usize, exe: &Path, args: &[&str]) -> Output {
    let accord = release_dir().join("accord");
    assert!(
        accord.exists(),
        "the launcher is not built: run `cargo build --release -p accord-cli` first (test.sh does)"
    );
    Command::new("timeout")
        .arg("300")
        .arg(accord)
        .args(["run", "-n", &n.to_string()])
        .arg(exe)
        .args(args)
        .env("ACCORD_TIMEOUT", "60")
        .output()
        .expect("run accord")
}

fn assert_every_rank(o: &Output, n: usize, needle: &str, what: &str) {
    let all = text(o);
    assert!(o.status.success(), "{what} failed:\n{all}");
    assert_eq!(
        all.matches(needle).count(),
        n,
        "{what}: not every rank said {needle:?}:\n{all}"
    );
}

#[test]
fn the_c_header_compiles_as_c11_and_runs() {
    if !tools(&["gcc", "pkg-config"]) {
        return;
    }
    let exe = build(
        "gcc",
        "tests/c/smoke.c",
        "-std=c11 -Wall -Wextra -Werror",
        "smoke",
    );
    for n in [1, 2, 4] {
        assert_every_rank(&accord_run(n, &exe, &[]), n, "C ok", "smoke.c");
    }
}

#[test]
fn the_raft_example_allreduces_to_the_world_size() {
    if !tools(&["g++", "pkg-config"]) {
        return;
    }
    let exe = build(
        "g++",
        "examples/raft_allreduce.cpp",
        "-std=c++17 -Wall -Wextra -Werror",
        "raft_allreduce",
    );
    for n in [1, 3] {
        let o = accord_run(n, &exe, &[]);
        assert_every_rank(&o, n, &format!("final_size: {n}"), "raft_allreduce");
        assert_every_rank(&o, n, ": ok", "raft_allreduce");
    }
}

#[test]
fn every_collective_is_right_at_every_world_size() {
    if !tools(&["g++", "pkg-config"]) {
        return;
    }
    for n in [1, 2, 3, 4, 5, 7, 9] {
        let o = accord_run(n, every_collective(), &[]);
        assert_every_rank(
            &o,
            n,
            " 0 failures",
            &format!("every_collective at {n} ranks"),
        );
    }
}

#[test]
fn errors_reach_cxx_as_exceptions_with_accords_text() {
    if !tools(&["g++", "pkg-config"]) {
        return;
    }
    // Bad arguments on each rank, then a count that differs between ranks: a desync (never
    // wrong data), which the test program checks on every rank.
    let o = accord_run(3, every_collective(), &["--errors"]);
    assert_every_rank(&o, 3, " 0 failures", "every_collective --errors");
}

#[test]
fn runs_under_mpirun() {
    if !tools(&["g++", "pkg-config", "mpirun"]) {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let o = Command::new("timeout")
        .arg("300")
        .arg("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "3"])
        .args([
            "-x",
            "MASTER_ADDR=127.0.0.1",
            "-x",
            &format!("MASTER_PORT={port}"),
        ])
        .args(["-x", "ACCORD_TIMEOUT=60"])
        .arg(every_collective())
        .output()
        .expect("run mpirun");
    assert_every_rank(&o, 3, " 0 failures", "every_collective under mpirun");
}
