use super::*;
use crate::rendezvous::StoreServer;
use std::io::Seek;

const T: Duration = Duration::from_secs(10);

fn store(token: &str) -> (StoreServer, String) {
    let s = StoreServer::bind("127.0.0.1:0", Token::new(token)).unwrap();
    let addr = s.addr().to_string();
    (s, addr)
}

fn client(addr: &str, token: &str) -> StoreClient {
    StoreClient::connect(addr, &Token::new(token), T).unwrap()
}

/// A file holding `text`, as an owned descriptor.
fn file_with(text: &str) -> OwnedFd {
    let mut f = tempfile_in_tmp();
    f.write_all(text.as_bytes()).unwrap();
    f.rewind().unwrap();
    f.into()
}

fn tempfile_in_tmp() -> std::fs::File {
    let path = std::env::temp_dir().join(format!(
        "accord-fdpass-{}-{:x}",
        std::process::id(),
        u64::from_le_bytes(crate::auth::random_bytes::<8>())
    ));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f
}

/// The file's text from its start (peers share one file offset, so read at an offset).
fn read_all(fd: OwnedFd) -> String {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::from(fd);
    let mut buf = vec![0u8; 64];
    let n = f.read_at(&mut buf, 0).unwrap();
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

#[test]
fn descriptors_reach_every_local_rank_in_order() {
    let (_server, addr) = store("job");
    let local = [0usize, 1, 2];
    let out: Vec<Vec<(usize, String, u8)>> = std::thread::scope(|s| {
        let hs: Vec<_> = local
            .iter()
            .map(|&me| {
                let addr = addr.clone();
                s.spawn(move || {
                    let c = client(&addr, "job");
                    let mesh =
                        LocalMesh::connect(me, &local, &c, "t1", &Token::new("job"), T, "test")
                            .unwrap();
                    let mut seen = Vec::new();
                    for step in 0..3u64 {
                        let mut payload = [0u8; PAYLOAD];
                        payload[0] = me as u8 * 10 + step as u8;
                        let fd = file_with(&format!("rank {me} step {step}"));
                        let got = mesh.exchange(step, &payload, Some(&fd), T).unwrap();
                        for (r, m) in got {
                            let text = read_all(m.fd.expect("a descriptor"));
                            seen.push((r, text, m.payload[0]));
                        }
                    }
                    seen
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (me, seen) in out.iter().enumerate() {
        assert_eq!(seen.len(), 6, "rank {me}: {seen:?}");
        for (i, (r, text, p)) in seen.iter().enumerate() {
            let step = i / 2;
            assert_ne!(*r, me);
            assert_eq!(text, &format!("rank {r} step {step}"));
            assert_eq!(*p as usize, r * 10 + step);
        }
    }
}

#[test]
fn a_wrong_token_is_refused_and_the_waiting_rank_names_who_never_came() {
    let (_server, addr) = store("job");
    let local = [0usize, 1];
    let (r0, r1) = std::thread::scope(|s| {
        let a0 = addr.clone();
        let h0 = s.spawn(move || {
            let c = client(&a0, "job");
            // Rank 0 proves the wrong token to rank 1's socket.
            LocalMesh::connect(0, &local, &c, "t2", &Token::new("intruder"), T, "test").err()
        });
        let a1 = addr.clone();
        let h1 = s.spawn(move || {
            let c = client(&a1, "job");
            let short = Duration::from_millis(800);
            LocalMesh::connect(1, &local, &c, "t2", &Token::new("job"), short, "test").err()
        });
        (h0.join().unwrap(), h1.join().unwrap())
    });
    let e0 = r0.expect("the wrong token was accepted");
    assert!(matches!(e0, Error::Unauthorized(_)), "{e0}");
    match r1.expect("rank 1 accepted a stranger") {
        Error::Timeout { waiting_for, .. } => assert_eq!(waiting_for, vec![0]),
        e => panic!("expected a timeout naming rank 0, got {e}"),
    }
}

#[test]
fn a_peer_that_never_sends_is_named() {
    let (_server, addr) = store("job");
    let local = [0usize, 1];
    std::thread::scope(|s| {
        let (a0, a1) = (addr.clone(), addr.clone());
        let h0 = s.spawn(move || {
            let c = client(&a0, "job");
            let m = LocalMesh::connect(0, &local, &c, "t3", &Token::new("job"), T, "test").unwrap();
            m.exchange(0, &[0; PAYLOAD], None, Duration::from_millis(300))
                .map(|_| ())
        });
        let h1 = s.spawn(move || {
            let c = client(&a1, "job");
            let m = LocalMesh::connect(1, &local, &c, "t3", &Token::new("job"), T, "test").unwrap();
            std::thread::sleep(Duration::from_millis(900));
            drop(m);
        });
        let e = h0
            .join()
            .unwrap()
            .expect_err("an exchange with a silent peer succeeded");
        h1.join().unwrap();
        match e {
            Error::Timeout { waiting_for, .. } => assert_eq!(waiting_for, vec![1]),
            e => panic!("expected a timeout naming rank 1, got {e}"),
        }
    });
}

#[test]
fn steps_out_of_order_are_an_error_not_a_mixup() {
    let (_server, addr) = store("job");
    let local = [0usize, 1];
    let errs: Vec<Option<Error>> = std::thread::scope(|s| {
        let hs: Vec<_> = [0usize, 1]
            .into_iter()
            .map(|me| {
                let a = addr.clone();
                s.spawn(move || {
                    let c = client(&a, "job");
                    let m = LocalMesh::connect(me, &local, &c, "t4", &Token::new("job"), T, "test")
                        .unwrap();
                    m.exchange(me as u64, &[0; PAYLOAD], None, T).err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in errs {
        let e = e.expect("mismatched steps were accepted");
        assert!(e.to_string().contains("different orders"), "{e}");
    }
}
