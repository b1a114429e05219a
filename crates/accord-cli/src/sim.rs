//! `accord sim`: every algorithm of an operation simulated on a world of any size, next to the
//! tuner's closed-form prediction and its choice.

use accord::schedule::sim;
use accord::schedule::tuner::CostModel;

/// Print one table per size.
pub fn run(op: &str, n: usize, sizes: &str, factor: usize, model: &str) -> Result<(), String> {
    if n == 0 {
        return Err("need at least one rank".into());
    }
    let model = match model {
        "tcp" => CostModel::tcp(),
        "shm" => CostModel::shm(),
        "inproc" => CostModel::inproc(),
        m => {
            return Err(format!(
                "unknown cost model {m:?}; choose tcp, shm or inproc"
            ))
        }
    };
    let (lo, hi) = crate::bench::parse_range(sizes)?;
    println!(
        "# cost model: alpha {} us, beta {} us/B, gamma {} us/B; elements of 4 bytes",
        model.alpha_us, model.beta_us_per_byte, model.gamma_us_per_byte
    );
    let mut bytes = lo.max(4);
    let total = match op {
        "barrier" => 1,
        _ => crate::progress::steps(bytes, hi, factor),
    };
    let progress = crate::progress::Progress::stderr(total, &format!("sim {op}"));
    for step in 0.. {
        progress.at(step, bytes);
        // Per-rank blocks of at least one element, so every table has data to move.
        let whole_buffer_op = matches!(op, "allreduce" | "broadcast" | "reduce");
        let count = (bytes / 4).max(if whole_buffer_op { 1 } else { n });
        let coll = crate::bench::collective_of(op, n, count)
            .ok_or_else(|| format!("unknown operation {op:?}"))?;
        let table = sim::table(&coll, n, 4, &model).map_err(|e| e.to_string())?;
        progress.suspend(|| println!("\n{table}"));
        if bytes >= hi || op == "barrier" {
            break;
        }
        bytes = (bytes * factor.max(2)).min(hi);
    }
    Ok(())
}
