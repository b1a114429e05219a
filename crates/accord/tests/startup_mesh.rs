//! A rank that ends during start-up after it registered, before it connects to its peers or
//! after: the others name it within the join deadline (`ACCORD_JOIN_TIMEOUT`) or at once, not
//! at the operation timeout. The binary
//! re-executes itself as the ranks (`MESH_TEST_SCENARIO`), joining through `env://` with rank 0
//! hosting the store.

mod common;
use common::{finish, free_port};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn rank(scenario: &str, r: usize, n: usize, store: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["rank_main", "--exact", "--nocapture", "--test-threads=1"])
        .env("MESH_TEST_SCENARIO", scenario)
        .env("ACCORD_RANK", r.to_string())
        .env("ACCORD_WORLD_SIZE", n.to_string())
        .env("ACCORD_STORE", store)
        .env("ACCORD_TOKEN", "mesh-test-token")
        .env("ACCORD_HOST", "127.0.0.1")
        .env("ACCORD_TIMEOUT", "60")
        .env("ACCORD_JOIN_TIMEOUT", "2")
        .env_remove("ACCORD_STORE_EXTERNAL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Rank 2 of 4 does `scenario` and ends well; every other rank fails (exit 3) with an error
/// `names_it` accepts, waiting at most `limit` for each, and all of it within 15 s.
fn rank_two_ends(scenario: &str, limit: Duration, names_it: impl Fn(&str) -> bool) {
    let store = format!("127.0.0.1:{}", free_port());
    let start = Instant::now();
    let ranks: Vec<Child> = (0..4)
        .map(|r| rank(if r == 2 { scenario } else { "init" }, r, 4, &store))
        .collect();
    for (r, child) in ranks.into_iter().enumerate() {
        let (code, err) = finish(child, limit);
        if r == 2 {
            assert_eq!(code, Some(0), "rank 2: {err}");
            continue;
        }
        assert_eq!(code, Some(3), "rank {r}: {err}");
        assert!(names_it(&err), "rank {r}: {err}");
    }
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "took {:?}",
        start.elapsed()
    );
}

/// Rank 2 of 4 registers and exits. Ranks 0 and 1, which it should have dialled, wait for the
/// join deadline (2 s, not the 60 s operation timeout); rank 3, which dials it, finds its
/// address refusing. Every one names rank 2.
#[test]
fn a_rank_that_ends_after_registering_is_named_at_the_join_deadline() {
    rank_two_ends("register-then-exit", Duration::from_secs(30), |err| {
        err.contains("rank 2") || err.contains("rank(s) 2")
    });
}

/// Rank 2 of 4 forms the mesh with the others and ends before it publishes its settings: the
/// others, waiting in the store for its settings (rank 0) or for rank 0's verdict on them, name
/// rank 2 as soon as the mesh sees it gone, not when the operation timeout (60 s) passes.
#[test]
fn a_rank_that_ends_after_the_mesh_formed_is_named_at_once() {
    rank_two_ends("connect-then-exit", Duration::from_secs(40), |err| {
        err.contains("rank 2 is lost")
    });
}

/// What a rank process does; a no-op when this binary runs as the test suite.
#[test]
fn rank_main() {
    let Ok(scenario) = std::env::var("MESH_TEST_SCENARIO") else {
        return;
    };
    let result = match scenario.as_str() {
        "register-then-exit" => {
            let method = accord::rendezvous::InitMethod::parse("env://").unwrap();
            drop(accord::rendezvous::init(&method, None, None, None).unwrap());
            std::process::exit(0)
        }
        "connect-then-exit" => {
            // What `accord::init` does up to the mesh, then the process ends.
            use accord::transport::tcp::{lanes_for, TcpOptions, TcpTransport};
            let method = accord::rendezvous::InitMethod::parse("env://").unwrap();
            let rdv = accord::rendezvous::init(&method, None, None, None).unwrap();
            let opts = TcpOptions {
                form_deadline: Some(rdv.join_deadline),
                lanes: lanes_for(rdv.local_world_size),
                ..TcpOptions::default()
            };
            let book = rdv.store.with_prefix("accord/tcp");
            let mesh = TcpTransport::connect(rdv.rank, rdv.world_size, &rdv.token, &book, opts);
            std::mem::forget(mesh.unwrap());
            std::process::exit(0)
        }
        "init" => accord::init().and_then(|c| c.barrier()),
        other => panic!("unknown scenario {other:?}"),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(3);
    }
}
