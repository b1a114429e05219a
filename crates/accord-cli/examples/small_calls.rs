//! A rank program that makes `N` small calls (`OP`: `allreduce`, the default, `broadcast`,
//! `allgather` or `alltoall`; 16 floats to each rank) and nothing else, for counting what one
//! call costs: run under valgrind at two values of `N`, the difference divided by the
//! difference in calls is one call's allocations or instructions (`bench/per_call.sh`).

fn main() {
    let comm = accord::init().expect("init");
    let op = std::env::var("OP").unwrap_or_else(|_| "allreduce".into());
    let n: usize = std::env::var("N").map_or(1000, |v| v.parse().expect("N: a count"));
    let mut buf = [1f32; 16];
    let (all, mut out) = (vec![1f32; 16 * comm.size()], vec![0f32; 16 * comm.size()]);
    comm.barrier().expect("barrier");
    for _ in 0..n {
        match op.as_str() {
            "broadcast" => comm.broadcast(&mut buf[..], 0).map(drop),
            "allgather" => comm.all_gather(&buf[..], &mut out[..]).map(drop),
            "alltoall" => comm.all_to_all(&all[..], &mut out[..]).map(drop),
            _ => comm
                .all_reduce(&mut buf[..], accord::ReduceOp::Max)
                .map(drop),
        }
        .expect("call");
    }
}
