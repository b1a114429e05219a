//! The reader thread of one peer's connection: it drains the socket into the [`Mailbox`]
//! whatever the application does, answers and forwards control frames, and reports the peer
//! lost when the connection ends or carries malformed bytes (see the [parent module](super)).

use super::*;

/// Everything a reader thread needs.
pub(super) struct ReaderCtx {
    pub(super) peer: usize,
    /// World size: bounds the rank a forwarded abort notice may name.
    pub(super) size: usize,
    pub(super) mailbox: Arc<Mailbox>,
    pub(super) closing: Arc<AtomicBool>,
    pub(super) ctl: TcpStream,
    /// Status queries go to the responder thread.
    pub(super) queries: mpsc::SyncSender<Query>,
}

impl ReaderCtx {
    pub(super) fn run(self, stream: TcpStream) {
        let mut r = io::BufReader::with_capacity(READ_BUFFER_BYTES, stream);
        let peer = self.peer;
        let ended = |why: String| {
            if self.closing.load(Ordering::SeqCst) {
                "this rank's TCP transport was shut down".to_string()
            } else {
                format!("connection closed (process exited or was killed): {why}")
            }
        };
        loop {
            let mut hb = [0u8; HEADER_LEN];
            match read_header(&mut r, &mut hb) {
                Ok(true) => {}
                Ok(false) => {
                    self.mailbox
                        .peer_lost(peer, ended(format!("rank {peer} closed without a goodbye")));
                    break;
                }
                Err(e) => {
                    self.mailbox.peer_lost(peer, ended(e.to_string()));
                    break;
                }
            }
            let h = match Header::decode(&hb, peer as u32) {
                Ok(h) => h,
                Err(e) => {
                    if let Some(len) = wire::unknown_kind_len(&hb, peer as u32) {
                        // A control frame of a later version: skip it.
                        let len = len as u64;
                        let skipped = io::copy(&mut (&mut r).take(len), &mut io::sink());
                        if !matches!(skipped, Ok(n) if n == len) {
                            self.mailbox
                                .peer_lost(peer, ended("in the middle of a frame".into()));
                            break;
                        }
                        tracing::debug!(peer, kind = hb[4], "skipped a frame of an unknown kind");
                        continue;
                    }
                    tracing::warn!(peer, "closing the connection: {e}");
                    self.mailbox.peer_lost(peer, e.to_string());
                    break;
                }
            };
            // `decode` bounded chunk_len by the frame kind's limit.
            let mut data = vec![0u8; h.chunk_len as usize];
            if let Err(e) = r.read_exact(&mut data) {
                self.mailbox
                    .peer_lost(peer, ended(format!("in the middle of a frame ({e})")));
                break;
            }
            match h.kind {
                FrameKind::Data => self.mailbox.deliver(
                    peer,
                    Frame {
                        env: h.env,
                        total_len: h.total_len,
                        offset: h.offset,
                        data,
                    },
                ),
                FrameKind::Abort => {
                    let (by, reason) = match data.split_first_chunk::<4>() {
                        Some((by, text)) => (u32::from_le_bytes(*by) as usize, text),
                        None => (peer, &data[..]),
                    };
                    // A forwarded notice names the rank that failed first; a rank number
                    // outside the world is the sender's own failure.
                    let by = if by < self.size { by } else { peer };
                    self.mailbox
                        .abort(by, String::from_utf8_lossy(reason).into_owned());
                }
                FrameKind::Bye => {
                    self.mailbox
                        .peer_lost(peer, format!("rank {peer} closed its communicator"));
                    break;
                }
                FrameKind::Query => {
                    if let Ok(nonce) = <[u8; QUERY_LEN]>::try_from(&data[..]) {
                        // Beyond the bound (a peer that floods queries), queries go unanswered.
                        let _ = self.queries.try_send((peer, u64::from_le_bytes(nonce)));
                    }
                }
                FrameKind::Status => match waits::decode_status(&data, self.size) {
                    Some((nonce, w)) => self.mailbox.waits().answer(peer, nonce, w),
                    None => {
                        let e = format!("malformed status from rank {peer}");
                        tracing::warn!(peer, "closing the connection: {e}");
                        self.mailbox.peer_lost(peer, e);
                        break;
                    }
                },
            }
        }
        // Nothing more is read from this connection; closing our end also tells a peer that said
        // goodbye that we heard it.
        let _ = self.ctl.shutdown(Shutdown::Both);
    }
}

/// Read one header; `Ok(false)` on a clean end of stream before its first byte.
fn read_header(r: &mut impl Read, buf: &mut [u8; HEADER_LEN]) -> io::Result<bool> {
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("end of stream after {got} bytes of a frame header"),
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
