//! The store client.
//!
//! A [`StoreClient`] is cheap to clone and safe to share between threads. It keeps a small pool
//! of authenticated connections: a request takes an idle connection (or opens a new one), so a
//! thread blocked in [`StoreClient::get`] never stops another thread of the same process from
//! calling [`StoreClient::set`] — the key it may be waiting for.
//!
//! Start order does not matter: the first connection is retried while it is refused. Once the
//! store has answered, a closed connection or a refused one means its process is gone, and
//! requests fail at once saying so (naming the rank that hosted it, where one did) instead of
//! waiting for their deadline.

use super::protocol::{self, Request, Response};
use crate::auth::{self, Role, Token};
use crate::error::{Error, Result};
use crate::transport::{AddressBook, Directory};
use std::io::{BufRead, BufReader, ErrorKind, Read};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Extra time a client waits for an answer beyond the deadline it gave the server.
const ANSWER_GRACE: Duration = Duration::from_secs(5);
/// Most idle connections kept per client.
const MAX_IDLE: usize = 8;
/// How long a probe waits to learn whether anything still listens at the store's address.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Probes of a store that accepted but did not greet, before it counts as alive.
const PROBE_ROUNDS: usize = 3;

/// A connection to a [`super::StoreServer`] (or any Accord store).
#[derive(Clone)]
pub struct StoreClient {
    inner: Arc<Inner>,
    /// Namespace prepended (with `/`) to every key this handle touches; empty for none.
    prefix: String,
}

struct Inner {
    addr: String,
    token: Token,
    timeout: Duration,
    /// The rank whose process serves the store, where a rank does; errors name it when the
    /// store is gone.
    host_rank: Option<usize>,
    idle: Mutex<Vec<Conn>>,
}

struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl std::fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreClient")
            .field("addr", &self.inner.addr)
            .field("prefix", &self.prefix)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

fn transient(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::ConnectionRefused
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::TimedOut
            | ErrorKind::WouldBlock
            | ErrorKind::AddrNotAvailable
            | ErrorKind::NotFound
            | ErrorKind::UnexpectedEof
            | ErrorKind::BrokenPipe
    )
}

fn store_timeout(op: String, after: Duration, hint: String, waiting_for: Vec<usize>) -> Error {
    Error::Timeout {
        op,
        seq: 0,
        comm: "rendezvous store".into(),
        waiting_for,
        after,
        hint,
    }
}

/// What a refused connection means to [`open`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// The store may not have started yet: retry until the deadline.
    Retry,
    /// The store answered this client before: nothing listens there any more.
    Gone,
}

/// The store's process is gone. `seen` says how that showed.
fn store_gone(addr: &str, host_rank: Option<usize>, seen: &str) -> Error {
    match host_rank {
        Some(rank) => Error::PeerLost {
            rank,
            cause: format!("it hosts the store at {addr} and is gone: {seen}"),
        },
        None => Error::Store(format!("the store at {addr} is gone: {seen}")),
    }
}

/// Open one authenticated connection, retrying unreachable connects (and refused ones, with
/// [`Refused::Retry`]) until `deadline`.
fn open(
    addr: &str,
    token: &Token,
    deadline: Instant,
    refused: Refused,
    host_rank: Option<usize>,
) -> Result<Conn> {
    let what = format!("store at {addr}");
    let mut backoff = Duration::from_millis(10);
    let start = Instant::now();
    let mut last: Option<std::io::Error>;
    loop {
        let attempt = (|| -> std::io::Result<TcpStream> {
            let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
            let mut err = std::io::Error::new(ErrorKind::NotFound, "no address");
            for a in addrs {
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(100));
                match TcpStream::connect_timeout(&a, left.min(Duration::from_secs(10))) {
                    Ok(s) => return Ok(s),
                    Err(e) => err = e,
                }
            }
            Err(err)
        })();
        match attempt {
            Ok(mut s) => {
                let _ = s.set_nodelay(true);
                let hs = deadline
                    .saturating_duration_since(Instant::now())
                    .clamp(Duration::from_secs(1), Duration::from_secs(30));
                s.set_read_timeout(Some(hs))
                    .and_then(|_| s.set_write_timeout(Some(hs)))
                    .map_err(|e| Error::io(format!("{what}: socket options"), e))?;
                match auth::connect(&mut s, token, Role::Store, &what) {
                    Ok(()) => {
                        let writer = s
                            .try_clone()
                            .map_err(|e| Error::io(format!("{what}: clone socket"), e))?;
                        return Ok(Conn {
                            reader: BufReader::new(s),
                            writer,
                        });
                    }
                    // A wrong token or a wrong service will not fix itself: fail now.
                    Err(e @ (Error::Unauthorized(_) | Error::Protocol(_))) => return Err(e),
                    Err(Error::Io { kind, message, .. }) if transient(kind) => {
                        last = Some(std::io::Error::new(kind, message));
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) if e.kind() == ErrorKind::ConnectionRefused && refused == Refused::Gone => {
                return Err(store_gone(addr, host_rank, "connection refused"));
            }
            Err(e) if transient(e.kind()) => last = Some(e),
            Err(e) => return Err(Error::io(format!("cannot connect to the {what}"), e)),
        }
        let now = Instant::now();
        if now >= deadline {
            let cause = last.map(|e| e.to_string()).unwrap_or_default();
            let (hint, waiting_for) = match host_rank {
                Some(r) => (
                    format!(
                        " — rank {r} hosts the store at {addr}, which never answered ({cause}): \
                         rank {r} has not started, failed before listening, or the address is \
                         wrong"
                    ),
                    vec![r],
                ),
                None => (
                    format!(
                        "(none; the store itself is unreachable: {cause}) — is the store \
                         running, and is the address right?"
                    ),
                    vec![],
                ),
            };
            return Err(store_timeout(
                format!("connecting to the {what}"),
                start.elapsed(),
                hint,
                waiting_for,
            ));
        }
        std::thread::sleep(backoff.min(deadline - now));
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

impl StoreClient {
    /// Connect to the store at `addr` (`host:port`), retrying while the connection is refused
    /// (the store may start after its clients) until `timeout`, then prove knowledge of `token`.
    /// `timeout` is also the default deadline of every later request.
    ///
    /// A wrong token fails at once with [`Error::Unauthorized`].
    pub fn connect(addr: &str, token: &Token, timeout: Duration) -> Result<StoreClient> {
        Self::connect_until(addr, token, Instant::now() + timeout, timeout, None)
    }

    /// Like [`Self::connect`], retrying until `deadline`, with `timeout` as the default request
    /// deadline. `host_rank` is the rank whose process serves the store, if one does: errors
    /// then name it when the store cannot be reached or is gone.
    pub(crate) fn connect_until(
        addr: &str,
        token: &Token,
        deadline: Instant,
        timeout: Duration,
        host_rank: Option<usize>,
    ) -> Result<StoreClient> {
        let conn = open(addr, token, deadline, Refused::Retry, host_rank)?;
        Ok(StoreClient {
            inner: Arc::new(Inner {
                addr: addr.to_string(),
                token: token.clone(),
                timeout,
                host_rank,
                idle: Mutex::new(vec![conn]),
            }),
            prefix: String::new(),
        })
    }

    /// A handle on the same store (sharing connections) whose keys all live under
    /// `{prefix}/…` of this handle's namespace. Use one namespace per job or communicator so
    /// several can share one store.
    pub fn with_prefix(&self, prefix: &str) -> StoreClient {
        let prefix = prefix.trim_matches('/');
        StoreClient {
            inner: self.inner.clone(),
            prefix: match (self.prefix.is_empty(), prefix.is_empty()) {
                (_, true) => self.prefix.clone(),
                (true, false) => prefix.to_string(),
                (false, false) => format!("{}/{prefix}", self.prefix),
            },
        }
    }

    /// This handle's namespace (empty for the root).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The job's token this client proved (for other local connections of the job).
    pub(crate) fn token(&self) -> &Token {
        &self.inner.token
    }

    /// The store address this client connects to.
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// The default deadline of requests.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    fn key(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix)
        }
    }

    fn keys<K: AsRef<str>>(&self, keys: &[K]) -> Vec<String> {
        keys.iter().map(|k| self.key(k.as_ref())).collect()
    }

    fn unprefix(&self, key: String) -> String {
        if self.prefix.is_empty() {
            return key;
        }
        match key
            .strip_prefix(&self.prefix)
            .and_then(|k| k.strip_prefix('/'))
        {
            Some(k) => k.to_string(),
            None => key,
        }
    }

    /// The error for a connection that ended without an answer (`seen` says how): the store is
    /// gone when nothing listens at its address any more.
    fn ended(&self, seen: &str) -> Error {
        if self.store_is_gone() {
            store_gone(
                &self.inner.addr,
                self.inner.host_rank,
                &format!("{seen}, and nothing serves at its address any more"),
            )
        } else {
            Error::Store(format!("the store at {}: {seen}", self.inner.addr))
        }
    }

    /// Whether no store serves at its address any more: connections are refused, closed before
    /// the store's greeting (the listener of a process being torn down can still complete a
    /// connect), or greeted by something else (another process that took the freed port, such
    /// as a rank's peer listener). A probe that is accepted but never greeted is asked again a
    /// few times: a killed process's listener can accept until its teardown ends, and a live
    /// store greets at once.
    fn store_is_gone(&self) -> bool {
        for _ in 0..PROBE_ROUNDS {
            match self.probe() {
                Some(gone) => return gone,
                None => continue,
            }
        }
        false
    }

    /// One probe of the store's address: `Some(gone)`, or `None` if a connection was accepted
    /// and nothing was said on it in time.
    fn probe(&self) -> Option<bool> {
        let Ok(addrs) = self.inner.addr.to_socket_addrs() else {
            return Some(false);
        };
        let addrs: Vec<SocketAddr> = addrs.collect();
        if addrs.is_empty() {
            return Some(false);
        }
        let mut gone = true;
        for a in &addrs {
            match TcpStream::connect_timeout(a, PROBE_TIMEOUT) {
                // Reset: the listener went away during the connect.
                Err(e) => {
                    gone &= matches!(
                        e.kind(),
                        ErrorKind::ConnectionRefused
                            | ErrorKind::ConnectionReset
                            | ErrorKind::ConnectionAborted
                    )
                }
                Ok(mut s) => {
                    let _ = s.set_read_timeout(Some(PROBE_TIMEOUT));
                    let mut hello = [0u8; 9];
                    match s.read_exact(&mut hello) {
                        Ok(()) => gone &= !auth::greets_as(&hello, Role::Store),
                        Err(e)
                            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                        {
                            return None
                        }
                        Err(e) => {
                            gone &= matches!(
                                e.kind(),
                                ErrorKind::UnexpectedEof
                                    | ErrorKind::ConnectionReset
                                    | ErrorKind::ConnectionAborted
                            )
                        }
                    }
                }
            }
        }
        Some(gone)
    }

    /// An I/O error on an established connection: the end of the connection, or another error.
    fn broken(&self, what: &str, e: std::io::Error) -> Error {
        match e.kind() {
            ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
            | ErrorKind::UnexpectedEof => {
                self.ended(&format!("the connection broke without an answer ({e})"))
            }
            _ => Error::io(what, e),
        }
    }

    /// Send one request and read its answer. `wait` is the deadline the server was given (for
    /// blocking requests); the socket waits a little longer than that.
    fn request(&self, req: Request, wait: Option<Duration>) -> Result<Response> {
        req.validate()?;
        let io_timeout = wait
            .unwrap_or(self.inner.timeout)
            .saturating_add(ANSWER_GRACE);
        let pooled = self
            .inner
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => open(
                &self.inner.addr,
                &self.inner.token,
                Instant::now() + self.inner.timeout,
                Refused::Gone,
                self.inner.host_rank,
            )?,
        };
        let what = format!("store request to {}", self.inner.addr);
        conn.writer
            .set_write_timeout(Some(io_timeout))
            .and_then(|_| conn.reader.get_ref().set_read_timeout(Some(io_timeout)))
            .map_err(|e| Error::io(format!("{what}: socket options"), e))?;
        protocol::write_msg(&mut conn.writer, &req.encode())
            .map_err(|e| self.broken(&format!("{what}: send"), e))?;
        // Wait for the first byte here, to tell the end of the connection from a slow answer.
        match conn.reader.fill_buf() {
            Ok([]) => return Err(self.ended("the connection closed without an answer")),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(store_timeout(
                    what,
                    io_timeout,
                    "(none; the store did not answer) — is the store process alive?".into(),
                    vec![],
                ))
            }
            Err(e) => return Err(self.broken(&format!("{what}: receive"), e)),
        }
        let resp = match Response::read(&mut conn.reader) {
            Ok(r) => r,
            Err(Error::Io {
                kind: ErrorKind::WouldBlock | ErrorKind::TimedOut,
                ..
            }) => {
                return Err(store_timeout(
                    what,
                    io_timeout,
                    "(none; the store did not answer) — is the store process alive?".into(),
                    vec![],
                ))
            }
            Err(e) => return Err(e),
        };
        let mut idle = self.inner.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
        Ok(resp)
    }

    fn unexpected(op: &str, resp: Response) -> Error {
        match resp {
            Response::Error(msg) => Error::Store(msg),
            other => Error::Protocol(format!(
                "store: unexpected answer to {op}: {:?}",
                std::mem::discriminant(&other)
            )),
        }
    }

    pub(crate) fn timed_out(&self, op: &str, after: Duration, missing: Vec<String>) -> Error {
        let missing: Vec<String> = missing.into_iter().map(|k| self.unprefix(k)).collect();
        let ns = if self.prefix.is_empty() {
            String::new()
        } else {
            format!(" in namespace {:?}", self.prefix)
        };
        store_timeout(
            format!("store {op} for keys {missing:?}{ns}"),
            after,
            format!(
                "(none; keys still missing from the store at {}: {missing:?}) — the process \
                 expected to set them has not started, has failed, or uses another store",
                self.inner.addr
            ),
            vec![],
        )
    }

    /// Store `value` under `key`, replacing any previous value and waking anyone waiting for it.
    pub fn set(&self, key: &str, value: impl AsRef<[u8]>) -> Result<()> {
        let req = Request::Set {
            key: self.key(key),
            value: value.as_ref().to_vec(),
        };
        match self.request(req, None)? {
            Response::Ok => Ok(()),
            r => Err(Self::unexpected("set", r)),
        }
    }

    /// The value of `key`, waiting for it to be set for up to the client's default timeout.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_timeout(key, self.inner.timeout)
    }

    /// The value of `key`, waiting up to `timeout` for it to be set. A timeout error names the
    /// key.
    pub fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let req = Request::Get {
            key: self.key(key),
            timeout: Some(timeout),
        };
        match self.request(req, Some(timeout))? {
            Response::Value(v) => Ok(v),
            Response::Timeout(missing) => Err(self.timed_out("get", timeout, missing)),
            r => Err(Self::unexpected("get", r)),
        }
    }

    /// The value of `key` if it is set now, without waiting.
    pub fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let req = Request::Get {
            key: self.key(key),
            timeout: Some(Duration::ZERO),
        };
        match self.request(req, Some(Duration::ZERO))? {
            Response::Value(v) => Ok(Some(v)),
            Response::Timeout(_) => Ok(None),
            r => Err(Self::unexpected("get", r)),
        }
    }

    /// Wait until every key in `keys` is set, for up to the client's default timeout.
    pub fn wait<K: AsRef<str>>(&self, keys: &[K]) -> Result<()> {
        self.wait_timeout(keys, self.inner.timeout)
    }

    /// Wait until every key in `keys` is set, for up to `timeout`. A timeout error lists the keys
    /// still missing.
    pub fn wait_timeout<K: AsRef<str>>(&self, keys: &[K], timeout: Duration) -> Result<()> {
        match self.wait_missing(keys, timeout)? {
            missing if missing.is_empty() => Ok(()),
            missing => Err(self.timed_out("wait", timeout, missing)),
        }
    }

    /// Wait up to `timeout`; return the keys still missing at the deadline.
    pub(crate) fn wait_missing<K: AsRef<str>>(
        &self,
        keys: &[K],
        timeout: Duration,
    ) -> Result<Vec<String>> {
        let req = Request::Wait {
            keys: self.keys(keys),
            timeout: Some(timeout),
        };
        match self.request(req, Some(timeout))? {
            Response::Ok => Ok(vec![]),
            Response::Timeout(missing) => {
                Ok(missing.into_iter().map(|k| self.unprefix(k)).collect())
            }
            r => Err(Self::unexpected("wait", r)),
        }
    }

    /// The values of all `keys` (in order), waiting up to `timeout` until every one is set. One
    /// round trip; the values together may be at most
    /// [`MAX_VALUE_BYTES`](super::protocol::MAX_VALUE_BYTES).
    pub fn multi_get<K: AsRef<str>>(&self, keys: &[K], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let req = Request::MultiGet {
            keys: self.keys(keys),
            timeout: Some(timeout),
        };
        match self.request(req, Some(timeout))? {
            Response::Values(vs) if vs.len() == keys.len() => Ok(vs),
            Response::Timeout(missing) => Err(self.timed_out("multi_get", timeout, missing)),
            r => Err(Self::unexpected("multi_get", r)),
        }
    }

    /// The values of all `keys` (in order) once every one is set, or the keys still missing when
    /// `timeout` passes first.
    pub(crate) fn multi_get_or_missing<K: AsRef<str>>(
        &self,
        keys: &[K],
        timeout: Duration,
    ) -> Result<std::result::Result<Vec<Vec<u8>>, Vec<String>>> {
        let req = Request::MultiGet {
            keys: self.keys(keys),
            timeout: Some(timeout),
        };
        match self.request(req, Some(timeout))? {
            Response::Values(vs) if vs.len() == keys.len() => Ok(Ok(vs)),
            Response::Timeout(missing) => {
                Ok(Err(missing.into_iter().map(|k| self.unprefix(k)).collect()))
            }
            r => Err(Self::unexpected("multi_get", r)),
        }
    }

    /// Atomically add `delta` to the counter `key` (a missing key counts as 0) and return the new
    /// value. Counters are stored as decimal text, so [`Self::get`] returns e.g. `b"3"`.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let req = Request::Add {
            key: self.key(key),
            delta,
        };
        match self.request(req, None)? {
            Response::Int(n) => Ok(n),
            r => Err(Self::unexpected("add", r)),
        }
    }

    /// Atomically set `key` to `new` if its current value is `expected` (`None`: if the key does
    /// not exist). Returns the value stored after the call — `new` if the swap happened, else
    /// the current value (`None` if the key does not exist).
    pub fn compare_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        let req = Request::CompareSet {
            key: self.key(key),
            expected: expected.map(<[u8]>::to_vec),
            new: new.to_vec(),
        };
        match self.request(req, None)? {
            Response::Maybe(v) => Ok(v),
            r => Err(Self::unexpected("compare_set", r)),
        }
    }

    /// Remove `key`; `true` if it existed.
    pub fn delete(&self, key: &str) -> Result<bool> {
        let req = Request::Delete { key: self.key(key) };
        match self.request(req, None)? {
            Response::Bool(b) => Ok(b),
            r => Err(Self::unexpected("delete", r)),
        }
    }

    /// Number of keys in the whole store (all namespaces).
    pub fn num_keys(&self) -> Result<u64> {
        match self.request(Request::NumKeys, None)? {
            Response::Count(n) => Ok(n),
            r => Err(Self::unexpected("num_keys", r)),
        }
    }

    /// Whether every key in `keys` is set now (no waiting).
    pub fn check<K: AsRef<str>>(&self, keys: &[K]) -> Result<bool> {
        let req = Request::Check {
            keys: self.keys(keys),
        };
        match self.request(req, None)? {
            Response::Bool(b) => Ok(b),
            r => Err(Self::unexpected("check", r)),
        }
    }
}

/// Ranks publish their listening addresses under `{prefix}/addr/{rank}`.
impl Directory for StoreClient {
    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.set(key, value)
    }

    fn get_all(&self, keys: &[String], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        self.multi_get(keys, timeout)
    }

    fn wait_all(&self, keys: &[String], timeout: Duration) -> Result<()> {
        self.wait_timeout(keys, timeout)
    }
}

impl AddressBook for StoreClient {
    fn publish(&self, rank: usize, addr: &str) -> Result<()> {
        self.set(&format!("addr/{rank}"), addr)
    }

    fn lookup(&self, rank: usize, deadline: Instant) -> Result<String> {
        let key = format!("addr/{rank}");
        let left = deadline.saturating_duration_since(Instant::now());
        match self.get_timeout(&key, left) {
            Ok(v) => String::from_utf8(v).map_err(|_| {
                Error::Protocol(format!(
                    "store: the address published by rank {rank} is not UTF-8"
                ))
            }),
            Err(Error::Timeout { after, .. }) => Err(store_timeout(
                "looking up a peer's address in the rendezvous store".into(),
                after,
                format!(
                    " — rank {rank} has not published {:?} in the store at {}; it has not \
                     started, has failed, or joined a different store/namespace",
                    self.key(&key),
                    self.inner.addr
                ),
                vec![rank],
            )),
            Err(e) => Err(e),
        }
    }
}
