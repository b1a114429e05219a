//! The receiving side of one peer's connection ([`Inbound`]): frames are cut from the socket and
//! handed to the [`Mailbox`], control frames answered and forwarded, and the peer reported lost
//! when the connection ends or carries malformed bytes (see the [parent module](super)).
//!
//! Two parties read a connection, one at a time, through the same decoder: its reader thread,
//! which drains the socket whatever the application does, and a caller waiting for a small
//! message from that peer (a turn from [`Inbound::enter`], through [`Mailbox::set_pump`]),
//! which reads the socket itself instead of waiting for the reader thread to be woken and hand
//! the frame over.
//! That wake-up is the larger part of a small message's trip where idle CPUs sleep deeply (a
//! virtual machine's: 20 us and more). The caller never blocks: it reads what has arrived
//! (`MSG_DONTWAIT`) if the decoder is free, and leaves a frame it could not finish to whoever
//! comes next. The reader thread sleeps in `poll(2)` between frames, never holding the decoder,
//! and blocks in `recv` only inside a frame, whose sender is writing the rest. While callers
//! poll the connection it stays out of their way, parked (at most [`PARK_SLICE`] at a time):
//! woken for every frame it would only take CPU time and the decoder from them (on a rank
//! bound to one CPU, the caller's whole gain). A caller that stops polling to sleep wakes it,
//! and so does one that starts waiting for a message it leaves to the reader thread (a large
//! one), which would otherwise sit in the socket until the park ends.

use super::lanes::Sequencer;
use super::*;
use crate::transport::mailbox::{PollSource, PollTurn};
use crate::transport::payloads::RECYCLE_MIN_BYTES;
use crate::transport::placement::{striped_first, Claim};
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicUsize;

/// Payload remainders at least this large are read straight into the frame's buffer; smaller
/// ones through the staging buffer, which also picks up the frames that follow in one call.
const DIRECT_READ_BYTES: usize = 32 * 1024;
/// Longest sleep of the reader thread between checks that the connection is still open.
const POLL_SLICE_MS: i32 = 500;
/// Longest the reader thread stays parked while callers poll: how late a frame nobody polls
/// for (a control frame, or data arriving after the callers left) may be read.
const PARK_SLICE: Duration = Duration::from_millis(1);
/// Longest sleep of the reader thread inside a frame read into a posted destination: how late
/// it may notice that the receive withdrew it (the receive waits for that).
const PLACING_POLL_MS: i32 = 2;

/// One peer's connection as its receivers see it.
pub(super) struct Inbound {
    peer: usize,
    /// Which of the peer's connections this is (see `lanes`).
    lane: usize,
    /// Orders the data frames of a peer with several lanes.
    sequencer: Option<Arc<Sequencer>>,
    /// World size: bounds the rank a forwarded abort notice may name.
    size: usize,
    mailbox: Arc<Mailbox>,
    closing: Arc<AtomicBool>,
    /// The connection: read through the decoder, polled, and shut down when it ends.
    stream: TcpStream,
    /// Status queries go to the responder thread.
    queries: mpsc::SyncSender<Query>,
    /// Whether waiting callers read this connection (not where the peer's data comes another
    /// way, as shared memory does on one host).
    pub(super) pumped: AtomicBool,
    decoder: Mutex<Decoder>,
    /// Callers polling this connection now; the reader thread parks on `park` while any do.
    polling: AtomicUsize,
    park: (Mutex<()>, Condvar),
    parked: AtomicBool,
    /// The frame being read goes straight into a receive's destination.
    placing: AtomicBool,
}

/// Waiting callers read the connection themselves ([`Inbound::enter`]).
impl PollSource for Inbound {
    fn read_available(&self) -> bool {
        let Ok(mut d) = self.decoder.try_lock() else {
            return false;
        };
        let before = d.received;
        if !d.ended && !self.pump(&mut d, false) {
            d.frame = None; // a claim on a destination ends with the connection
            let _ = self.stream.shutdown(Shutdown::Both);
        }
        d.received != before
    }

    fn leave(&self, sleeping: bool) {
        self.polling.fetch_sub(1, Ordering::SeqCst);
        // The reader thread reads for the sleeping caller: wake it if it is parked. (A caller
        // that got its frame does not: the next call is likely to poll again soon, and the
        // reader's park ends by itself.)
        if sleeping
            && self.polling.load(Ordering::SeqCst) == 0
            && self.parked.load(Ordering::SeqCst)
        {
            let _g = self.park.0.lock().unwrap_or_else(|e| e.into_inner());
            self.park.1.notify_all();
        }
    }
}

/// Where reading stands: staged bytes and the frame they belong to.
struct Decoder {
    buf: Box<[u8]>,
    /// Staged bytes not consumed yet: `buf[start..end]`.
    start: usize,
    end: usize,
    frame: Option<Partial>,
    /// The connection ended (or is unusable) and the peer was reported lost.
    ended: bool,
    /// Bytes read so far.
    received: u64,
    /// The last read (into staging or a frame's own buffer) took less than it had room for:
    /// the socket held nothing more then, so looking again at once after the frames it
    /// completed would most likely find nothing (a system call per message, contending for
    /// the socket's lock with the sender's).
    drained: bool,
}

/// A frame whose header has been read.
enum Partial {
    Body {
        h: Header,
        data: Vec<u8>,
        got: usize,
    },
    /// A data frame read straight into the destination of the receive waiting for it.
    Placed { h: Header, claim: Claim, got: usize },
    /// A control frame of a later version, skipped.
    Skip { left: usize },
}

/// What one read from the socket gave.
enum Got {
    Bytes,
    Nothing,
    Closed,
}

impl Inbound {
    /// The receiving side of connection `lane` to `peer`; `sequencer` where the peer has
    /// several. Waiting callers read lane 0 only.
    pub(super) fn new(
        (peer, lane): (usize, usize),
        sequencer: Option<Arc<Sequencer>>,
        size: usize,
        mailbox: Arc<Mailbox>,
        closing: Arc<AtomicBool>,
        stream: TcpStream,
        queries: mpsc::SyncSender<Query>,
    ) -> Self {
        Inbound {
            peer,
            lane,
            sequencer,
            size,
            mailbox,
            closing,
            stream,
            queries,
            pumped: AtomicBool::new(lane == 0),
            polling: AtomicUsize::new(0),
            park: (Mutex::new(()), Condvar::new()),
            parked: AtomicBool::new(false),
            placing: AtomicBool::new(false),
            decoder: Mutex::new(Decoder {
                buf: vec![0; READ_BUFFER_BYTES].into_boxed_slice(),
                start: 0,
                end: 0,
                frame: None,
                ended: false,
                received: 0,
                drained: false,
            }),
        }
    }

    /// The reader thread: sleep until bytes arrive, then take the decoder and drain them.
    pub(super) fn run(&self) {
        loop {
            if self.polling.load(Ordering::SeqCst) > 0 {
                let g = self.park.0.lock().unwrap_or_else(|e| e.into_inner());
                self.parked.store(true, Ordering::SeqCst);
                let still = |_: &mut ()| self.polling.load(Ordering::SeqCst) > 0;
                let _ = self.park.1.wait_timeout_while(g, PARK_SLICE, still);
                self.parked.store(false, Ordering::SeqCst);
                if self.polling.load(Ordering::SeqCst) > 0 {
                    continue;
                }
            }
            let fd = self.stream.as_raw_fd();
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            };
            let slice = match self.placing.load(Ordering::Relaxed) {
                true => PLACING_POLL_MS,
                false => POLL_SLICE_MS,
            };
            // SAFETY: one valid pollfd; the descriptor stays open as long as `self.stream` does.
            unsafe { libc::poll(&mut p, 1, slice) };
            if self.polling.load(Ordering::SeqCst) > 0 {
                continue; // a polling caller reads it
            }
            let mut d = self.decoder.lock().unwrap_or_else(|e| e.into_inner());
            if d.ended || !self.pump(&mut d, true) {
                d.frame = None; // a claim on a destination ends with the connection
                break;
            }
        }
        // Nothing more is read from this connection; closing our end also tells a peer that said
        // goodbye that we heard it.
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Start polling this connection from a waiting caller (`None` where callers do not read
    /// it); the reader thread keeps out of the way until the returned turn is dropped.
    pub(super) fn enter(self: Arc<Self>) -> Option<PollTurn> {
        if !self.pumped.load(Ordering::Relaxed) {
            return None;
        }
        self.polling.fetch_add(1, Ordering::SeqCst);
        Some(PollTurn::new(self))
    }

    /// Read and dispatch frames until the socket has nothing more, or seemed to have nothing
    /// more after the last read (`true`: callers and the reader's `poll(2)` come back for what
    /// arrives later), or the connection ended (`false`, the peer reported lost). With
    /// `inside_frames`, waits in `recv` for the rest of a frame already begun.
    fn pump(&self, d: &mut Decoder, inside_frames: bool) -> bool {
        let peer = self.peer;
        loop {
            if let Some(f) = &mut d.frame {
                let staged = d.end - d.start;
                match f {
                    Partial::Body { data, got, .. } => {
                        let n = staged.min(data.len() - *got);
                        data[*got..*got + n].copy_from_slice(&d.buf[d.start..d.start + n]);
                        (*got, d.start) = (*got + n, d.start + n);
                        let left = data.len() - *got;
                        if left == 0 {
                            let Some(Partial::Body { h, data, .. }) = d.frame.take() else {
                                unreachable!("a body was being read")
                            };
                            if !self.dispatch(h, data, None) {
                                d.ended = true;
                                return false;
                            }
                            continue;
                        }
                        if left >= DIRECT_READ_BYTES {
                            match rest_of_frame(&self.stream, &mut data[*got..], inside_frames) {
                                Ok(Some(n)) => {
                                    d.drained = n < left;
                                    (*got, d.received) = (*got + n, d.received + n as u64)
                                }
                                Ok(None) => return true,
                                Err(why) => return self.end(d, why),
                            }
                            continue;
                        }
                    }
                    Partial::Placed { claim, got, .. } => {
                        if claim.revoked() {
                            // Its receive gave up: the frame takes a buffer of its own.
                            let Some(Partial::Placed { h, mut claim, got }) = d.frame.take() else {
                                unreachable!("a placed frame was being read")
                            };
                            let mut data = self.mailbox.payloads().buffer(h.chunk_len as usize);
                            data[..got].copy_from_slice(&claim.bytes()[..got]);
                            drop(claim);
                            self.placing.store(false, Ordering::Relaxed);
                            d.frame = Some(Partial::Body { h, data, got });
                            continue;
                        }
                        let dest = claim.bytes();
                        let n = staged.min(dest.len() - *got);
                        dest[*got..*got + n].copy_from_slice(&d.buf[d.start..d.start + n]);
                        (*got, d.start) = (*got + n, d.start + n);
                        if *got == dest.len() {
                            let Some(Partial::Placed { h, claim, .. }) = d.frame.take() else {
                                unreachable!("a placed frame was being read")
                            };
                            let delivered = self.dispatch(h, Vec::new(), Some(&claim));
                            drop(claim);
                            self.placing.store(false, Ordering::Relaxed);
                            if !delivered {
                                d.ended = true;
                                return false;
                            }
                            continue;
                        }
                        // Never blocking, so that a withdrawn destination is noticed soon.
                        let left = dest.len() - *got;
                        match rest_of_frame(&self.stream, &mut dest[*got..], false) {
                            Ok(Some(n)) => {
                                d.drained = n < left;
                                (*got, d.received) = (*got + n, d.received + n as u64)
                            }
                            Ok(None) => return true,
                            Err(why) => return self.end(d, why),
                        }
                        continue;
                    }
                    Partial::Skip { left } => {
                        let n = staged.min(*left);
                        d.start += n;
                        *left -= n;
                        if *left == 0 {
                            d.frame = None;
                            tracing::debug!(peer, "skipped a frame of an unknown kind");
                            continue;
                        }
                    }
                }
                match self.fill(d, inside_frames) {
                    Ok(Got::Bytes) => continue,
                    Ok(Got::Nothing) => return true,
                    Ok(Got::Closed) => return self.end(d, "in the middle of a frame".into()),
                    Err(e) => return self.end(d, format!("in the middle of a frame ({e})")),
                }
            }
            if d.end - d.start >= HEADER_LEN {
                let hb: [u8; HEADER_LEN] = d.buf[d.start..d.start + HEADER_LEN]
                    .try_into()
                    .expect("a header's length");
                d.start += HEADER_LEN;
                match Header::decode(&hb, peer as u32) {
                    // `decode` bounded chunk_len by the frame kind's limit.
                    Ok(h) => {
                        d.frame = Some(match self.claim(&h) {
                            Some(claim) => {
                                self.placing.store(true, Ordering::Relaxed);
                                Partial::Placed { h, claim, got: 0 }
                            }
                            None => self.body(d, h),
                        })
                    }
                    Err(e) => match wire::unknown_kind_len(&hb, peer as u32) {
                        Some(left) => d.frame = Some(Partial::Skip { left }),
                        None => {
                            tracing::warn!(peer, "closing the connection: {e}");
                            self.mailbox.peer_lost(peer, e.to_string());
                            d.ended = true;
                            return false;
                        }
                    },
                }
                continue;
            }
            let begun = d.end - d.start;
            if begun == 0 && std::mem::take(&mut d.drained) {
                return true;
            }
            match self.fill(d, inside_frames && begun > 0) {
                Ok(Got::Bytes) => {}
                Ok(Got::Nothing) => return true,
                Ok(Got::Closed) if begun == 0 => {
                    let why = format!("rank {peer} closed without a goodbye");
                    return self.end(d, why);
                }
                Ok(Got::Closed) => {
                    let why = format!("end of stream after {begun} bytes of a frame header");
                    return self.end(d, why);
                }
                Err(e) => return self.end(d, e.to_string()),
            }
        }
    }

    /// The frame whose header `h` was just read: a small body already staged whole is copied
    /// out once (not into a zeroed buffer first, and into a buffer an earlier small frame's
    /// receiver gave back), anything else is read into a buffer of its own.
    fn body(&self, d: &mut Decoder, h: Header) -> Partial {
        let len = h.chunk_len as usize;
        if len < RECYCLE_MIN_BYTES && d.end - d.start >= len {
            let data = self
                .mailbox
                .payloads()
                .copy_of(&d.buf[d.start..d.start + len]);
            d.start += len;
            return Partial::Body { h, data, got: len };
        }
        let data = self.mailbox.payloads().buffer(len);
        Partial::Body { h, data, got: 0 }
    }

    /// Read more bytes into the staging buffer.
    fn fill(&self, d: &mut Decoder, wait: bool) -> io::Result<Got> {
        if d.start == d.end {
            (d.start, d.end) = (0, 0);
        } else if d.buf.len() - d.end < HEADER_LEN {
            d.buf.copy_within(d.start..d.end, 0);
            (d.start, d.end) = (0, d.end - d.start);
        }
        loop {
            match recv(&self.stream, &mut d.buf[d.end..], wait) {
                Ok(0) => return Ok(Got::Closed),
                Ok(n) => {
                    d.end += n;
                    d.received += n as u64;
                    d.drained = d.end < d.buf.len();
                    return Ok(Got::Bytes);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Got::Nothing),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The place of data frame `h` in the destination of the receive waiting for it, if one
    /// was posted and the frame is large enough to be worth reading there.
    fn claim(&self, h: &Header) -> Option<Claim> {
        if h.kind != FrameKind::Data || (h.chunk_len as usize) < DIRECT_READ_BYTES {
            return None;
        }
        // Both stay true until the frame they name is delivered; false may be stale, which
        // only costs the placement. Lanes other than 0 carry only messages dealt over the
        // lanes: where such a message begins with the next frame due, the destination waiting
        // for its key is its own before its first frame is read (see `placement`).
        let due = self.sequencer.as_ref().map(|s| s.next_due());
        let in_order = due.is_none_or(|next| next == h.order);
        let begins_next = self.lane > 0 && due.is_some() && striped_first(h) == due;
        self.mailbox.claim(self.peer, h, in_order, begins_next)
    }

    /// The connection ended: report the peer lost, saying why.
    fn end(&self, d: &mut Decoder, why: String) -> bool {
        let cause = if self.closing.load(Ordering::SeqCst) {
            "this rank's TCP transport was shut down".to_string()
        } else {
            format!("connection closed (process exited or was killed): {why}")
        };
        self.mailbox.peer_lost(self.peer, cause);
        d.ended = true;
        false
    }

    /// Act on one whole frame, whose payload is `data` or, for a data frame, was `placed` in a
    /// receive's destination under that claim; `false` when it ends the connection.
    fn dispatch(&self, h: Header, data: Vec<u8>, placed: Option<&Claim>) -> bool {
        let peer = self.peer;
        match h.kind {
            FrameKind::Data => {
                let (placed, posting) = placed.map_or((0, 0), Claim::placed);
                let frame = Frame {
                    placed,
                    posting,
                    order: Some(h.order),
                    ..Frame::new(h.env, h.total_len, h.offset, data)
                };
                match &self.sequencer {
                    None => self.mailbox.deliver(peer, frame),
                    Some(s) => {
                        if let Err(e) = s.arrived(h.order, frame) {
                            return self.violated(e);
                        }
                    }
                }
            }
            FrameKind::Abort => {
                let (by, reason) = match data.split_first_chunk::<4>() {
                    Some((by, text)) => (u32::from_le_bytes(*by) as usize, text),
                    None => (peer, &data[..]),
                };
                // A forwarded notice names the rank that failed first; a rank number outside
                // the world is the sender's own failure.
                let by = if by < self.size { by } else { peer };
                self.mailbox
                    .abort(by, String::from_utf8_lossy(reason).into_owned());
            }
            FrameKind::Bye => {
                match self.sequencer.as_ref().map_or(Ok(true), |s| s.bye()) {
                    Ok(true) => self.mailbox.peer_left(peer),
                    Ok(false) => {}
                    Err(e) => return self.violated(e),
                }
                return false;
            }
            FrameKind::Query => {
                if let Ok(nonce) = <[u8; QUERY_LEN]>::try_from(&data[..]) {
                    // Beyond the bound (a peer that floods queries), queries go unanswered.
                    let _ = self.queries.try_send((peer, u64::from_le_bytes(nonce)));
                }
            }
            FrameKind::Status => match waits::decode_status(&data, self.size) {
                Some((nonce, w)) => self.mailbox.waits().answer(peer, nonce, w),
                None => return self.violated(format!("malformed status from rank {peer}")),
            },
        }
        true
    }

    /// The peer broke the protocol: report it lost with `why`; the connection ends (`false`).
    fn violated(&self, why: String) -> bool {
        tracing::warn!(
            peer = self.peer,
            lane = self.lane,
            "closing the connection: {why}"
        );
        self.mailbox.peer_lost(self.peer, why);
        false
    }
}

/// Read more of a frame's payload into `buf` (see [`recv`]): how many bytes came (`None`:
/// none had arrived, without `wait`), or why the connection ended in the middle of a frame.
fn rest_of_frame(s: &TcpStream, buf: &mut [u8], wait: bool) -> Result<Option<usize>, String> {
    loop {
        return match recv(s, buf, wait) {
            Ok(0) => Err("in the middle of a frame".into()),
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => Err(format!("in the middle of a frame ({e})")),
        };
    }
}

/// `recv(2)` into `buf`; without `wait`, only what has arrived (`WouldBlock` if nothing).
fn recv(s: &TcpStream, buf: &mut [u8], wait: bool) -> io::Result<usize> {
    let flags = if wait { 0 } else { libc::MSG_DONTWAIT };
    // SAFETY: `buf` is valid for writes of its length; the descriptor is open while `s` is.
    let n = unsafe { libc::recv(s.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
