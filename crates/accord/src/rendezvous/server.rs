//! The store server: an in-memory key-value map served over TCP.
//!
//! One thread accepts connections and runs the token handshake ([`Role::Store`]) of every new
//! connection through a `Gate` (`auth::gate`): non-blocking, at most
//! [`HandshakeLimits::max_pending`] at once, each closed if it has not finished within
//! [`HandshakeLimits::deadline`]. So a stranger costs one descriptor for a few seconds and no
//! thread. A connection that proves the token gets its own thread, which answers requests one at
//! a time. Blocking requests (`get`, `wait`, `multi_get`) wait on a [`Condvar`] with the map's
//! lock released, so a waiting client never holds up any other client.
//!
//! Counters (`add`) are stored as the decimal text of an `i64` (e.g. `b"42"`), so `get` on a
//! counter returns readable text and `set(key, b"10")` followed by `add(key, 1)` yields 11.

use super::protocol::{Request, Response, MAX_MULTI_VALUE_BYTES};
use crate::auth::gate::{Gate, Outcome};
use crate::auth::{HandshakeLimits, Role, Token};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest sleep of the accept thread between checks for shutdown.
const ACCEPT_SLICE: Duration = Duration::from_millis(200);

/// A running store. Stops (closing every connection) on [`StoreServer::shutdown`] or drop.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

struct Shared {
    map: Mutex<State>,
    changed: Condvar,
    stopping: AtomicBool,
    token: Token,
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
}

struct State {
    kv: HashMap<String, Vec<u8>>,
    /// Set under the lock so that waiters cannot miss the shutdown wake-up.
    stopped: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StoreServer {
    /// Listen on `addr` (`"0.0.0.0:0"` for every interface and an ephemeral port, or
    /// `"host:port"`) and serve clients that prove knowledge of `token` until shut down, with
    /// the default [`HandshakeLimits`].
    pub fn bind(addr: &str, token: Token) -> Result<StoreServer> {
        Self::bind_with_limits(addr, token, HandshakeLimits::default())
    }

    /// Like [`Self::bind`], with explicit bounds on connections that have not yet proved the
    /// token.
    pub fn bind_with_limits(
        addr: &str,
        token: Token,
        limits: HandshakeLimits,
    ) -> Result<StoreServer> {
        limits.check()?;
        let listener = TcpListener::bind(addr)
            .map_err(|e| Error::io(format!("store: cannot listen on {addr}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(format!("store: cannot listen on {addr}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::io("store: local address", e))?;
        let shared = Arc::new(Shared {
            map: Mutex::new(State {
                kv: HashMap::new(),
                stopped: false,
            }),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
            token,
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
        });
        let s2 = shared.clone();
        let accept_thread = std::thread::Builder::new()
            .name("accord-store-accept".into())
            .spawn(move || accept_loop(listener, s2, limits))
            .map_err(|e| Error::io("store: spawn accept thread", e))?;
        tracing::debug!(addr = %local, "store listening");
        Ok(StoreServer {
            addr: local,
            shared,
            accept_thread: Some(accept_thread),
        })
    }

    /// The address actually bound (with the real port when bound to port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// An address a client on this host can connect to: [`Self::addr`] with an unspecified IP
    /// (`0.0.0.0` / `::`) replaced by loopback.
    pub fn local_connect_addr(&self) -> SocketAddr {
        let mut a = self.addr;
        if a.ip().is_unspecified() {
            a.set_ip(match a.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        a
    }

    /// Stop accepting, close every client connection and wake every blocked request (which
    /// fails with a store error). Idempotent; also done on drop.
    pub fn shutdown(&mut self) {
        if self.shared.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        {
            let mut st = lock(&self.shared.map);
            st.stopped = true;
            self.shared.changed.notify_all();
        }
        for (_, c) in lock(&self.shared.conns).drain() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        // The accept thread never blocks for longer than ACCEPT_SLICE, so this join is short.
        if let Some(h) = self.accept_thread.take() {
            let _ = h.join();
        }
        tracing::debug!(addr = %self.addr, "store stopped");
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>, limits: HandshakeLimits) {
    let mut gate = Gate::new(
        shared.token.clone(),
        Role::Store,
        limits,
        "the store".into(),
    );
    while !shared.stopping.load(Ordering::SeqCst) {
        for outcome in gate.turn(&listener, ACCEPT_SLICE) {
            match outcome {
                Outcome::Passed(stream, peer) => serve_on_own_thread(stream, peer, &shared),
                Outcome::Refused(peer, e @ Error::Unauthorized(_)) => {
                    tracing::warn!(%peer, "store: refused a connection: {e}")
                }
                Outcome::Refused(peer, e) => {
                    tracing::debug!(%peer, "store: handshake failed: {e}")
                }
            }
        }
    }
}

/// Register an authenticated connection (so shutdown can close it) and serve it on a thread.
fn serve_on_own_thread(stream: TcpStream, peer: SocketAddr, shared: &Arc<Shared>) {
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    if let Ok(c) = stream.try_clone() {
        lock(&shared.conns).insert(id, c);
    }
    // Shutdown may have drained the registry between the accept thread's check and the insert.
    if shared.stopping.load(Ordering::SeqCst) {
        let _ = stream.shutdown(std::net::Shutdown::Both);
        lock(&shared.conns).remove(&id);
        return;
    }
    let s2 = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("accord-store-conn".into())
        .spawn(move || {
            serve_connection(stream, peer, &s2);
            lock(&s2.conns).remove(&id);
        });
    if let Err(e) = spawned {
        tracing::warn!(%peer, error = %e, "store: cannot spawn a connection thread");
        lock(&shared.conns).remove(&id);
    }
}

/// Answer the requests of an authenticated client until it leaves or the store stops.
fn serve_connection(s: TcpStream, peer: SocketAddr, shared: &Shared) {
    let _ = s.set_nodelay(true);
    // Authenticated clients may stay idle for as long as they like.
    if s.set_read_timeout(None).is_err() || s.set_write_timeout(None).is_err() {
        return;
    }
    let Ok(w) = s.try_clone() else { return };
    let mut reader = BufReader::new(s);
    let mut writer = BufWriter::new(w);
    loop {
        let req = match Request::read(&mut reader) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e @ Error::Protocol(_)) => {
                tracing::warn!(%peer, "store: closing connection after malformed request: {e}");
                let _ = super::protocol::write_msg(
                    &mut writer,
                    &Response::Error(e.to_string()).encode(),
                );
                return;
            }
            Err(e) => {
                if !shared.stopping.load(Ordering::SeqCst) {
                    tracing::debug!(%peer, "store: connection ended: {e}");
                }
                return;
            }
        };
        let resp = shared.handle(req);
        if let Err(e) = super::protocol::write_msg(&mut writer, &resp.encode()) {
            tracing::debug!(%peer, "store: cannot answer: {e}");
            return;
        }
    }
}

fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| Instant::now().checked_add(t))
}

fn parse_counter(key: &str, v: &[u8]) -> std::result::Result<i64, String> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .ok_or_else(|| {
            format!(
                "add on key {key:?}: its value is not a decimal integer, so it is not a counter"
            )
        })
}

impl Shared {
    fn handle(&self, req: Request) -> Response {
        let mut st = lock(&self.map);
        match req {
            Request::Set { key, value } => {
                st.kv.insert(key, value);
                self.changed.notify_all();
                Response::Ok
            }
            Request::Get { key, timeout } => {
                let keys = [key];
                match self.wait_for(st, &keys, deadline(timeout)) {
                    Ok(st) => Response::Value(st.kv[&keys[0]].clone()),
                    Err(r) => r,
                }
            }
            Request::Wait { keys, timeout } => match self.wait_for(st, &keys, deadline(timeout)) {
                Ok(_) => Response::Ok,
                Err(r) => r,
            },
            Request::MultiGet { keys, timeout } => {
                match self.wait_for(st, &keys, deadline(timeout)) {
                    Ok(st) => {
                        let total: usize = keys.iter().map(|k| st.kv[k].len()).sum();
                        if total > MAX_MULTI_VALUE_BYTES {
                            return Response::Error(format!(
                                "multi_get of {} keys would return {total} bytes, more than the \
                                 limit of {MAX_MULTI_VALUE_BYTES}; fetch them in smaller groups",
                                keys.len()
                            ));
                        }
                        Response::Values(keys.iter().map(|k| st.kv[k].clone()).collect())
                    }
                    Err(r) => r,
                }
            }
            Request::Add { key, delta } => {
                let cur = match st.kv.get(&key) {
                    None => 0,
                    Some(v) => match parse_counter(&key, v) {
                        Ok(n) => n,
                        Err(msg) => return Response::Error(msg),
                    },
                };
                let Some(new) = cur.checked_add(delta) else {
                    return Response::Error(format!(
                        "add on key {key:?}: {cur} + {delta} overflows a 64-bit integer"
                    ));
                };
                st.kv.insert(key, new.to_string().into_bytes());
                self.changed.notify_all();
                Response::Int(new)
            }
            Request::CompareSet { key, expected, new } => {
                let swap = match (st.kv.get(&key), &expected) {
                    (None, None) => true,
                    (Some(cur), Some(exp)) => cur == exp,
                    _ => false,
                };
                if swap {
                    st.kv.insert(key, new.clone());
                    self.changed.notify_all();
                    Response::Maybe(Some(new))
                } else {
                    Response::Maybe(st.kv.get(&key).cloned())
                }
            }
            Request::Delete { key } => Response::Bool(st.kv.remove(&key).is_some()),
            Request::NumKeys => Response::Count(st.kv.len() as u64),
            Request::Check { keys } => Response::Bool(keys.iter().all(|k| st.kv.contains_key(k))),
        }
    }

    /// Block (with the lock released) until every key exists, the deadline passes (a
    /// `Timeout` response naming the keys still missing) or the server stops.
    fn wait_for<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        keys: &[String],
        deadline: Option<Instant>,
    ) -> std::result::Result<MutexGuard<'a, State>, Response> {
        loop {
            if keys.iter().all(|k| st.kv.contains_key(k)) {
                return Ok(st);
            }
            if st.stopped {
                return Err(Response::Error("the store is shutting down".into()));
            }
            let wait = match deadline {
                None => Duration::from_secs(3600),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        let missing = keys
                            .iter()
                            .filter(|k| !st.kv.contains_key(*k))
                            .cloned()
                            .collect();
                        return Err(Response::Timeout(missing));
                    }
                    d - now
                }
            };
            st = self
                .changed
                .wait_timeout(st, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth;
    use crate::rendezvous::protocol::MAX_KEY_BYTES;
    use crate::rendezvous::StoreClient;
    use crate::transport::AddressBook;
    use std::io::{Read, Write};

    const T: Duration = Duration::from_secs(5);

    fn server() -> (StoreServer, StoreClient) {
        let s = StoreServer::bind("127.0.0.1:0", Token::new("tok")).unwrap();
        let c = StoreClient::connect(&s.addr().to_string(), &Token::new("tok"), T).unwrap();
        (s, c)
    }

    #[test]
    fn every_op() {
        let (_s, c) = server();
        assert_eq!(c.num_keys().unwrap(), 0);
        c.set("a", b"1").unwrap();
        assert_eq!(c.get("a").unwrap(), b"1");
        assert_eq!(c.try_get("nope").unwrap(), None);
        assert_eq!(c.try_get("a").unwrap(), Some(b"1".to_vec()));
        c.set("a", b"").unwrap();
        assert_eq!(c.get("a").unwrap(), b"");
        c.wait(&["a"]).unwrap();
        assert!(c.check(&["a"]).unwrap());
        assert!(!c.check(&["a", "b"]).unwrap());
        assert!(c.check::<&str>(&[]).unwrap());

        assert_eq!(c.add("n", 5).unwrap(), 5);
        assert_eq!(c.add("n", -7).unwrap(), -2);
        assert_eq!(c.get("n").unwrap(), b"-2");
        c.set("n", "10").unwrap();
        assert_eq!(c.add("n", 1).unwrap(), 11);
        let e = c.add("a", 1).unwrap_err();
        assert!(matches!(e, Error::Store(_)), "{e}");
        c.set("big", i64::MAX.to_string()).unwrap();
        assert!(c
            .add("big", 1)
            .unwrap_err()
            .to_string()
            .contains("overflow"));

        assert_eq!(c.compare_set("c", None, b"x").unwrap(), Some(b"x".to_vec()));
        assert_eq!(c.compare_set("c", None, b"y").unwrap(), Some(b"x".to_vec()));
        assert_eq!(
            c.compare_set("c", Some(b"wrong"), b"y").unwrap(),
            Some(b"x".to_vec())
        );
        assert_eq!(
            c.compare_set("c", Some(b"x"), b"y").unwrap(),
            Some(b"y".to_vec())
        );
        assert_eq!(c.compare_set("absent", Some(b"x"), b"y").unwrap(), None);
        assert!(!c.check(&["absent"]).unwrap());

        assert_eq!(
            c.multi_get(&["a", "c"], T).unwrap(),
            vec![b"".to_vec(), b"y".to_vec()]
        );
        assert_eq!(c.num_keys().unwrap(), 4);
        assert!(c.delete("c").unwrap());
        assert!(!c.delete("c").unwrap());
        assert_eq!(c.num_keys().unwrap(), 3);

        let long = "k".repeat(MAX_KEY_BYTES + 1);
        assert!(matches!(c.set(&long, b""), Err(Error::InvalidArgument(_))));
        // The connection is still usable after a locally refused request.
        assert_eq!(c.get("a").unwrap(), b"");
    }

    #[test]
    fn prefixes_separate_namespaces() {
        let (_s, c) = server();
        let a = c.with_prefix("job1");
        let b = c.with_prefix("job2/");
        a.set("k", b"a").unwrap();
        b.set("k", b"b").unwrap();
        assert_eq!(a.get("k").unwrap(), b"a");
        assert_eq!(b.get("k").unwrap(), b"b");
        assert_eq!(c.get("job1/k").unwrap(), b"a");
        assert_eq!(a.with_prefix("sub").prefix(), "job1/sub");
        let e = a
            .wait_timeout(&["k", "missing"], Duration::from_millis(50))
            .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("\"missing\"") && msg.contains("job1"), "{msg}");
        assert!(!msg.contains("\"k\""), "{msg}");
    }

    #[test]
    fn get_blocks_until_another_client_sets() {
        let (s, c) = server();
        let addr = s.addr().to_string();
        let setter = std::thread::spawn(move || {
            let c2 = StoreClient::connect(&addr, &Token::new("tok"), T).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            c2.set("late", b"here").unwrap();
        });
        let t0 = Instant::now();
        assert_eq!(c.get_timeout("late", T).unwrap(), b"here");
        assert!(t0.elapsed() >= Duration::from_millis(150));
        setter.join().unwrap();
    }

    #[test]
    fn shared_client_blocked_get_does_not_block_other_threads() {
        let (_s, c) = server();
        let c2 = c.clone();
        let waiter = std::thread::spawn(move || c2.get_timeout("k", T));
        std::thread::sleep(Duration::from_millis(100));
        c.set("k", b"v").unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), b"v");
    }

    #[test]
    fn wait_timeout_names_missing_key() {
        let (_s, c) = server();
        c.set("addr/0", b"x").unwrap();
        let t0 = Instant::now();
        let e = c
            .wait_timeout(&["addr/0", "addr/3"], Duration::from_millis(300))
            .unwrap_err();
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("[\"addr/3\"]"), "{msg}");
        let e = c
            .get_timeout("addr/9", Duration::from_millis(50))
            .unwrap_err();
        assert!(e.to_string().contains("addr/9"), "{e}");
    }

    #[test]
    fn address_book_lookup_names_rank() {
        let (_s, c) = server();
        let book = c.with_prefix("comm7");
        book.publish(0, "10.0.0.1:5000").unwrap();
        let soon = Instant::now() + Duration::from_millis(50);
        assert_eq!(book.lookup(0, soon).unwrap(), "10.0.0.1:5000");
        assert_eq!(c.get("comm7/addr/0").unwrap(), b"10.0.0.1:5000");
        match book.lookup(3, Instant::now() + Duration::from_millis(50)) {
            Err(Error::Timeout { waiting_for, .. }) => assert_eq!(waiting_for, vec![3]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn concurrent_clients_count_atomically() {
        let (s, c) = server();
        let addr = s.addr().to_string();
        let hs: Vec<_> = (0..8)
            .map(|i| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let c = StoreClient::connect(&addr, &Token::new("tok"), T).unwrap();
                    for j in 0..50 {
                        c.add("counter", 1).unwrap();
                        c.set(&format!("k/{i}/{j}"), [i as u8, j as u8]).unwrap();
                    }
                })
            })
            .collect();
        // Also many threads over one shared client.
        let shared: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        c.add("counter", 1).unwrap();
                    }
                })
            })
            .collect();
        for h in hs.into_iter().chain(shared) {
            h.join().unwrap();
        }
        assert_eq!(c.get("counter").unwrap(), b"600");
        assert_eq!(c.num_keys().unwrap(), 1 + 8 * 50);
        assert_eq!(c.get("k/7/49").unwrap(), vec![7, 49]);
    }

    #[test]
    fn wrong_token_refused_and_server_keeps_serving() {
        let (s, c) = server();
        let addr = s.addr().to_string();
        let e = StoreClient::connect(&addr, &Token::new("guess"), T).unwrap_err();
        assert!(matches!(e, Error::Unauthorized(_)), "{e:?}");
        assert!(e.to_string().contains("ACCORD_TOKEN"), "{e}");

        // A raw stranger that answers the challenge with junk learns nothing and sets nothing.
        let mut raw = TcpStream::connect(s.addr()).unwrap();
        raw.set_read_timeout(Some(T)).unwrap();
        let mut hello = [0u8; 41];
        raw.read_exact(&mut hello).unwrap();
        raw.write_all(&[0u8; 64]).unwrap();
        // Pretend the handshake passed and send a SET; the server must ignore it.
        let set = Request::Set {
            key: "evil".into(),
            value: b"1".to_vec(),
        };
        let _ = raw.write_all(&set.encode());
        let mut status = [0u8; 1];
        raw.read_exact(&mut status).unwrap();
        assert_eq!(status[0], 0, "refused");
        let mut rest = Vec::new();
        let _ = raw.read_to_end(&mut rest); // the server closes the connection
        assert!(!c.check(&["evil"]).unwrap());

        // A server with another token is refused by a client.
        let other = StoreServer::bind("127.0.0.1:0", Token::new("other")).unwrap();
        let e = StoreClient::connect(&other.addr().to_string(), &Token::new("tok"), T).unwrap_err();
        assert!(matches!(e, Error::Unauthorized(_)), "{e:?}");

        c.set("still", b"ok").unwrap();
        let good = StoreClient::connect(&addr, &Token::new("tok"), T).unwrap();
        assert_eq!(good.get("still").unwrap(), b"ok");
    }

    fn authenticated_raw(s: &StoreServer) -> TcpStream {
        let mut raw = TcpStream::connect(s.addr()).unwrap();
        raw.set_read_timeout(Some(T)).unwrap();
        auth::connect(&mut raw, &Token::new("tok"), Role::Store, "test").unwrap();
        raw
    }

    fn assert_closed_after_error(mut raw: TcpStream) {
        let mut rest = Vec::new();
        raw.read_to_end(&mut rest).unwrap();
        let resp = Response::read(&mut rest.as_slice()).unwrap();
        assert!(
            matches!(&resp, Response::Error(m) if m.contains("protocol")),
            "{resp:?}"
        );
    }

    #[test]
    fn garbage_after_handshake_drops_only_that_connection() {
        let (s, c) = server();
        let mut raw = authenticated_raw(&s);
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let junk: Vec<u8> = (0..256)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x as u8) | 0x80 // no valid request code
            })
            .collect();
        raw.write_all(&junk).unwrap();
        assert_closed_after_error(raw);

        // A SET claiming a 4 GiB value.
        let mut raw = authenticated_raw(&s);
        let mut b = vec![1u8];
        b.extend_from_slice(&1u32.to_le_bytes());
        b.push(b'k');
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        raw.write_all(&b).unwrap();
        assert_closed_after_error(raw);

        // A WAIT claiming 4 billion keys.
        let mut raw = authenticated_raw(&s);
        let mut b = vec![3u8];
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        raw.write_all(&b).unwrap();
        assert_closed_after_error(raw);

        c.set("alive", b"yes").unwrap();
        assert_eq!(c.get("alive").unwrap(), b"yes");
        assert!(!c.check(&["k"]).unwrap());
    }

    #[test]
    fn shutdown_wakes_blocked_clients_and_closes() {
        let mut s = StoreServer::bind("127.0.0.1:0", Token::new("tok")).unwrap();
        let c = StoreClient::connect(&s.addr().to_string(), &Token::new("tok"), T).unwrap();
        let c2 = c.clone();
        let waiter = std::thread::spawn(move || c2.get_timeout("never", T));
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        s.shutdown();
        let r = waiter.join().unwrap();
        assert!(r.is_err());
        assert!(t0.elapsed() < Duration::from_secs(3));
        s.shutdown(); // idempotent
        let short = Duration::from_millis(200);
        let quick = StoreClient::connect(&s.addr().to_string(), &Token::new("tok"), short);
        assert!(quick.is_err() || quick.unwrap().set("x", b"y").is_err());
    }

    #[test]
    fn client_retries_until_server_starts() {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let starter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            StoreServer::bind(&addr.to_string(), Token::new("tok")).unwrap()
        });
        let c = StoreClient::connect(&addr.to_string(), &Token::new("tok"), T).unwrap();
        let _s = starter.join().unwrap();
        c.set("a", b"b").unwrap();
        // And gives up with a timeout when nothing ever listens.
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = probe.local_addr().unwrap().to_string();
        drop(probe);
        let e = StoreClient::connect(&dead, &Token::new("tok"), Duration::from_millis(300))
            .unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
        assert!(e.to_string().contains(&dead), "{e}");
    }
}
