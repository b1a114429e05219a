//! Writing one frame, header and payload, to a connection: all of it, without SIGPIPE, and
//! noting a wait only where the socket cannot take the frame at once.

use socket2::Socket;
use std::io::{self, IoSlice};

/// Write a header and its payload, all of it, without raising SIGPIPE on a closed connection.
pub(super) fn write_frame(s: &Socket, hdr: &[u8], body: &[u8]) -> io::Result<()> {
    write_frame_noting(s, hdr, body, || ())
}

/// [`write_frame`], trying first without waiting: where the socket cannot take the whole frame
/// at once, `blocked()` is called before the write waits, and what it returns is held until the
/// frame is written (a record that this rank waits for the peer to read).
pub(super) fn write_frame_noting<G>(
    s: &Socket,
    hdr: &[u8],
    body: &[u8],
    blocked: impl FnOnce() -> G,
) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    const FLAGS: libc::c_int = libc::MSG_NOSIGNAL;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    const FLAGS: libc::c_int = 0;
    let (mut blocked, mut _held) = (Some(blocked), None);
    let (mut h, mut b) = (0, 0);
    while h < hdr.len() || b < body.len() {
        let bufs = [IoSlice::new(&hdr[h..]), IoSlice::new(&body[b..])];
        let bufs: &[IoSlice<'_>] = if h < hdr.len() { &bufs } else { &bufs[1..] };
        let flags = match blocked.is_some() {
            true => FLAGS | libc::MSG_DONTWAIT,
            false => FLAGS,
        };
        match s.send_vectored_with_flags(bufs, flags) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                let in_hdr = n.min(hdr.len() - h);
                h += in_hdr;
                b += n - in_hdr;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && blocked.is_some() => {}
            Err(e) => return Err(e),
        }
        // Whatever is left now waits for the peer to read.
        if let Some(note) = blocked.take().filter(|_| h < hdr.len() || b < body.len()) {
            _held = Some(note());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    /// A frame the socket takes at once is not noted as a wait; one that fills the socket's
    /// buffers while the peer does not read is, before the write waits, and arrives whole.
    #[test]
    fn only_a_write_that_must_wait_is_noted_as_blocked() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = Socket::from(TcpStream::connect(l.local_addr().unwrap()).unwrap());
        let (mut b, _) = l.accept().unwrap();
        a.set_send_buffer_size(64 << 10).unwrap();
        let noted = std::cell::Cell::new(0);
        write_frame_noting(&a, &[1; 8], &[2; 64], || noted.set(noted.get() + 1)).unwrap();
        assert_eq!(noted.get(), 0);
        let body: Vec<u8> = (0..32 << 20).map(|i| (i % 251) as u8).collect();
        let len = 8 + 64 + 8 + body.len();
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            let mut got = vec![0; len];
            b.read_exact(&mut got).unwrap();
            got
        });
        write_frame_noting(&a, &[3; 8], &body, || noted.set(noted.get() + 1)).unwrap();
        assert_eq!(noted.get(), 1);
        let got = reader.join().unwrap();
        assert_eq!(
            (&got[..8], &got[8..72], &got[72..80]),
            (&[1; 8][..], &[2; 64][..], &[3; 8][..])
        );
        assert!(got[80..] == body[..]);
    }
}
