//! Rendezvous of ranks as threads of this process, through every init method.

use super::*;
use std::collections::HashMap;

const T: Duration = Duration::from_secs(5);

pub(super) fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

#[test]
fn env_errors_name_the_variables() {
    let e = EnvConfig::from_vars(vars(&[("RANK", "x")])).unwrap_err();
    assert!(e.to_string().contains("RANK=\"x\""), "{e}");
    let e = EnvConfig::from_vars(vars(&[("ACCORD_TIMEOUT", "-1")])).unwrap_err();
    assert!(e.to_string().contains("ACCORD_TIMEOUT"), "{e}");

    // Slurm gives rank and size but no store address.
    let e = init_with_vars(
        &InitMethod::Env,
        None,
        None,
        Some(T),
        vars(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")]),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::InvalidArgument(_)));
    assert!(
        msg.contains("ACCORD_STORE") && msg.contains("MASTER_PORT"),
        "{msg}"
    );
    assert!(!msg.contains("the rank"), "{msg}");

    let e = init_with_vars(
        &InitMethod::Env,
        None,
        None,
        Some(T),
        vars(&[("PMI_RANK", "1"), ("MASTER_ADDR", "h")]),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("PMI_SIZE"), "{e}");
    assert!(e.contains("(MASTER_PORT, since MASTER_ADDR is set"), "{e}");

    let e = init_with_vars(&InitMethod::Env, None, None, Some(T), vars(&[]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ACCORD_RANK") && e.contains("SLURM_PROCID"),
        "{e}"
    );

    let e = init_with_vars(
        &InitMethod::parse("tcp://127.0.0.1:1").unwrap(),
        Some(3),
        Some(2),
        Some(T),
        vars(&[]),
    )
    .unwrap_err();
    assert!(e.to_string().contains("rank 3"), "{e}");
}

fn run_ranks(
    method: &InitMethod,
    ranks: &[usize],
    world: usize,
    timeout: Duration,
    env: &'static [(&'static str, &'static str)],
) -> Vec<Result<Rendezvous>> {
    let hs: Vec<_> = ranks
        .iter()
        .map(|&r| {
            let m = method.clone();
            std::thread::spawn(move || {
                init_with_vars(&m, Some(r), Some(world), Some(timeout), vars(env))
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn check_world(rs: &[Result<Rendezvous>], world: usize) {
    for (r, rv) in rs.iter().enumerate() {
        let rv = rv.as_ref().unwrap();
        assert_eq!((rv.rank, rv.world_size), (r, world));
        assert_eq!(rv.local_rank, r, "all threads share one host");
        assert_eq!(rv.local_world_size, Some(world));
        assert_eq!(rv.hosts_store(), r == 0);
    }
    // They share one store.
    rs[1].as_ref().unwrap().store.set("hello", b"1").unwrap();
    assert_eq!(rs[0].as_ref().unwrap().store.get("hello").unwrap(), b"1");
}

#[test]
fn tcp_four_ranks_as_threads() {
    let port = free_port().unwrap();
    let m = InitMethod::parse(&format!("tcp://127.0.0.1:{port}")).unwrap();
    // Rank 0 last, so the others must retry until the store appears.
    let rs = run_ranks(&m, &[3, 2, 1, 0], 4, T, &[("ACCORD_TOKEN", "job")]);
    let mut rs: Vec<_> = rs.into_iter().collect();
    rs.reverse();
    check_world(&rs, 4);
}

#[test]
fn env_init_with_external_store() {
    let server = StoreServer::bind("127.0.0.1:0", Token::default()).unwrap();
    let addr = server.addr().to_string();
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let env = vars(&[
                    ("ACCORD_STORE", &addr),
                    ("ACCORD_STORE_EXTERNAL", "1"),
                    ("ACCORD_RANK", &r.to_string()),
                    ("ACCORD_WORLD_SIZE", "2"),
                    ("ACCORD_TIMEOUT", "5"),
                ]);
                init_with_vars(&InitMethod::Env, None, None, None, env)
            })
        })
        .collect();
    for (r, h) in hs.into_iter().enumerate() {
        let rv = h.join().unwrap().unwrap();
        assert_eq!(rv.rank, r);
        assert!(!rv.hosts_store());
        assert_eq!(rv.store.timeout(), T);
    }
}

#[test]
fn file_three_ranks_as_threads() {
    let dir = std::env::temp_dir().join(format!(
        "accord-file-init-{}-{:08x}",
        std::process::id(),
        u32::from_le_bytes(crate::auth::random_bytes::<4>())
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rdv");
    let m = InitMethod::parse(&format!("file://{}", path.display())).unwrap();
    let rs = run_ranks(&m, &[0, 1, 2], 3, T, &[]);
    check_world(&rs, 3);
    assert!(path.exists());
    assert_eq!(
        rs[0].as_ref().unwrap().rendezvous_file(),
        Some(path.as_path())
    );
    drop(rs);
    assert!(!path.exists(), "rank 0 removes the file");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn file_init_times_out_naming_rank_zero() {
    let path = std::env::temp_dir().join(format!("accord-never-{}", std::process::id()));
    let m = InitMethod::File(path);
    let e = init_with_vars(
        &m,
        Some(1),
        Some(2),
        Some(Duration::from_millis(200)),
        vars(&[]),
    )
    .unwrap_err();
    match e {
        Error::Timeout { waiting_for, .. } => assert_eq!(waiting_for, vec![0]),
        e => panic!("{e:?}"),
    }
}

#[test]
fn duplicate_rank_detected() {
    let port = free_port().unwrap();
    let m = InitMethod::parse(&format!("tcp://127.0.0.1:{port}")).unwrap();
    let rs = run_ranks(&m, &[0, 1, 1], 3, Duration::from_secs(2), &[]);
    let dup: Vec<_> = rs
        .iter()
        .filter_map(|r| r.as_ref().err())
        .filter(|e| e.to_string().contains("claimed twice"))
        .collect();
    assert_eq!(dup.len(), 1, "{rs:?}");
    // The others time out waiting for rank 2, and say so.
    for r in &rs {
        if let Err(Error::Timeout { waiting_for, .. }) = r {
            assert_eq!(waiting_for, &vec![2]);
        }
    }
}

#[test]
fn world_size_disagreement_detected() {
    let port = free_port().unwrap();
    let m = InitMethod::parse(&format!("tcp://127.0.0.1:{port}")).unwrap();
    let m2 = m.clone();
    let h0 = std::thread::spawn(move || {
        init_with_vars(
            &m2,
            Some(0),
            Some(2),
            Some(Duration::from_secs(2)),
            vars(&[]),
        )
    });
    std::thread::sleep(Duration::from_millis(200));
    let e = init_with_vars(
        &m,
        Some(1),
        Some(3),
        Some(Duration::from_secs(2)),
        vars(&[]),
    )
    .unwrap_err();
    assert!(e.to_string().contains("world size disagreement"), "{e}");
    assert!(h0.join().unwrap().is_err());
}

fn external_store() -> (StoreServer, String) {
    let server = StoreServer::bind("127.0.0.1:0", Token::new("job")).unwrap();
    let addr = server.addr().to_string();
    (server, addr)
}

/// Ranks of a world of `world` as threads on the store at `addr`, with `timeout` and
/// `ACCORD_JOIN_TIMEOUT=join`.
fn join_threads(
    addr: &str,
    ranks: &[usize],
    world: usize,
    timeout: Duration,
    join: &str,
) -> Vec<std::thread::JoinHandle<Result<Rendezvous>>> {
    ranks
        .iter()
        .map(|&r| {
            let env: Vec<(String, String)> = [
                ("ACCORD_STORE", addr),
                ("ACCORD_STORE_EXTERNAL", "1"),
                ("ACCORD_TOKEN", "job"),
                ("ACCORD_JOIN_TIMEOUT", join),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            std::thread::spawn(move || {
                let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
                init_with_vars(&InitMethod::Env, Some(r), Some(world), Some(timeout), get)
            })
        })
        .collect()
}

#[test]
fn the_join_deadline_is_not_the_timeout() {
    let (_server, addr) = external_store();
    let t0 = Instant::now();
    let hs = join_threads(&addr, &[0], 2, Duration::from_secs(30), "0.5");
    let e = hs.into_iter().next().unwrap().join().unwrap().unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    match &e {
        Error::Timeout { waiting_for, .. } => assert_eq!(waiting_for, &vec![1], "{e}"),
        e => panic!("{e:?}"),
    }
    assert!(
        e.to_string().contains("ACCORD_JOIN_TIMEOUT, 500.0ms"),
        "{e}"
    );

    // A rank arriving after that is told the others gave up on it.
    let hs = join_threads(&addr, &[1], 2, Duration::from_secs(30), "5");
    let e = hs.into_iter().next().unwrap().join().unwrap().unwrap_err();
    assert!(e.to_string().contains("rank 1 joined too late"), "{e}");
}

#[test]
fn without_a_join_timeout_the_shorter_of_a_minute_and_the_timeout_applies() {
    let (_server, addr) = external_store();
    let t0 = Instant::now();
    let env = vars(&[
        ("ACCORD_STORE", &addr),
        ("ACCORD_STORE_EXTERNAL", "1"),
        ("ACCORD_TOKEN", "job"),
    ]);
    let short = Duration::from_millis(300);
    let e = init_with_vars(&InitMethod::Env, Some(0), Some(2), Some(short), env).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(DEFAULT_JOIN_TIMEOUT, Duration::from_secs(60));
}

#[test]
fn a_rank_whose_process_ended_is_named_at_once() {
    let (_server, addr) = external_store();
    let t0 = Instant::now();
    let hs = join_threads(&addr, &[0, 1], 3, Duration::from_secs(30), "30");
    let launcher = StoreClient::connect(&addr, &Token::new("job"), T).unwrap();
    let ns = launcher.with_prefix(INIT_PREFIX);
    ns.wait_timeout(&["rank/0", "rank/1"], T).unwrap();
    assert!(crate::rendezvous::mark_exited(&ns, 2, "exit status 0").unwrap());
    // A rank that registered is not marked.
    assert!(!crate::rendezvous::mark_exited(&ns, 1, "exit status 0").unwrap());
    for h in hs {
        match h.join().unwrap().unwrap_err() {
            Error::PeerLost { rank, cause } => {
                assert_eq!(rank, 2);
                assert!(
                    cause.contains("ended (exit status 0) before it joined"),
                    "{cause}"
                );
            }
            e => panic!("{e:?}"),
        }
    }
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[test]
fn a_store_host_that_stops_is_named() {
    let port = free_port().unwrap();
    let m = InitMethod::parse(&format!("tcp://127.0.0.1:{port}")).unwrap();
    let env = &[("ACCORD_TOKEN", "job"), ("ACCORD_JOIN_TIMEOUT", "30")];
    let mut rs = run_ranks(&m, &[0, 1], 2, T, env);
    let r1 = rs.pop().unwrap().unwrap();
    let mut r0 = rs.pop().unwrap().unwrap();
    r0.server.as_mut().unwrap().shutdown();
    let t0 = Instant::now();
    let e = r1
        .store
        .get_timeout("never", Duration::from_secs(20))
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let addr = format!("127.0.0.1:{port}");
    match &e {
        Error::PeerLost { rank: 0, cause } => assert!(
            cause.contains(&format!("hosts the store at {addr} and is gone")),
            "{cause}"
        ),
        e => panic!("{e:?}"),
    }
    // A new connection is refused at once, not retried for the timeout.
    let t0 = Instant::now();
    let e = r1.store.set("k", "v").unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(
        matches!(&e, Error::PeerLost { rank: 0, cause } if cause.contains("refused")),
        "{e:?}"
    );
}

#[test]
fn wrong_token_fails_init() {
    let server = StoreServer::bind("127.0.0.1:0", Token::new("right")).unwrap();
    let url = format!("tcp://{}", server.addr());
    let e = init_with_vars(
        &InitMethod::parse(&url).unwrap(),
        Some(1),
        Some(2),
        Some(T),
        vars(&[("ACCORD_TOKEN", "wrong")]),
    )
    .unwrap_err();
    assert!(matches!(e, Error::Unauthorized(_)), "{e:?}");
}

/// Two worlds of two ranks share one external store and one token under different
/// `ACCORD_STORE_PREFIX`es, forming at the same time: each connects only to its own ranks (the
/// addresses they publish live under their prefix) and sums only its own values.
#[test]
fn worlds_under_different_prefixes_share_a_store_without_meeting() {
    let (server, addr) = external_store();
    let ranks: Vec<_> = ["jobA", "jobB"]
        .iter()
        .enumerate()
        .flat_map(|(w, prefix)| (0..2).map(move |r| (w, *prefix, r)))
        .map(|(w, prefix, r)| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let env = vars(&[
                    ("ACCORD_STORE", &addr),
                    ("ACCORD_STORE_EXTERNAL", "1"),
                    ("ACCORD_TOKEN", "job"),
                    ("ACCORD_STORE_PREFIX", prefix),
                    ("ACCORD_TRANSPORT", "tcp"),
                ]);
                let rdv = init_with_vars(&InitMethod::Env, Some(r), Some(2), Some(T), env)?;
                let comm = crate::bootstrap::from_rendezvous(rdv, T)?;
                let mut v = vec![(10 * w + r) as u64];
                comm.all_reduce(&mut v, crate::ReduceOp::Sum)?;
                Ok::<_, Error>((w, v[0]))
            })
        })
        .collect();
    for h in ranks {
        let (w, sum) = h.join().unwrap().unwrap();
        assert_eq!(sum, (20 * w + 1) as u64, "world {w}");
    }
    let root = StoreClient::connect(&addr, &Token::new("job"), T).unwrap();
    for prefix in ["jobA", "jobB"] {
        assert!(root
            .check(&[format!("{prefix}/accord/tcp/addr/0")])
            .unwrap());
    }
    assert!(!root.check(&["accord/tcp/addr/0"]).unwrap());
    drop(server);
}

#[test]
fn ranks_sharing_cpus_are_counted_whatever_their_host_names() {
    let (_server, addr) = external_store();
    let ns = StoreClient::connect(&addr, &Token::new("job"), T)
        .unwrap()
        .with_prefix(INIT_PREFIX);
    let budget = crate::rendezvous::join::cpu_budget();
    // Rank 1 under another host name on these CPUs (a network namespace of this machine), rank
    // 2 elsewhere (another machine, or a container of its own).
    ns.set("rank/1", format!("elsewhere|7|00|{budget}").as_bytes())
        .unwrap();
    ns.set("rank/2", b"faraway|8|00|another-kernel").unwrap();
    let hs = join_threads(&addr, &[0], 3, Duration::from_secs(30), "30");
    let rv = hs.into_iter().next().unwrap().join().unwrap().unwrap();
    assert_eq!(rv.local_world_size, Some(1), "alone under its host name");
    let expected = (!budget.is_empty()).then_some(2);
    assert_eq!(
        rv.cpu_sharing_ranks, expected,
        "ranks 0 and 1 share the CPUs"
    );
}
