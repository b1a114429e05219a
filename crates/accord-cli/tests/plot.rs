//! `accord plot` and `accord bench --plot`: the SVG parses, has one line per run in each
//! panel, the axis labels and every run's label; bench's JSON carries its schema version.

use std::path::{Path, PathBuf};
use std::process::Command;

fn accord() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_accord"));
    c.env_remove("ACCORD_TRANSPORT");
    c
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("accord-plot-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The SVG's text, and its runs: the stroke colours of the 2-pixel lines (the grid is 1 pixel).
fn read_svg(path: &Path) -> (Vec<String>, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .collect();
    let mut colours: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke-width") == Some("2"))
        .filter_map(|n| n.attribute("stroke").map(str::to_string))
        .collect();
    colours.sort();
    colours.dedup();
    (texts, colours)
}

fn assert_axes(texts: &[String]) {
    for label in [
        "time (us)",
        "bus bandwidth (GB/s)",
        "message size (bytes)",
        "time per call",
    ] {
        assert!(texts.iter().any(|t| t == label), "{label}: {texts:?}");
    }
}

#[test]
fn plot_draws_one_line_per_file_labelled_by_label_or_file_name() {
    let d = scratch("standalone");
    let rows = |scale: f64| {
        serde_json::json!([
            {"bytes": 8, "time_us": 2.0 * scale, "busbw_gbps": 0.004 / scale},
            {"bytes": 4096, "time_us": 5.0 * scale, "busbw_gbps": 0.8 / scale},
            {"bytes": 1048576, "time_us": 300.0 * scale, "busbw_gbps": 3.5 / scale},
        ])
    };
    let a = d.join("ours.json");
    let b = d.join("peer.json");
    let c = d.join("sim.json");
    let doc = |label: Option<&str>, scale| {
        let mut v = serde_json::json!({"schema": 1, "op": "allreduce", "rows": rows(scale)});
        if let Some(l) = label {
            v["label"] = l.into();
        }
        v.to_string()
    };
    std::fs::write(&a, doc(None, 1.0)).unwrap();
    std::fs::write(&b, doc(Some("peer NCCL 2.21"), 2.0)).unwrap();
    std::fs::write(
        &c,
        r#"{"schema": 1, "op": "allreduce", "rows": [{"bytes": 8, "predicted_us": 9.0},
            {"bytes": 1048576, "predicted_us": 900.0}]}"#,
    )
    .unwrap();
    let out = d.join("out.svg");
    let run = accord()
        .arg("plot")
        .args([&a, &b, &c])
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let (texts, colours) = read_svg(&out);
    assert_axes(&texts);
    assert_eq!(colours.len(), 3, "{colours:?}");
    for label in ["ours", "peer NCCL 2.21", "sim", "accord bench: allreduce"] {
        assert!(texts.iter().any(|t| t == label), "{label}: {texts:?}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn plot_refuses_a_file_that_is_not_a_run_naming_it() {
    let d = scratch("bad");
    let bad = d.join("notes.json");
    std::fs::write(&bad, r#"{"op": "allreduce"}"#).unwrap();
    let run = accord()
        .arg("plot")
        .arg(&bad)
        .arg("-o")
        .arg(d.join("x.svg"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&bad.display().to_string()) && err.contains("\"rows\""),
        "{err}"
    );
    assert!(!d.join("x.svg").exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bench_plots_its_run_over_earlier_ones() {
    let d = scratch("bench");
    let earlier = d.join("tcp-run.json");
    let bench = |extra: &[&std::ffi::OsStr], env: Option<&str>| {
        let mut c = accord();
        c.args([
            "bench",
            "allreduce",
            "-n",
            "2",
            "--sizes",
            "8:64K",
            "--factor",
            "8",
        ])
        .args(["--iters", "3"])
        .args(extra);
        if let Some(t) = env {
            c.env("ACCORD_TRANSPORT", t);
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Not a terminal: no progress drawn.
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    bench(&["--json".as_ref(), earlier.as_os_str()], Some("tcp"));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&earlier).unwrap()).unwrap();
    assert_eq!(doc["schema"], 1);
    assert_eq!(doc["transport"], "tcp");
    let svg = d.join("bench.svg");
    bench(
        &[
            "--plot".as_ref(),
            svg.as_os_str(),
            "--overlay".as_ref(),
            earlier.as_os_str(),
        ],
        None,
    );
    let (texts, colours) = read_svg(&svg);
    assert_axes(&texts);
    assert_eq!(colours.len(), 2, "{colours:?}");
    assert!(texts.iter().any(|t| t == "tcp-run"), "{texts:?}");
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("allreduce, 2 ranks, shm")),
        "{texts:?}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bench_checks_overlays_before_running() {
    let missing = scratch("missing").join("nope.json");
    let out = accord()
        .args([
            "bench",
            "allreduce",
            "-n",
            "2",
            "--plot",
            "x.svg",
            "--overlay",
        ])
        .arg(&missing)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("cannot read {}", missing.display())),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "the benchmark ran");
    // An overlay needs a plot to go on.
    let out = accord()
        .args(["bench", "--overlay", "a.json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--plot"));
}
