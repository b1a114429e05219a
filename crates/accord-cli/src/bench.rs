//! `accord bench`: time every operation over a range of sizes, check every result, and print an
//! nccl-tests-style table (per-iteration maximum over ranks, median over iterations).

use crate::progress::{steps, Progress};
use accord::schedule::Collective;
use accord::{Communicator, DataType, Element, ReduceOp, Result};
use std::time::Instant;

/// The operations the benchmark knows.
pub const OPS: &[&str] = &[
    "allreduce",
    "broadcast",
    "reduce",
    "allgather",
    "gather",
    "scatter",
    "reduce_scatter",
    "alltoall",
    "scan",
    "sendrecv",
    "barrier",
    "copy",
    "put",
    "fft",
    "redistribute",
];

/// Options shared by the launcher side and the ranks.
#[derive(Debug, Clone)]
pub struct BenchOpts {
    /// Operation name (one of [`OPS`]).
    pub op: String,
    /// Smallest size in bytes.
    pub min_bytes: usize,
    /// Largest size in bytes.
    pub max_bytes: usize,
    /// Multiply the size by this between rows.
    pub factor: usize,
    /// Element type.
    pub dtype: DataType,
    /// Print the tuner's cost table for every size.
    pub explain: bool,
    /// Write rows as JSON here (rank 0).
    pub json: Option<String>,
    /// Iterations override (0 = automatic).
    pub iters: usize,
    /// `cpu` (host buffers) or `cuda` (GPU buffers, see `bench_gpu`).
    pub device: String,
    /// With `cuda`: the engine forced with `--engine` (else `ACCORD_GPU_ENGINE` applies).
    pub engine: Option<accord::config::GpuEngine>,
    /// With `cuda`: buffers in the symmetric heap.
    pub symmetric: bool,
    /// Draw the rows to this SVG file (rank 0).
    pub plot: Option<String>,
    /// `fft` and `redistribute`: the global array's shape.
    pub shape: Vec<usize>,
    /// Earlier runs' `--json` files drawn with this one.
    pub overlay: Vec<String>,
}

/// One row of the table.
pub struct Row {
    pub(crate) bytes: usize,
    pub(crate) count: usize,
    pub(crate) time_us: f64,
    pub(crate) algbw: f64,
    pub(crate) busbw: f64,
    pub(crate) wrong: u64,
}

impl Row {
    /// The row for `count` elements (`bytes` as shown) timed at `time_us` per call, with
    /// nccl-tests' bandwidths.
    pub(crate) fn new(
        op: &str,
        n: usize,
        bytes: usize,
        count: usize,
        time_us: f64,
        wrong: u64,
    ) -> Row {
        let algbw = bytes as f64 / time_us / 1e3;
        Row {
            bytes,
            count,
            time_us,
            algbw,
            busbw: algbw * bus_factor(op, n),
            wrong,
        }
    }
}

/// Sizes follow nccl-tests (the whole buffer; per-rank blocks are size / n), so a size is a
/// multiple of this many bytes.
pub(crate) fn size_unit(op: &str, n: usize, esz: usize) -> usize {
    if matches!(
        op,
        "allgather" | "gather" | "scatter" | "reduce_scatter" | "alltoall"
    ) {
        esz * n
    } else {
        esz
    }
}

/// Parse `4`, `64K`, `16M`, `1G` (powers of two).
pub(crate) fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 1usize << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        Some('B') => (&s[..s.len() - 1], 1),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .map(|n| n * mult)
        .map_err(|_| format!("bad size {s:?} (use e.g. 4, 64K, 16M)"))
}

/// A range `MIN:MAX` of sizes in bytes (or one size), as `--sizes` takes it.
pub(crate) fn parse_range(s: &str) -> std::result::Result<(usize, usize), String> {
    let (lo, hi) = s.split_once(':').unwrap_or((s, s));
    Ok((parse_size(lo)?, parse_size(hi)?))
}

/// Bus bandwidth factor (nccl-tests conventions).
pub(crate) fn bus_factor(op: &str, n: usize) -> f64 {
    let n = n as f64;
    match op {
        "allreduce" => 2.0 * (n - 1.0) / n,
        "allgather" | "reduce_scatter" | "alltoall" | "gather" | "scatter" => (n - 1.0) / n,
        // Bytes read and written by all ranks together: the machine's copy bandwidth.
        "copy" => 2.0 * n,
        _ => 1.0,
    }
}

/// Element types the benchmark can check exactly.
pub(crate) trait Num: Element + PartialEq + std::fmt::Debug {
    fn of(v: i64) -> Self;
}
macro_rules! num {
    ($($t:ty),*) => {$( impl Num for $t { fn of(v: i64) -> Self { v as $t } } )*};
}
num!(f32, f64, i32, i64);

/// The value rank `r` contributes at index `i`: small integers, so every sum is exact.
fn val<T: Num>(r: usize, i: usize) -> T {
    T::of(((r + 1) * (i % 7 + 1)) as i64)
}

/// The value rank `r` sends to rank `to` at index `i` of the block (all-to-all).
fn a2a<T: Num>(r: usize, to: usize, i: usize) -> T {
    T::of(((r * 16 + to) * 100 + i % 100) as i64)
}

/// Buffers and a checker for one operation at one size.
struct Case<T> {
    send: Vec<T>,
    recv: Vec<T>,
}

fn count_wrong<T: Num>(got: &[T], want: impl Fn(usize) -> T) -> u64 {
    got.iter()
        .enumerate()
        .filter(|(i, g)| **g != want(*i))
        .count() as u64
}

/// Run `op` once.
fn run_once<T: Num>(comm: &Communicator, op: &str, c: &mut Case<T>) -> Result<()> {
    let n = comm.size();
    let me = comm.rank();
    match op {
        "allreduce" => comm.all_reduce((&c.send, &mut c.recv), ReduceOp::Sum),
        // The root's buffer holds its data from `make_case` on (a broadcast leaves it as it is,
        // which the check verifies), so refilling it is not timed: the baselines do not either.
        "broadcast" => comm.broadcast(&mut c.recv, 0),
        "reduce" => comm.reduce((&c.send, &mut c.recv), ReduceOp::Sum, 0),
        "allgather" => comm.all_gather(&c.send, &mut c.recv),
        "gather" => comm.gather(&c.send, &mut c.recv, 0),
        "scatter" => comm.scatter(&c.send, &mut c.recv, 0),
        "reduce_scatter" => comm.reduce_scatter(&c.send, &mut c.recv, ReduceOp::Sum),
        "alltoall" => comm.all_to_all(&c.send, &mut c.recv),
        "scan" => comm.scan((&c.send, &mut c.recv), ReduceOp::Sum),
        "sendrecv" => comm.sendrecv(&c.send, (me + 1) % n, &mut c.recv, (me + n - 1) % n, 7),
        "barrier" => return comm.barrier(),
        // No communication: every rank copies its own buffer at once with the collectives'
        // streaming copy. Its bandwidth is the memory floor of the large rows.
        "copy" => {
            accord::copy_streaming(
                accord::dtype::as_bytes_mut(&mut c.recv),
                accord::dtype::as_bytes(&c.send),
            );
            return Ok(());
        }
        _ => Err(accord::Error::invalid(format!(
            "unknown benchmark op {op:?}"
        ))),
    }
    .map(|_| ())
}

/// Buffers for `op` with `count` elements per the nccl-tests size convention.
fn make_case<T: Num>(op: &str, n: usize, me: usize, count: usize) -> Case<T> {
    let block = count / n.max(1);
    let zero = || T::of(0);
    match op {
        "allgather" => Case {
            send: (0..block).map(|i| val(me, i)).collect(),
            recv: vec![zero(); block * n],
        },
        "gather" => Case {
            send: (0..block).map(|i| val(me, i)).collect(),
            recv: vec![zero(); if me == 0 { block * n } else { 0 }],
        },
        "scatter" => Case {
            send: if me == 0 {
                (0..block * n)
                    .map(|j| val(j / block.max(1), j % block.max(1)))
                    .collect()
            } else {
                vec![]
            },
            recv: vec![zero(); block],
        },
        "reduce_scatter" => Case {
            send: (0..block * n).map(|i| val(me, i)).collect(),
            recv: vec![zero(); block],
        },
        "alltoall" => Case {
            send: (0..block * n)
                .map(|j| a2a(me, j / block.max(1), j % block.max(1)))
                .collect(),
            recv: vec![zero(); block * n],
        },
        "broadcast" => Case {
            send: vec![],
            recv: (0..count)
                .map(|i| if me == 0 { val(0, i) } else { zero() })
                .collect(),
        },
        "barrier" => Case {
            send: vec![],
            recv: vec![],
        },
        "sendrecv" => Case {
            send: (0..count).map(|i| val(me, i)).collect(),
            recv: vec![zero(); count],
        },
        _ => Case {
            send: (0..count).map(|i| val(me, i)).collect(),
            recv: vec![zero(); count],
        },
    }
}

/// Elements of this rank's result that are wrong.
fn check<T: Num>(op: &str, n: usize, me: usize, c: &Case<T>) -> u64 {
    let block = c.recv.len() / n.max(1);
    let sum = |i: usize| T::of(((n * (n + 1) / 2) * (i % 7 + 1)) as i64);
    match op {
        "allreduce" => count_wrong(&c.recv, sum),
        "reduce" if me == 0 => count_wrong(&c.recv, sum),
        "broadcast" => count_wrong(&c.recv, |i| val(0, i)),
        "allgather" => count_wrong(&c.recv, |j| val(j / block.max(1), j % block.max(1))),
        "gather" if me == 0 => count_wrong(&c.recv, |j| val(j / block.max(1), j % block.max(1))),
        "scatter" => count_wrong(&c.recv, |i| val(me, i)),
        "reduce_scatter" => {
            let b = c.recv.len();
            count_wrong(&c.recv, |i| sum(me * b + i))
        }
        "alltoall" => count_wrong(&c.recv, |j| a2a(j / block.max(1), me, j % block.max(1))),
        "sendrecv" => count_wrong(&c.recv, |i| val((me + n - 1) % n, i)),
        "scan" => count_wrong(&c.recv, |i| {
            T::of(((me + 1) * (me + 2) / 2 * (i % 7 + 1)) as i64)
        }),
        "copy" => count_wrong(&c.recv, |i| val(me, i)),
        _ => 0,
    }
}

pub(crate) fn iterations(bytes: usize, forced: usize) -> (usize, usize) {
    if forced > 0 {
        return (forced.div_ceil(10).max(1), forced);
    }
    let iters = ((256usize << 20) / bytes.max(1 << 12)).clamp(5, 300);
    (iters / 10 + 2, iters)
}

pub(crate) fn bench_typed<T: Num>(comm: &Communicator, o: &BenchOpts) -> Result<Vec<Row>> {
    let n = comm.size();
    let me = comm.rank();
    let esz = T::DTYPE.size();
    let mut rows = Vec::new();
    let unit = size_unit(&o.op, n, esz);
    // Rows follow min, min x factor, ... exactly (as the baselines' tables do); a size too
    // small for one element per rank is skipped rather than rounded up.
    let progress = match (o.explain, o.op.as_str()) {
        // --explain prints as it goes, which a bar redrawn in place would garble.
        (true, _) => Progress::hidden(),
        (false, "barrier") => Progress::for_rank(me, 1, &o.op),
        _ => Progress::for_rank(me, steps(o.min_bytes, o.max_bytes, o.factor), &o.op),
    };
    let mut bytes = o.min_bytes;
    for step in 0.. {
        progress.at(step, bytes);
        let count = (bytes / unit) * unit / esz;
        let shown = count * esz;
        if count == 0 && o.op != "barrier" {
            if bytes >= o.max_bytes {
                break;
            }
            bytes = (bytes.max(1) * o.factor.max(2)).min(o.max_bytes);
            continue;
        }
        if o.explain && me == 0 {
            if let Some(coll) = collective_of(&o.op, n, count) {
                println!("# {}", comm.explain(&coll, T::DTYPE).replace('\n', "\n# "));
            }
        }
        let mut case = make_case::<T>(&o.op, n, me, count);
        let (warm, iters) = iterations(shown, o.iters);
        let mut wrong = 0;
        for _ in 0..warm {
            run_once(comm, &o.op, &mut case)?;
        }
        wrong += check(&o.op, n, me, &case);
        let mut times = vec![0f64; iters];
        // ACCORD_BENCH_SYNC=1: a barrier before every timed call, as the MPI and gloo baseline
        // scripts do, so that the tables compare like with like.
        let sync = std::env::var("ACCORD_BENCH_SYNC").is_ok_and(|v| v.trim() == "1");
        for t in times.iter_mut() {
            if sync {
                comm.barrier()?;
            }
            let start = Instant::now();
            run_once(comm, &o.op, &mut case)?;
            *t = start.elapsed().as_secs_f64() * 1e6;
        }
        wrong += check(&o.op, n, me, &case);
        comm.all_reduce(&mut times, ReduceOp::Max)?;
        let mut w = [wrong];
        comm.all_reduce(&mut w, ReduceOp::Sum)?;
        times.sort_by(f64::total_cmp);
        rows.push(Row::new(
            &o.op,
            n,
            shown,
            count,
            times[times.len() / 2],
            w[0],
        ));
        if bytes >= o.max_bytes || o.op == "barrier" {
            break;
        }
        bytes = (bytes * o.factor.max(2)).min(o.max_bytes);
    }
    if rows.is_empty() {
        return Err(accord::Error::invalid(format!(
            "no size between {} and {} bytes holds one {} element per rank for {}",
            o.min_bytes,
            o.max_bytes,
            T::DTYPE,
            o.op
        )));
    }
    Ok(rows)
}

/// The collective the benchmark runs for `op` at `count` elements (for `--explain`).
pub(crate) fn collective_of(op: &str, n: usize, count: usize) -> Option<Collective> {
    let block = count / n.max(1);
    Some(match op {
        "allreduce" => Collective::AllReduce { count },
        "broadcast" => Collective::Broadcast { count, root: 0 },
        "reduce" => Collective::Reduce { count, root: 0 },
        "allgather" => Collective::AllGather {
            counts: vec![block; n],
        },
        "gather" => Collective::Gather {
            counts: vec![block; n],
            root: 0,
        },
        "scatter" => Collective::Scatter {
            counts: vec![block; n],
            root: 0,
        },
        "reduce_scatter" => Collective::ReduceScatter {
            counts: vec![block; n],
        },
        "alltoall" => Collective::AllToAll {
            send_counts: vec![block; n],
            recv_counts: vec![block; n],
        },
        "barrier" => Collective::Barrier,
        "scan" => Collective::Scan {
            count,
            exclusive: false,
        },
        _ => return None,
    })
}

/// Body of one benchmark rank. Returns the process exit code.
pub fn rank_main(o: &BenchOpts) -> i32 {
    let comm = match accord::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("accord bench: init failed: {e}");
            return 1;
        }
    };
    let rows = match o.dtype {
        DataType::F32 => bench_typed::<f32>(&comm, o),
        DataType::F64 => bench_typed::<f64>(&comm, o),
        DataType::I32 => bench_typed::<i32>(&comm, o),
        DataType::I64 => bench_typed::<i64>(&comm, o),
        d => Err(accord::Error::invalid(format!(
            "the benchmark checks f32, f64, i32 and i64, not {d}"
        ))),
    };
    let rows = match rows {
        Ok(r) => r,
        Err(e) => {
            eprintln!("accord bench: rank {}: {e}", comm.rank());
            return 1;
        }
    };
    let transport = match comm.uses_shm() {
        true => format!("{}, shared-memory collectives", comm.transport_name()),
        false => comm.transport_name().to_string(),
    };
    report(&comm, o, &rows, &transport, &transport)
}

/// Rank 0 prints the table (labelled with `transport`) and writes the JSON (with
/// `json_transport`); every rank returns the exit code: 1 if any result was wrong.
pub(crate) fn report(
    comm: &Communicator,
    o: &BenchOpts,
    rows: &[Row],
    transport: &str,
    json_transport: &str,
) -> i32 {
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    if comm.rank() == 0 {
        print_rows(comm, o, rows, transport);
        let doc = rows_doc(comm, o, rows, json_transport);
        if let Some(path) = &o.json {
            let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
            if let Err(e) = std::fs::write(path, text) {
                eprintln!("accord bench: cannot write {path}: {e}");
                return 1;
            }
        }
        if let Some(path) = &o.plot {
            if let Err(e) = plot(&doc, o, path) {
                eprintln!("accord bench: {e}");
                return 1;
            }
        }
        if wrong > 0 {
            eprintln!("accord bench: {wrong} wrong result element(s)");
        }
    }
    i32::from(wrong > 0)
}

pub(crate) fn print_rows(comm: &Communicator, o: &BenchOpts, rows: &[Row], transport: &str) {
    let redop = if matches!(o.op.as_str(), "allreduce" | "reduce" | "reduce_scatter") {
        "sum"
    } else {
        "-"
    };
    let root = if matches!(o.op.as_str(), "broadcast" | "reduce" | "gather" | "scatter") {
        "0"
    } else {
        "-"
    };
    println!(
        "# accord bench {}: {} ranks, transport {}, dtype {}",
        o.op,
        comm.size(),
        transport,
        o.dtype
    );
    println!(
        "# {:>12} {:>12} {:>6} {:>6} {:>5} {:>11} {:>11} {:>11} {:>7}",
        "size(B)",
        "count",
        "type",
        "redop",
        "root",
        "time(us)",
        "algbw(GB/s)",
        "busbw(GB/s)",
        "#wrong"
    );
    for r in rows {
        println!(
            "  {:>12} {:>12} {:>6} {:>6} {:>5} {:>11.2} {:>11.3} {:>11.3} {:>7}",
            r.bytes,
            r.count,
            o.dtype.name(),
            redop,
            root,
            r.time_us,
            r.algbw,
            r.busbw,
            r.wrong
        );
    }
}

/// Version of the `--json` document (docs/json_formats.md); bumped when a field changes
/// meaning or goes away.
pub const JSON_SCHEMA: u32 = 1;

/// The `--json` document of a run.
pub(crate) fn rows_doc(
    comm: &Communicator,
    o: &BenchOpts,
    rows: &[Row],
    transport: &str,
) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "bytes": r.bytes, "count": r.count, "time_us": r.time_us,
                "algbw_gbps": r.algbw, "busbw_gbps": r.busbw, "wrong": r.wrong,
            })
        })
        .collect();
    serde_json::json!({
        "schema": JSON_SCHEMA, "op": o.op, "ranks": comm.size(), "transport": transport,
        "dtype": o.dtype.name(), "rows": rows,
    })
}

/// `--plot`: this run (`doc`) and the `--overlay` runs, into the SVG file `path`.
fn plot(doc: &serde_json::Value, o: &BenchOpts, path: &str) -> std::result::Result<(), String> {
    let label = format!(
        "{}, {} ranks, {}",
        o.op,
        doc["ranks"],
        doc["transport"].as_str().unwrap_or_default()
    );
    let mut series = vec![crate::plot::series(doc, &label)?];
    for f in &o.overlay {
        series.push(crate::plot::load(f)?);
    }
    crate::plot::draw(&series, path, &crate::plot::default_title(&series))
}
