//! Collectives across simulated hosts (ranks whose `ACCORD_HOST_ID`s differ: shared memory
//! inside each host, TCP between them), where hosts or ranks disagree or are missing: every
//! rank fails promptly, a barrier holds every rank, and one deadline spans a call's steps. This
//! test binary re-executes itself as the ranks (`SHM_TEST_SCENARIO` selects what a rank does),
//! with a store hosted by the parent; every wait is bounded.

mod common;

use accord::{Error, ReduceOp};
use common::{all_ok, collect, run_ok, spawn};
use std::time::{Duration, Instant};

/// Hosts that disagree about a reduce-scatter or allgather on the stripes (block size, reduce
/// operator) fail on every rank with a desync, instead of exchanging misfit blocks; so do hosts
/// whose sizes put them on different paths (striped or whole on the stripes for allreduce, the
/// stripes or one schedule for the others), at once rather than at the deadline, also when the
/// ranks of one host take different paths; hosts that disagree in the middle of a pipelined
/// striped allreduce (4 MiB and more); and per-rank counts against equal blocks; all-to-alls
/// of other blocks, on either side of the stripes' limit, or of the v variant.
#[test]
fn hosts_that_disagree_about_a_striped_call_all_fail() {
    // Ranks 0 and 2 on host a, 1 and 3 on host b: host b's ranks call differently.
    let host = |r: usize| ["a", "b", "a", "b"][r].to_string();
    for (op, differ) in [
        ("reduce_scatter", "block"),
        ("reduce_scatter", "operator"),
        ("allgather", "block"),
        ("allgather", "large"),
        ("reduce_scatter", "large"),
        ("allreduce", "large"),
        ("allreduce", "pipelined"),
        // Ranks of one host on different paths, crossing between hosts: no wait in a cycle.
        ("allgather", "large:0,1,3"),
        ("allgather", "large:0,3"),
        ("reduce_scatter", "large:0,3"),
        ("reduce_scatter", "large:2"),
        ("allreduce", "large:0,3"),
        // One rank calls an allreduce where the others wait at a barrier: a host's leader,
        // another of its ranks, or a whole host.
        ("barrier", "other:0"),
        ("barrier", "other:3"),
        ("barrier", "other"),
        // Per-rank counts on one host, equal blocks on the other.
        ("allgatherv", "block"),
        ("alltoall", "block"),
        ("alltoall", "large"),
        ("alltoall", "large:0,3"),
        ("alltoallv", "block"),
    ] {
        let extra = [
            ("BLOCKS_OP", op),
            ("BLOCKS_DIFFER", differ),
            ("ACCORD_HIER_PIPELINE_BYTES", "1048576"),
        ];
        let (_s, ch) = spawn("blocks-mismatch", 4, host, &extra);
        let t0 = Instant::now();
        all_ok(&collect(ch, Duration::from_secs(60)));
        assert!(t0.elapsed() < Duration::from_secs(20), "{op} {differ}");
    }
}

/// A barrier across hosts holds every rank until the last has arrived: with stripes (hosts of
/// equal rank counts) and without (the leaders meet, then release their hosts' other ranks).
#[test]
fn a_barrier_across_hosts_holds_every_rank_until_the_last_arrives() {
    let uneven = |r: usize| ["a", "a", "b"][r].to_string();
    let striped = |r: usize| ["a", "b", "a", "b"][r].to_string();
    run_ok("barrier-holds", 3, uneven, &[], Duration::from_secs(60));
    run_ok("barrier-holds", 4, striped, &[], Duration::from_secs(60));
}

/// A deadline set with `set_timeout` holds on every step of a call across hosts, the steps
/// between hosts too: with one host's ranks absent, the other host's all-to-alls (over the
/// stripes, and large ones after the stripes' barrier), allreduces (striped or not) and
/// barriers end within it, every rank naming its missing stripe partner by its world rank.
/// One deadline spans the call's steps: a rank whose host-mate arrives 2.5 s late still gives
/// up 3 s after its own call began, not 3 s after its step between hosts began.
#[test]
fn set_timeout_bounds_the_steps_between_hosts() {
    let host = |r: usize| ["a", "b", "a", "b"][r].to_string();
    for op in [
        "alltoall",
        "alltoall_large",
        "allreduce_striped",
        "allreduce_small",
        "barrier",
    ] {
        run_ok(
            "hier-timeout",
            4,
            host,
            &[("HIER_TIMEOUT_OP", op)],
            Duration::from_secs(60),
        );
    }
    for op in ["alltoall_large", "allreduce_small", "barrier"] {
        let env = [("HIER_TIMEOUT_OP", op), ("HIER_TIMEOUT_LATE", "2500")];
        run_ok("hier-timeout", 4, host, &env, Duration::from_secs(60));
    }
}

/// The child side: does nothing unless started by one of the tests above.
#[test]
fn rank_main() {
    let Ok(scenario) = std::env::var("SHM_TEST_SCENARIO") else {
        return;
    };
    let comm = accord::init().expect("init");
    match scenario.as_str() {
        "blocks-mismatch" => {
            // "large:R,S": ranks R and S (any host) call with a large block, the others small.
            let differ = std::env::var("BLOCKS_DIFFER").unwrap();
            let (differ, odd) = match differ.split_once(':') {
                Some((d, ranks)) => (
                    d.to_string(),
                    ranks.split(',').any(|r| r == comm.rank().to_string()),
                ),
                None => (differ.clone(), comm.rank() % 2 == 1),
            };
            let block = match (odd, differ.as_str()) {
                (true, "block") => 5,
                (true, "large") => 70_000,
                (true, "pipelined") => (1 << 20) + 8,
                (false, "pipelined") => 1 << 20,
                _ => 4,
            };
            let redop = match odd && differ == "operator" {
                true => ReduceOp::Max,
                false => ReduceOp::Sum,
            };
            let n = comm.size();
            let t = Instant::now();
            let e = match std::env::var("BLOCKS_OP").unwrap().as_str() {
                "barrier" if odd => comm.all_reduce(&mut vec![1f32; block], redop).map(drop),
                "barrier" => comm.barrier(),
                op => match op {
                    "reduce_scatter" => {
                        let mut out = vec![0f32; block];
                        comm.reduce_scatter(&vec![1f32; block * n], &mut out, redop)
                    }
                    "allreduce" => comm.all_reduce(&mut vec![1f32; block], redop),
                    // Odd ranks give per-rank counts, unequal, summing to what the others expect.
                    "allgatherv" if odd => {
                        let counts: Vec<usize> = (0..n).map(|r| [5, 3][r % 2]).collect();
                        let mut out = vec![0f32; 4 * n];
                        let send = vec![1f32; counts[comm.rank()]];
                        comm.all_gather(&send, accord::Parts::new(&mut out, &counts))
                    }
                    "alltoall" => {
                        comm.all_to_all(&vec![1f32; block * n], &mut vec![0f32; block * n])
                    }
                    // Odd ranks call the v variant with the counts the others use.
                    "alltoallv" if odd => {
                        let (send, counts) = (vec![1f32; 4 * n], vec![4; n]);
                        let mut out = vec![0f32; 4 * n];
                        let send = accord::Parts::new(&send, &counts);
                        comm.all_to_all(send, accord::Parts::new(&mut out, &counts))
                    }
                    "alltoallv" => comm.all_to_all(&vec![1f32; 4 * n], &mut vec![0f32; 4 * n]),
                    _ => comm.all_gather(&vec![1f32; block], &mut vec![0f32; block * n]),
                }
                .map(drop),
            }
            .expect_err("hosts disagree");
            println!("error: {e}");
            assert!(
                matches!(e, Error::Desync { .. } | Error::Aborted { .. }),
                "{e:?}"
            );
            assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        }
        "barrier-holds" => {
            // The last rank (alone on its host, or a stripe's) arrives 400 ms late.
            let last = comm.size() - 1;
            comm.barrier().unwrap();
            if comm.rank() == last {
                std::thread::sleep(Duration::from_millis(400));
            }
            let t = Instant::now();
            comm.barrier().unwrap();
            if comm.rank() != last {
                let waited = t.elapsed();
                assert!(
                    waited >= Duration::from_millis(300),
                    "left after {waited:?}"
                );
            }
        }
        "hier-timeout" => {
            // Host b (odd ranks) stays away; host a's ranks must give up after 3 s.
            if comm.rank() % 2 == 1 {
                std::thread::sleep(Duration::from_secs(8));
                println!("RANK-OK");
                std::process::exit(0);
            }
            comm.set_timeout(Duration::from_secs(3));
            let n = comm.size();
            // HIER_TIMEOUT_LATE=ms: host a's second rank calls that much later, so that its
            // host-mate spends that long in the step inside the host before the one between
            // hosts (the late rank is then told of the other's timeout at once).
            let late = std::env::var("HIER_TIMEOUT_LATE").map_or(0, |v| v.parse().unwrap());
            if late > 0 {
                // Counted from one instant on both: host a's ranks leave `init` apart.
                let peer = 2 - comm.rank();
                let mut got = [0f32];
                comm.sendrecv(&[1f32], peer, &mut got, peer, 9).unwrap();
            }
            if comm.rank() == 2 {
                std::thread::sleep(Duration::from_millis(late));
            }
            let t = Instant::now();
            let e = match std::env::var("HIER_TIMEOUT_OP").unwrap().as_str() {
                "alltoall" => comm
                    .all_to_all(&vec![1f32; 4 * n], &mut vec![0f32; 4 * n])
                    .map(drop),
                "alltoall_large" => comm
                    .all_to_all(&vec![1f32; 70_000 * n], &mut vec![0f32; 70_000 * n])
                    .map(drop),
                "barrier" => comm.barrier(),
                "allreduce_small" => comm.all_reduce(&mut [1f32; 16], ReduceOp::Sum).map(drop),
                _ => comm
                    .all_reduce(&mut vec![1f32; 100_000], ReduceOp::Sum)
                    .map(drop),
            }
            .expect_err("host b never calls");
            println!("error after {:?}: {e}", t.elapsed());
            // The 3 s timeout, and the diagnosis of who is missing (about 0.2 s; a rank late
            // by 2.5 s before the step between hosts made it 5.5 s and more before one deadline
            // spanned the steps).
            assert!(
                t.elapsed() < Duration::from_millis(5200),
                "{:?}",
                t.elapsed()
            );
            // The step between hosts names the missing rank as the world does: this rank's
            // stripe partner on host b (unless the other host-a rank's abort came first).
            if let Error::Timeout { waiting_for, .. } = &e {
                assert_eq!(waiting_for, &[comm.rank() + 1], "{e}");
            }
        }
        s => panic!("unknown scenario {s}"),
    }
    println!("RANK-OK");
}
