//! Forming the mesh: listening on the published address, dialling lower ranks, the
//! introduction that follows the token handshake (see the [parent module](super)), the options
//! every connection gets, and how long waits on the formed mesh poll.

use super::*;
use crate::transport::wire::PROTOCOL;

/// Listen on `bind_host` if given, else on the advertised address, as the
/// [module documentation](self) describes.
pub(super) fn listen_for(bind_host: &str, advertised: &str) -> Result<TcpListener> {
    if !bind_host.is_empty() {
        return listen(bind_host);
    }
    let every_interface = |ip: &IpAddr| {
        if ip.is_ipv6() {
            "::"
        } else {
            "0.0.0.0"
        }
    };
    let addr = match (advertised, 0).to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        _ => {
            tracing::warn!(
                "the published host {advertised:?} does not resolve on this machine; \
                 listening on every interface"
            );
            return listen("0.0.0.0");
        }
    };
    if addr.ip().is_loopback() && advertised.parse::<IpAddr>().is_err() {
        tracing::debug!(
            "the published host name {advertised:?} resolves here to {}, which other machines \
             cannot reach; listening on every interface",
            addr.ip()
        );
        return listen(every_interface(&addr.ip()));
    }
    match bind(addr) {
        Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {
            tracing::warn!(
                "the published address {advertised} is not an interface of this machine \
                 (behind NAT?); listening on every interface"
            );
            listen(every_interface(&addr.ip()))
        }
        bound => bound.map_err(|e| Error::io(format!("listening on {advertised}"), e)),
    }
}

fn listen(host: &str) -> Result<TcpListener> {
    let addr = (host, 0)
        .to_socket_addrs()
        .map_err(|e| Error::io(format!("resolving the bind address {host:?}"), e))?
        .next()
        .ok_or_else(|| Error::invalid(format!("bind address {host:?} resolves to nothing")))?;
    bind(addr).map_err(|e| Error::io(format!("listening on {host}"), e))
}

/// A non-blocking listener on `addr`.
fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    let _ = s.set_reuse_address(true);
    // Accepted connections inherit the listener's buffer sizes.
    tune(&s);
    s.bind(&SockAddr::from(addr))?;
    s.listen(1024)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Open lane `lane` of `lanes` to `peer` (a lower rank): connect, authenticate and introduce
/// this rank.
pub(super) fn dial(
    rank: usize,
    size: usize,
    (peer, lane, lanes): (usize, usize, usize),
    token: &Token,
    book: &dyn AddressBook,
    deadline: Instant,
    cancel: &AtomicBool,
) -> Result<TcpStream> {
    let start = Instant::now();
    let timeout = |hint: String| Error::Timeout {
        op: format!("forming the TCP mesh (rank {rank} of {size})"),
        seq: 0,
        comm: "world".into(),
        waiting_for: vec![peer],
        after: start.elapsed(),
        hint,
    };
    let addr = loop {
        let until = deadline.min(Instant::now() + LOOKUP_SLICE);
        match book.lookup(peer, until) {
            Ok(a) => break a,
            Err(Error::Timeout { .. }) if until < deadline && !cancel.load(Ordering::Relaxed) => {}
            Err(e @ Error::Timeout { .. }) => {
                return Err(timeout(format!(
                    "; rank {peer}'s address was never published ({e})"
                )))
            }
            Err(e) => return Err(e),
        }
    };
    let what = match lanes {
        1 => format!("connection from rank {rank} to rank {peer} at {addr}"),
        _ => format!("connection {lane} of {lanes} from rank {rank} to rank {peer} at {addr}"),
    };
    let mut backoff = Duration::from_millis(5);
    let mut last_err: Option<io::Error> = None;
    // A rank publishes its address only once its listener is bound, so a published address
    // that keeps refusing connections belongs to a process that has ended since.
    let mut refused_since: Option<Instant> = None;
    let setup = |e| Error::io(format!("{what}: setting socket options"), e);
    let mut stream = loop {
        let now = Instant::now();
        if now >= deadline || cancel.load(Ordering::Relaxed) {
            let why = last_err.map(|e| e.to_string()).unwrap_or_default();
            return Err(timeout(format!("; could not connect to {addr}: {why}")));
        }
        let e = match try_connect(&addr, deadline - now) {
            Ok(mut s) => {
                let hs = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(100));
                s.set_read_timeout(Some(hs)).map_err(setup)?;
                s.set_write_timeout(Some(hs)).map_err(setup)?;
                match auth::connect(&mut s, token, Role::Peer, &what) {
                    Ok(()) => break s,
                    // Closed before the handshake was done: the peer's listener had as many
                    // connections in the handshake as it allows. Try again.
                    Err(Error::Io { kind, message, .. })
                        if matches!(
                            kind,
                            io::ErrorKind::UnexpectedEof
                                | io::ErrorKind::ConnectionReset
                                | io::ErrorKind::ConnectionAborted
                                | io::ErrorKind::BrokenPipe
                        ) =>
                    {
                        io::Error::new(kind, format!("closed during the handshake: {message}"))
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => {
                if e.kind() != io::ErrorKind::ConnectionRefused {
                    refused_since = None;
                } else if refused_since.get_or_insert(now).elapsed() >= REFUSED_MEANS_GONE {
                    return Err(Error::PeerLost {
                        rank: peer,
                        cause: format!(
                            "its listener at {addr} has refused connections for {:.0?} after \
                             it registered: the process has ended (or a firewall rejects the \
                             port)",
                            REFUSED_MEANS_GONE
                        ),
                    });
                }
                if !matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::AddrNotAvailable
                ) && e.raw_os_error() != Some(libc::EHOSTUNREACH)
                    && e.raw_os_error() != Some(libc::ENETUNREACH)
                {
                    return Err(Error::io(format!("{what}: connecting"), e));
                }
                e
            }
        };
        last_err = Some(e);
        std::thread::sleep(backoff.min(deadline.saturating_duration_since(now)));
        backoff = (backoff * 2).min(Duration::from_millis(200));
    };
    let mut hello = [0u8; HELLO_LEN];
    hello[..4].copy_from_slice(&(rank as u32).to_le_bytes());
    hello[4..8].copy_from_slice(&(size as u32).to_le_bytes());
    hello[8..10].copy_from_slice(&(lane as u16).to_le_bytes());
    hello[10] = lanes as u8;
    hello[11] = PROTOCOL as u8;
    stream
        .write_all(&hello)
        .map_err(|e| Error::io(format!("{what}: introducing this rank"), e))?;
    let mut status = [0u8; 1];
    read_or_timeout(&mut stream, &mut status, &what)?;
    if status[0] != 0 {
        let mut len = [0u8; 2];
        read_or_timeout(&mut stream, &mut len, &what)?;
        let mut reason = vec![0u8; u16::from_le_bytes(len) as usize];
        read_or_timeout(&mut stream, &mut reason, &what)?;
        let reason = String::from_utf8_lossy(&reason);
        // A release from before the format travelled here reads it as part of the lane count.
        let older = reason.contains(&format!(
            "of {}; at most",
            u16::from_le_bytes([hello[10], hello[11]])
        ));
        let hint = match older {
            true => format!(
                " (rank {peer} reads this introduction as a release older than this rank's \
                 does: every rank must run the same Accord release)"
            ),
            false => String::new(),
        };
        return Err(Error::invalid(format!(
            "rank {peer} refused the connection from rank {rank}: {reason}{hint}"
        )));
    }
    Ok(stream)
}

fn read_or_timeout(s: &mut TcpStream, buf: &mut [u8], what: &str) -> Result<()> {
    s.read_exact(buf).map_err(|e| {
        if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            Error::Protocol(format!(
                "{what}: no answer to this rank's introduction in time"
            ))
        } else {
            Error::io(
                format!("{what}: waiting for the answer to the introduction"),
                e,
            )
        }
    })
}

fn try_connect(addr: &str, within: Duration) -> io::Result<TcpStream> {
    let mut last = None;
    for a in addr.to_socket_addrs()? {
        let s = Socket::new(Domain::for_address(a), Type::STREAM, Some(Protocol::TCP))?;
        tune(&s);
        match s.connect_timeout(&SockAddr::from(a), within.max(Duration::from_millis(1))) {
            Ok(()) => return Ok(s.into()),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            "address resolves to nothing",
        )
    }))
}

/// The introduction: rank u32 | world size u32 | lane u16 | lanes u8 | frame format u8
/// ([`PROTOCOL`]; releases before it sent lanes as a u16, so theirs reads 0).
const HELLO_LEN: usize = 12;
const _: () = assert!(PROTOCOL < 256 && MAX_LANES < 256);

/// Everything the thread that reads an authenticated connection's introduction needs.
pub(super) struct AcceptCtx {
    pub(super) rank: usize,
    pub(super) size: usize,
    /// Per peer, which of its lanes have connected (empty: none yet).
    pub(super) claimed: Arc<Mutex<Vec<Vec<bool>>>>,
    pub(super) deadline: Instant,
    pub(super) tx: mpsc::Sender<Arrival>,
}

impl AcceptCtx {
    pub(super) fn run(self, stream: TcpStream, from: SocketAddr) {
        let arrival = match self.handshake(stream, from) {
            Ok((peer, lane, lanes, s)) => Arrival::Peer(peer, lane, lanes, s),
            Err(e) => Arrival::Refused(format!("from {from}: {e}")),
        };
        let _ = self.tx.send(arrival);
    }

    fn handshake(
        &self,
        mut s: TcpStream,
        from: SocketAddr,
    ) -> Result<(usize, usize, usize, TcpStream)> {
        let what = format!("connection to rank {} from {from}", self.rank);
        let setup = |e| Error::io(format!("{what}: setting socket options"), e);
        let hs = self
            .deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        s.set_read_timeout(Some(hs)).map_err(setup)?;
        s.set_write_timeout(Some(hs)).map_err(setup)?;
        tune(&Socket::from(s.try_clone().map_err(setup)?));
        // The gate has authenticated it.
        let mut hello = [0u8; HELLO_LEN];
        s.read_exact(&mut hello)
            .map_err(|e| Error::io(format!("{what}: reading the peer's introduction"), e))?;
        let peer = u32::from_le_bytes(hello[..4].try_into().unwrap()) as usize;
        let their_size = u32::from_le_bytes(hello[4..8].try_into().unwrap()) as usize;
        let lane = u16::from_le_bytes(hello[8..10].try_into().unwrap()) as usize;
        let lanes = hello[10] as usize;
        let format = hello[11] as u32;
        let verdict = if format != PROTOCOL {
            Err(match format {
                0 => format!(
                    "rank {peer} runs a release older than rank {}'s, whose frames are format \
                     {PROTOCOL}: every rank must run the same Accord release",
                    self.rank
                ),
                f => format!(
                    "rank {peer} speaks frame format {f} and rank {} format {PROTOCOL}: every \
                     rank must run the same Accord release",
                    self.rank
                ),
            })
        } else if their_size != self.size {
            Err(format!(
                "rank {peer} was started with a world of {their_size} ranks but rank {} with {}; \
                 every rank must be given the same world size",
                self.rank, self.size
            ))
        } else if peer <= self.rank || peer >= self.size {
            Err(format!(
                "a connection claiming rank {peer} reached rank {}, which only accepts ranks {}..{}",
                self.rank,
                self.rank + 1,
                self.size
            ))
        } else if lanes == 0 || lanes > MAX_LANES || lane >= lanes {
            Err(format!(
                "rank {peer} asked for connection {lane} of {lanes}; at most {MAX_LANES} are \
                 allowed"
            ))
        } else {
            let mut claimed = self.claimed.lock().unwrap();
            let got = &mut claimed[peer];
            if got.is_empty() {
                got.resize(lanes, false);
            }
            if got.len() != lanes {
                Err(format!(
                    "rank {peer} asked for {lanes} connections after asking for {}; were two \
                     processes started with rank {peer}?",
                    got.len()
                ))
            } else if std::mem::replace(&mut got[lane], true) {
                Err(format!(
                    "rank {peer} is already connected to rank {}; were two processes started \
                     with rank {peer}?",
                    self.rank
                ))
            } else {
                Ok(())
            }
        };
        match verdict {
            Ok(()) => {
                s.write_all(&[0])
                    .map_err(|e| Error::io(format!("{what}: answering the introduction"), e))?;
                Ok((peer, lane, lanes, s))
            }
            Err(why) => {
                let bytes = &why.as_bytes()[..why.len().min(u16::MAX as usize)];
                let mut msg = vec![1u8];
                msg.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
                msg.extend_from_slice(bytes);
                let _ = s.write_all(&msg);
                Err(Error::invalid(why))
            }
        }
    }
}

/// How long waits poll for frames before sleeping (`ACCORD_TCP_POLL_US`): not at all when this
/// host's ranks outnumber its CPUs, where a polling waiter takes the CPU from the threads that
/// receive and send (four ranks on two CPUs were 1.5x slower polling); and whether waits for
/// large messages poll too: where this host has two CPUs per rank and this rank may use two,
/// one for the waiting thread and one for its reader. Ranks on this host are those whose
/// connection's two ends share an address.
pub(super) fn poll_for<'a>(
    streams: impl Iterator<Item = &'a TcpStream>,
) -> (std::time::Duration, bool) {
    let local = 1 + streams
        .filter(|s| match (s.local_addr(), s.peer_addr()) {
            (Ok(a), Ok(b)) => a.ip() == b.ip(),
            _ => false,
        })
        .count();
    let cpus = crate::transport::cpus::usable_here();
    match local > cpus {
        true => (std::time::Duration::ZERO, false),
        // A rank bound to one CPU shares it with its reader thread.
        false => {
            let own = crate::transport::cpus::allowed().len() >= 2;
            (crate::config::get().tcp_poll, own && 2 * local <= cpus)
        }
    }
}

/// `SO_BUSY_POLL` of `poll`: a read that finds the socket empty polls the network device's
/// receive queue itself (drivers with NAPI) rather than waiting for the device's interrupt,
/// which NICs delay to batch packets. A call waiting for a small message reads its socket
/// without blocking (module `reader`), so each of those reads polls the device once. Loopback
/// and veth pairs without NAPI have no queue to poll: there it changes nothing.
pub(super) fn busy_poll(s: &SockRef<'_>, poll: Duration) -> Result<()> {
    use std::os::fd::AsRawFd;
    let us = poll.as_micros().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: a valid descriptor and a c_int option of the size passed.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BUSY_POLL,
            (&us as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    let why = if e.raw_os_error() == Some(libc::EPERM) {
        let system = std::fs::read_to_string("/proc/sys/net/core/busy_read")
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        format!(
            "{e}: this kernel lets only processes with CAP_NET_ADMIN raise it above \
             net.core.busy_read ({system} us here); run with that capability, set the sysctl \
             on every host instead, or unset the variable"
        )
    } else {
        e.to_string()
    };
    Err(Error::invalid(format!(
        "ACCORD_TCP_BUSY_POLL_US={us}: setting SO_BUSY_POLL failed: {why}"
    )))
}

/// The options every connection gets (and the listener, whose connections inherit them).
pub(super) fn tune(s: &Socket) {
    if let Some(poll) = crate::config::get().tcp_busy_poll {
        // The listener's setting was checked: this one fails only as that one would have.
        if let Err(e) = busy_poll(&SockRef::from(s), poll) {
            tracing::debug!("{e}");
        }
    }
    let _ = s.set_nodelay(true);
    let _ = s.set_send_buffer_size(SOCKET_BUFFER_BYTES);
    let _ = s.set_recv_buffer_size(SOCKET_BUFFER_BYTES);
    let ka = TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10));
    let _ = s.set_tcp_keepalive(&ka);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_host_rules() {
        let mut o = TcpOptions::loopback(Duration::from_secs(1));
        assert_eq!(o.advertised_host(), "127.0.0.1");
        o.advertise_host = Some("node7.cluster".into());
        assert_eq!(o.advertised_host(), "node7.cluster");
        o.advertise_host = None;
        o.bind_host = "0.0.0.0".into();
        let ip: IpAddr = o.advertised_host().parse().expect("an IP address");
        assert!(ip.is_ipv4() && !ip.is_unspecified());
        o.bind_host = "myhost".into();
        assert_eq!(o.advertised_host(), "myhost");
    }

    #[test]
    fn listener_binds_the_published_address_unless_told_otherwise() {
        let bound = |bind: &str, published: &str| {
            listen_for(bind, published)
                .unwrap()
                .local_addr()
                .unwrap()
                .ip()
                .to_string()
        };
        assert_eq!(bound("", "127.0.0.1"), "127.0.0.1");
        assert_eq!(bound("", "127.0.0.2"), "127.0.0.2");
        // Not an address of this machine (a documentation range): every interface.
        assert_eq!(bound("", "192.0.2.1"), "0.0.0.0");
        // A name that resolves here to loopback may resolve elsewhere to this machine.
        let ip: IpAddr = bound("", "localhost").parse().unwrap();
        assert!(ip.is_unspecified(), "{ip}");
        assert_eq!(bound("0.0.0.0", "127.0.0.1"), "0.0.0.0");
        assert_eq!(bound("127.0.0.3", "10.1.2.3"), "127.0.0.3");
    }

    #[test]
    fn addresses_are_formatted_for_connecting() {
        assert_eq!(host_port("10.0.0.5", 41234), "10.0.0.5:41234");
        assert_eq!(host_port("::1", 80), "[::1]:80");
        assert_eq!(host_port("node7", 80), "node7:80");
    }

    #[test]
    fn busy_polling_is_set_or_refused_naming_the_variable() {
        use std::os::fd::AsRawFd;
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        match busy_poll(&SockRef::from(&s), Duration::from_micros(50)) {
            Ok(()) => {
                let (mut v, mut len) = (0 as libc::c_int, 4 as libc::socklen_t);
                // SAFETY: a valid descriptor, a c_int and its size.
                let r = unsafe {
                    libc::getsockopt(
                        s.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_BUSY_POLL,
                        (&mut v as *mut libc::c_int).cast(),
                        &mut len,
                    )
                };
                assert_eq!((r, v), (0, 50), "the socket busy-polls 50 us");
            }
            // Refused (without CAP_NET_ADMIN on some kernels, or without busy polling built
            // in): the error names the variable, and the capability where that is the cause.
            Err(e) => {
                let m = e.to_string();
                assert!(m.contains("ACCORD_TCP_BUSY_POLL_US=50"), "{m}");
                let eperm = io::Error::from_raw_os_error(libc::EPERM).to_string();
                assert!(!m.contains(&eperm) || m.contains("CAP_NET_ADMIN"), "{m}");
            }
        }
    }

    #[test]
    fn bad_arguments_are_refused_before_listening() {
        let book = MemoryAddressBook::new();
        let t = Token::new("t");
        let o = TcpOptions::loopback(Duration::from_secs(1));
        assert!(matches!(
            TcpTransport::connect(2, 2, &t, &book, o.clone()),
            Err(Error::InvalidArgument(_))
        ));
        let zero = TcpOptions {
            timeout: Duration::ZERO,
            ..o
        };
        assert!(matches!(
            TcpTransport::connect(0, 1, &t, &book, zero),
            Err(Error::InvalidArgument(_))
        ));
    }
}
