//! Progress shows on a terminal (a pseudo-terminal here) and nowhere else.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

/// Run `accord args` with stderr on a new pseudo-terminal; returns what the terminal showed.
fn on_terminal(args: &[&str]) -> String {
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: out-pointers to locals; no name, settings or window size.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened and are owned here alone.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut child = Command::new(env!("CARGO_BIN_EXE_accord"))
        .args(args)
        .env_remove("ACCORD_TRANSPORT")
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    let reader = std::thread::spawn(move || {
        let mut f = std::fs::File::from(master);
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        // Reads fail with EIO once no process holds the terminal open.
        while let Ok(n) = f.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    assert!(child.wait().unwrap().success());
    reader.join().unwrap()
}

#[test]
fn bench_rank_zero_draws_on_the_launchers_terminal() {
    let shown = on_terminal(&[
        "bench",
        "allreduce",
        "-n",
        "2",
        "--sizes",
        "8:8K",
        "--iters",
        "3",
    ]);
    assert!(
        shown.contains("allreduce [") && shown.contains("/11: "),
        "{shown:?}"
    );
}

#[test]
fn sim_draws_on_its_terminal() {
    let shown = on_terminal(&[
        "sim",
        "allgather",
        "-n",
        "16",
        "--sizes",
        "8:8K",
        "--factor",
        "4",
    ]);
    assert!(
        shown.contains("sim allgather [") && shown.contains("/6: "),
        "{shown:?}"
    );
}

#[test]
fn nothing_is_drawn_off_a_terminal() {
    let out = Command::new(env!("CARGO_BIN_EXE_accord"))
        .args(["sim", "allreduce", "-n", "16", "--sizes", "8:8K"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
