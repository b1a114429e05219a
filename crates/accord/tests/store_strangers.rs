//! Connections that never finish the authentication handshake cost the store a bounded number of
//! descriptors for a bounded time, and no threads.
//!
//! This file holds one test, so the process's thread and descriptor counts (read from
//! `/proc/self/task` and `/proc/self/fd`) move only with what the test does. The test opens
//! twice as many connections trickling one byte every 100 ms as the store lets into the
//! handshake, plus as many idle ones. `ACCORD_SOAK=n` opens n times as many.

use accord::auth::{HandshakeLimits, Token};
use accord::rendezvous::{StoreClient, StoreServer};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const CAP: usize = 16;
const DEADLINE: Duration = Duration::from_secs(1);
const TICK: Duration = Duration::from_millis(100);
const T: Duration = Duration::from_secs(10);

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).expect(dir).count()
}

/// Raise the soft limit on open files to the hard one, so a soak run is not cut short by it.
fn raise_fd_limit() -> usize {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit for both calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        }
    }
    r.rlim_cur as usize
}

struct Stranger {
    s: TcpStream,
    trickles: bool,
    opened: Instant,
    /// Bytes of the store's greeting received: only connections let into the handshake get it.
    greeted: usize,
    closed: Option<Instant>,
}

impl Stranger {
    /// Read what has arrived without blocking, and note when the store closed the connection.
    fn check(&mut self) {
        if self.closed.is_some() {
            return;
        }
        let mut buf = [0u8; 64];
        loop {
            match self.s.read(&mut buf) {
                Ok(0) => break self.closed = Some(Instant::now()),
                Ok(n) => self.greeted += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break self.closed = Some(Instant::now()),
            }
        }
    }

    /// Send the next byte, if this one trickles and is open.
    fn trickle(&mut self) {
        if self.trickles && self.closed.is_none() && self.s.write_all(&[0x5a]).is_err() {
            self.closed = Some(Instant::now());
        }
    }
}

#[test]
fn strangers_in_the_handshake_cost_bounded_resources() {
    let n_trickle = 2 * CAP * accord::testing::soak();
    let n_idle = CAP * accord::testing::soak();
    let n = n_trickle + n_idle;
    let limit = raise_fd_limit();
    assert!(
        limit > 2 * n + CAP + 64,
        "the open-file limit ({limit}) is too low for ACCORD_SOAK={}",
        accord::testing::soak()
    );
    let token = Token::new("store-strangers");
    let limits = HandshakeLimits {
        max_pending: CAP,
        deadline: DEADLINE,
    };
    let server = StoreServer::bind_with_limits("127.0.0.1:0", token.clone(), limits).unwrap();
    let addr = server.addr().to_string();
    let early = StoreClient::connect(&addr, &token, T).unwrap();
    early.set("before", b"1").unwrap();

    // A client that connects while the handshake slots are full of strangers.
    let (go, start_late) = std::sync::mpsc::channel::<()>();
    let (late_addr, late_token) = (addr.clone(), token.clone());
    let late = std::thread::spawn(move || {
        start_late.recv().unwrap();
        let t0 = Instant::now();
        let c = StoreClient::connect(&late_addr, &late_token, T)?;
        let connected = t0.elapsed();
        c.set("late", b"2")?;
        assert_eq!(c.get("before")?, b"1");
        Ok::<_, accord::Error>(connected)
    });
    std::thread::sleep(Duration::from_millis(50));
    let base_threads = count("/proc/self/task");
    let base_fds = count("/proc/self/fd");

    // Open them a batch at a time, each batch well inside the listen backlog, and wait for the
    // store to greet or close each: "closed at once" then means that, not a retried SYN.
    let mut strangers: Vec<Stranger> = Vec::with_capacity(n);
    while strangers.len() < n {
        let first = strangers.len();
        for i in first..n.min(first + 32) {
            let s = TcpStream::connect(server.addr()).unwrap();
            s.set_nonblocking(true).unwrap();
            strangers.push(Stranger {
                s,
                trickles: i % 3 != 2,
                opened: Instant::now(),
                greeted: 0,
                closed: None,
            });
        }
        let t0 = Instant::now();
        while strangers[first..]
            .iter()
            .any(|s| s.greeted == 0 && s.closed.is_none())
        {
            assert!(
                t0.elapsed() < T,
                "the store neither greets nor closes a stranger"
            );
            std::thread::sleep(Duration::from_millis(5));
            strangers[first..].iter_mut().for_each(Stranger::check);
        }
    }
    go.send(()).unwrap();

    let storm = Instant::now();
    let (mut max_threads, mut max_fds, mut max_in_handshake) = (0, 0, 0);
    let mut slowest_request = Duration::ZERO;
    while storm.elapsed() < DEADLINE + Duration::from_secs(3) {
        strangers.iter_mut().for_each(Stranger::check);
        let in_handshake = strangers
            .iter()
            .filter(|s| s.greeted > 0 && s.closed.is_none())
            .count();
        max_in_handshake = max_in_handshake.max(in_handshake);
        strangers.iter_mut().for_each(Stranger::trickle);
        max_threads = max_threads.max(count("/proc/self/task"));
        max_fds = max_fds.max(count("/proc/self/fd"));
        let t0 = Instant::now();
        assert_eq!(early.get("before").unwrap(), b"1");
        slowest_request = slowest_request.max(t0.elapsed());
        if strangers.iter().all(|s| s.closed.is_some()) {
            break;
        }
        std::thread::sleep(TICK);
    }
    let late_connected = late
        .join()
        .unwrap()
        .expect("a client connects despite the strangers");

    // A client that connected before the strangers is served promptly throughout, and a new one
    // gets in once the strangers' handshake deadline has passed.
    assert!(
        slowest_request < Duration::from_millis(500),
        "{slowest_request:?}"
    );
    assert!(
        late_connected < DEADLINE + Duration::from_secs(2),
        "{late_connected:?}"
    );
    assert_eq!(early.get("late").unwrap(), b"2");

    // At most CAP strangers were in the handshake at once; the others were closed at once.
    let admitted: Vec<&Stranger> = strangers.iter().filter(|s| s.greeted > 0).collect();
    assert!(
        !admitted.is_empty() && max_in_handshake <= CAP,
        "{} admitted, up to {max_in_handshake} at once",
        admitted.len()
    );
    for s in strangers.iter().filter(|s| s.greeted == 0) {
        let closed = s.closed.expect("a stranger beyond the cap is closed");
        assert!(
            closed - s.opened < Duration::from_millis(500),
            "closed after {:?}",
            closed - s.opened
        );
    }
    // The admitted ones, trickling or idle, were closed by the handshake deadline: not before,
    // and not much after.
    assert!(admitted.iter().any(|s| s.trickles));
    for s in &admitted {
        let Some(closed) = s.closed else {
            panic!(
                "a stranger (trickling: {}) is still open {:?} after it connected",
                s.trickles,
                s.opened.elapsed()
            );
        };
        let lived = closed - s.opened;
        assert!(
            lived >= DEADLINE - Duration::from_millis(50)
                && lived < DEADLINE + Duration::from_secs(1),
            "a stranger (trickling: {}) lived {lived:?}",
            s.trickles
        );
    }

    // No thread per stranger: the only new server thread serves the late client. The process's
    // descriptors are its own stranger sockets, at most CAP on the server's side, and the late
    // client's connection (two descriptors here, three in the server).
    assert!(
        max_threads <= base_threads + 1,
        "threads: {base_threads} before the strangers, up to {max_threads} with them"
    );
    assert!(
        max_fds <= base_fds + n + CAP + 5,
        "descriptors: {base_fds} before {n} strangers, up to {max_fds} with them"
    );
    let after = count("/proc/self/fd");
    assert!(
        after <= base_fds + n + 5,
        "descriptors: {base_fds} before {n} strangers, {after} once they were closed"
    );
    drop(strangers);
}
