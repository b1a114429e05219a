//! The conformance suite ([`accord::testing::conformance`]) on every host engine: the same
//! calls, checked against the same sequential reference, over each transport and engine.
//!
//! The matrix is trimmed per engine to keep this file fast on a small machine:
//! - in-process schedules: world sizes 1 to 9, the tuner's choice and every algorithm that
//!   applies, counts 0, 1, 7 and 1031;
//! - TCP: the same for world sizes 1, 2, 3 and 5 only; every algorithm at 1 MiB + 12 B on 2
//!   and 3 ranks over 3 lanes, and at 64 KiB and 256 KiB blocks on 5 ranks over 2 lanes;
//! - shared memory between processes (this binary re-executed as the ranks, see [`rank_main`]):
//!   2, 3, 4 and 7 ranks on one host, and 4 and 5 ranks over two simulated hosts (the
//!   hierarchical path), 6 ranks over three (contiguous placement), and 3, 7, 8 and 9 ranks
//!   over hosts of one to three ranks (uneven, interleaved, and three stripes of three); the
//!   engines' own algorithms, counts 0, 1, 7 and 1031, then a count of
//!   40009 (many staging chunks, and copies between processes) on bf16, f64 and u8 only, and
//!   allreduces of 262147 and 262144 elements (striped across hosts) on f32, f64 and i64;
//!   the same over two simulated hosts without the hierarchy (`ACCORD_HIERARCHY=off`), and
//!   there on 3 ranks with allreduces in pieces of 1 KiB.
//!
//! Every type and reduce operator runs on every engine.

mod common;

use accord::fingerprint::OpKind;
use accord::testing::conformance::{self, Algorithms, HostMemory, Options};
use accord::testing::{run_tcp_world, run_world};
use accord::DataType;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Fail with every rank's failures, if any rank had one.
fn assert_conforms(results: Vec<Result<conformance::Summary, conformance::Failures>>) {
    let mut report = String::new();
    for r in &results {
        match r {
            Ok(s) => assert!(s.cases > 0, "the suite ran no call"),
            Err(f) => report.push_str(&f.to_string()),
        }
    }
    assert!(report.is_empty(), "{report}");
}

/// Every algorithm on `engine`, with one seed per round (`ACCORD_SOAK=<n>` runs n rounds).
fn every_algorithm(engine: &str, round: usize) -> Options {
    let opts = Options::new(engine);
    Options {
        algorithms: Algorithms::EachApplicable,
        seed: opts.seed + round as u64,
        ..opts
    }
}

#[test]
fn in_process_schedules_with_every_algorithm() {
    for round in 0..accord::testing::soak() {
        let opts = every_algorithm("in-process", round);
        for n in 1..=9 {
            assert_conforms(run_world(n, |comm| {
                conformance::check(&comm, &HostMemory, &opts)
            }));
        }
    }
}

#[test]
fn tcp_with_every_algorithm() {
    for round in 0..accord::testing::soak() {
        let opts = every_algorithm("tcp", round);
        for n in [1, 2, 3, 5] {
            assert_conforms(run_tcp_world(n, Duration::from_secs(60), |comm| {
                conformance::check(&comm, &HostMemory, &opts)
            }));
        }
    }
}

/// Several connections per pair: messages from 256 KiB are dealt over them and sent in the
/// background while the round receives (1 MiB + 12 B calls, every algorithm).
#[test]
fn tcp_with_several_lanes_and_every_algorithm() {
    let opts = Options {
        engine: "tcp, 3 lanes, 1 MiB + 12 B".into(),
        counts: vec![262_147],
        dtypes: vec![DataType::F32, DataType::F64],
        ..every_algorithm("tcp", 0)
    };
    for n in [2, 3] {
        assert_conforms(accord::testing::run_tcp_world_with_lanes(
            n,
            3,
            Duration::from_secs(60),
            |comm| conformance::check(&comm, &HostMemory, &opts),
        ));
    }
}

/// Five ranks over two lanes a pair, blocks of 64 KiB and 256 KiB: frames read straight into
/// destinations posted before a round's sends, the larger dealt over both lanes, on every
/// algorithm (the matrix above stays at 8 KiB and below).
#[test]
fn tcp_messages_read_into_place_on_five_ranks_and_every_algorithm() {
    let opts = Options {
        engine: "tcp, 5 ranks, 2 lanes, 64 KiB and 256 KiB".into(),
        counts: vec![16_387, 65_539],
        dtypes: vec![DataType::F32],
        reduce_ops: vec![accord::ReduceOp::Sum],
        ..every_algorithm("tcp", 0)
    };
    assert_conforms(accord::testing::run_tcp_world_with_lanes(
        5,
        2,
        Duration::from_secs(60),
        |comm| conformance::check(&comm, &HostMemory, &opts),
    ));
}

/// Broadcasts of two and three pieces of the pipelined chain (at least 128 Ki elements each)
/// and one just short of two, over TCP on five ranks, every algorithm and a few types: the
/// pieces' offsets, and the chain's forwarding while it receives.
#[test]
fn tcp_broadcasts_in_several_chain_pieces() {
    let opts = Options {
        engine: "tcp, 5 ranks, broadcast in chain pieces".into(),
        counts: vec![(256 << 10) - 1, (256 << 10) + 3, (384 << 10) + 5],
        dtypes: vec![DataType::F32, DataType::U8, DataType::F64],
        kinds: vec![OpKind::Broadcast],
        ..every_algorithm("tcp", 0)
    };
    assert_conforms(run_tcp_world(5, Duration::from_secs(60), |comm| {
        conformance::check(&comm, &HostMemory, &opts)
    }));
}

/// The host id of the ranks of the one-host runs.
const ONE_HOST: &str = "conformance-host";

/// The shared-memory runs: the full matrix, then a large count (many staging chunks, and
/// copies between processes) on a few types.
fn shm_runs(engine: &str) -> [Options; 3] {
    let large = Options {
        engine: format!("{engine}, large"),
        counts: vec![40_009],
        dtypes: vec![DataType::BF16, DataType::F64, DataType::U8],
        ..Options::new(engine)
    };
    // Allreduces from 64 KiB over hosts of equal rank counts are striped: one slice per local
    // rank, padded where the local ranks do not divide the count (the first count here).
    let striped = Options {
        engine: format!("{engine}, 1 MiB + 12/16 B allreduce"),
        counts: vec![262_147, 262_144],
        dtypes: vec![DataType::F32, DataType::F64, DataType::I64],
        kinds: vec![OpKind::AllReduce],
        ..Options::new(engine)
    };
    [Options::new(engine), large, striped]
}

#[test]
fn shared_memory_between_processes_on_one_host() {
    for n in [2, 3, 4, 7] {
        // Small staging chunks: the 1031-element calls are pipelined over several chunks.
        run_ranks(
            n,
            |_| "conformance-host".into(),
            &[("ACCORD_SHM_CHUNK_BYTES", "4096")],
        );
    }
}

#[test]
fn shared_memory_across_two_simulated_hosts() {
    // Alternating hosts: every host's ranks are not contiguous, and host leaders are not rank 0
    // and 1 only.
    for n in [4, 5] {
        let stripes = if n % 2 == 0 { "1" } else { "0" };
        run_ranks(
            n,
            |r| ["a", "b"][r % 2].into(),
            &[("CONFORMANCE_STRIPES", stripes)],
        );
    }
}

#[test]
fn shared_memory_across_three_simulated_hosts() {
    // Consecutive ranks share a host: stripes of three hosts, blocks reordered by stripe; the
    // large reduce-scatters, allgathers and all-to-alls too, and allreduces from 256 KiB
    // pipelined.
    run_ranks(
        6,
        |r| ["a", "b", "c"][r / 2].into(),
        &[
            ("CONFORMANCE_STRIPES", "1"),
            ("ACCORD_HIER_BLOCKS_BYTES", "67108864"),
            ("ACCORD_HIER_ALLTOALL_BLOCK_BYTES", "67108864"),
            ("ACCORD_HIER_PIPELINE_BYTES", "262144"),
        ],
    );
}

#[test]
fn shared_memory_across_hosts_of_other_shapes() {
    // 3 ranks: hosts of two and one (no stripes: the leaders' paths). 7: hosts of three, two
    // and two, interleaved. 8: four hosts of two, interleaved. 9: three hosts of three, whose
    // small allreduces go through the leaders and whose stripes have three ranks a host.
    // (ranks, rank -> host, whether hosts have equal rank counts)
    type Shape = (usize, fn(usize) -> String, &'static str);
    let shapes: [Shape; 4] = [
        (3, |r| ["a", "a", "b"][r].into(), "0"),
        (7, |r| ["a", "b", "c"][r % 3].into(), "0"),
        (8, |r| ["a", "b", "c", "d"][r % 4].into(), "1"),
        (9, |r| ["a", "b", "c"][r / 3].into(), "1"),
    ];
    for (n, host, stripes) in shapes {
        let t = Instant::now();
        run_ranks(n, host, &[("CONFORMANCE_STRIPES", stripes)]);
        println!("{n} ranks: {:?}", t.elapsed());
    }
}

#[test]
fn flat_schedules_across_two_simulated_hosts() {
    // No hierarchy: one schedule over shared-memory rings and TCP at once.
    run_ranks(
        5,
        |r| ["a", "b"][r % 2].into(),
        &[("ACCORD_HIERARCHY", "off")],
    );
}

#[test]
fn flat_schedules_in_pieces_across_two_simulated_hosts() {
    // Allreduces above 2 KiB in pieces of 1 KiB: the matrix's 1031 elements of 4 bytes and
    // more, the large counts in tens to thousands of pieces.
    run_ranks(
        3,
        |r| ["a", "b"][r % 2].into(),
        &[("ACCORD_HIERARCHY", "off"), ("ACCORD_PIECE_BYTES", "1024")],
    );
}

/// Start `n` ranks of this binary ([`rank_main`]) with `host(r)` as rank `r`'s host id and
/// `extra` in their environment, and require every one to pass.
fn run_ranks(n: usize, host: impl Fn(usize) -> String, extra: &[(&str, &str)]) {
    const TOKEN: &str = "conformance-token";
    let server =
        accord::rendezvous::StoreServer::bind("127.0.0.1:0", accord::auth::Token::new(TOKEN))
            .unwrap();
    let children: Vec<Child> = (0..n)
        .map(|r| {
            let mut c = common::rank_command(r, n, server.addr(), TOKEN, &host(r));
            c.env("CONFORMANCE_RANK", "1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if (0..n).filter(|&q| host(q) == host(r)).count() == 1 {
                c.env("CONFORMANCE_ALONE", "1");
            }
            for (k, v) in extra {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect();
    // Nine ranks take about 50 s on two CPUs.
    let end = Instant::now() + Duration::from_secs(240);
    let mut report = String::new();
    for (r, mut c) in children.into_iter().enumerate() {
        while c.try_wait().unwrap().is_none() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let o = c.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        print!("rank {r} of {n}: {out}");
        if o.status.code() != Some(0) || !out.contains("RANK-OK") {
            let err = String::from_utf8_lossy(&o.stderr);
            report.push_str(&format!(
                "rank {r} of {n} ({:?}):\n{out}\n{err}\n",
                o.status
            ));
        }
    }
    assert!(report.is_empty(), "{report}");
}

/// The rank side of the shared-memory tests: does nothing unless started by [`run_ranks`].
#[test]
fn rank_main() {
    if std::env::var("CONFORMANCE_RANK").is_err() {
        return;
    }
    let comm = accord::init().expect("init");
    let flat = std::env::var("ACCORD_HIERARCHY").is_ok_and(|v| v == "off");
    assert!(
        comm.uses_shm() != flat,
        "expected the shared-memory engine unless turned off"
    );
    // Shared-memory rings alone on one host; with TCP between hosts (the hierarchy) on several.
    let one_host = std::env::var("ACCORD_HOST_ID").unwrap() == ONE_HOST;
    // A rank alone on its host has no shared memory with anyone.
    let alone = std::env::var("CONFORMANCE_ALONE").is_ok();
    let (hosts, transport) = match (one_host, alone) {
        (true, _) => ("one host", "shm"),
        (false, false) => ("several hosts", "tcp+shm"),
        (false, true) => ("several hosts, alone on its own", "tcp"),
    };
    assert_eq!(comm.transport_name(), transport);
    let pieces = match std::env::var("ACCORD_PIECE_BYTES") {
        Ok(b) => format!(", in pieces of {b} bytes"),
        Err(_) => String::new(),
    };
    let engine = match flat {
        false => format!("shared memory, {hosts}{pieces}"),
        true => format!("schedules over shared-memory rings and TCP, {hosts}{pieces}"),
    };
    let mut calls = 0;
    for opts in shm_runs(&engine) {
        match conformance::check(&comm, &HostMemory, &opts) {
            Ok(s) => calls += s.cases,
            Err(f) => {
                println!("{f}");
                std::process::exit(1);
            }
        }
    }
    if let Ok(stripes) = std::env::var("CONFORMANCE_STRIPES") {
        assert_blocks_route(&comm, stripes == "1");
    }
    if !one_host {
        // Across hosts a barrier meets inside the hosts first (the hierarchy's engine).
        comm.barrier().unwrap();
        let records = comm.flight_record();
        let last = records
            .iter()
            .rfind(|r| r.fp.kind == OpKind::Barrier)
            .unwrap();
        let on_engine = matches!(last.route, accord::observe::Route::Engine(_));
        assert_eq!(on_engine, !flat, "barrier ran on {:?}", last.route);
    }
    println!("RANK-OK ({calls} calls)");
}

/// Reduce-scatter and allgather of equal blocks, and all-to-all, run on the hierarchy's stripes
/// where hosts have equal rank counts (`stripes`), else on a schedule over the transport.
fn assert_blocks_route(comm: &accord::Communicator, stripes: bool) {
    use accord::observe::Route;
    let n = comm.size();
    let mut block = vec![0f32; 5];
    comm.reduce_scatter(&vec![1f32; 5 * n], &mut block, accord::ReduceOp::Sum)
        .unwrap();
    assert_eq!(block, vec![n as f32; 5]);
    let mut all = vec![0f32; 5 * n];
    comm.all_gather(&block, &mut all).unwrap();
    let sent: Vec<f32> = (0..3 * n)
        .map(|i| (comm.rank() * 1000 + i) as f32)
        .collect();
    let mut got = vec![0f32; 3 * n];
    comm.all_to_all(&sent, &mut got).unwrap();
    let from = |q: usize, k: usize| (q * 1000 + 3 * comm.rank() + k) as f32;
    let want: Vec<f32> = (0..n)
        .flat_map(|q| (0..3).map(move |k| from(q, k)))
        .collect();
    assert_eq!(got, want, "all-to-all");
    // Blocks of one element under the stripes' limit and of the limit: the two paths of the
    // hierarchy's all-to-all either side of it, results exact (below 2^24, as f32 holds them).
    // Only near the default limit: a run that raises it to keep every call on the stripes
    // would make these blocks of megabytes.
    let limit = accord::config::get().hier_alltoall_block_bytes;
    if (8..=256 << 10).contains(&limit) {
        let at = limit.div_ceil(4);
        assert!(accord::comm::alltoall_on_stripes((at - 1) * 4));
        assert!(!accord::comm::alltoall_on_stripes(at * 4));
        for block in [at - 1, at] {
            let sent: Vec<f32> = (0..block * n)
                .map(|i| (comm.rank() * block * n + i) as f32)
                .collect();
            let mut got = vec![0f32; block * n];
            comm.all_to_all(&sent, &mut got).unwrap();
            let want: Vec<f32> = (0..n)
                .flat_map(|q| {
                    (0..block).map(move |k| (q * block * n + block * comm.rank() + k) as f32)
                })
                .collect();
            assert!(got == want, "all-to-all of {block} elements a block");
        }
    }
    let records = comm.flight_record();
    for kind in [OpKind::ReduceScatter, OpKind::AllGather, OpKind::AllToAll] {
        let last = records.iter().rfind(|r| r.fp.kind == kind).unwrap();
        let on_engine = matches!(last.route, Route::Engine(_));
        assert_eq!(on_engine, stripes, "{kind} ran on {:?}", last.route);
    }
}
