//! `accord sim`: every algorithm of an operation simulated on a world of any size, next to the
//! tuner's closed-form prediction and its choice.

use accord::schedule::sim;
use accord::schedule::tuner::CostModel;
use accord::schedule::Collective;

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
    let (lo, hi) = sizes.split_once(':').unwrap_or((sizes, sizes));
    let (lo, hi) = (crate::bench::parse_size(lo)?, crate::bench::parse_size(hi)?);
    println!(
        "# cost model: alpha {} us, beta {} us/B, gamma {} us/B; elements of 4 bytes",
        model.alpha_us, model.beta_us_per_byte, model.gamma_us_per_byte
    );
    let mut bytes = lo.max(4);
    loop {
        let count = bytes / 4;
        let block = (count / n).max(1);
        let coll = match op {
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
            other => return Err(format!("unknown operation {other:?}")),
        };
        println!(
            "\n{}",
            sim::table(&coll, n, 4, &model).map_err(|e| e.to_string())?
        );
        if bytes >= hi || op == "barrier" {
            return Ok(());
        }
        bytes = (bytes * factor.max(2)).min(hi);
    }
}
