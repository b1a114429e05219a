//! Status codes, this thread's last error text, and the guard every exported function runs in
//! (no panic crosses the C boundary).

use accord::Error;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What every function of the ABI returns: `ACCORD_SUCCESS` (0) or an `ACCORD_ERROR_*` code.
#[allow(non_camel_case_types)]
pub type accord_status_t = i32;

/// The call succeeded (for device memory: it was enqueued).
pub const ACCORD_SUCCESS: accord_status_t = 0;
/// A bad argument: a null handle, a wrong count, dtype, root or rank, mixed memory kinds.
pub const ACCORD_ERROR_INVALID_ARGUMENT: accord_status_t = 1;
/// A peer did not arrive before the deadline (the text names it, the op and its sequence number).
pub const ACCORD_ERROR_TIMEOUT: accord_status_t = 2;
/// Ranks called different operations, counts, dtypes or roots (the text names both calls).
pub const ACCORD_ERROR_DESYNC: accord_status_t = 3;
/// A peer died or closed its communicator.
pub const ACCORD_ERROR_PEER_LOST: accord_status_t = 4;
/// The communicator was aborted (by this rank or a peer, whose reason the text gives).
pub const ACCORD_ERROR_ABORTED: accord_status_t = 5;
/// Not supported here (e.g. an operation the attached device engine cannot run).
pub const ACCORD_ERROR_UNSUPPORTED: accord_status_t = 6;
/// A peer or the store did not prove knowledge of the job's token.
pub const ACCORD_ERROR_UNAUTHORIZED: accord_status_t = 7;
/// Garbage on a connection.
pub const ACCORD_ERROR_PROTOCOL: accord_status_t = 8;
/// An operating-system error (socket, shared memory).
pub const ACCORD_ERROR_IO: accord_status_t = 9;
/// The rendezvous store failed.
pub const ACCORD_ERROR_STORE: accord_status_t = 10;
/// CUDA or NCCL failed.
pub const ACCORD_ERROR_GPU: accord_status_t = 11;
/// A bug in Accord (a caught panic); the text says where.
pub const ACCORD_ERROR_INTERNAL: accord_status_t = 12;

/// The status code of an error.
pub(crate) fn code(e: &Error) -> accord_status_t {
    match e {
        Error::InvalidArgument(_) => ACCORD_ERROR_INVALID_ARGUMENT,
        Error::Timeout { .. } => ACCORD_ERROR_TIMEOUT,
        Error::Desync { .. } => ACCORD_ERROR_DESYNC,
        Error::PeerLost { .. } => ACCORD_ERROR_PEER_LOST,
        Error::Aborted { .. } => ACCORD_ERROR_ABORTED,
        Error::Unsupported(_) => ACCORD_ERROR_UNSUPPORTED,
        Error::Unauthorized(_) => ACCORD_ERROR_UNAUTHORIZED,
        Error::Protocol(_) => ACCORD_ERROR_PROTOCOL,
        Error::Io { .. } => ACCORD_ERROR_IO,
        Error::Store(_) => ACCORD_ERROR_STORE,
        Error::Gpu { .. } => ACCORD_ERROR_GPU,
        _ => ACCORD_ERROR_INTERNAL,
    }
}

/// The name of a status code (`"ACCORD_ERROR_TIMEOUT"`), or `"unknown status"`.
pub(crate) fn name(status: accord_status_t) -> &'static [u8] {
    match status {
        ACCORD_SUCCESS => b"ACCORD_SUCCESS\0",
        ACCORD_ERROR_INVALID_ARGUMENT => b"ACCORD_ERROR_INVALID_ARGUMENT\0",
        ACCORD_ERROR_TIMEOUT => b"ACCORD_ERROR_TIMEOUT\0",
        ACCORD_ERROR_DESYNC => b"ACCORD_ERROR_DESYNC\0",
        ACCORD_ERROR_PEER_LOST => b"ACCORD_ERROR_PEER_LOST\0",
        ACCORD_ERROR_ABORTED => b"ACCORD_ERROR_ABORTED\0",
        ACCORD_ERROR_UNSUPPORTED => b"ACCORD_ERROR_UNSUPPORTED\0",
        ACCORD_ERROR_UNAUTHORIZED => b"ACCORD_ERROR_UNAUTHORIZED\0",
        ACCORD_ERROR_PROTOCOL => b"ACCORD_ERROR_PROTOCOL\0",
        ACCORD_ERROR_IO => b"ACCORD_ERROR_IO\0",
        ACCORD_ERROR_STORE => b"ACCORD_ERROR_STORE\0",
        ACCORD_ERROR_GPU => b"ACCORD_ERROR_GPU\0",
        ACCORD_ERROR_INTERNAL => b"ACCORD_ERROR_INTERNAL\0",
        _ => b"unknown status\0",
    }
}

thread_local! {
    /// This thread's last error text (what `accord_last_error` returns).
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Remember `text` as this thread's last error.
pub(crate) fn set_last(text: String) {
    let text = CString::new(text.replace('\0', " ")).unwrap_or_default();
    // `try_with`: a call from a thread-local destructor finds the text gone, and keeps none.
    let _ = LAST.try_with(|l| *l.borrow_mut() = text);
}

/// This thread's last error text; valid until this thread's next failing call.
pub(crate) fn last() -> *const c_char {
    LAST.try_with(|l| l.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// Run one exported function's body: its error becomes a status code and this thread's last
/// error text (prefixed with the function's name), a panic `ACCORD_ERROR_INTERNAL`.
pub(crate) fn guard(what: &str, f: impl FnOnce() -> accord::Result<()>) -> accord_status_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ACCORD_SUCCESS,
        Ok(Err(e)) => {
            set_last(format!("{what}: {e}"));
            code(&e)
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last(format!("{what}: internal error (please report): {msg}"));
            ACCORD_ERROR_INTERNAL
        }
    }
}

/// An invalid-argument error for the guard.
pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::invalid(msg)
}
