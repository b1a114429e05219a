//! Payload buffers that receives give back, kept for the frames that come next.
//!
//! A receive that copies a frame out of the mailbox hands the frame's payload buffer back
//! ([`Payloads::recycle`]); the transport's reader takes the next frame's buffer from here.
//! Large buffers ([`RECYCLE_MIN_BYTES`] and more) spare a fresh allocation that the kernel maps
//! and faults in page by page, zeroed; small ones spare every small call's frame an allocation
//! and a free. Each size class keeps at most 16 buffers.

use std::sync::Mutex;

/// Payload buffers from this size are kept for large frames ([`Payloads::buffer`]), smaller ones
/// for copies of small frames ([`Payloads::copy_of`]); see [`Payloads::recycle`].
pub const RECYCLE_MIN_BYTES: usize = 32 << 10;
/// Most buffers kept for recycling, of each size class (large, and small: at most
/// `SPARE_BUFFERS * RECYCLE_MIN_BYTES` = 512 KiB kept for small frames).
const SPARE_BUFFERS: usize = 16;

/// The kept buffers of one mailbox ([`super::mailbox::Mailbox::payloads`]).
#[derive(Default)]
pub struct Payloads {
    /// Buffers of large frames.
    large: Mutex<Vec<Vec<u8>>>,
    /// Buffers of small frames.
    small: Mutex<Vec<Vec<u8>>>,
}

impl Payloads {
    /// A buffer of `len` bytes for a frame's payload (its contents are to be overwritten): a
    /// recycled one where there is one large enough.
    pub fn buffer(&self, len: usize) -> Vec<u8> {
        if len >= RECYCLE_MIN_BYTES {
            let mut spare = self.large.lock().unwrap();
            if let Some(i) = spare.iter().position(|b| b.capacity() >= len) {
                let mut b = spare.swap_remove(i);
                drop(spare);
                // Bytes up to the old length were written before: only a longer tail is zeroed.
                b.resize(len, 0);
                return b;
            }
        }
        vec![0; len]
    }

    /// A small frame's payload (below [`RECYCLE_MIN_BYTES`]) copied into a buffer of its own:
    /// a recycled one that fits, holding at most twice the payload (or 128 bytes), since the
    /// untaken bytes a source may leave are counted by length. Where none fits and the spares
    /// are full, the oldest goes, so that the spares follow the sizes in use.
    pub fn copy_of(&self, bytes: &[u8]) -> Vec<u8> {
        if bytes.is_empty() {
            return Vec::new(); // a token: nothing to hold
        }
        let fits = bytes.len()..=2 * bytes.len().max(64);
        let mut b = {
            let mut spare = self.small.lock().unwrap();
            match spare.iter().rposition(|b| fits.contains(&b.capacity())) {
                Some(i) => spare.swap_remove(i),
                None => {
                    if spare.len() == SPARE_BUFFERS {
                        spare.remove(0);
                    }
                    Vec::new()
                }
            }
        };
        b.clear();
        b.extend_from_slice(bytes);
        b
    }

    /// Give back the payload buffer of a frame that was taken and used, for [`Payloads::buffer`]
    /// or [`Payloads::copy_of`] by its size.
    pub fn recycle(&self, b: Vec<u8>) {
        let spare = match b.capacity() {
            0 => return,
            c if c >= RECYCLE_MIN_BYTES => &self.large,
            _ => &self.small,
        };
        let mut spare = spare.lock().unwrap();
        if spare.len() < SPARE_BUFFERS {
            spare.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_payload_buffers_are_recycled_for_copies_of_small_frames() {
        let m = Payloads::default();
        let first = m.copy_of(&[1, 2, 3]);
        let at = first.as_ptr();
        m.recycle(first);
        // The next small frame's copy lands in the returned buffer, holding only its bytes.
        let second = m.copy_of(&[4, 5]);
        assert_eq!((second.as_ptr(), second.as_slice()), (at, &[4u8, 5][..]));
        // A spare far larger than the payload is left (a queued 2-byte frame must not hold
        // 16 KiB: untaken bytes are counted by length); one that fits is taken.
        let wide = vec![0u8; 16 << 10];
        let wide_at = wide.as_ptr();
        m.recycle(wide);
        let tiny = m.copy_of(&[9; 2]);
        assert!(tiny.capacity() <= 128 && tiny.as_ptr() != wide_at);
        let fitting = m.copy_of(&[3; 10_000]);
        assert_eq!(fitting.as_ptr(), wide_at);
        assert!(fitting.len() == 10_000 && fitting.iter().all(|&b| b == 3));
        assert!(m.small.lock().unwrap().is_empty());
        // A large spare is never taken for a small frame.
        let big = vec![0u8; RECYCLE_MIN_BYTES];
        let big_at = big.as_ptr();
        m.recycle(big);
        let other = m.copy_of(&[7; 20_000]);
        assert_ne!(other.as_ptr(), big_at);
        let reused = m.buffer(RECYCLE_MIN_BYTES);
        assert_eq!(reused.as_ptr(), big_at);
        // At most SPARE_BUFFERS are kept; empty (placed frames') buffers are not.
        for _ in 0..2 * SPARE_BUFFERS {
            m.recycle(vec![0u8; 8]);
        }
        m.recycle(Vec::new());
        assert_eq!(m.small.lock().unwrap().len(), SPARE_BUFFERS);
        // A token's copy takes none; a copy that none fits makes room by dropping the oldest.
        assert_eq!(m.copy_of(&[]).capacity(), 0);
        assert_eq!(m.small.lock().unwrap().len(), SPARE_BUFFERS);
        drop(m.copy_of(&[5; 1000]));
        assert_eq!(m.small.lock().unwrap().len(), SPARE_BUFFERS - 1);
    }

    #[test]
    fn large_payload_buffers_are_recycled_for_large_frames_only() {
        let m = Payloads::default();
        let big = vec![7u8; RECYCLE_MIN_BYTES * 2];
        let at = big.as_ptr();
        m.recycle(big);
        let again = m.buffer(RECYCLE_MIN_BYTES * 2 - 8);
        assert_eq!(
            (again.as_ptr(), again.len()),
            (at, RECYCLE_MIN_BYTES * 2 - 8)
        );
        // Nothing spare is large enough: a fresh, zeroed buffer.
        m.recycle(again);
        let bigger = m.buffer(RECYCLE_MIN_BYTES * 4);
        assert!(bigger.len() == RECYCLE_MIN_BYTES * 4 && bigger.iter().all(|&b| b == 0));
        // `buffer` for a small frame takes no large spare (the large one stays spare, so its
        // address cannot come back from the allocator).
        let m = Payloads::default();
        let spare = vec![1u8; RECYCLE_MIN_BYTES];
        let at = spare.as_ptr();
        m.recycle(spare);
        let small = m.buffer(100);
        assert_ne!(small.as_ptr(), at);
        let reused = m.buffer(RECYCLE_MIN_BYTES);
        assert_eq!(reused.as_ptr(), at);
        // A recycled buffer that grows gets zeros past what was written before.
        let mut part = vec![9u8; RECYCLE_MIN_BYTES];
        part.reserve(RECYCLE_MIN_BYTES);
        let m = Payloads::default();
        m.recycle(part);
        let grown = m.buffer(RECYCLE_MIN_BYTES + 16);
        assert!(grown[RECYCLE_MIN_BYTES..].iter().all(|&b| b == 0));
    }
}
