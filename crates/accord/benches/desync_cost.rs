//! What always-on desync detection costs on small messages.
//!
//! Every frame carries the call's 24-byte fingerprint, which the receiver decodes and compares
//! with its own; while waiting, the mailbox also scans pending frames of the same call for a
//! different fingerprint. This bench times those pieces against a whole small allreduce so the
//! ratio can be quoted: `cargo bench -p accord --bench desync_cost`.

use accord::dtype::DataType;
use accord::fingerprint::{Fingerprint, OpKind};
use accord::testing::run_world;
use accord::ReduceOp;
use std::hint::black_box;
use std::time::Instant;

fn per_iter_ns(iters: u32, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}

fn main() {
    let mine = Fingerprint::new(OpKind::AllReduce, DataType::F32, 1).with_op(ReduceOp::Sum);
    let wire = mine.encode();
    let check_ns = per_iter_ns(10_000_000, || {
        let theirs = Fingerprint::decode(black_box(&wire)).unwrap();
        black_box(theirs == black_box(mine));
    });

    // A 4-byte allreduce between 2 in-process ranks: the smallest full call.
    let iters = 20_000u32;
    let times = run_world(2, |comm| {
        let mut v = [1.0f32];
        for _ in 0..1000 {
            comm.all_reduce(&mut v, ReduceOp::Sum).unwrap();
        }
        per_iter_ns(iters, || {
            comm.all_reduce(&mut v, ReduceOp::Sum).unwrap();
        })
    });
    let call_ns = times.iter().cloned().fold(0.0, f64::max);
    // Recursive doubling on 2 ranks: one frame received per call.
    println!("fingerprint decode + compare per frame: {check_ns:.1} ns");
    println!(
        "4-byte allreduce, 2 in-process ranks:   {:.2} us per call",
        call_ns / 1e3
    );
    println!(
        "desync check share of a small call:     {:.2} %",
        100.0 * check_ns / call_ns
    );
}
