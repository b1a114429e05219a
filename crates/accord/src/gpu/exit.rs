//! Process exit against the watchdogs' CUDA calls. `exit` runs the `atexit` handlers and then
//! the libraries' destructors (the CUDA driver's and NCCL's among them) while other threads
//! still run. Ranks end at about the same time, so a watchdog often sees a peer that exited a
//! moment earlier as lost and aborts its engines — inside a driver being torn down, which
//! crashed processes at exit. The first watchdog registers a handler that waits for any
//! watchdog's look in progress and stops them all before the destructors run.

use std::sync::{Once, RwLock, RwLockReadGuard};

/// `true` once the process is exiting. Watchdogs hold the read side during a look.
static EXITING: RwLock<bool> = RwLock::new(false);

extern "C" fn stop_watchdogs() {
    *EXITING.write().unwrap_or_else(|p| p.into_inner()) = true;
}

/// Register the handler (once per process).
pub(super) fn register() {
    static ONCE: Once = Once::new();
    // SAFETY: registers a handler that only takes a lock and sets a flag.
    ONCE.call_once(|| unsafe {
        libc::atexit(stop_watchdogs);
    });
}

/// Leave to look while this is held; `None` once the process is exiting.
pub(super) fn running() -> Option<RwLockReadGuard<'static, bool>> {
    let g = EXITING.read().unwrap_or_else(|p| p.into_inner());
    (!*g).then_some(g)
}
