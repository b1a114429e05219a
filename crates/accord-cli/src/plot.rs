//! Plots of benchmark results: time per call and bus bandwidth against message size, one line
//! per run, in one SVG (two panels, logarithmic size axis).
//!
//! Runs come as `accord bench --json` documents (docs/json_formats.md): a `rows` array of
//! `bytes`, `time_us` and, where it applies, `busbw_gbps` (`accord sim --profile --json` rows
//! with `predicted_us` are drawn as times). Text is written as SVG `<text>` elements, so no font
//! library is needed to draw.

use plotters::prelude::*;
use serde_json::Value;

/// `accord plot`'s options.
#[derive(clap::Args, Clone)]
pub struct PlotArgs {
    /// `--json` files of `accord bench` (or `accord sim --profile`) runs, one line each.
    #[arg(required = true, value_name = "JSON")]
    inputs: Vec<String>,
    /// The SVG file to write.
    #[arg(short = 'o', long = "output", value_name = "SVG")]
    output: String,
    /// Title above the panels (default: the operations plotted).
    #[arg(long)]
    title: Option<String>,
}

/// One run.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    /// The operation, when the document names it.
    pub op: Option<String>,
    pub points: Vec<Point>,
}

/// One row of a run.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub bytes: f64,
    pub time_us: f64,
    pub busbw_gbps: Option<f64>,
}

/// `accord plot`: returns the exit code.
pub fn main(args: &PlotArgs) -> i32 {
    let series: Result<Vec<Series>, String> = args.inputs.iter().map(|p| load(p)).collect();
    let result = series.and_then(|s| {
        let title = args.title.clone().unwrap_or_else(|| default_title(&s));
        draw(&s, &args.output, &title)
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("accord plot: {e}");
            2
        }
    }
}

/// The run in the JSON file `path`, labelled by its `label` field or else the file name.
pub fn load(path: &str) -> Result<Series, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| format!("{path} is not JSON: {e}"))?;
    let name = std::path::Path::new(path)
        .file_stem()
        .map_or(path.to_string(), |s| s.to_string_lossy().into_owned());
    series(&doc, &name).map_err(|e| format!("{path}: {e}"))
}

/// The run in `doc`, labelled by its `label` field or else `fallback`.
pub fn series(doc: &Value, fallback: &str) -> Result<Series, String> {
    let rows = doc["rows"]
        .as_array()
        .ok_or("no \"rows\" array (expected the --json output of accord bench)")?;
    let points = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let num = |k: &str| r[k].as_f64();
            Ok(Point {
                bytes: num("bytes").ok_or(format!("row {i} has no \"bytes\""))?,
                time_us: num("time_us")
                    .or_else(|| num("predicted_us"))
                    .ok_or(format!("row {i} has no \"time_us\""))?,
                busbw_gbps: num("busbw_gbps"),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    if points.is_empty() {
        return Err("\"rows\" is empty".into());
    }
    Ok(Series {
        label: doc["label"].as_str().unwrap_or(fallback).to_string(),
        op: doc["op"].as_str().map(str::to_string),
        points,
    })
}

/// "allreduce" when every run is one, else "allreduce, broadcast".
pub fn default_title(series: &[Series]) -> String {
    let mut ops: Vec<&str> = series.iter().filter_map(|s| s.op.as_deref()).collect();
    ops.dedup();
    match ops.as_slice() {
        [] => "accord bench".into(),
        ops => format!("accord bench: {}", ops.join(", ")),
    }
}

/// A tick value without a trailing `.0`, sizes in decimal units: `1000` -> `1k`, `1e6` ->
/// `1M` (the logarithmic axis ticks at powers of ten).
fn tick(v: f64) -> String {
    let (v, unit) = match v.abs() {
        a if a >= 1e9 => (v / 1e9, "G"),
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e3 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let text = format!("{v:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}{unit}")
}

/// Line colours that stay apart on white (the "tab10" set).
const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// `lo..hi` widened to a usable logarithmic range (positive, not empty).
fn log_range(lo: f64, hi: f64) -> std::ops::Range<f64> {
    let lo = if lo.is_finite() && lo > 0.0 { lo } else { 1.0 };
    let hi = if hi.is_finite() && hi > lo {
        hi
    } else {
        lo * 2.0
    };
    lo / 1.5..hi * 1.5
}

/// Draw every series into the SVG file `out`: time (us, log) above, bus bandwidth (GB/s)
/// below, both against message size (log).
pub fn draw(series: &[Series], out: &str, title: &str) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("cannot draw {out}: {e}");
    let all = || series.iter().flat_map(|s| &s.points);
    let fold = |f: fn(&Point) -> Option<f64>| {
        all()
            .filter_map(f)
            .filter(|v| v.is_finite() && *v > 0.0)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
    };
    let x = fold(|p| Some(p.bytes));
    let t = fold(|p| Some(p.time_us));
    let bw = fold(|p| p.busbw_gbps);
    let x = log_range(x.0, x.1);
    let bw_top = if bw.1.is_finite() { bw.1 * 1.1 } else { 1.0 };

    let root = SVGBackend::new(out, (960, 960)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(title, ("sans-serif", 30))
        .map_err(|e| err(&e))?;
    let (upper, lower) = root.split_vertically(460);

    let mut time = ChartBuilder::on(&upper)
        .margin(16)
        .caption("time per call", ("sans-serif", 22))
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(x.clone().log_scale(), log_range(t.0, t.1).log_scale())
        .map_err(|e| err(&e))?;
    time.configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("time (us)")
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .draw()
        .map_err(|e| err(&e))?;
    let mut bandwidth = ChartBuilder::on(&lower)
        .margin(16)
        .caption("bus bandwidth", ("sans-serif", 22))
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(x.log_scale(), 0.0..bw_top)
        .map_err(|e| err(&e))?;
    bandwidth
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("bus bandwidth (GB/s)")
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .draw()
        .map_err(|e| err(&e))?;

    for (i, s) in series.iter().enumerate() {
        let color = COLOURS[i % COLOURS.len()].to_rgba();
        let times = s
            .points
            .iter()
            .filter(|p| p.time_us > 0.0)
            .map(|p| (p.bytes, p.time_us));
        time.draw_series(LineSeries::new(times, color.stroke_width(2)).point_size(3))
            .map_err(|e| err(&e))?
            .label(s.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        let bws: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter_map(|p| p.busbw_gbps.map(|b| (p.bytes, b)))
            .collect();
        if !bws.is_empty() {
            bandwidth
                .draw_series(LineSeries::new(bws, color.stroke_width(2)).point_size(3))
                .map_err(|e| err(&e))?
                .label(s.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
    }
    time.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 18))
        .draw()
        .map_err(|e| err(&e))?;
    bandwidth
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 18))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_come_from_the_document_or_the_fallback() {
        let doc = serde_json::json!({"op": "allreduce", "rows": [
            {"bytes": 8, "time_us": 1.5, "busbw_gbps": 0.01}]});
        let s = series(&doc, "run-a").unwrap();
        assert_eq!(s.label, "run-a");
        assert_eq!(s.points[0].busbw_gbps, Some(0.01));
        let mut labelled = doc.clone();
        labelled["label"] = "nccl 2.21".into();
        assert_eq!(series(&labelled, "x").unwrap().label, "nccl 2.21");
    }

    #[test]
    fn documents_without_rows_or_times_are_refused_by_name() {
        let e = series(&serde_json::json!({"op": "x"}), "f").unwrap_err();
        assert!(e.contains("\"rows\""), "{e}");
        let e = series(&serde_json::json!({"rows": [{"bytes": 4}]}), "f").unwrap_err();
        assert!(e.contains("row 0 has no \"time_us\""), "{e}");
        // A simulation's predicted times plot as times, without bandwidth.
        let s = series(
            &serde_json::json!({"rows": [{"bytes": 4, "predicted_us": 2.0}]}),
            "f",
        );
        assert!(s.unwrap().points[0].busbw_gbps.is_none());
    }

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(1000.0), "1k");
        assert_eq!(tick(1e6), "1M");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(100.0), "100");
        assert_eq!(tick(0.001), "0.001");
        assert_eq!(log_range(8.0, 8.0), 8.0 / 1.5..16.0 * 1.5);
    }
}
