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
    /// `in_order` says whether every frame its sender sent before it has been delivered.
    pub fn admits(&self, h: &Header, in_order: bool) -> bool {
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
            _ => false,
        }
    }

    /// `h` was admitted and is being claimed.
    pub fn claimed(&mut self, h: &Header) {
        if h.offset == 0 && self.first.is_none() {
            self.first = Some((h.order, h.chunk_len as usize));
        }
        self.claims += 1;
    }
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
    /// sent before it has been delivered. (Found out before the call: a transport that puts
    /// frames back in order delivers them here under its own lock.)
    pub fn claim(
        self: &std::sync::Arc<Self>,
        src: usize,
        h: &super::wire::Header,
        in_order: bool,
    ) -> Option<Claim> {
        let key = (src, h.env.comm, h.env.seq);
        let mut st = self.state.lock().unwrap();
        let p = st.posted.get_mut(&key)?;
        if !p.admits(h, in_order) {
            return None;
        }
        p.claimed(h);
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
                assert!(m.claim(0, &header_of(&mine), true).is_some());
                m.deliver(0, frame(96 << 10));
            }
            assert!(m.claim(0, &header_of(&theirs), true).is_none());
            assert!(m.claim(0, &header_of(&mine), true).is_none());
            drop(posted);
        }
        // With nothing ahead of it, the message's first frame is placed.
        let m = Arc::new(Mailbox::new());
        let _posted = m.post(0, 1, 5, &mine.env.fp, dest.as_mut_ptr(), dest.len());
        assert!(m.claim(0, &header_of(&mine), true).is_some());
    }
}
