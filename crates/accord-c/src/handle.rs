//! `accord_comm_t`: a communicator as C holds it, and the function table it carries.
//!
//! Every handle starts with a pointer to the table of the library that made it. C programs call
//! the exported functions, which forward a handle made by another copy of Accord (the Python
//! extension's, say) to its own table; `<accord/comms.hpp>` always calls through the table, so
//! a C++ extension needs no library of its own to use a handle Python gave it.

use crate::api::{accord_api_t, ACCORD_ABI_VERSION, API};
use crate::status::{accord_status_t, guard, invalid};
use accord::Communicator;
use std::ffi::c_void;

/// A communicator. Made by `accord_init*` or `accord_comm_split` (free it with
/// `accord_finalize`), or lent by another owner (Python's `Communicator.c_handle()`), which
/// frees it.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct accord_comm_t {
    /// The functions of the library that made this handle.
    pub api: *const accord_api_t,
    /// The library's own state; not for callers.
    pub private_: *mut c_void,
}

/// What `private_` points to.
pub(crate) struct Handle {
    pub(crate) comm: Communicator,
    /// Made here (freed by `accord_finalize`) rather than lent by another owner.
    owned: bool,
}

/// A new handle over `comm`; `owned` handles are freed by `accord_finalize`, others by
/// [`free_handle`].
pub(crate) fn new_handle(comm: Communicator, owned: bool) -> *mut accord_comm_t {
    let private_ = Box::into_raw(Box::new(Handle { comm, owned })).cast();
    Box::into_raw(Box::new(accord_comm_t {
        api: &API,
        private_,
    }))
}

/// A handle over `comm` lent to C or C++ code, which must not finalize it: its owner frees it
/// with [`free_handle`] once that code is done with it. (The Python extension's
/// `Communicator.c_handle()`.)
pub fn lend_handle(comm: Communicator) -> *mut accord_comm_t {
    new_handle(comm, false)
}

/// Free a handle made by [`lend_handle`] (the communicator itself lives on in its other owners).
///
/// # Safety
/// `h` came from [`lend_handle`] and is not used afterwards.
pub unsafe fn free_handle(h: *mut accord_comm_t) {
    if h.is_null() {
        return;
    }
    let outer = Box::from_raw(h);
    drop(Box::from_raw(outer.private_.cast::<Handle>()));
}

/// The handle behind `h`, or an error for a null or foreign one.
///
/// # Safety
/// `h` is null or a live handle.
pub(crate) unsafe fn handle<'a>(h: *const accord_comm_t) -> accord::Result<&'a Handle> {
    if h.is_null() || (*h).api.is_null() {
        return Err(invalid("the communicator handle is NULL"));
    }
    if !std::ptr::eq((*h).api, &API) {
        return Err(invalid(
            "the handle was made by another copy of Accord, whose ABI version differs",
        ));
    }
    Ok(&*(*h).private_.cast::<Handle>())
}

/// Run `f` on the communicator behind `h`, as one exported function named `what`.
///
/// # Safety
/// `h` is null or a live handle.
pub(crate) unsafe fn with_comm(
    h: *const accord_comm_t,
    what: &str,
    f: impl FnOnce(&Communicator) -> accord::Result<()>,
) -> accord_status_t {
    guard(what, || f(&handle(h)?.comm))
}

/// Close the communicator and free an owned handle.
///
/// # Safety
/// `h` is null or a live handle, not used afterwards when this succeeds.
pub(crate) unsafe fn finalize(h: *mut accord_comm_t) -> accord_status_t {
    guard("accord_finalize", || {
        if !handle(h)?.owned {
            return Err(invalid(
                "this handle is lent by its owner (e.g. Python's Communicator.c_handle()); \
                 close the communicator there",
            ));
        }
        let outer = Box::from_raw(h);
        let inner = Box::from_raw(outer.private_.cast::<Handle>());
        inner.comm.close();
        Ok(())
    })
}

/// Forward a call on a handle made by another copy of Accord (same ABI version) to that copy's
/// function: its state is of that copy's making. A failure's text is copied into this copy's,
/// so `accord_last_error` tells it. `value`: a call returning a value, not a status.
macro_rules! forward {
    (value $h:expr, $f:ident($($a:expr),* $(,)?)) => {
        if let Some(api) = $crate::handle::foreign($h) {
            return (api.$f)($($a),*);
        }
    };
    ($h:expr, $f:ident($($a:expr),* $(,)?)) => {
        if let Some(api) = $crate::handle::foreign($h) {
            let status = (api.$f)($($a),*);
            $crate::handle::take_error(api, status);
            return status;
        }
    };
}
pub(crate) use forward;

/// The table of the other copy of Accord that made `h`, if another copy (of this ABI version)
/// made it.
///
/// # Safety
/// `h` is null or a live handle.
pub(crate) unsafe fn foreign<'a>(h: *const accord_comm_t) -> Option<&'a accord_api_t> {
    if h.is_null() || (*h).api.is_null() || std::ptr::eq((*h).api, &API) {
        return None;
    }
    let api = &*(*h).api;
    (api.abi_version == ACCORD_ABI_VERSION).then_some(api)
}

/// After a call forwarded to another copy's `api`: its error text, when it failed.
pub(crate) fn take_error(api: &accord_api_t, status: accord_status_t) {
    if status != crate::status::ACCORD_SUCCESS {
        // SAFETY: the other copy returns its thread's text, a NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr((api.last_error)()) };
        crate::status::set_last(text.to_string_lossy().into_owned());
    }
}
