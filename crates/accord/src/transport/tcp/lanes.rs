//! Several connections ("lanes") to one peer, so that a large message's bytes are copied into
//! and out of the kernel by several threads at once.
//!
//! Over one TCP connection a message goes no faster than one thread copies it into the socket
//! and one copies it out: on 16 CPUs, two processes exchanging 4-16 MiB over loopback moved
//! 2.3-3.2 GB/s each way over one connection and 8-13.7 GB/s over four to eight
//! (`bench/tcp_streams.py`). A pair of ranks opens the number of lanes the higher rank asks for
//! when the mesh forms ([`super::TcpOptions::lanes`]; [`lanes_for`]: one per CPU for each rank
//! drawing on them, 1 to 4); lane 0 carries every control frame and every message smaller than
//! [`STRIPE_MIN_BYTES`] (`ACCORD_TCP_STRIPE_BYTES`). A larger message is cut into frames of
//! at most the transport's chunk, at least one per lane ([`stripe_chunk`]), dealt round-robin
//! over the lanes: the
//! caller writes lane 0's share, one [`LaneWriter`] thread per other lane writes its share, and
//! `send` returns once all of them are written (the caller's buffer is borrowed until then).
//! `send_start` returns after lane 0's share, and the other lanes go on writing while the
//! caller receives, until the [`crate::transport::Sending`] it got is waited for: the executor
//! does that for sends whose bytes its round does not write, and waits at the round's end.
//!
//! Each lane has its own reader thread. Every data frame to a peer carries its place among all
//! the data frames sent to that peer ([`Header::order`], modulo 2^24), so the receiving side's
//! [`Sequencer`] hands frames to the mailbox in exactly the order they were sent, as one
//! connection would: the executor and the mailbox never see lanes. The goodbye comes on every
//! lane; the peer counts as gone once every lane has said it, by which time every frame has
//! arrived.

use super::*;
use crate::transport::wire::ORDER_MODULUS;

/// Messages from this size are dealt over a peer's lanes by default (`ACCORD_TCP_STRIPE_BYTES`):
/// on 16 CPUs, striping from 256 KiB instead of 1 MiB made 1 MiB calls between two ranks
/// 1.14-1.73x faster (4 lanes), and changed 256 KiB - 4 MiB calls at 4 ranks and over 2 x 2
/// namespaces by 0.89-1.28x.
pub const STRIPE_MIN_BYTES: usize = 256 << 10;

/// The frame size of a message of `len` bytes dealt over `lanes` lanes: the transport's
/// `chunk`, or less, so that every lane has a frame (a multiple of 4 KiB, which keeps every
/// element type's elements whole).
pub(super) fn stripe_chunk(len: usize, lanes: usize, chunk: usize) -> usize {
    let even = len.div_ceil(lanes.max(1)).next_multiple_of(4096);
    chunk.min(even).max(4096)
}

/// Most lanes per peer.
pub const MAX_LANES: usize = 8;

/// Lanes per pair where `ACCORD_TCP_LANES` does not say: one per CPU each of the `ranks`
/// drawing on this process's CPUs has, 1 to 4 (each lane wants a CPU to copy on, on both sides;
/// 4 lanes made 4-64 MiB messages 1.3-1.65x faster than 1 on 16 CPUs with 2 ranks, 1.07-1.44x
/// with 4). The caller counts the ranks of other host names on the same CPUs too (network
/// namespaces of one machine, [`crate::rendezvous::Rendezvous::cpu_sharing_ranks`]): over 4
/// namespaces x 2 ranks on 16 CPUs, 2 lanes instead of 4 took 0.88-0.89x the time at 1 MiB and
/// within 0.9-1.1x elsewhere from 256 KiB.
pub fn lanes_for(ranks: Option<usize>) -> usize {
    if let Some(n) = crate::config::get().tcp_lanes {
        return n;
    }
    by_cpus(crate::transport::cpus::usable_here(), ranks)
}

fn by_cpus(cpus: usize, local_ranks: Option<usize>) -> usize {
    (cpus / local_ranks.unwrap_or(cpus).max(1)).clamp(1, 4)
}

/// A job for a [`LaneWriter`]: the frames `first`, `first + step`, ... of one message.
struct Job {
    /// The message's bytes; borrowed from the sending caller, who waits for the job's end.
    data: *const u8,
    len: usize,
    env: Envelope,
    src: u32,
    chunk: usize,
    first: usize,
    step: usize,
    /// The order of the message's first frame.
    base: u32,
    /// Where the writer reports that the job is over (its own, so that a sender waits for
    /// exactly its jobs whatever other threads send).
    done: mpsc::SyncSender<io::Result<()>>,
}

// SAFETY: `data` points into a buffer the sending caller keeps borrowed until the job has
// reported its end (`LaneWriter::wait`), and the writer only reads it.
unsafe impl Send for Job {}

/// One extra connection to a peer: its write side, and the thread that writes its frames.
pub(super) struct LaneWriter {
    pub(super) writer: Arc<Mutex<Socket>>,
    /// For shutting the connection down without the write lock.
    pub(super) ctl: TcpStream,
    jobs: mpsc::SyncSender<Job>,
}

impl LaneWriter {
    /// Start the writer thread of a lane (`name` names the thread).
    pub(super) fn start(stream: &TcpStream, name: String) -> Result<LaneWriter> {
        let setup = |e| Error::io(format!("setting up {name}"), e);
        let writer = Arc::new(Mutex::new(Socket::from(stream.try_clone().map_err(setup)?)));
        let (jobs, todo) = mpsc::sync_channel::<Job>(1);
        let w = writer.clone();
        let ctl = stream.try_clone().map_err(setup)?;
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                while let Ok(job) = todo.recv() {
                    let _ = job.done.send(write_share(&w, &job));
                }
            })
            .map_err(|e| Error::io("starting a lane writer", e))?;
        Ok(LaneWriter { writer, ctl, jobs })
    }

    /// Shut the connection down (both ways, or only our writing side).
    pub(super) fn shutdown(&self, how: Shutdown) {
        let _ = self.ctl.shutdown(how);
    }
}

/// Write the frames of `job`, each under the lane's write lock (control frames go between).
fn write_share(w: &Mutex<Socket>, job: &Job) -> io::Result<()> {
    // SAFETY: see `Job`: the buffer outlives the job.
    let data = unsafe { std::slice::from_raw_parts(job.data, job.len) };
    let frames = data.len().div_ceil(job.chunk);
    for i in (job.first..frames).step_by(job.step) {
        let off = i * job.chunk;
        let bytes = &data[off..(off + job.chunk).min(data.len())];
        let hdr = data_header(job.src, job.env, data.len(), off, bytes.len(), job.base, i);
        let s = w.lock().unwrap_or_else(|e| e.into_inner());
        write_frame(&s, &hdr, bytes)?;
    }
    Ok(())
}

/// The header of frame `index` of a message (at `off`, `len` bytes) whose first frame has order
/// `base`.
pub(super) fn data_header(
    src: u32,
    env: Envelope,
    total: usize,
    off: usize,
    len: usize,
    base: u32,
    index: usize,
) -> [u8; HEADER_LEN] {
    Header {
        kind: FrameKind::Data,
        src,
        chunk_len: len as u32,
        env,
        total_len: total as u64,
        offset: off as u64,
        order: base.wrapping_add(index as u32) % ORDER_MODULUS,
    }
    .encode()
}

/// One message on its way out: `data` from rank `src`, labelled `env`, in frames of `chunk`
/// bytes of which the first has order `base`.
pub(super) struct Outgoing<'a> {
    pub(super) src: u32,
    pub(super) env: Envelope,
    pub(super) data: &'a [u8],
    pub(super) chunk: usize,
    pub(super) base: u32,
}

impl Outgoing<'_> {
    /// The frames `first`, `first + step`, ... of this message, and where its end is reported.
    fn share(&self, first: usize, step: usize) -> (Job, mpsc::Receiver<io::Result<()>>) {
        let (done, over) = mpsc::sync_channel(1);
        let job = Job {
            data: self.data.as_ptr(),
            len: self.data.len(),
            env: self.env,
            src: self.src,
            chunk: self.chunk,
            first,
            step,
            base: self.base,
            done,
        };
        (job, over)
    }
}

/// The lanes' jobs of one message still being written ([`start_striped`]).
pub(super) type Pending = Vec<mpsc::Receiver<io::Result<()>>>;

/// Send `m` over lane 0 (`lane0`, written by this thread) and `extra` (written by their
/// threads), frame `i` on lane `i % lanes`. Returns once every frame is written, or the first
/// error once no lane uses the message's bytes any more (on an error `shut_all` shuts the
/// lanes down, so the others stop at once).
pub(super) fn send_striped(
    lane0: &Mutex<Socket>,
    extra: &[LaneWriter],
    m: &Outgoing<'_>,
    shut_all: &dyn Fn(),
) -> io::Result<()> {
    let (mine, pending) = start_striped(lane0, extra, m, shut_all);
    finish_striped(pending, mine, shut_all)
}

/// The first half of [`send_striped`]: hand the other lanes their shares and write lane 0's.
/// Returns lane 0's outcome and the jobs still being written, which [`finish_striped`] must
/// wait for before the message's bytes may go.
pub(super) fn start_striped(
    lane0: &Mutex<Socket>,
    extra: &[LaneWriter],
    m: &Outgoing<'_>,
    shut_all: &dyn Fn(),
) -> (io::Result<()>, Pending) {
    let frames = m.data.len().div_ceil(m.chunk);
    let step = (extra.len() + 1).min(frames).max(1);
    let mut pending = Vec::with_capacity(step - 1);
    let mut result = Ok(());
    for (i, lane) in extra[..step - 1].iter().enumerate() {
        let (job, over) = m.share(i + 1, step);
        if lane.jobs.send(job).is_err() {
            result = Err(io::Error::other("a lane's writer thread has ended"));
            break;
        }
        pending.push(over);
    }
    if result.is_ok() {
        result = write_share(lane0, &m.share(0, step).0);
    }
    if result.is_err() {
        shut_all();
    }
    (result, pending)
}

/// The second half of [`send_striped`]: wait for every job of `pending`; the first error.
pub(super) fn finish_striped(
    pending: Pending,
    mut result: io::Result<()>,
    shut_all: &dyn Fn(),
) -> io::Result<()> {
    for over in pending {
        let r = over
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("a lane's writer thread has ended")));
        if let (Ok(()), Err(e)) = (&result, r) {
            shut_all();
            result = Err(e);
        }
    }
    result
}

/// Puts one peer's data frames, arriving over several lanes, back in the order they were sent
/// (see the [module documentation](self)).
pub(super) struct Sequencer {
    peer: usize,
    lanes: usize,
    mailbox: Arc<Mailbox>,
    state: Mutex<SequencerState>,
}

#[derive(Default)]
struct SequencerState {
    /// The order of the next frame to deliver.
    next: u32,
    /// Frames that came before their turn, by order.
    early: HashMap<u32, Frame>,
    early_bytes: usize,
    /// Lanes that have said goodbye.
    byes: usize,
}

impl Sequencer {
    pub(super) fn new(peer: usize, lanes: usize, mailbox: Arc<Mailbox>) -> Self {
        Sequencer {
            peer,
            lanes,
            mailbox,
            state: Mutex::default(),
        }
    }

    /// A data frame with order `order` arrived: deliver it and the frames waiting for it, or
    /// keep it for its turn. An error (a frame seen before, one from behind the frames
    /// delivered, more early bytes than a peer may leave untaken) is a protocol violation.
    pub(super) fn arrived(&self, order: u32, frame: Frame) -> std::result::Result<(), String> {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *guard;
        let ahead = order.wrapping_sub(st.next) % ORDER_MODULUS;
        if ahead >= ORDER_MODULUS / 2 {
            return Err(format!(
                "rank {} sent data frame {order} after frame {} was due",
                self.peer, st.next
            ));
        }
        if ahead > 0 {
            st.early_bytes += frame.data.len();
            if st.early_bytes > crate::transport::mailbox::max_unmatched_bytes() {
                return Err(format!(
                    "rank {} sent {} bytes of frames ahead of a missing one",
                    self.peer, st.early_bytes
                ));
            }
            if st.early.insert(order, frame).is_some() {
                return Err(format!("rank {} sent data frame {order} twice", self.peer));
            }
            return Ok(());
        }
        self.mailbox.deliver(self.peer, frame);
        st.next = (st.next + 1) % ORDER_MODULUS;
        while let Some(f) = st.early.remove(&st.next) {
            st.early_bytes -= f.data.len();
            self.mailbox.deliver(self.peer, f);
            st.next = (st.next + 1) % ORDER_MODULUS;
        }
        Ok(())
    }

    /// The order of the next data frame to deliver: every frame before it has been.
    pub(super) fn next_due(&self) -> u32 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).next
    }

    /// A lane said goodbye: `Ok(true)` once every lane has, with every frame delivered.
    pub(super) fn bye(&self) -> std::result::Result<bool, String> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.byes += 1;
        match (st.byes >= self.lanes, st.early.len()) {
            (true, 0) => Ok(true),
            (true, n) => Err(format!(
                "rank {} said goodbye with {n} data frame(s) after a missing one",
                self.peer
            )),
            (false, _) => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DataType;

    fn frame(i: u8) -> Frame {
        Frame::new(
            Envelope {
                comm: 1,
                seq: 2,
                fp: Fingerprint::new(OpKind::P2p, DataType::U8, 1),
            },
            256,
            u64::from(i),
            vec![i],
        )
    }

    fn delivered(m: &Mailbox, n: usize) -> Vec<u8> {
        let fp = Fingerprint::new(OpKind::P2p, DataType::U8, 1);
        let soon = Instant::now() + Duration::from_millis(50);
        (0..n)
            .map(|_| m.take(0, 1, 2, &fp, soon, 1).unwrap().data[0])
            .collect()
    }

    #[test]
    fn striped_frames_give_every_lane_some_and_keep_elements_whole() {
        let c = 512 << 10;
        assert_eq!(stripe_chunk(64 << 20, 4, c), c);
        assert_eq!(stripe_chunk(1 << 20, 4, c), 256 << 10);
        assert_eq!(stripe_chunk(256 << 10, 4, c), 64 << 10);
        assert_eq!(stripe_chunk((256 << 10) + 8, 4, c), (64 << 10) + 4096);
        assert_eq!(stripe_chunk(5000, 4, c), 4096);
        assert_eq!(
            stripe_chunk(1 << 20, 4, 8192),
            8192,
            "never above the transport's frames"
        );
    }

    #[test]
    fn lanes_follow_the_cpus_each_rank_of_the_host_has() {
        assert_eq!(by_cpus(2, Some(2)), 1);
        assert_eq!(by_cpus(16, Some(2)), 4);
        assert_eq!(by_cpus(16, Some(4)), 4);
        assert_eq!(by_cpus(16, Some(8)), 2);
        assert_eq!(by_cpus(16, Some(32)), 1);
        assert_eq!(by_cpus(64, Some(1)), 4);
        assert_eq!(by_cpus(16, None), 1, "unknown: as if every CPU had a rank");
    }

    #[test]
    fn frames_from_several_lanes_are_delivered_in_order() {
        let m = Arc::new(Mailbox::new());
        let s = Sequencer::new(0, 3, m.clone());
        for i in [2u8, 0, 3, 1, 5, 4] {
            s.arrived(u32::from(i), frame(i)).unwrap();
        }
        assert_eq!(delivered(&m, 6), [0, 1, 2, 3, 4, 5]);
        assert!(!s.bye().unwrap() && !s.bye().unwrap());
        assert!(s.bye().unwrap(), "the last lane's goodbye");
    }

    #[test]
    fn the_order_wraps_around() {
        let m = Arc::new(Mailbox::new());
        let s = Sequencer::new(0, 2, m.clone());
        s.state.lock().unwrap().next = ORDER_MODULUS - 1;
        s.arrived(0, frame(1)).unwrap();
        s.arrived(ORDER_MODULUS - 1, frame(0)).unwrap();
        assert_eq!(delivered(&m, 2), [0, 1]);
    }

    #[test]
    fn repeated_stale_and_missing_frames_are_protocol_errors() {
        let s = Sequencer::new(4, 2, Arc::new(Mailbox::new()));
        s.arrived(0, frame(0)).unwrap();
        let e = s.arrived(0, frame(0)).unwrap_err();
        assert!(e.contains("after frame 1 was due"), "{e}");
        s.arrived(3, frame(3)).unwrap();
        let e = s.arrived(3, frame(3)).unwrap_err();
        assert!(e.contains("rank 4 sent data frame 3 twice"), "{e}");
        assert!(!s.bye().unwrap());
        let e = s.bye().unwrap_err();
        assert!(
            e.contains("goodbye with 1 data frame(s) after a missing one"),
            "{e}"
        );
    }
}
