//! What the always-on flight recorder costs a call: one entry written when a call starts and
//! updated when it returns (`cargo bench -p accord --bench flight_cost`). Compare with a
//! 4-byte allreduce's time from `accord bench allreduce -n 2 --sizes 4:4`.

use accord::dtype::DataType;
use accord::fingerprint::{Fingerprint, OpKind};
use accord::observe::{FlightRecorder, Route};
use accord::ReduceOp;
use std::hint::black_box;
use std::time::Instant;

fn main() {
    let rec = FlightRecorder::new(2048);
    let fp = Fingerprint::new(OpKind::AllReduce, DataType::F32, 1).with_op(ReduceOp::Sum);
    let iters = 20_000_000u64;
    let start = Instant::now();
    for seq in 0..iters {
        let e = rec.begin_host(black_box(seq), black_box(&fp), Route::Engine(0), true);
        rec.end(e, true);
    }
    let ns = start.elapsed().as_nanos() as f64 / iters as f64;
    println!("flight recorder, one call recorded (start + end): {ns:.1} ns");
    black_box(rec.records().len());
}
