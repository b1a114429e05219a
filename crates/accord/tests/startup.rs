//! Start-up without a launcher that watches the ranks (as under torchrun, mpirun or Slurm): this
//! test binary re-executes itself as the ranks (`STARTUP_TEST_SCENARIO` selects what a rank
//! does), joining through `env://` with rank 0 hosting the store. Every wait is bounded: ranks
//! run with short join deadlines, and the parent kills children that outlive their limit.

use accord::auth::Token;
use accord::rendezvous::{StoreClient, StoreServer};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{finish, free_port};

const TOKEN: &str = "startup-test-token";
const WARNING: &str = "no job token";

/// Start rank `rank` of a world of `n` doing `scenario`, with the store at `store`.
fn spawn(scenario: &str, rank: usize, n: usize, store: &str, env: &[(&str, &str)]) -> Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["rank_main", "--exact", "--nocapture", "--test-threads=1"])
        .env("STARTUP_TEST_SCENARIO", scenario)
        .env("ACCORD_RANK", rank.to_string())
        .env("ACCORD_WORLD_SIZE", n.to_string())
        .env("ACCORD_STORE", store)
        .env("ACCORD_TOKEN", TOKEN)
        .env("ACCORD_HOST", "127.0.0.1")
        .env("ACCORD_TIMEOUT", "60")
        .env_remove("ACCORD_TOKEN_FILE")
        .env_remove("ACCORD_JOIN_TIMEOUT")
        .env_remove("ACCORD_STORE_EXTERNAL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        match *v {
            "" => c.env_remove(k),
            v => c.env(k, v),
        };
    }
    c.spawn().unwrap()
}

/// A rank that ends before it registers is named by the others once the join deadline
/// (`ACCORD_JOIN_TIMEOUT`, 2 s), not the operation timeout (60 s), has passed — by every rank,
/// whichever of them reaches its deadline first (the store's host or another rank).
#[test]
fn a_rank_that_never_joins_is_named_at_the_join_deadline() {
    for first in [0, 1] {
        let store = format!("127.0.0.1:{}", free_port());
        let env = [("ACCORD_JOIN_TIMEOUT", "2")];
        let start = Instant::now();
        let early = spawn("init", first, 3, &store, &env);
        std::thread::sleep(Duration::from_millis(300));
        let late = spawn("init", 1 - first, 3, &store, &env);
        // Rank 2 ends before it ever calls init.
        let gone = spawn("exit", 2, 3, &store, &env);
        assert_eq!(finish(gone, Duration::from_secs(20)).0, Some(0));
        for (r, child) in [(first, early), (1 - first, late)] {
            let (code, err) = finish(child, Duration::from_secs(20));
            assert_eq!(code, Some(3), "rank {r}: {err}");
            assert!(
                err.contains("in rendezvous")
                    && err.contains("waiting for rank(s) 2 ")
                    && err.contains("ACCORD_JOIN_TIMEOUT"),
                "rank {r} (rank {first} started first): {err}"
            );
        }
        let took = start.elapsed();
        assert!(took < Duration::from_secs(10), "took {took:?}");
    }
}

/// When rank 0, which hosts the store, is killed while the others wait for a third rank, they
/// fail at once saying so, long before their join deadline (30 s); a rank started after it died
/// never reaches the store and names rank 0 at its own deadline.
#[test]
fn the_store_host_killed_during_startup_is_named() {
    let store = format!("127.0.0.1:{}", free_port());
    let env = [("ACCORD_JOIN_TIMEOUT", "30")];
    let mut host = spawn("init", 0, 3, &store, &env);
    let waiter = spawn("init", 1, 3, &store, &env);
    let watch = StoreClient::connect(&store, &Token::new(TOKEN), Duration::from_secs(20)).unwrap();
    watch
        .get_timeout("accord/init/rank/1", Duration::from_secs(20))
        .expect("rank 1 registers");
    host.kill().unwrap();
    let killed = Instant::now();
    let (code, err) = finish(waiter, Duration::from_secs(25));
    let took = killed.elapsed();
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("rank 0 is lost")
            && err.contains(&format!("hosts the store at {store} and is gone")),
        "{err}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}: {err}");
    let _ = finish(host, Duration::from_secs(1));

    let late = spawn("init", 2, 3, &store, &[("ACCORD_JOIN_TIMEOUT", "1")]);
    let (code, err) = finish(late, Duration::from_secs(20));
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("waiting for rank(s) 0 ")
            && err.contains(&format!("rank 0 hosts the store at {store}"))
            && err.contains("ACCORD_JOIN_TIMEOUT"),
        "{err}"
    );
}

/// Rank 0 killed at a random point of its start-up (before or after it listens, while rank 1
/// connects or registers): rank 1 always fails within its join deadline (2 s) naming rank 0,
/// whether it saw the store go or never reached it. Three kills; `ACCORD_SOAK=<n>` makes it `3n`.
#[test]
fn the_store_host_killed_at_random_points_is_named() {
    let soak = accord::testing::soak();
    for _ in 0..3 * soak {
        let store = format!("127.0.0.1:{}", free_port());
        let env = [("ACCORD_JOIN_TIMEOUT", "2")];
        let delay = u16::from_le_bytes(accord::auth::random_bytes::<2>()) % 100;
        let mut host = spawn("init", 0, 3, &store, &env);
        let waiter = spawn("init", 1, 3, &store, &env);
        std::thread::sleep(Duration::from_millis(delay.into()));
        host.kill().unwrap();
        let (code, err) = finish(waiter, Duration::from_secs(15));
        assert_eq!(code, Some(3), "killed after {delay} ms: {err}");
        assert!(
            err.contains("rank 0 is lost: it hosts the store")
                || err.contains(&format!(
                    "waiting for rank(s) 0 — rank 0 hosts the store at {store}"
                )),
            "killed after {delay} ms: {err}"
        );
        let _ = finish(host, Duration::from_secs(1));
    }
}

/// Without a token, init says once per process, on stderr, that the job is unauthenticated and
/// how to fix it; with one it says nothing.
#[test]
fn a_job_without_a_token_is_warned_about_once() {
    let unset = [("ACCORD_TOKEN", ""), ("ACCORD_JOIN_TIMEOUT", "10")];
    let (code, err) = finish(
        spawn("init-twice", 0, 1, "127.0.0.1:1", &unset),
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(err.matches(WARNING).count(), 1, "{err}");
    assert!(
        err.contains("unauthenticated")
            && err.contains("ACCORD_TOKEN_FILE")
            && err.contains("mpi_comm"),
        "{err}"
    );

    let (code, err) = finish(
        spawn("init-twice", 0, 1, "127.0.0.1:1", &[]),
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains(WARNING), "{err}");
}

fn token_file(name: &str, mode: u32) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("accord-startup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// `ACCORD_TOKEN_FILE` supplies the token (a store that knows only the file's secret admits the
/// ranks, without a warning); a file that others may read is refused, naming the fix.
#[test]
fn a_token_file_supplies_the_token_and_an_open_one_is_refused() {
    let server = StoreServer::bind("127.0.0.1:0", Token::new(TOKEN)).unwrap();
    let store = server.addr().to_string();
    let private = token_file("private", 0o600);
    let path = private.to_str().unwrap();
    let env = [
        ("ACCORD_TOKEN", ""),
        ("ACCORD_TOKEN_FILE", path),
        ("ACCORD_STORE_EXTERNAL", "1"),
        ("ACCORD_JOIN_TIMEOUT", "10"),
    ];
    let ranks: Vec<Child> = (0..2).map(|r| spawn("init", r, 2, &store, &env)).collect();
    for (r, c) in ranks.into_iter().enumerate() {
        let (code, err) = finish(c, Duration::from_secs(30));
        assert_eq!(code, Some(0), "rank {r}: {err}");
        assert!(!err.contains(WARNING), "rank {r}: {err}");
    }

    let open = token_file("open", 0o644);
    let path = open.to_str().unwrap();
    let env = [
        ("ACCORD_TOKEN", ""),
        ("ACCORD_TOKEN_FILE", path),
        ("ACCORD_STORE_EXTERNAL", "1"),
    ];
    let (code, err) = finish(spawn("init", 0, 1, &store, &env), Duration::from_secs(30));
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains(&format!("ACCORD_TOKEN_FILE={path}"))
            && err.contains("permissions 0644 are too open")
            && err.contains(&format!("chmod 600 {path}")),
        "{err}"
    );
    std::fs::remove_dir_all(private.parent().unwrap()).unwrap();
}

/// What a rank process does; a no-op when this binary runs as the test suite.
#[test]
fn rank_main() {
    let Ok(scenario) = std::env::var("STARTUP_TEST_SCENARIO") else {
        return;
    };
    let result = match scenario.as_str() {
        "exit" => std::process::exit(0),
        "init" => accord::init().and_then(|c| c.barrier()),
        "init-twice" => (0..2)
            .try_for_each(|_| accord::init_with("tcp://127.0.0.1:0", Some(0), Some(1)).map(drop)),
        other => panic!("unknown scenario {other:?}"),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(3);
    }
}
