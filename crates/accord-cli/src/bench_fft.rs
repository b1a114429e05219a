//! `accord bench fft` and `accord bench redistribute`: distributed arrays on host memory.
//!
//! `fft --shape X,Y,Z`: a complex 3-D transform of an array in X slabs, forward into Y slabs
//! and backward into X slabs (one transpose each way, as mpi4py-fft's `PFFT` with slabs
//! does), after a check that backward(forward(x)) returns x. `redistribute --shape ...`: X
//! slabs to Y slabs, timed beside an alltoallv of the same counts on already packed buffers:
//! what the redistribution adds to the exchange it is built on (`fraction`: the alltoallv's time
//! over the redistribution's, the share of alltoallv's bandwidth the redistribution reaches). Each time is the slowest
//! rank's (ranks start together after a barrier); the table gives the median and the fastest of
//! the iterations.

use crate::bench::BenchOpts;
use accord::distributed::{
    Direction, DistributedFft, Distribution, FftKind, Norm, Precision, Redistribute,
};
use accord::dtype::Complex;
use accord::{Communicator, DataType, Parts, RecvBuf, ReduceOp, Result, SendBuf};
use std::time::Instant;

/// The slowest rank's time of `f`, in seconds, for each of `iters` runs after `warmup`.
fn timed(
    comm: &Communicator,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        comm.barrier()?;
        let t0 = Instant::now();
        f()?;
        let mut t = [t0.elapsed().as_secs_f64()];
        comm.all_reduce(&mut t, ReduceOp::Max)?;
        if i >= warmup {
            out.push(t[0]);
        }
    }
    Ok(out)
}

/// (median, fastest) of `v`, in milliseconds.
fn summary(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    (1e3 * s[s.len() / 2], 1e3 * s[0])
}

fn precision(o: &BenchOpts) -> Result<Precision> {
    match o.dtype {
        DataType::F32 | DataType::C64 => Ok(Precision::F32),
        DataType::F64 | DataType::C128 => Ok(Precision::F64),
        d => Err(accord::Error::invalid(format!(
            "fft and redistribute run in single (f32, c64) or double (f64, c128) precision, not {d}"
        ))),
    }
}

/// A deterministic complex value per local index and rank.
fn value(i: usize, rank: usize) -> Complex<f64> {
    let k = (i * 2654435761 + rank * 40503) % 1000;
    Complex::new(
        k as f64 / 500.0 - 1.0,
        ((k * 7) % 1000) as f64 / 500.0 - 1.0,
    )
}

/// Body of one `fft` or `redistribute` rank; the exit code.
pub fn rank_main(o: &BenchOpts) -> i32 {
    let comm = match accord::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("accord bench: init failed: {e}");
            return 1;
        }
    };
    let run = || match (o.op.as_str(), precision(o)?) {
        ("fft", Precision::F32) => fft::<Complex<f32>>(
            &comm,
            o,
            Precision::F32,
            |c| Complex::new(c.re as f32, c.im as f32),
            |c| Complex::new(c.re as f64, c.im as f64),
        ),
        ("fft", Precision::F64) => fft::<Complex<f64>>(&comm, o, Precision::F64, |c| c, |c| c),
        (_, p) => redistribute(&comm, o, p),
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("accord bench: rank {}: {e}", comm.rank());
            1
        }
    }
}

fn iterations(o: &BenchOpts, bytes: usize) -> (usize, usize) {
    match o.iters {
        0 => (2, (2_000_000_000 / bytes.max(1)).clamp(5, 50)),
        n => (1, n),
    }
}

fn fft<T: accord::Element + Copy + Default>(
    comm: &Communicator,
    o: &BenchOpts,
    p: Precision,
    make: impl Fn(Complex<f64>) -> T,
    widen: impl Fn(T) -> Complex<f64>,
) -> Result<()> {
    let (r, size) = (comm.rank(), comm.size());
    let x_slab = Distribution::Slab(0).region(&o.shape, r, size)?;
    let t0 = Instant::now();
    let forward = DistributedFft::new(comm, &x_slab, None, FftKind::C2C, p)?;
    let y_slab = forward.output().region(r).clone();
    let backward = DistributedFft::new(comm, &y_slab, Some(&x_slab), FftKind::C2C, p)?;
    let plan_s = t0.elapsed().as_secs_f64();
    let x: Vec<T> = (0..x_slab.volume()).map(|i| make(value(i, r))).collect();
    let mut spec = vec![T::default(); y_slab.volume()];
    let mut back = vec![T::default(); x_slab.volume()];
    // Correct first: the round trip returns the input.
    forward.execute(comm, &x, &mut spec, Direction::Forward, Norm::Backward)?;
    backward.execute(comm, &spec, &mut back, Direction::Inverse, Norm::Backward)?;
    let err = x
        .iter()
        .zip(&back)
        .map(|(a, b)| (widen(*a) - widen(*b)).norm())
        .fold(0.0f64, f64::max);
    let mut worst = [err];
    comm.all_reduce(&mut worst, ReduceOp::Max)?;
    let tol = if p == Precision::F32 { 1e-4 } else { 1e-10 };
    if worst[0] > tol {
        return Err(accord::Error::invalid(format!(
            "fft: backward(forward(x)) differs from x by {:e}",
            worst[0]
        )));
    }
    let bytes = x.len() * std::mem::size_of::<T>();
    let (warmup, iters) = iterations(o, bytes * size);
    let f = timed(comm, warmup, iters, || {
        forward
            .execute(comm, &x, &mut spec, Direction::Forward, Norm::Backward)
            .map(|_| ())
    })?;
    let b = timed(comm, warmup, iters, || {
        backward
            .execute(comm, &spec, &mut back, Direction::Inverse, Norm::Backward)
            .map(|_| ())
    })?;
    if r == 0 {
        let ((fm, ff), (bm, bf)) = (summary(&f), summary(&b));
        let name = if p == Precision::F32 {
            "complex64"
        } else {
            "complex128"
        };
        println!(
            "# accord fft: shape {:?} {name}, {size} ranks, X slabs -> Y slabs and back; plan {:.1} ms; \
             round trip error {:.1e}; {iters} iterations",
            o.shape,
            1e3 * plan_s,
            worst[0]
        );
        println!("{:>10} {:>12} {:>12}", "direction", "median ms", "best ms");
        println!("{:>10} {fm:>12.3} {ff:>12.3}", "forward");
        println!("{:>10} {bm:>12.3} {bf:>12.3}", "backward");
        let doc = serde_json::json!({
            "impl": "accord", "shape": o.shape, "ranks": size, "dtype": name,
            "forward_s": fm / 1e3, "backward_s": bm / 1e3, "all": f, "all_backward": b,
            "plan_s": plan_s, "round_trip_error": worst[0],
        });
        println!("{doc}");
        write_json(o, &doc)?;
    }
    Ok(())
}

fn redistribute(comm: &Communicator, o: &BenchOpts, p: Precision) -> Result<()> {
    let (r, size) = (comm.rank(), comm.size());
    let dtype = if p == Precision::F32 {
        DataType::C64
    } else {
        DataType::C128
    };
    let w = dtype.size();
    let from = Distribution::Slab(0).region(&o.shape, r, size)?;
    let to = Distribution::Slab(1).region(&o.shape, r, size)?;
    let plan = Redistribute::new(comm, &from, &to, dtype)?;
    let input: Vec<u8> = (0..from.volume() * w)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    let mut output = vec![0u8; to.volume() * w];
    // The same exchange without the layout: each peer's count of the plan, packed buffers.
    let sends: Vec<usize> = (0..size)
        .map(|j| {
            from.intersect(&Distribution::Slab(1).region(&o.shape, j, size).unwrap())
                .map_or(0, |b| b.volume())
        })
        .collect();
    let recvs: Vec<usize> = (0..size)
        .map(|j| {
            to.intersect(&Distribution::Slab(0).region(&o.shape, j, size).unwrap())
                .map_or(0, |b| b.volume())
        })
        .collect();
    let mut packed = vec![0u8; output.len()];
    let (warmup, iters) = iterations(o, input.len() * size);
    let mut rounds = Vec::new();
    // Alternate the two, several rounds, so that neither always runs on a warmer machine.
    for _ in 0..3 {
        let a = timed(comm, warmup, iters, || {
            plan.execute(
                comm,
                SendBuf::bytes(&input, dtype),
                RecvBuf::bytes(&mut output, dtype),
            )
            .map(|_| ())
        })?;
        let b = timed(comm, warmup, iters, || {
            comm.all_to_all(
                Parts::new(SendBuf::bytes(&input, dtype), &sends),
                Parts::new(RecvBuf::bytes(&mut packed, dtype), &recvs),
            )
            .map(|_| ())
        })?;
        rounds.push((summary(&a).0, summary(&b).0));
    }
    let (sent, _) = plan.bytes_moved();
    let mut total = [sent as f64];
    comm.all_reduce(&mut total, ReduceOp::Sum)?;
    if r == 0 {
        println!(
            "# accord redistribute: shape {:?} {dtype}, {size} ranks, X slabs -> Y slabs; {:.1} MB \
             between ranks per call; {iters} iterations x 3 alternating rounds",
            o.shape,
            total[0] / 1e6
        );
        println!(
            "{:>6} {:>16} {:>16} {:>10} {:>14}",
            "round", "redistribute ms", "alltoallv ms", "fraction", "redist GB/s"
        );
        for (i, (a, b)) in rounds.iter().enumerate() {
            let gbs = total[0] / (a / 1e3) / 1e9;
            println!(
                "{:>6} {a:>16.3} {b:>16.3} {:>10.2} {gbs:>14.2}",
                i + 1,
                b / a
            );
        }
        let doc = serde_json::json!({
            "impl": "accord", "op": "redistribute", "shape": o.shape, "ranks": size,
            "dtype": dtype.to_string(), "bytes_between_ranks": total[0],
            "rounds_ms": rounds.iter().map(|(a, b)| [*a, *b]).collect::<Vec<_>>(),
        });
        write_json(o, &doc)?;
    }
    Ok(())
}

fn write_json(o: &BenchOpts, doc: &serde_json::Value) -> Result<()> {
    if let Some(path) = &o.json {
        std::fs::write(path, serde_json::to_string_pretty(doc).unwrap_or_default())
            .map_err(|e| accord::Error::invalid(format!("cannot write {path}: {e}")))?;
    }
    Ok(())
}
