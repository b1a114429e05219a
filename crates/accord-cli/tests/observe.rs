//! Flight records, `accord analyze` and the timeline, end to end: jobs started with `accord
//! run` that hang or desynchronise on purpose (the `rank_check` example's `stall` and
//! `wrong-root` modes), and traced jobs.

mod common;

use common::{accord, rank_check, text};
use std::path::{Path, PathBuf};
use std::process::Output;

/// A fresh directory under the system's temporary one.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("accord-observe-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run_job(n: usize, mode: &str, env: &[(&str, &str)]) -> Output {
    accord()
        .args(["run", "-n", &n.to_string()])
        .arg(rank_check())
        .arg(mode)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn flight_files(dir: &Path) -> Vec<PathBuf> {
    let mut f: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("accord-flight-")
        })
        .collect();
    f.sort();
    f
}

fn analyze(dir: &Path) -> String {
    let out = accord().arg("analyze").arg(dir).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

fn verdict(report: &str) -> &str {
    report
        .lines()
        .find_map(|l| l.strip_prefix("verdict: "))
        .unwrap_or_else(|| panic!("no verdict in:\n{report}"))
}

#[test]
fn a_stalled_rank_is_named_behind_from_every_ranks_record() {
    let dir = scratch("stall");
    let d = dir.to_str().unwrap();
    let out = run_job(
        3,
        "stall",
        &[
            ("ACCORD_FLIGHT_DIR", d),
            ("ACCORD_TIMEOUT", "2"),
            ("ACCORD_CHECK_RANK", "1"),
        ],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("accord analyze"),
        "the launcher points at the records:\n{err}"
    );
    // Every rank wrote one: the two that timed out, and the stalled one (asked by the launcher,
    // or on hearing of the others' failure).
    let files = flight_files(&dir);
    assert_eq!(files.len(), 3, "{files:?}\n{err}");
    let report = analyze(&dir);
    assert_eq!(
        verdict(&report),
        "rank 1 is behind on world: its last host call is #4 allreduce(f32 x 16, sum) \
         (completed); ranks 0, 2 entered #5 allreduce(f32 x 16, sum) and waited for it",
        "{report}"
    );
    // Ranks 0 and 2 both time out after 2 s; whichever gives up first aborts the other, so
    // one of them failed by its own timeout and the other may say it was aborted.
    assert!(
        report.contains("rank 0 failed: timed out") || report.contains("rank 2 failed: timed out"),
        "{report}"
    );
    // Without the stalled rank's file the report says so first.
    std::fs::remove_file(
        files
            .iter()
            .find(|f| f.to_string_lossy().ends_with("rank1.json"))
            .unwrap(),
    )
    .unwrap();
    let report = analyze(&dir);
    assert!(
        verdict(&report).starts_with("rank 1 left no record"),
        "{report}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ranks_that_disagree_on_the_root_are_named_with_their_calls() {
    for transport in ["shm", "tcp"] {
        let dir = scratch(&format!("root-{transport}"));
        let d = dir.to_str().unwrap();
        let out = run_job(
            4,
            "wrong-root",
            &[
                ("ACCORD_FLIGHT_DIR", d),
                ("ACCORD_CHECK_RANK", "2"),
                ("ACCORD_TRANSPORT", transport),
            ],
        );
        assert!(!out.status.success());
        assert_eq!(flight_files(&dir).len(), 4, "{}", text(&out.stderr));
        let report = analyze(&dir);
        // A rank the abort reaches before it records call #5 (over TCP it may still be
        // finishing #4) is not among the callers the verdict lists; rank 2's side always is.
        let v = verdict(&report);
        assert!(
            v.starts_with("ranks disagree on host call #5 of world: ")
                && v.contains(
                    "called broadcast(f32 x 16, root 0); rank 2 called broadcast(f32 x 16, root 1)"
                ),
            "{transport}: {report}"
        );
        let json = accord().args(["analyze", d, "--json"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(v["communicators"][0]["host"]["desync"]["seq"], 5);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn analyze_refuses_what_is_not_a_record() {
    let dir = scratch("garbage");
    let out = accord().arg("analyze").arg(&dir).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no flight records"),
        "{}",
        text(&out.stderr)
    );
    std::fs::write(
        dir.join("accord-flight-x-rank0.json"),
        "{\"format\": \"other\"}",
    )
    .unwrap();
    let out = accord().arg("analyze").arg(&dir).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not an Accord flight record"),
        "{}",
        text(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_traced_job_writes_one_valid_trace_per_rank_and_they_merge() {
    for transport in ["shm", "tcp"] {
        let dir = scratch(&format!("trace-{transport}"));
        let out = run_job(
            3,
            "ops",
            &[
                ("ACCORD_TRACE", dir.to_str().unwrap()),
                ("ACCORD_TRANSPORT", transport),
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        let files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(files.len(), 3, "{files:?}");
        for f in &files {
            let v: serde_json::Value = serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
            let events = v["traceEvents"].as_array().unwrap();
            let calls = events
                .iter()
                .filter(|e| e["ph"] == "X" && e["name"] == "allreduce");
            assert!(calls.count() >= 3, "{}", f.display());
            for e in events.iter().filter(|e| e["ph"] == "X") {
                assert!(e["ts"].as_f64().unwrap() > 1.6e15 && e["dur"].as_f64().unwrap() >= 0.0);
            }
        }
        let merged = dir.join("merged.json");
        let out = accord()
            .args(["trace", "merge"])
            .arg(&dir)
            .arg("-o")
            .arg(&merged)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&merged).unwrap()).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        // One process (track group) per rank, named after it.
        let mut names: Vec<(u64, String)> = events
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| {
                (
                    e["pid"].as_u64().unwrap(),
                    e["args"]["name"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                (0, "rank 0".into()),
                (1, "rank 1".into()),
                (2, "rank 2".into())
            ],
            "{transport}"
        );
        if transport == "tcp" {
            // Schedules over the transport show their rounds.
            assert!(events
                .iter()
                .any(|e| e["name"].as_str().is_some_and(|n| n.starts_with("round "))));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
