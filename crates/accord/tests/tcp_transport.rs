//! The TCP transport over loopback: worlds of threads, each rank with its own transport.

use accord::auth::{self, HandshakeLimits, Role, Token};
use accord::fingerprint::{Fingerprint, OpKind};
use accord::transport::tcp::{MemoryAddressBook, TcpOptions, TcpTransport};
use accord::transport::wire::PROTOCOL;
use accord::transport::{chunk_bytes, AddressBook, Envelope, LinkKind, Transport, WaitError};
use accord::{DataType, Error};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(10);

fn opts(timeout: Duration) -> TcpOptions {
    TcpOptions::loopback(timeout)
}

/// Form a world of `n` ranks as threads sharing one address book.
fn world(n: usize) -> Vec<Arc<TcpTransport>> {
    world_with(n, |_| 1)
}

/// [`world`] where rank `r` opens `lanes(r)` connections to each lower rank.
fn world_with(n: usize, lanes: impl Fn(usize) -> usize) -> Vec<Arc<TcpTransport>> {
    let book = Arc::new(MemoryAddressBook::new());
    let token = Token::new("test-token");
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let book = book.clone();
            let token = token.clone();
            let o = TcpOptions {
                lanes: lanes(rank),
                ..opts(TIMEOUT)
            };
            std::thread::spawn(move || TcpTransport::connect(rank, n, &token, &*book, o))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap().expect("world formed"))
        .collect()
}

fn env(seq: u64, _len: usize) -> Envelope {
    Envelope {
        comm: 1,
        seq,
        fp: fp(),
    }
}

/// The fingerprint every test frame carries (receivers check it against their own call).
fn fp() -> Fingerprint {
    Fingerprint::new(OpKind::P2p, DataType::U8, 0)
}

fn pattern(src: usize, dst: usize, seq: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            ((i as u64).wrapping_mul(2_654_435_761) >> 7) as u8 ^ (src * 16 + dst) as u8 ^ seq as u8
        })
        .collect()
}

/// Take every frame of one message and reassemble it, checking offsets cover it exactly once.
fn recv_message(t: &TcpTransport, src: usize, seq: u64) -> (Vec<u8>, usize) {
    let deadline = Instant::now() + TIMEOUT;
    let first = t
        .mailbox()
        .take(src, 1, seq, &fp(), deadline, 0)
        .expect("first frame");
    let total = first.total_len as usize;
    let mut out = vec![0u8; total];
    let mut covered = vec![false; total];
    let mut got = 0;
    let mut frames = 0;
    let mut frame = Some(first);
    loop {
        let f = match frame.take() {
            Some(f) => f,
            None if got == total => break,
            None => t
                .mailbox()
                .take(src, 1, seq, &fp(), deadline, 0)
                .expect("next frame"),
        };
        frames += 1;
        assert_eq!(f.total_len as usize, total);
        assert!(f.data.len() <= chunk_bytes());
        let off = f.offset as usize;
        for (i, b) in f.data.iter().enumerate() {
            assert!(!covered[off + i], "byte {} delivered twice", off + i);
            covered[off + i] = true;
            out[off + i] = *b;
        }
        got += f.data.len();
        if got == total {
            break;
        }
    }
    (out, frames)
}

/// Messages over several connections per pair arrive whole and in the order they were sent,
/// frame by frame (the executor needs each message's frames in order): large messages are
/// dealt over the lanes, small ones go on the first, and pairs take the lanes their higher
/// rank asked for (here 1, 3 and 4).
#[test]
fn messages_over_several_lanes_arrive_in_order() {
    const SIZES: [usize; 7] = [5 << 20 | 7, 3, 1 << 20, 0, (2 << 20) + 1, 100_000, 3 << 20];
    let ts = world_with(4, |r| [1, 1, 3, 4][r]);
    let handles: Vec<_> = ts
        .iter()
        .cloned()
        .map(|t| {
            std::thread::spawn(move || {
                let (me, n) = (t.rank(), t.size());
                // Two rounds on one sequence number: the mailbox separates messages only by
                // the order of their frames.
                for _ in 0..2 {
                    for (i, &len) in SIZES.iter().enumerate() {
                        for peer in (0..n).filter(|&p| p != me) {
                            t.send(peer, &env(7, len), &pattern(me, peer, i as u64, len))
                                .unwrap();
                        }
                    }
                    for (i, &len) in SIZES.iter().enumerate() {
                        for peer in (0..n).filter(|&p| p != me) {
                            let deadline = Instant::now() + TIMEOUT;
                            let mut got = Vec::new();
                            loop {
                                let f = t.mailbox().take(peer, 1, 7, &fp(), deadline, 0).unwrap();
                                assert_eq!(f.total_len as usize, len, "message {i} from {peer}");
                                assert_eq!(f.offset as usize, got.len(), "frames out of order");
                                got.extend_from_slice(&f.data);
                                if got.len() == len {
                                    break;
                                }
                            }
                            assert!(got == pattern(peer, me, i as u64, len), "message {i}");
                        }
                    }
                }
                t
            })
        })
        .collect();
    let ts: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // A goodbye on every lane: the peer is gone once all of them said it, after the data.
    ts[3]
        .send(2, &env(9, 3 << 20), &pattern(3, 2, 9, 3 << 20))
        .unwrap();
    ts[3].shutdown();
    let (got, _) = recv_message(&ts[2], 3, 9);
    assert!(got == pattern(3, 2, 9, 3 << 20));
    let deadline = Instant::now() + TIMEOUT;
    while !ts[2].mailbox().left(3) {
        assert!(Instant::now() < deadline, "rank 3's goodbye never counted");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A rank that dies in the middle of a message dealt over several lanes is reported lost to
/// its peer, which does not wait for the rest.
#[test]
fn a_rank_dying_during_a_striped_message_is_reported_lost() {
    let ts = world_with(2, |_| 3);
    let sender = ts[1].clone();
    let big = vec![5u8; 64 << 20];
    let t = std::thread::spawn(move || sender.send(0, &env(4, big.len()), &big));
    // Let some frames go, then die without a goodbye.
    let first = ts[0]
        .mailbox()
        .take(1, 1, 4, &fp(), Instant::now() + TIMEOUT, 1 << 20)
        .unwrap();
    assert_eq!(first.offset, 0);
    ts[1].kill_for_test();
    let start = Instant::now();
    let err = loop {
        match ts[0]
            .mailbox()
            .take(1, 1, 4, &fp(), Instant::now() + TIMEOUT, 1 << 20)
        {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, WaitError::Lost { .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(
        t.join().unwrap().is_err(),
        "the sender learns its send failed"
    );
}

#[test]
fn all_to_all_world_sizes_1_to_5() {
    const SIZES: [usize; 4] = [0, 1, 1000, 3_000_000];
    for n in 1..=5 {
        let ts = world(n);
        let handles: Vec<_> = ts
            .iter()
            .cloned()
            .map(|t| {
                std::thread::spawn(move || {
                    let me = t.rank();
                    assert_eq!(t.size(), n);
                    assert_eq!(t.name(), "tcp");
                    assert_eq!(t.link(), LinkKind::Tcp);
                    for (seq, &len) in SIZES.iter().enumerate() {
                        for peer in (0..n).filter(|&p| p != me) {
                            let data = pattern(me, peer, seq as u64, len);
                            t.send(peer, &env(seq as u64, len), &data).unwrap();
                        }
                    }
                    for (seq, &len) in SIZES.iter().enumerate() {
                        for peer in (0..n).filter(|&p| p != me) {
                            let (got, frames) = recv_message(&t, peer, seq as u64);
                            assert_eq!(got.len(), len);
                            assert!(got == pattern(peer, me, seq as u64, len), "bytes differ");
                            assert_eq!(frames, len.div_ceil(chunk_bytes()).max(1));
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        drop(ts);
    }
}

/// Waiting callers read their peer's socket themselves, beside its reader thread: several
/// threads waiting on one connection at once, for messages of every size (frames cut across
/// reads, payloads read straight into their buffers, frames one thread began and another
/// finished), must each get exactly their message.
#[test]
fn callers_reading_one_connection_together_get_exactly_their_messages() {
    const THREADS: u64 = 4;
    const MESSAGES: u64 = 48;
    // 0 B to 1.2 MiB: whole and partial frames, below and above the direct-read size and the
    // chunk size.
    let len = |seq: u64| ((seq * 7919) % 97) as usize * ((seq % 5) as usize * 3_000 + 1);
    let ts = world(2);
    let (a, b) = (ts[0].clone(), ts[1].clone());
    let sender = std::thread::spawn(move || {
        for seq in 0..MESSAGES {
            a.send(1, &env(seq, len(seq)), &pattern(0, 1, seq, len(seq)))
                .unwrap();
        }
    });
    let receivers: Vec<_> = (0..THREADS)
        .map(|k| {
            let b = b.clone();
            std::thread::spawn(move || {
                // Thread k takes messages k, k + THREADS, ... in its own order.
                let mine: Vec<u64> = (k..MESSAGES).step_by(THREADS as usize).collect();
                for &seq in mine.iter().rev() {
                    let (got, _) = recv_message(&b, 0, seq);
                    assert!(got == pattern(0, 1, seq, len(seq)), "message {seq} differs");
                }
            })
        })
        .collect();
    sender.join().unwrap();
    for r in receivers {
        r.join().unwrap();
    }
}

#[test]
fn send_to_self_or_outside_the_world_is_invalid() {
    let ts = world(2);
    let e = ts[0].send(0, &env(0, 1), &[1]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = ts[0].send(5, &env(0, 1), &[1]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

/// A stranger that does not know the token reaches rank 0's listener while the world forms: it
/// is refused (both ends see `Unauthorized`), and the real world still forms and works.
#[test]
fn stranger_with_wrong_token_is_refused_and_world_stays_healthy() {
    let book = Arc::new(MemoryAddressBook::new());
    let token = Token::new("right");
    let spawn = |rank: usize| {
        let book = book.clone();
        let token = token.clone();
        std::thread::spawn(move || TcpTransport::connect(rank, 3, &token, &*book, opts(TIMEOUT)))
    };
    let r0 = spawn(0);
    let addr = book
        .lookup(0, Instant::now() + TIMEOUT)
        .expect("rank 0 publishes");
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    let e = auth::connect(&mut s, &Token::new("wrong"), Role::Peer, "stranger").unwrap_err();
    assert!(matches!(e, Error::Unauthorized(_)), "{e}");
    // Whatever the stranger sends afterwards is never read as an introduction.
    let _ = s.write_all(&[1, 0, 0, 0, 3, 0, 0, 0]);
    let (r1, r2) = (spawn(1), spawn(2));
    let ts: Vec<_> = [r0, r1, r2]
        .into_iter()
        .map(|h| h.join().unwrap().expect("world forms"))
        .collect();
    ts[1].send(0, &env(7, 3), b"abc").unwrap();
    let f = ts[0]
        .mailbox()
        .take(1, 1, 7, &fp(), Instant::now() + TIMEOUT, 0)
        .unwrap();
    assert_eq!(f.data, b"abc");
}

/// Without `ACCORD_HOST` a rank's listener binds the address it publishes, not every
/// interface: published as 127.0.0.2, the same port on 127.0.0.1 refuses connections, and the
/// world forms through the published address.
#[test]
fn listener_binds_the_published_address() {
    let book = Arc::new(MemoryAddressBook::new());
    let token = Token::new("t");
    let published_only = TcpOptions {
        // What `TcpOptions::default()` holds when ACCORD_HOST is unset.
        bind_host: String::new(),
        advertise_host: Some("127.0.0.2".into()),
        ..opts(TIMEOUT)
    };
    let (b0, t0) = (book.clone(), token.clone());
    let r0 = std::thread::spawn(move || TcpTransport::connect(0, 2, &t0, &*b0, published_only));
    let addr = book.lookup(0, Instant::now() + TIMEOUT).unwrap();
    let port: u16 = addr
        .strip_prefix("127.0.0.2:")
        .unwrap_or_else(|| panic!("rank 0 published {addr}"))
        .parse()
        .unwrap();
    let e = TcpStream::connect(("127.0.0.1", port)).expect_err("nothing listens on 127.0.0.1");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    let t1 = TcpTransport::connect(1, 2, &token, &*book, opts(TIMEOUT)).expect("world forms");
    let t0 = r0.join().unwrap().expect("world forms");
    t1.send(0, &env(3, 2), b"hi").unwrap();
    let f = t0
        .mailbox()
        .take(1, 1, 3, &fp(), Instant::now() + TIMEOUT, 0)
        .unwrap();
    assert_eq!(f.data, b"hi");
}

/// Strangers that connect to a forming rank and then trickle one byte every 100 ms or stay
/// silent hold no more than the handshake limit: the ones beyond it are closed at once, the
/// others when the handshake deadline passes, and the real peer, turned away while the limit is
/// reached, retries and gets in. `ACCORD_SOAK=n` opens n times as many strangers.
#[test]
fn strangers_are_closed_by_the_handshake_deadline_and_the_world_forms() {
    let soak: usize = accord::testing::soak();
    let cap = 4;
    let deadline = Duration::from_secs(1);
    let book = Arc::new(MemoryAddressBook::new());
    let token = Token::new("t");
    let limited = TcpOptions {
        handshake: HandshakeLimits {
            max_pending: cap,
            deadline,
        },
        ..opts(TIMEOUT)
    };
    let (b0, t0) = (book.clone(), token.clone());
    let r0 = std::thread::spawn(move || TcpTransport::connect(0, 2, &t0, &*b0, limited));
    let addr = book.lookup(0, Instant::now() + TIMEOUT).unwrap();
    let n = 3 * cap * soak;
    let opened = Instant::now();
    let mut strangers: Vec<(TcpStream, bool, Option<Duration>)> = (0..n)
        .map(|i| {
            let s = TcpStream::connect(&addr).unwrap();
            s.set_nonblocking(true).unwrap();
            (s, i % 3 != 2, None)
        })
        .collect();
    let (b1, t1) = (book.clone(), token.clone());
    let r1 = std::thread::spawn(move || TcpTransport::connect(1, 2, &t1, &*b1, opts(TIMEOUT)));
    while opened.elapsed() < deadline + Duration::from_secs(2) {
        for (s, trickles, closed) in strangers.iter_mut().filter(|s| s.2.is_none()) {
            let mut buf = [0u8; 64];
            let gone = match s.read(&mut buf) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            };
            if gone || (*trickles && s.write_all(&[1]).is_err()) {
                *closed = Some(opened.elapsed());
            }
        }
        if strangers.iter().all(|s| s.2.is_some()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let lived: Vec<Option<Duration>> = strangers.iter().map(|s| s.2).collect();
    assert!(
        lived
            .iter()
            .all(|l| l.is_some_and(|l| l < deadline + Duration::from_millis(700))),
        "strangers closed after (None: still open) {lived:?}"
    );
    let t1 = r1.join().unwrap().expect("world forms");
    let t0 = r0.join().unwrap().expect("world forms");
    t1.send(0, &env(4, 2), b"ok").unwrap();
    let f = t0
        .mailbox()
        .take(1, 1, 4, &fp(), Instant::now() + TIMEOUT, 0)
        .unwrap();
    assert_eq!(f.data, b"ok");
}

/// A rank started with the wrong token cannot join: it gets `Unauthorized`, and the rank it tried
/// to reach times out naming it, quoting the refusal.
#[test]
fn rank_with_wrong_token_fails_clearly() {
    let book = Arc::new(MemoryAddressBook::new());
    let short = Duration::from_secs(2);
    let b0 = book.clone();
    let r0 = std::thread::spawn(move || {
        TcpTransport::connect(0, 2, &Token::new("right"), &*b0, opts(short))
    });
    let e1 = TcpTransport::connect(1, 2, &Token::new("wrong"), &*book, opts(short)).unwrap_err();
    assert!(matches!(e1, Error::Unauthorized(_)), "{e1}");
    let e0 = r0.join().unwrap().unwrap_err();
    match &e0 {
        Error::Timeout {
            waiting_for, hint, ..
        } => {
            assert_eq!(waiting_for, &vec![1]);
            assert!(hint.contains("token"), "{e0}");
        }
        other => panic!("expected a timeout, got {other}"),
    }
}

#[test]
fn world_size_mismatch_is_reported() {
    let book = Arc::new(MemoryAddressBook::new());
    let short = Duration::from_secs(2);
    let token = Token::new("t");
    let (b0, t0) = (book.clone(), token.clone());
    let r0 = std::thread::spawn(move || TcpTransport::connect(0, 2, &t0, &*b0, opts(short)));
    let e1 = TcpTransport::connect(1, 3, &token, &*book, opts(short)).unwrap_err();
    assert!(
        matches!(&e1, Error::InvalidArgument(m) if m.contains("world of 3")),
        "{e1}"
    );
    let e0 = r0.join().unwrap().unwrap_err();
    assert!(
        matches!(&e0, Error::Timeout { waiting_for, .. } if waiting_for == &vec![1]),
        "{e0}"
    );
    assert!(e0.to_string().contains("world of 3"), "{e0}");
}

#[test]
fn timeout_names_the_ranks_that_never_came() {
    let book = Arc::new(MemoryAddressBook::new());
    let short = Duration::from_secs(1);
    let token = Token::new("t");
    let hs: Vec<_> = (0..2)
        .map(|rank| {
            let (b, t) = (book.clone(), token.clone());
            std::thread::spawn(move || TcpTransport::connect(rank, 3, &t, &*b, opts(short)))
        })
        .collect();
    for h in hs {
        let e = h.join().unwrap().unwrap_err();
        assert!(
            matches!(&e, Error::Timeout { waiting_for, .. } if waiting_for == &vec![2]),
            "{e}"
        );
    }
}

/// Ranks 1 and 3 of 4 start; each names exactly the two ranks that never came.
#[test]
fn timeout_names_missing_lower_and_higher_ranks() {
    let book = Arc::new(MemoryAddressBook::new());
    let short = Duration::from_secs(1);
    let token = Token::new("t");
    let hs: Vec<_> = [1, 3]
        .into_iter()
        .map(|rank| {
            let (b, t) = (book.clone(), token.clone());
            std::thread::spawn(move || TcpTransport::connect(rank, 4, &t, &*b, opts(short)))
        })
        .collect();
    for h in hs {
        let e = h.join().unwrap().unwrap_err();
        assert!(
            matches!(&e, Error::Timeout { waiting_for, .. } if waiting_for == &vec![0, 2]),
            "{e}"
        );
    }
}

/// A rank of a release from before the frames' format travelled in the introduction (lanes as
/// a u16, so format 0) or of another format is refused, told why, and named by rank 0.
#[test]
fn an_introduction_from_another_release_is_refused_naming_it() {
    for (format, says) in [
        (0, "runs a release older"),
        (PROTOCOL as u8 + 1, "speaks frame format"),
    ] {
        let book = Arc::new(MemoryAddressBook::new());
        let token = Token::new("t");
        let (b0, t0) = (book.clone(), token.clone());
        let short = Duration::from_secs(2);
        let r0 = std::thread::spawn(move || TcpTransport::connect(0, 2, &t0, &*b0, opts(short)));
        let addr = book.lookup(0, Instant::now() + TIMEOUT).unwrap();
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        auth::connect(&mut s, &token, Role::Peer, "old rank 1").unwrap();
        s.write_all(&[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 1, format])
            .unwrap();
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).unwrap();
        assert_eq!(answer.first(), Some(&1), "introduction refused");
        let why = String::from_utf8_lossy(&answer[3..]).into_owned();
        assert!(
            why.contains(says) && why.contains("same Accord release"),
            "{why}"
        );
        let e = r0.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("same Accord release"), "{e}");
    }
}

/// A world of rank 0 and a rank 1 this test plays by hand over the returned socket, having
/// passed the handshake and the introduction.
fn world_with_a_hand_made_rank_one() -> (TcpStream, Arc<TcpTransport>) {
    let book = Arc::new(MemoryAddressBook::new());
    let token = Token::new("t");
    let (b0, t0) = (book.clone(), token.clone());
    let r0 = std::thread::spawn(move || TcpTransport::connect(0, 2, &t0, &*b0, opts(TIMEOUT)));
    let addr = book.lookup(0, Instant::now() + TIMEOUT).unwrap();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    auth::connect(&mut s, &token, Role::Peer, "hand-made rank 1").unwrap();
    s.write_all(&[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 1, PROTOCOL as u8])
        .unwrap();
    let mut status = [9u8];
    s.read_exact(&mut status).unwrap();
    assert_eq!(status[0], 0, "introduction accepted");
    let t0 = r0
        .join()
        .unwrap()
        .expect("world of one real rank and one hand-made");
    (s, t0)
}

/// A client that completes the handshake as rank 1 and then sends a malformed header: rank 0
/// reports rank 1 lost with the protocol error and keeps running.
#[test]
fn garbage_after_handshake_is_a_protocol_error() {
    let (mut s, t0) = world_with_a_hand_made_rank_one();
    s.write_all(&[0xAB; 72]).unwrap();
    let start = Instant::now();
    match t0
        .mailbox()
        .take(1, 1, 0, &fp(), Instant::now() + TIMEOUT, 0)
    {
        Err(WaitError::Lost { cause }) => {
            assert!(cause.contains("malformed frame"), "{cause}");
            assert!(cause.contains("bad magic"), "{cause}");
        }
        other => panic!("expected the peer to be lost, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(1));
    let e = t0.send(1, &env(0, 1), &[1]).unwrap_err();
    assert!(matches!(e, Error::PeerLost { rank: 1, .. }), "{e}");
    // The connection was shut down: the fake peer sees the end of the stream.
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
}

/// A header that promises more than the limit is refused before anything is allocated.
#[test]
fn oversized_frame_is_refused() {
    let (mut s, t0) = world_with_a_hand_made_rank_one();
    let h = accord::transport::wire::Header {
        kind: accord::transport::wire::FrameKind::Data,
        src: 1,
        chunk_len: u32::MAX,
        env: env(0, 1),
        total_len: u64::MAX,
        offset: 0,
        order: 0,
    }
    .encode();
    s.write_all(&h).unwrap();
    match t0
        .mailbox()
        .take(1, 1, 0, &fp(), Instant::now() + TIMEOUT, 0)
    {
        Err(WaitError::Lost { cause }) => assert!(cause.contains("exceeds the limit"), "{cause}"),
        other => panic!("expected the peer to be lost, got {other:?}"),
    }
}

#[test]
fn killed_peer_is_lost_within_a_second() {
    let ts = world(3);
    ts[2].kill_for_test();
    for t in &ts[..2] {
        let start = Instant::now();
        match t
            .mailbox()
            .take(2, 1, 0, &fp(), Instant::now() + Duration::from_secs(1), 0)
        {
            Err(WaitError::Lost { cause }) => {
                assert!(cause.contains("process exited or was killed"), "{cause}")
            }
            other => panic!("expected rank 2 lost, got {other:?}"),
        }
        assert!(start.elapsed() < Duration::from_secs(1));
        let e = t.send(2, &env(0, 4), &[1, 2, 3, 4]).unwrap_err();
        assert!(matches!(e, Error::PeerLost { rank: 2, .. }), "{e}");
    }
    // The survivors still talk to each other.
    ts[0].send(1, &env(3, 2), &[5, 6]).unwrap();
    let f = ts[1]
        .mailbox()
        .take(0, 1, 3, &fp(), Instant::now() + TIMEOUT, 0)
        .unwrap();
    assert_eq!(f.data, vec![5, 6]);
}

/// A peer that sends its last message and closes cleanly: the message arrives whole, and waiting
/// for more reports that the peer closed its communicator.
#[test]
fn clean_close_delivers_last_messages_then_reports_closed() {
    let mut ts = world(2);
    let last = pattern(1, 0, 9, 2_000_000);
    ts[1].send(0, &env(9, last.len()), &last).unwrap();
    let t1 = ts.pop().unwrap();
    let start = Instant::now();
    drop(t1);
    assert!(start.elapsed() < Duration::from_secs(6));
    let (got, _) = recv_message(&ts[0], 1, 9);
    assert!(got == last, "last message intact");
    match ts[0]
        .mailbox()
        .take(1, 1, 10, &fp(), Instant::now() + Duration::from_secs(1), 0)
    {
        Err(WaitError::Lost { cause }) => {
            assert!(cause.contains("rank 1 closed its communicator"), "{cause}")
        }
        other => panic!("expected rank 1 closed, got {other:?}"),
    }
}

#[test]
fn abort_propagates_to_peers() {
    let ts = world(3);
    ts[0].abort(0, "rank 0 ran out of memory");
    for t in &ts {
        match t
            .mailbox()
            .take(1, 1, 0, &fp(), Instant::now() + Duration::from_secs(1), 0)
        {
            Err(WaitError::Aborted { by, reason }) => {
                assert_eq!(by, 0);
                assert_eq!(reason, "rank 0 ran out of memory");
            }
            other => panic!("expected an abort, got {other:?}"),
        }
    }
}

#[test]
fn shutdown_is_idempotent_and_quick() {
    let ts = world(4);
    let start = Instant::now();
    for t in &ts {
        t.shutdown();
        t.shutdown();
    }
    assert!(start.elapsed() < Duration::from_secs(6));
    let e = ts[0].send(1, &env(0, 1), &[1]).unwrap_err();
    assert!(matches!(e, Error::PeerLost { rank: 1, .. }), "{e}");
}

/// Loopback bandwidth of one direction; run with
/// `cargo test --release --test tcp_transport -- --ignored --nocapture`.
#[test]
#[ignore]
fn loopback_bandwidth() {
    let ts = world(2);
    let data = vec![7u8; 64 << 20];
    let rounds = 16;
    let start = Instant::now();
    let t1 = ts[1].clone();
    let rx = std::thread::spawn(move || {
        let deadline = Instant::now() + TIMEOUT;
        for seq in 0..rounds {
            let mut got = 0;
            while got < 64 << 20 {
                got += t1
                    .mailbox()
                    .take(0, 1, seq, &fp(), deadline, 0)
                    .unwrap()
                    .data
                    .len();
            }
        }
    });
    for seq in 0..rounds {
        ts[0].send(1, &env(seq, data.len()), &data).unwrap();
    }
    rx.join().unwrap();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{:.2} GB/s over loopback",
        (rounds as f64 * data.len() as f64) / secs / 1e9
    );
}

/// Receive the message of `len` bytes from `src` on `seq` into a destination posted for it,
/// saying on `posted` once it is; the bytes, and how many of them were read straight into it.
fn recv_into_posted_then(
    t: &TcpTransport,
    src: usize,
    seq: u64,
    len: usize,
    posted: Option<std::sync::mpsc::Sender<()>>,
) -> (Vec<u8>, usize) {
    let mut dest = vec![0u8; len];
    // Written through this pointer only, as the transport's readers write the rest.
    let at = dest.as_mut_ptr();
    let guard = t.mailbox().post(src, 1, seq, &fp(), at, len);
    if let Some(p) = posted {
        p.send(()).unwrap();
    }
    let deadline = Instant::now() + TIMEOUT;
    let (mut got, mut placed) = (0, 0);
    loop {
        let f = t.mailbox().take(src, 1, seq, &fp(), deadline, len).unwrap();
        assert_eq!((f.total_len as usize, f.offset as usize), (len, got));
        // SAFETY: in bounds (checked above and by the transport); no reader writes this chunk.
        unsafe { std::ptr::copy_nonoverlapping(f.data.as_ptr(), at.add(got), f.data.len()) };
        placed += f.placed;
        got += f.len();
        if got == len {
            break;
        }
    }
    drop(guard);
    (dest, placed)
}

fn recv_into_posted(t: &TcpTransport, src: usize, seq: u64, len: usize) -> (Vec<u8>, usize) {
    recv_into_posted_then(t, src, seq, len, None)
}

/// Frames read straight into posted destinations land where they belong, over one connection
/// and over several lanes, while the next message of the same key (and the same length) is
/// already on its way and a message of another key travels between: every message arrives
/// whole and intact, and a large message sent after its receive was posted is read into the
/// destination (all of it over one connection).
#[test]
fn frames_read_into_posted_destinations_land_in_their_own_message() {
    const SIZES: [usize; 8] = [
        3 << 20,
        3 << 20,
        1 << 20,
        1 << 20,
        100_000,
        5 << 20 | 7,
        40_000,
        0,
    ];
    for lanes in [1, 3] {
        let ts = world_with(2, |_| lanes);
        let (go, went) = std::sync::mpsc::channel::<usize>();
        let sender = {
            let t = ts[1].clone();
            std::thread::spawn(move || {
                // Message i is sent once its receive is posted; an even one's successor right
                // after it, while that receive still runs.
                let mut sent = 0;
                while let Ok(i) = went.recv() {
                    let last = if i % 2 == 0 { i + 1 } else { i };
                    while sent <= last.min(SIZES.len() - 1) {
                        let len = SIZES[sent];
                        t.send(0, &env(7, len), &pattern(1, 0, sent as u64, len))
                            .unwrap();
                        t.send(0, &env(8, 64), &pattern(1, 0, 99, 64)).unwrap();
                        sent += 1;
                    }
                }
            })
        };
        for (i, &len) in SIZES.iter().enumerate() {
            let t = ts[0].clone();
            let (posted, is_posted) = std::sync::mpsc::channel();
            let receiver =
                std::thread::spawn(move || recv_into_posted_then(&t, 1, 7, len, Some(posted)));
            is_posted.recv().unwrap();
            go.send(i).unwrap();
            let (got, placed) = receiver.join().unwrap();
            assert!(
                got == pattern(1, 0, i as u64, len),
                "message {i} over {lanes} lane(s)"
            );
            if i % 2 == 0 && len >= 1 << 20 {
                // Sent after its receive was posted: over one connection every frame is next
                // in order when it comes; over lanes at least the first is (the others are
                // unless a frame sent before the message, the small one, is still on its way
                // when their headers come ahead of the first's).
                match lanes {
                    1 => assert_eq!(placed, len, "message {i}"),
                    _ => assert!(placed > 0, "nothing of message {i} placed"),
                }
            }
        }
        drop(go);
        sender.join().unwrap();
        for _ in 0..SIZES.len() {
            let (small, _) = recv_message(&ts[0], 1, 8);
            assert!(small == pattern(1, 0, 99, 64));
        }
    }
}

/// Over lanes, a message sent after its receive was posted is read into the destination whole,
/// frames whose headers come ahead of the first frame's included: nothing its sender sent
/// before it is still on its way, so the message is the one the receive takes. (A message's last
/// frame alone on its lane could still come first and be buffered; 4 MiB over three lanes puts
/// two frames before it on its lane.) Many times over, as the lanes' readers race.
#[test]
fn lane_frames_ahead_of_the_first_are_read_into_place() {
    let len = 4 << 20;
    let ts = world_with(2, |_| 3);
    for i in 0..20u64 {
        let (t0, t1) = (ts[0].clone(), ts[1].clone());
        let (posted, is_posted) = std::sync::mpsc::channel();
        let seq = 20 + i;
        let receiver =
            std::thread::spawn(move || recv_into_posted_then(&t0, 1, seq, len, Some(posted)));
        is_posted.recv().unwrap();
        t1.send(0, &env(seq, len), &pattern(1, 0, i, len)).unwrap();
        let (got, placed) = receiver.join().unwrap();
        assert!(got == pattern(1, 0, i, len), "message {i}");
        assert_eq!(placed, len, "message {i}: bytes read into place");
    }
}

/// A receive that gives up while a frame is being read into its destination (the sender
/// stopped in the middle of it) withdraws the destination at once; the frame gets a buffer of
/// its own, and once its sender goes on it arrives whole for whoever takes it.
#[test]
fn a_withdrawn_destination_is_left_at_once_and_its_frame_kept() {
    let (mut s, t0) = world_with_a_hand_made_rank_one();
    let len = 256 << 10;
    let body = pattern(1, 0, 3, len);
    let h = accord::transport::wire::Header {
        kind: accord::transport::wire::FrameKind::Data,
        src: 1,
        chunk_len: len as u32,
        env: env(3, len),
        total_len: len as u64,
        offset: 0,
        order: 0,
    }
    .encode();
    // Unlike the frame's bytes everywhere, so that their arrival shows.
    let mut dest: Vec<u8> = body.iter().map(|b| !b).collect();
    let posted = t0.mailbox().post(1, 1, 3, &fp(), dest.as_mut_ptr(), len);
    s.write_all(&h).unwrap();
    s.write_all(&body[..len / 2]).unwrap();
    // The first half lands in the destination.
    let deadline = Instant::now() + TIMEOUT;
    let probe = dest[len / 2 - 1..].as_ptr();
    // SAFETY: in bounds; the reader thread writes this byte, so it is read afresh each time.
    while unsafe { std::ptr::read_volatile(probe) } != body[len / 2 - 1] {
        assert!(
            Instant::now() < deadline,
            "the frame was not read into the destination"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let start = Instant::now();
    drop(posted);
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
    dest.fill(0); // the destination is the caller's again
    s.write_all(&body[len / 2..]).unwrap();
    let f = t0.mailbox().take(1, 1, 3, &fp(), deadline, len).unwrap();
    assert_eq!(f.placed, 0);
    assert!(f.data == body, "the frame arrived whole");
    assert!(
        dest.iter().all(|&b| b == 0),
        "nothing was written after the withdrawal"
    );
    drop(s); // before rank 0 closes, which would wait for its goodbye
}

/// Many messages dealt over four lanes, two keys at once, each received into a posted
/// destination while the next is on its way: every one arrives intact, and the lanes' readers,
/// which claim places in destinations while others deliver frames in order, never wait for
/// each other for good (the whole exchange must end well within its deadline).
#[test]
fn many_messages_over_lanes_into_posted_destinations_never_stall() {
    const MESSAGES: usize = 1500;
    const LEN: usize = 256 << 10;
    let ts = world_with(2, |_| 4);
    let (done, finished) = std::sync::mpsc::channel();
    for seq in [11, 12] {
        let (t0, t1) = (ts[0].clone(), ts[1].clone());
        std::thread::spawn(move || {
            for i in 0..MESSAGES {
                t1.send(0, &env(seq, LEN), &pattern(1, 0, i as u64, LEN))
                    .unwrap();
            }
        });
        let done = done.clone();
        std::thread::spawn(move || {
            for i in 0..MESSAGES {
                let (got, _) = recv_into_posted(&t0, 1, seq, LEN);
                assert!(got == pattern(1, 0, i as u64, LEN), "message {i} of {seq}");
            }
            done.send(()).unwrap();
        });
    }
    for _ in 0..2 {
        finished
            .recv_timeout(Duration::from_secs(60))
            .expect("every message received within a minute");
    }
}

/// A point-to-point `recv` of a large message, waiting before the message comes, has its frames
/// read straight into its buffer as a collective's receive does, and gets the message whole; a
/// small message after it on the same tag is buffered and arrives whole too.
#[test]
fn a_waiting_large_recv_is_read_into_place() {
    let len = 1usize << 20; // u32s: 4 MiB
    let sent: Vec<u32> = (0..len as u32)
        .map(|x| x.wrapping_mul(2_654_435_761))
        .collect();
    for lanes in [1, 3] {
        let ts = world_with(2, |_| lanes);
        let receiver = ts[0].clone();
        let transports = ts.into_iter().map(|t| t as Arc<dyn Transport>).collect();
        let whole = accord::testing::run_world_on(transports, TIMEOUT, |comm| {
            if comm.rank() == 1 {
                std::thread::sleep(Duration::from_millis(100)); // rank 0 waits first
                comm.send(&sent[..], 0, 4).unwrap();
                comm.send(&[5u32; 16][..], 0, 4).unwrap();
                return true;
            }
            let (mut big, mut small) = (vec![0u32; len], [0u32; 16]);
            comm.recv(&mut big[..], 1, 4).unwrap();
            comm.recv(&mut small[..], 1, 4).unwrap();
            big == sent && small == [5; 16]
        });
        assert!(whole.iter().all(|&w| w), "{lanes} lane(s)");
        let placed = receiver.mailbox().placed_bytes() as usize;
        // Over one connection every frame is next in order when it comes, over lanes every
        // frame's message begins with the frame due next: all of it, unless the receive posted
        // late (100 ms late: half of it is still far more than any other way).
        assert!(
            placed >= 2 * len,
            "{placed} bytes placed over {lanes} lane(s)"
        );
    }
}
