//! Process exit against the watchdogs' CUDA calls. `exit` runs the `atexit` handlers and then
//! the libraries' destructors (the CUDA driver's and NCCL's among them) while other threads
//! still run. Ranks end at about the same time, so a watchdog often sees a peer that exited a
//! moment earlier as lost and aborts its engines — inside a driver being torn down, which
//! crashed processes at exit. The first watchdog registers a handler that stops them all and
//! waits for a look in progress before the destructors run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Once, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

/// Set once the process is exiting.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Held (shared) by each watchdog during a look.
static LOOKING: RwLock<()> = RwLock::new(());

extern "C" fn stop_watchdogs() {
    EXITING.store(true, Ordering::SeqCst);
    // Bounded: a child forked while a watchdog looked inherits a lock no thread will release.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        if LOOKING.try_write().is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Register the handler (once per process).
pub(super) fn register() {
    static ONCE: Once = Once::new();
    // SAFETY: registers a handler that only sets a flag and takes a lock, with a deadline.
    ONCE.call_once(|| unsafe {
        libc::atexit(stop_watchdogs);
    });
}

/// Look while this is held; `None` once the process is exiting.
pub(super) fn running() -> Option<RwLockReadGuard<'static, ()>> {
    let g = LOOKING.read().unwrap_or_else(|p| p.into_inner());
    (!EXITING.load(Ordering::SeqCst)).then_some(g)
}
