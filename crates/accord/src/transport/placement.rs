//! Frames read straight into the destination of the receive waiting for them, instead of into
//! a buffer of their own that the receive then copies: the copy out of that buffer is one pass
//! over every received byte on the receiving thread alone, while the connections' reader
//! threads copy out of the kernel in parallel.
//!
//! A receive of a whole message into one destination *posts* it ([`Mailbox::post`]): the key
//! it waits on, the message's length and fingerprint, and where its bytes go. A reader that
//! has just read a data frame's header asks the mailbox to *claim* the frame's place
//! ([`Mailbox::claim`]); a claimed frame's payload is read into the destination, and the frame
//! is delivered as a marker ([`Frame::placed`]) through the same queues and in the same order
//! as a buffered one, so the receive takes it as it takes every frame, without the copy.
//!
//! Which frames belong to the posted message is decided from what is certain at the moment a
//! header is read (`Posting::admits`):
//! - the frame that continues the message where delivered frames end (`offset == next`), when
//!   every frame the peer sent before it has been delivered (one connection: always; several
//!   lanes: when its order is the next one due). Frames of one key are delivered in the order
//!   sent and one message's frames are contiguous among them, so this frame is the message's.
//! - once the message's first frame is known (its order and size), any frame of the message's
//!   shape whose order is that first order plus its index: a message dealt over lanes takes
//!   consecutive orders, and a later message of the same key takes larger ones, so no other
//!   frame has that order.
//! - before anything of the message has arrived, a frame of a message dealt over lanes that is
//!   not the message's last, whose message begins with the frame its sender's frames deliver
//!   next (`striped_first`; the transport asks its sequencer): every frame before that one
//!   has been delivered and none of the key is waiting, so the first message of the key to
//!   arrive from now on is this frame's, and the receive takes it. Without this rule the
//!   lanes' readers raced the one reading the first frame, and a frame whose header came
//!   first was buffered and copied by the receive (on 16 CPUs, 10-18 % of a ping-pong's
//!   frames of 1-4 MiB over four lanes).
//!
//! Nothing is admitted once a frame of another message of the key (another size or type) was
//! delivered before the posted message began: the receive takes that message first (a
//! point-to-point receive of another size fails on it and leaves it for a later receive), so
//! what follows it is not the posted message's to take.
//!
//! Everything else is buffered as before. A receive that ends (its message complete, or its
//! wait failed) withdraws the posting ([`Posted`] on drop): it waits until no reader writes into
//! the destination any more (a reader checks at every read and gives its frame a buffer of its
//! own once the posting is withdrawn), then copies the bytes of markers nobody took into buffers
//! of their own; a marker delivered afterwards, whose receive failed, is dropped.
//!
//! This file holds the postings' bookkeeping, the [`Mailbox`] methods that post, claim, release
//! and withdraw destinations, and the guards they hand out ([`Claim`], [`Posted`]). The frames'
//! queues and the waits on them are in [`super::mailbox`], whose lock guards the postings too.

use super::mailbox::{Frame, Key, Mailbox};
use super::wire::{Header, ORDER_MODULUS};
use crate::fingerprint::Fingerprint;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// One receive's posted destination (see the module docs).
pub(super) struct Posting {
    /// Tells this posting's frames from those of an earlier one of the same key.
    pub id: u64,
    /// The destination's address and length.
    pub dest: *mut u8,
    pub len: usize,
    pub fp: Fingerprint,
    /// Where the next frame of the message to be delivered starts.
    pub next: usize,
    /// The order and length of the message's first frame, once known.
    pub first: Option<(u32, usize)>,
    /// Frames being read into the destination now.
    pub claims: usize,
    /// Set when the receive withdraws the posting; readers stop writing.
    pub revoked: Arc<AtomicBool>,
    /// Another message of the key came first: the posted one is not next in line.
    pub behind: bool,
}

impl Posting {
    pub fn new(dest: *mut u8, len: usize, fp: Fingerprint) -> Self {
        static POSTINGS: AtomicU64 = AtomicU64::new(1);
        Posting {
            id: POSTINGS.fetch_add(1, Ordering::Relaxed),
            dest,
            len,
            fp,
            next: 0,
            first: None,
            claims: 0,
            revoked: Arc::default(),
            behind: false,
        }
    }

    /// A frame of the posting's key was delivered, in order: follow the message.
    pub fn delivered(&mut self, f: &Frame) {
        if self.behind {
            return;
        }
        if f.env.fp == self.fp && f.total_len == self.len as u64 && f.offset == self.next as u64 {
            if f.offset == 0 && self.first.is_none() {
                self.first = f.order.map(|o| (o, f.len()));
            }
            self.next += f.len();
        } else if self.next == 0 {
            // A frame of another message before this one began: the receive will take that
            // message first (a point-to-point receive of another size fails on it and leaves
            // it), so no later frame may be taken for this one.
            self.behind = true;
        }
    }

    /// Whether the frame `h`, whose header was just read, belongs to the posted message;
    /// `in_order` says whether every frame its sender sent before it has been delivered,
    /// `begins_next` whether its message is one dealt over lanes that begins with the next
    /// frame its sender's frames deliver (`striped_first`).
    pub fn admits(&self, h: &Header, in_order: bool, begins_next: bool) -> bool {
        let (off, len) = (h.offset as usize, h.chunk_len as usize);
        if self.behind
            || h.env.fp != self.fp
            || h.total_len != self.len as u64
            || off < self.next
            || off + len > self.len
            || self.revoked.load(Ordering::Relaxed)
        {
            return false;
        }
        if off == self.next && in_order {
            return true;
        }
        match self.first {
            Some((first, chunk)) if chunk > 0 && off.is_multiple_of(chunk) => {
                let index = (h.order.wrapping_add(ORDER_MODULUS) - first) % ORDER_MODULUS;
                index as usize == off / chunk && len == chunk.min(self.len - off)
            }
            Some(_) => false,
            // Nothing of the message delivered or claimed: its frame is the posted message's
            // where the message begins with the next frame due (the module's third rule).
            None => begins_next && self.next == 0 && striped_first(h).is_some(),
        }
    }

    /// `h` was admitted (with `begins_next` as [`Posting::admits`] had it) and is being
    /// claimed: the message's first frame is known from the first frame itself, or from a
    /// frame admitted by the third rule.
    pub fn claimed(&mut self, h: &Header, begins_next: bool) {
        if self.first.is_none() {
            let len = h.chunk_len as usize;
            self.first = match (h.offset, begins_next) {
                (0, _) => Some((h.order, len)),
                (_, true) => striped_first(h).map(|first| (first, len)),
                _ => None,
            };
        }
        self.claims += 1;
    }
}

/// The order of the first frame of the message of `h`, where `h` is a frame of a message dealt
/// over lanes and not the message's last: such a message's frames take consecutive orders and,
/// all but the last, one length, so `h` is frame `offset / chunk_len` (see `tcp::lanes`).
/// `None` for a last frame, whose length does not tell the others'.
pub(super) fn striped_first(h: &Header) -> Option<u32> {
    let (off, len) = (h.offset, u64::from(h.chunk_len));
    if len == 0 || off.saturating_add(len) >= h.total_len || !off.is_multiple_of(len) {
        return None;
    }
    let modulus = u64::from(ORDER_MODULUS);
    let index = (off / len) % modulus;
    Some(((u64::from(h.order) + modulus - index) % modulus) as u32)
}

impl Mailbox {
    /// Let frames of the message from `src` for (`comm`, `seq`) be read straight into `dest`,
    /// the `len` bytes a receive of that whole message (fingerprint `fp`) fills, until the
    /// returned guard is dropped (see [`super::placement`]). The caller keeps `dest` valid and
    /// neither reads nor writes it while the guard lives, except through frames it takes.
    pub fn post(
        &self,
        src: usize,
        comm: u64,
        seq: u64,
        fp: &Fingerprint,
        dest: *mut u8,
        len: usize,
    ) -> Posted<'_> {
        let key = (src, comm, seq);
        let mut st = self.state.lock().unwrap();
        let mut p = Posting::new(dest, len, *fp);
        // Only the frames up to the message's end (or to another message before it) matter:
        // a backlog of later messages is not scanned at every receive.
        for f in st.queues.get(&key).into_iter().flatten() {
            p.delivered(f);
            if p.behind || p.next >= len {
                break;
            }
        }
        // Nothing to post where everything has arrived (or the key is posted already).
        let fresh = p.next < len && !p.behind && !st.posted.contains_key(&key);
        if fresh {
            st.posted.insert(key, p);
        }
        Posted {
            mailbox: self,
            key: fresh.then_some(key),
        }
    }

    /// Claim the place of the frame `h` from `src`, whose header was just read, in the
    /// destination posted for it, if it has one; `in_order` says whether every frame `src`
    /// sent before it has been delivered, `begins_next` whether `h` is a frame of a message
    /// dealt over lanes (`striped_first`) whose first frame is the next that `src`'s frames
    /// deliver. (Both found out before the call: a transport that puts frames back in order
    /// delivers them here under its own lock, and each stays true until the frame it names
    /// is delivered. A `begins_next` gone stale is harmless: that first frame, delivered in
    /// the meantime, set the posting's `first` or moved its `next`, and the third rule no
    /// longer applies.)
    pub fn claim(
        self: &std::sync::Arc<Self>,
        src: usize,
        h: &super::wire::Header,
        in_order: bool,
        begins_next: bool,
    ) -> Option<Claim> {
        let key = (src, h.env.comm, h.env.seq);
        let mut st = self.state.lock().unwrap();
        let p = st.posted.get_mut(&key)?;
        if !p.admits(h, in_order, begins_next) {
            return None;
        }
        p.claimed(h, begins_next);
        Some(Claim {
            mailbox: self.clone(),
            key,
            posting: p.id,
            // SAFETY (of the offset): `admits` checked offset + len <= the destination's length.
            dest: unsafe { p.dest.add(h.offset as usize) },
            len: h.chunk_len as usize,
            revoked: p.revoked.clone(),
        })
    }

    /// A reader stopped writing into the destination posted under `key`.
    pub(super) fn release(&self, key: Key) {
        let mut st = self.state.lock().unwrap();
        if let Some(p) = st.posted.get_mut(&key) {
            p.claims -= 1;
        }
        let waiting = st.unposting > 0;
        drop(st);
        if waiting {
            self.released.notify_all();
        }
    }

    /// Withdraw the destination posted under `key`: once no reader writes into it, frames
    /// placed there and not taken get buffers of their own (their receive failed, or a later
    /// one may take them).
    ///
    /// Only the markers already delivered are converted: a placed frame that came before its
    /// turn waits in the transport's sequencer and is dropped when it is delivered after the
    /// withdrawal (see [`Mailbox::deliver`]). A receive that gives up before its message is
    /// whole therefore loses that message's placed frames; today every such failure ends the
    /// communicator, so no later receive waits for them.
    pub(super) fn unpost(&self, key: Key) {
        let mut st = self.state.lock().unwrap();
        let Some(p) = st.posted.get(&key) else {
            return;
        };
        p.revoked.store(true, Ordering::Release);
        let since = Instant::now();
        while st.posted.get(&key).is_some_and(|p| p.claims > 0) {
            // A reader checks at every read (see `tcp::reader`): this is short.
            st.unposting += 1;
            st = self
                .released
                .wait_timeout(st, std::time::Duration::from_secs(1))
                .unwrap()
                .0;
            st.unposting -= 1;
            if since.elapsed() > std::time::Duration::from_secs(5) {
                tracing::warn!(?key, "a reader still writes into a withdrawn destination");
            }
        }
        let p = st.posted.remove(&key).expect("posted above");
        let mut kept = 0;
        for f in st.queues.get_mut(&key).into_iter().flatten() {
            if f.placed > 0 && f.posting == p.id {
                // SAFETY: the frame was read into the destination at its offset; the
                // destination is still the caller's (see `post`).
                let at = unsafe { p.dest.add(f.offset as usize) }.cast_const();
                f.data = unsafe { std::slice::from_raw_parts(at, f.placed) }.to_vec();
                kept += std::mem::take(&mut f.placed);
            }
        }
        *st.buffered.entry(key.0).or_default() += kept;
    }
}

/// A frame's place in a posted destination, held by the reader writing it; dropping it tells
/// the receive that this reader no longer writes there.
pub struct Claim {
    pub(super) mailbox: Arc<Mailbox>,
    pub(super) key: (usize, u64, u64),
    pub(super) posting: u64,
    pub(super) dest: *mut u8,
    pub(super) len: usize,
    pub(super) revoked: Arc<AtomicBool>,
}

// SAFETY: the destination stays valid and written by no one else until the claim is dropped:
// the receive that posted it waits for that before it returns (`Mailbox::unpost`).
unsafe impl Send for Claim {}
// SAFETY: the address is only written through by claims (see above) and read by `unpost`
// while the receive that posted it still waits there.
unsafe impl Send for Posting {}

impl Claim {
    /// The frame's bytes in the destination.
    pub fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: see `Send`; `Mailbox::claim` checked the range against the destination.
        unsafe { std::slice::from_raw_parts_mut(self.dest, self.len) }
    }

    /// The frame's length, and the posting it was placed for ([`Frame::placed`],
    /// [`Frame::posting`]).
    pub fn placed(&self) -> (usize, u64) {
        (self.len, self.posting)
    }

    /// Whether the receive withdrew its posting: write no more, move what was read elsewhere.
    pub fn revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.mailbox.release(self.key);
    }
}

/// A posted destination ([`Mailbox::post`]); dropping it withdraws the posting, once no reader
/// writes into it any more.
pub struct Posted<'a> {
    pub(super) mailbox: &'a Mailbox,
    pub(super) key: Option<(usize, u64, u64)>,
}

impl Drop for Posted<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.mailbox.unpost(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::mailbox::tests::frame;

    /// The header of `f` as a reader would have read it off the wire.
    fn header_of(f: &Frame) -> super::super::wire::Header {
        super::super::wire::Header {
            kind: super::super::wire::FrameKind::Data,
            src: 0,
            chunk_len: f.len() as u32,
            env: f.env,
            total_len: f.total_len,
            offset: f.offset,
            order: 0,
        }
    }

    #[test]
    fn a_destination_posted_behind_a_message_of_another_size_takes_nothing() {
        // A point-to-point receive of 64 KiB waits where a 96 KiB message comes first: it
        // fails on that one and leaves it; the 64 KiB message after it is not its to take.
        let (theirs, mine) = (frame(96 << 10), frame(64 << 10));
        let mut dest = vec![0u8; 64 << 10];
        for arrived_first in [true, false] {
            let m = Arc::new(Mailbox::new());
            if arrived_first {
                m.deliver(0, frame(96 << 10));
            }
            let posted = m.post(0, 1, 5, &mine.env.fp, dest.as_mut_ptr(), dest.len());
            if !arrived_first {
                // Still posted, as nothing arrived: the next frame in line would be placed.
                assert!(m.claim(0, &header_of(&mine), true, false).is_some());
                m.deliver(0, frame(96 << 10));
            }
            assert!(m.claim(0, &header_of(&theirs), true, false).is_none());
            assert!(m.claim(0, &header_of(&mine), true, false).is_none());
            drop(posted);
        }
        // With nothing ahead of it, the message's first frame is placed.
        let m = Arc::new(Mailbox::new());
        let _posted = m.post(0, 1, 5, &mine.env.fp, dest.as_mut_ptr(), dest.len());
        assert!(m.claim(0, &header_of(&mine), true, false).is_some());
    }

    /// The header of frame `index` of a message of `total` bytes dealt over lanes in frames of
    /// `chunk`, whose first frame has order `base` (as `tcp::lanes` writes them).
    fn lane_frame(total: usize, chunk: usize, base: u32, index: usize) -> Header {
        let off = index * chunk;
        Header {
            kind: super::super::wire::FrameKind::Data,
            src: 0,
            chunk_len: chunk.min(total - off) as u32,
            env: frame(total).env,
            total_len: total as u64,
            offset: off as u64,
            order: (base + index as u32) % ORDER_MODULUS,
        }
    }

    #[test]
    fn a_lane_frame_names_where_its_message_begins_unless_it_is_the_last() {
        let (total, chunk) = (1000 << 10, 256 << 10); // four frames, the last shorter
        for base in [0, 7, ORDER_MODULUS - 2] {
            for index in 0..3 {
                let h = lane_frame(total, chunk, base, index);
                assert_eq!(striped_first(&h), Some(base), "frame {index} from {base}");
            }
            assert_eq!(striped_first(&lane_frame(total, chunk, base, 3)), None);
        }
        // A message of one frame has no frame but its last.
        assert_eq!(striped_first(&lane_frame(chunk, chunk, 3, 0)), None);
    }

    /// Frames of a message dealt over lanes whose headers come before its first frame's are
    /// read into the waiting destination where the message begins with the frame due next;
    /// where it does not (another message of the same key and length may come first), or
    /// where the message's last frame is all there is, they are not.
    #[test]
    fn lane_frames_ahead_of_the_first_are_placed_where_their_message_is_next() {
        let (total, chunk) = (1000 << 10, 256 << 10);
        let fp = frame(total).env.fp;
        let mut dest = vec![0u8; total];
        let m = Arc::new(Mailbox::new());
        let posted = m.post(0, 1, 5, &fp, dest.as_mut_ptr(), total);
        // Whether frame `index` of the message whose first order is `base` is placed, with
        // `in_order` and `begins_next` as the reader found them.
        let placed = |m: &Arc<Mailbox>, base, index, in_order, begins_next| {
            m.claim(
                0,
                &lane_frame(total, chunk, base, index),
                in_order,
                begins_next,
            )
        };
        // The last frame alone does not say where its message begins, whatever the reader
        // believed.
        assert!(placed(&m, 40, 3, false, true).is_none());
        // Frame 2 of a message that does not begin with the frame due next: not placed.
        assert!(placed(&m, 40, 2, false, false).is_none());
        // Frame 2 of the message beginning with the frame due: placed, and with it the
        // message's start is known, so its last frame and (in order) its first follow.
        let two = placed(&m, 40, 2, false, true);
        assert!(two.is_some());
        assert_eq!(
            m.state.lock().unwrap().posted[&(0, 1, 5)].first,
            Some((40, chunk))
        );
        assert!(placed(&m, 40, 3, false, false).is_some());
        assert!(placed(&m, 40, 0, true, false).is_some());
        // A frame of a later message of the same key and length is not this message's.
        assert!(placed(&m, 44, 1, false, false).is_none());
        assert!(placed(&m, 44, 1, false, true).is_none());
        drop(two);
        drop(posted);

        // Once a frame of the key arrived buffered (here a whole message of another length),
        // the posted message is not next: nothing is placed for it.
        let m = Arc::new(Mailbox::new());
        let posted = m.post(0, 1, 5, &fp, dest.as_mut_ptr(), total);
        m.deliver(0, frame(96 << 10));
        assert!(placed(&m, 40, 1, false, true).is_none());
        drop(posted);
    }
}
