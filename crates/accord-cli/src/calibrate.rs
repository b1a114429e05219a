//! `accord bench --calibrate PROFILE`: measure what `accord sim --profile` prices calls with,
//! and what the tuner chooses algorithms by where `ACCORD_TUNER_PROFILE` names the profile.
//!
//! Two jobs of N local ranks (default 2) measure, in turn:
//! - over TCP only (`ACCORD_TRANSPORT=tcp`): the half round trip of a message between ranks 0
//!   and 1 from 8 B to 64 MiB, fitted to `alpha + beta x bytes` (alpha: the 8-byte time; beta:
//!   the least-squares slope from 256 KiB); the time of an *exchange*, both ranks sending to
//!   each other at once, as most steps of a schedule do (what `accord sim` prices a message
//!   with: where the two directions share CPUs or a link, the ping-pong is too optimistic);
//!   and how fast one core reduces (f32 sums: gamma, for arrays of 4 MiB, and per array size
//!   from 64 KiB to 64 MiB: beyond the caches a reduction runs at memory's pace);
//! - with shared memory: the same through the point-to-point rings (the messages of
//!   schedules between ranks of one host), and the shared-memory engine's own collectives
//!   (allreduce, broadcast, allgather, reduce_scatter, alltoall) from 4 KiB to 64 MiB, timed
//!   as `accord bench` times them with `ACCORD_BENCH_SYNC=1`. The engine's times are kept as a
//!   table (`accord sim` interpolates), since its cost is no per-message formula.
//!
//! With `--crowd M` (M >= 4) a third job of M ranks times the TCP exchange made by 2, 4, ...
//! up to M / 2 pairs of ranks at once (`crowd`): how much messages slow down when they compete
//! for the machine's CPUs, memory and loopback, which `accord sim` prices crowded rounds with.
//!
//! With `--network-from DIR` the TCP (and crowd) phases are not run here: their measurements
//! are read from `DIR/tcp.part` (and `DIR/crowd.part`), written by the same phases run as ranks
//! on other hosts (`accord bench-rank --calibrate DIR/tcp.part --calibrate-phase tcp`, as
//! `bench/multihost.sh calibrate` does between network namespaces), so that the profile prices
//! that network.
//!
//! The profile is JSON: `{"accord_profile": 1, "cpus", "ranks", "gamma_us_per_byte",
//! "gamma": [[bytes, us_per_byte], ...],
//! "tcp": {"alpha_us", "beta_us_per_byte", "pingpong": [[bytes, us], ...], "exchange": [...],
//! "crowd": [{"pairs": 2, "exchange": [...]}, ...]},
//! "shm": {...},
//! "shm_engine": {"allreduce": [[bytes, us], ...], ...}}`.

use crate::bench::{self, BenchOpts};
use crate::launch;
use accord::schedule::calibrated::{fit, points};
use accord::{Communicator, DataType, ReduceOp};
use serde_json::{json, Value};
use std::time::Instant;

/// The shared-memory engine's collectives the profile times.
pub const ENGINE_OPS: [&str; 5] = [
    "allreduce",
    "broadcast",
    "allgather",
    "reduce_scatter",
    "alltoall",
];

/// Message sizes of the ping-pong and the exchange: up to 64 MiB, as `accord sim` prices
/// calls, since messages beyond the caches cost more per byte than a fit of smaller ones says;
/// from 4 KiB every power of two, since the price between two sizes timed is interpolated and
/// a message's cost is not smooth in its size where the transport changes how it moves it
/// (the callers' own reads below 1 MiB, several connections from 256 KiB).
const MESSAGE_BYTES: [usize; 18] = [
    8,
    64,
    512,
    4 << 10,
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
    8 << 20,
    16 << 20,
    32 << 20,
    64 << 20,
];

/// Launcher side: run both phases on `n` local ranks and write the profile to `path`.
pub fn launch(
    n: usize,
    crowd: Option<usize>,
    network_from: Option<&str>,
    bind: launch::Binding,
    path: &str,
    self_cmd: &[String],
) -> i32 {
    if n < 2 {
        eprintln!("accord bench --calibrate: needs at least 2 ranks");
        return 2;
    }
    if crowd.is_some_and(|c| c < 4) {
        eprintln!("accord bench --calibrate: --crowd needs at least 4 ranks (2 pairs)");
        return 2;
    }
    let mut jobs = vec![("tcp", n), ("shm", n)];
    jobs.extend(crowd.map(|c| ("crowd", c)));
    let mut parts = Vec::new();
    for (phase, ranks) in jobs {
        if let Some(dir) = network_from.filter(|_| phase != "shm") {
            let part = format!("{dir}/{phase}.part");
            eprintln!("accord bench --calibrate: {phase} from {part}");
            match read_part(&part) {
                Ok(v) => parts.push(v),
                Err(e) => {
                    eprintln!("accord bench --calibrate: {part}: {e}");
                    return 1;
                }
            }
            continue;
        }
        let part = format!("{path}.{phase}.part");
        let mut program = self_cmd.to_vec();
        program.extend(
            [
                "bench-rank",
                "--calibrate",
                &part,
                "--calibrate-phase",
                phase,
            ]
            .map(String::from),
        );
        let mut env = vec![("ACCORD_BENCH_SYNC".to_string(), "1".to_string())];
        if phase != "shm" {
            env.push(("ACCORD_TRANSPORT".into(), "tcp".into()));
        }
        eprintln!("accord bench --calibrate: {phase} on {ranks} ranks");
        let code = launch::run(launch::Launch {
            n: ranks,
            program,
            env,
            prefix: false,
            bind,
        });
        if code != 0 {
            return code;
        }
        let read = read_part(&part);
        let _ = std::fs::remove_file(&part);
        match read {
            Ok(v) => parts.push(v),
            Err(e) => {
                eprintln!("accord bench --calibrate: the {phase} measurements: {e}");
                return 1;
            }
        }
    }
    let (tcp, shm) = (&parts[0], &parts[1]);
    let link = |v: &Value, name: &str| {
        let fitted = fit(&points(&v["pingpong"]));
        let Some((alpha, beta)) = fitted else {
            eprintln!("accord bench --calibrate: no usable {name} ping-pong times (each positive)");
            return None;
        };
        Some(
            json!({"alpha_us": alpha, "beta_us_per_byte": beta, "pingpong": v["pingpong"],
               "exchange": v["exchange"]}),
        )
    };
    let (Some(mut tcp_link), Some(shm_link)) = (link(tcp, "tcp"), link(shm, "shm")) else {
        return 1;
    };
    if let Some(c) = parts.get(2) {
        tcp_link["crowd"] = c["crowd"].clone();
    }
    let profile = json!({
        "accord_profile": 1,
        "cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "ranks": n,
        "gamma_us_per_byte": tcp["gamma_us_per_byte"],
        "gamma": tcp["gamma"],
        "tcp": tcp_link,
        "shm": shm_link,
        "shm_engine": shm["engine"],
    });
    let text = serde_json::to_string_pretty(&profile).unwrap_or_default();
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("accord bench --calibrate: cannot write {path}: {e}");
        return 1;
    }
    let (t, s) = (&profile["tcp"], &profile["shm"]);
    println!(
        "# profile {path}: tcp alpha {:.2} us, {:.3} GB/s; shm messages alpha {:.2} us, {:.3} GB/s; \
         reduction {:.2} GB/s; shared-memory engine timed on {n} ranks",
        t["alpha_us"].as_f64().unwrap_or(0.0),
        1e-3 / t["beta_us_per_byte"].as_f64().unwrap_or(f64::NAN),
        s["alpha_us"].as_f64().unwrap_or(0.0),
        1e-3 / s["beta_us_per_byte"].as_f64().unwrap_or(f64::NAN),
        1e-3 / profile["gamma_us_per_byte"].as_f64().unwrap_or(f64::NAN),
    );
    0
}

/// One phase's measurements, as its rank 0 wrote them.
fn read_part(part: &str) -> Result<Value, String> {
    std::fs::read_to_string(part)
        .map_err(|e| e.to_string())
        .and_then(|s| serde_json::from_str::<Value>(&s).map_err(|e| e.to_string()))
}

/// Rank side of one phase; rank 0 writes the measurements to `out`.
pub fn rank_main(phase: &str, out: &str) -> i32 {
    let comm = match accord::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("accord bench --calibrate: init failed: {e}");
            return 1;
        }
    };
    let measured = (|| -> accord::Result<Value> {
        if phase == "crowd" {
            let mut crowd = Vec::new();
            for pairs in crowd_sizes(comm.size()) {
                crowd.push(json!({"pairs": pairs, "exchange": crowded(&comm, pairs)?}));
            }
            return Ok(json!({ "crowd": crowd }));
        }
        let mut v = json!({
            "pingpong": messages(&comm, false)?,
            "exchange": messages(&comm, true)?,
        });
        if phase == "tcp" {
            let gammas = gammas();
            // The single figure of older profiles: the 4 MiB arrays' cost, timed once above.
            v["gamma_us_per_byte"] = gammas[1][1].clone();
            v["gamma"] = json!(gammas);
        } else {
            let mut engine = serde_json::Map::new();
            for op in ENGINE_OPS {
                let o = BenchOpts {
                    op: op.into(),
                    min_bytes: 4 << 10,
                    max_bytes: 64 << 20,
                    factor: 4,
                    dtype: DataType::F32,
                    explain: false,
                    json: None,
                    plot: None,
                    overlay: vec![],
                    iters: 0,
                    device: "cpu".into(),
                    engine: None,
                    symmetric: false,
                    shape: vec![],
                };
                let rows = bench::bench_typed::<f32>(&comm, &o)?;
                let table: Vec<Value> = rows.iter().map(|r| json!([r.bytes, r.time_us])).collect();
                engine.insert(op.into(), Value::Array(table));
            }
            v["engine"] = Value::Object(engine);
        }
        Ok(v)
    })();
    match measured {
        Ok(v) if comm.rank() == 0 => match std::fs::write(out, v.to_string()) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("accord bench --calibrate: cannot write {out}: {e}");
                1
            }
        },
        Ok(_) => 0,
        Err(e) => {
            eprintln!("accord bench --calibrate: rank {}: {e}", comm.rank());
            1
        }
    }
}

/// Ranks 0 and 1 pass messages (median per size; the other ranks wait): half round trips, or
/// with `exchange` both send at once (the time of one sendrecv).
fn messages(comm: &Communicator, exchange: bool) -> accord::Result<Vec<Value>> {
    let me = comm.rank();
    let mut rows = Vec::new();
    for (tag, &b) in MESSAGE_BYTES.iter().enumerate() {
        let tag = tag as u32 + if exchange { 100 } else { 0 };
        let mut buf = vec![1u8; b];
        let out = vec![2u8; b];
        let iters = ((64usize << 20) / b.max(4096)).clamp(10, 1000);
        let mut times = Vec::with_capacity(iters);
        comm.barrier()?;
        for i in 0..iters + iters / 10 + 2 {
            let start = Instant::now();
            match me {
                0 | 1 if exchange => {
                    comm.sendrecv(&out[..], 1 - me, &mut buf[..], 1 - me, tag)?;
                }
                0 => {
                    comm.send(&buf[..], 1, tag)?;
                    comm.recv(&mut buf[..], 1, tag)?;
                }
                1 => {
                    comm.recv(&mut buf[..], 0, tag)?;
                    comm.send(&buf[..], 0, tag)?;
                }
                _ => break,
            }
            let per = if exchange { 1.0 } else { 2.0 };
            if i > iters / 10 + 1 {
                times.push(start.elapsed().as_secs_f64() * 1e6 / per);
            }
        }
        times.sort_by(f64::total_cmp);
        if me == 0 {
            rows.push(json!([b, times[times.len() / 2]]));
        }
    }
    comm.barrier()?;
    Ok(rows)
}

/// The numbers of pairs exchanging at once that the calibration times on `n` ranks: 2, 4, ...
/// up to `n / 2`, which is always among them.
fn crowd_sizes(n: usize) -> Vec<usize> {
    let top = n / 2;
    let mut v: Vec<usize> = (1..).map(|i| 1 << i).take_while(|&p| p < top).collect();
    if top >= 2 {
        v.push(top);
    }
    v
}

/// `pairs` pairs of ranks (0 and 1, 2 and 3, ...) exchange messages at once, as the ranks of a
/// schedule's round do: per size, the slowest pair's median time of one exchange.
fn crowded(comm: &Communicator, pairs: usize) -> accord::Result<Vec<Value>> {
    let me = comm.rank();
    let mut rows = Vec::new();
    for (tag, &b) in MESSAGE_BYTES.iter().enumerate() {
        let tag = 200 + tag as u32;
        let (mut buf, out) = (vec![1u8; b], vec![2u8; b]);
        let iters = ((64usize << 20) / b.max(4096)).clamp(10, 1000);
        let mut times = Vec::with_capacity(iters);
        comm.barrier()?;
        if me < 2 * pairs {
            for i in 0..iters + iters / 10 + 2 {
                let start = Instant::now();
                comm.sendrecv(&out[..], me ^ 1, &mut buf[..], me ^ 1, tag)?;
                if i > iters / 10 + 1 {
                    times.push(start.elapsed().as_secs_f64() * 1e6);
                }
            }
            times.sort_by(f64::total_cmp);
        }
        let mut worst = [times.get(times.len() / 2).copied().unwrap_or(0.0)];
        comm.all_reduce(&mut worst, ReduceOp::Max)?;
        rows.push(json!([b, worst[0]]));
    }
    Ok(rows)
}

/// Array sizes (bytes) the reduction is timed at: in the caches up to a few MiB, from memory
/// beyond. The second, 4 MiB, gives the profile's `gamma_us_per_byte` too.
const GAMMA_BYTES: [usize; 4] = [64 << 10, 4 << 20, 16 << 20, 64 << 20];

/// Microseconds per byte one core takes to add one f32 array of `bytes` into another (best of
/// up to 20).
fn gamma_at(bytes: usize) -> f64 {
    let n = bytes / 4;
    let (mut acc, add) = (vec![1.0f32; n], vec![0.5f32; n]);
    let mut best = f64::INFINITY;
    for _ in 0..((256usize << 20) / bytes).clamp(3, 20) {
        let start = Instant::now();
        for (a, b) in acc.iter_mut().zip(&add) {
            *a += *b;
        }
        std::hint::black_box(&acc);
        best = best.min(start.elapsed().as_secs_f64() * 1e6);
    }
    best / bytes as f64
}

/// The reduction's cost per byte at each of [`GAMMA_BYTES`]: `[[bytes, us per byte], ...]`.
fn gammas() -> Vec<Value> {
    GAMMA_BYTES
        .iter()
        .map(|&b| json!([b, gamma_at(b)]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::crowd_sizes;

    #[test]
    fn crowds_double_up_to_half_the_ranks() {
        assert!(crowd_sizes(2).is_empty() && crowd_sizes(3).is_empty());
        assert_eq!(crowd_sizes(4), [2]);
        assert_eq!(crowd_sizes(6), [2, 3]);
        assert_eq!(crowd_sizes(8), [2, 4]);
        assert_eq!(crowd_sizes(16), [2, 4, 8]);
    }
}
