//! Which device addresses belong to a symmetric heap, so Accord's kernels can take an array of
//! the heap where it lies (zero-copy: peers read it through their mapping) instead of first
//! copying it into their scratch.
//!
//! Every buffer of a heap has a number that is the same on every rank (allocations are
//! collective and counted alike everywhere). The kernels of a communicator keep a device table
//! of `SLOTS` entries, each `[number + 1, then every rank's buffer as mapped here]`, which this
//! registry fills as the heap's buffers come and go. A rank tells its peers (number, offset) of
//! its array; they find the address in their own table and check the number, so a buffer one
//! rank dropped on its own is an error there, never a read of other memory.

use crate::error::Result;
use crate::gpu::cuda::{CuContext, CuDevicePtr, Driver};
use std::sync::{Arc, Mutex, Weak};

/// Entries a table holds: buffer `n` goes to slot `n % SLOTS` (a heap with more live buffers
/// keeps the later ones out of the table: they are copied like ordinary arrays).
pub(crate) const SLOTS: usize = 64;
/// Ranks an entry holds (Accord's kernels run at most this many).
pub(crate) const RANKS: usize = 16;
/// Words per entry.
const WORDS: usize = 1 + RANKS;
/// Offsets within a buffer take the low bits of a descriptor; the number the rest.
const OFFSET_BITS: u32 = 40;

/// A buffer of a heap.
struct Entry {
    heap: String,
    number: u64,
    ptr: u64,
    len: u64,
    /// Every rank's buffer as mapped here (0: not mapped).
    bases: [u64; RANKS],
    /// Whether the tables hold it (its slot was free when it came).
    tabled: bool,
}

impl Entry {
    fn words(&self) -> [u64; WORDS] {
        let mut w = [0u64; WORDS];
        w[0] = self.number + 1;
        w[1..].copy_from_slice(&self.bases);
        w
    }
}

/// The device table of one engine.
pub(crate) struct Table {
    cu: &'static Driver,
    ctx: usize,
    ptr: CuDevicePtr,
    heap: String,
}

impl Table {
    /// The table's device address, for the kernels.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    fn write(&self, slot: usize, words: &[u64; WORDS]) {
        if self.cu.make_current(self.ctx as CuContext).is_err() {
            return;
        }
        let at = self.ptr + (slot * WORDS * 8) as u64;
        // SAFETY: inside the table allocated in `table`; `words` lives through the copy.
        let mut rc = unsafe { (self.cu.memcpy_htod)(at, words.as_ptr().cast(), WORDS * 8) };
        if rc == 0 {
            // From pageable memory the copy may land after it returns, on the legacy stream,
            // which the kernels' non-blocking streams do not wait for.
            // SAFETY: null is the legacy default stream of the current context.
            rc = unsafe { (self.cu.stream_synchronize)(std::ptr::null_mut()) };
        }
        if let Err(e) = self.cu.check(rc, "cuMemcpyHtoD") {
            // The slot keeps its old number: a peer's lookup fails with an error, never reads.
            tracing::warn!("symmetric heap table not updated: {e}");
        }
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        if self.cu.make_current(self.ctx as CuContext).is_ok() {
            // SAFETY: allocated in `table`, freed once; the engine that owns it drained its
            // kernels before dropping it.
            unsafe { (self.cu.mem_free)(self.ptr) };
        }
    }
}

#[derive(Default)]
struct Registry {
    entries: Vec<Entry>,
    tables: Vec<Weak<Table>>,
}

impl Registry {
    fn tables_of<'a>(&'a self, heap: &'a str) -> impl Iterator<Item = Arc<Table>> + 'a {
        self.tables
            .iter()
            .filter_map(Weak::upgrade)
            .filter(move |t| t.heap == heap)
    }
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    entries: Vec::new(),
    tables: Vec::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Buffer `number` of `heap`: this rank's `ptr` (`len` bytes) and every rank's mapping
/// (`bases[rank]`, 0 for ranks not mapped here).
pub(crate) fn add(heap: &str, number: u64, ptr: u64, len: usize, bases: [u64; RANKS]) {
    let mut reg = registry();
    let slot = number as usize % SLOTS;
    let taken = reg
        .entries
        .iter()
        .any(|e| e.heap == heap && e.tabled && e.number as usize % SLOTS == slot);
    let entry = Entry {
        heap: heap.to_string(),
        number,
        ptr,
        len: len as u64,
        bases,
        tabled: !taken && (number + 1) >> (64 - OFFSET_BITS) == 0,
    };
    if entry.tabled {
        for t in reg.tables_of(heap) {
            t.write(slot, &entry.words());
        }
    }
    reg.entries.push(entry);
    reg.tables.retain(|t| t.strong_count() > 0);
}

/// This rank's buffer at `ptr` is gone.
pub(crate) fn remove(ptr: u64) {
    let mut reg = registry();
    let Some(at) = reg.entries.iter().position(|e| e.ptr == ptr) else {
        return;
    };
    let e = reg.entries.swap_remove(at);
    if e.tabled {
        for t in reg.tables_of(&e.heap) {
            t.write(e.number as usize % SLOTS, &[0; WORDS]);
        }
    }
}

/// A device table of `heap`'s buffers, on the device of context `ctx`, kept up to date until
/// dropped.
pub(crate) fn table(heap: &str, cu: &'static Driver, ctx: usize) -> Result<Arc<Table>> {
    let bytes = SLOTS * WORDS * 8;
    cu.make_current(ctx as CuContext)?;
    let mut ptr: CuDevicePtr = 0;
    // SAFETY: out-pointer to a local.
    cu.check(unsafe { (cu.mem_alloc)(&mut ptr, bytes) }, "cuMemAlloc")?;
    let table = Arc::new(Table {
        cu,
        ctx,
        ptr,
        heap: heap.to_string(),
    });
    // SAFETY: the allocation just made, whole; then the legacy stream it was cleared on.
    unsafe {
        cu.check((cu.memset_d8)(ptr, 0, bytes), "cuMemsetD8")?;
        cu.check(
            (cu.stream_synchronize)(std::ptr::null_mut()),
            "cuStreamSynchronize",
        )?;
    }
    let mut reg = registry();
    for e in reg.entries.iter().filter(|e| e.heap == heap && e.tabled) {
        table.write(e.number as usize % SLOTS, &e.words());
    }
    reg.tables.push(Arc::downgrade(&table));
    Ok(table)
}

/// What a rank tells its peers about its array `[ptr, ptr + bytes)`: 0 if it is not (wholly)
/// in a tabled buffer of `heap`, else `(number + 1) << 40 | offset`.
pub(crate) fn describe(heap: &str, ptr: u64, bytes: usize) -> u64 {
    if ptr == 0 {
        return 0;
    }
    let reg = registry();
    reg.entries
        .iter()
        .find(|e| {
            e.heap == heap
                && e.tabled
                && ptr >= e.ptr
                && ptr - e.ptr < e.len
                && (bytes as u64) <= e.len - (ptr - e.ptr)
        })
        .map_or(0, |e| {
            let off = ptr - e.ptr;
            match off >> OFFSET_BITS {
                0 => ((e.number + 1) << OFFSET_BITS) | off,
                _ => 0,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bases(a: u64) -> [u64; RANKS] {
        let mut b = [0; RANKS];
        b[0] = a;
        b[1] = a + 0x1000_0000;
        b
    }

    #[test]
    fn arrays_inside_a_tabled_buffer_are_described_by_number_and_offset() {
        let heap = "test/describe";
        add(heap, 7, 0x7000_0000, 1 << 20, bases(0x7000_0000));
        assert_eq!(describe(heap, 0x7000_0000, 1 << 20), 8 << 40);
        assert_eq!(describe(heap, 0x7000_0010, 16), (8 << 40) | 0x10);
        // Running past the end, outside, another heap, or a null pointer: not symmetric.
        assert_eq!(describe(heap, 0x7000_0010, 1 << 20), 0);
        assert_eq!(describe(heap, 0x6fff_fff0, 16), 0);
        assert_eq!(describe("test/other", 0x7000_0000, 16), 0);
        assert_eq!(describe(heap, 0, 0), 0);
        remove(0x7000_0000);
        assert_eq!(describe(heap, 0x7000_0000, 16), 0);
    }

    #[test]
    fn a_full_slot_keeps_the_later_buffer_out_of_the_table() {
        let heap = "test/slots";
        add(heap, 3, 0x1_0000_0000, 4096, bases(0x1_0000_0000));
        add(
            heap,
            3 + SLOTS as u64,
            0x2_0000_0000,
            4096,
            bases(0x2_0000_0000),
        );
        assert_ne!(describe(heap, 0x1_0000_0000, 8), 0);
        assert_eq!(describe(heap, 0x2_0000_0000, 8), 0);
        remove(0x1_0000_0000);
        remove(0x2_0000_0000);
    }
}
