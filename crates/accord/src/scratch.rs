//! Scratch buffers kept per thread between calls: malloc maps an allocation of more than 32 MiB
//! anew every time, and its pages fault in one by one as the call writes them (a 64 MiB
//! reduce-scatter over TCP spent about half its time there).
//!
//! Code that holds scratch while calling code that takes its own (the hierarchy's steps around
//! the schedules they run) has a pool of its own, so that neither takes the other's buffer.

use std::cell::RefCell;
use std::thread::LocalKey;

/// Scratch larger than this is not kept for the next call.
const KEPT_BYTES: usize = 256 << 20;

thread_local! {
    static SCHEDULE_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static HIERARCHY_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The schedules' scratch (`Buf::Tmp`).
pub(crate) static SCHEDULES: Pool = Pool(&SCHEDULE_BUF);

/// The hierarchy's scratch (blocks reordered by stripe, padded vectors).
pub(crate) static HIERARCHY: Pool = Pool(&HIERARCHY_BUF);

/// One kept buffer per thread.
pub(crate) struct Pool(&'static LocalKey<RefCell<Vec<u8>>>);

impl Pool {
    /// `bytes` bytes from this thread's kept buffer. Only bytes never used before are zeroed:
    /// callers write scratch before they read it.
    pub(crate) fn take(&self, bytes: usize) -> Vec<u8> {
        let mut v = self.0.with(|s| std::mem::take(&mut *s.borrow_mut()));
        v.truncate(bytes);
        v.resize(bytes, 0);
        v
    }

    /// Keep `v` for this thread's next [`Pool::take`], unless it is too large to keep or
    /// smaller than what is kept already.
    pub(crate) fn give_back(&self, v: Vec<u8>) {
        if v.capacity() <= KEPT_BYTES {
            self.0.with(|s| {
                let mut kept = s.borrow_mut();
                if v.capacity() > kept.capacity() {
                    *kept = v;
                }
            });
        }
    }
}
