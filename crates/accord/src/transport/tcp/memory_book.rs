//! An address book in memory, for worlds whose ranks are threads of one process.

use super::*;

/// An [`AddressBook`] in memory, for worlds whose ranks are threads of one process (tests,
/// examples).
#[derive(Default)]
pub struct MemoryAddressBook {
    addrs: Mutex<HashMap<usize, String>>,
    published: Condvar,
}

impl MemoryAddressBook {
    /// An empty book.
    pub fn new() -> Self {
        Self::default()
    }
}

impl AddressBook for MemoryAddressBook {
    fn publish(&self, rank: usize, addr: &str) -> Result<()> {
        self.addrs.lock().unwrap().insert(rank, addr.to_string());
        self.published.notify_all();
        Ok(())
    }

    fn lookup(&self, rank: usize, deadline: Instant) -> Result<String> {
        let start = Instant::now();
        let mut addrs = self.addrs.lock().unwrap();
        loop {
            if let Some(a) = addrs.get(&rank) {
                return Ok(a.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    op: format!("address lookup of rank {rank}"),
                    seq: 0,
                    comm: "world".into(),
                    waiting_for: vec![rank],
                    after: now - start,
                    hint: " (it never published its address)".into(),
                });
            }
            addrs = self
                .published
                .wait_timeout(addrs, deadline - now)
                .unwrap()
                .0;
        }
    }
}
