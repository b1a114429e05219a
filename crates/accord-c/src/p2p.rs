//! Point-to-point messages, requests, and groups.
//!
//! Host messages keep MPI's order per (peer, tag); device messages are enqueued on their stream
//! and matched in call order (tag 0 only, as NCCL). A nonblocking host message takes its place
//! in that order when it is called and moves on a thread of its own; `accord_wait` waits for it.
//! Between `accord_group_start` and `accord_group_end` device operations are launched together
//! (NCCL's group) and host messages become nonblocking ones that the group's end waits for, so
//! a group may post its receives before its sends on every rank without deadlock.

use crate::api::{accord_api_t, API};
use crate::handle::{accord_comm_t, forward, with_comm};
use crate::memory::{place, Place};
use crate::status::{accord_status_t, guard, invalid, ACCORD_SUCCESS};
use crate::types::{self, accord_dtype_t, accord_stream_t};
use accord::{Communicator, Completion, Result};
use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Condvar, Mutex};

/// A nonblocking operation: finish it with `accord_wait` (or `accord_waitall`), which frees it.
/// Like a communicator handle it starts with its library's table, so a request made through a
/// handle of another copy of Accord is finished by that copy.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct accord_request_t {
    /// The functions of the library that made the request.
    pub api: *const accord_api_t,
    /// The library's own state; not for callers.
    pub private_: *mut c_void,
}

/// What `private_` points to.
struct Request {
    pending: Pending,
}

impl Request {
    fn into_raw(self) -> *mut accord_request_t {
        let private_ = Box::into_raw(Box::new(self)).cast();
        Box::into_raw(Box::new(accord_request_t {
            api: &API,
            private_,
        }))
    }

    /// Take back a request this copy made (freeing the handle).
    ///
    /// # Safety
    /// `r` came from [`Request::into_raw`] of this copy and is not used afterwards.
    unsafe fn from_raw(r: *mut accord_request_t) -> Box<Request> {
        let outer = Box::from_raw(r);
        Box::from_raw(outer.private_.cast::<Request>())
    }
}

/// The table of another copy that made `r` (whose wait and test must be its own).
///
/// # Safety
/// `r` is a live request.
unsafe fn foreign_request<'a>(r: *const accord_request_t) -> Option<&'a accord_api_t> {
    let api = (*r).api;
    (!api.is_null() && !std::ptr::eq(api, &API)).then(|| &*api)
}

enum Pending {
    /// A host message moving on a thread.
    Host(Arc<Done>),
    /// Device work on a stream.
    Device(Completion),
}

/// What a host message's thread reports.
#[derive(Default)]
struct Done {
    result: Mutex<Option<Result<()>>>,
    cv: Condvar,
}

impl Done {
    fn finish(&self, r: Result<()>) {
        *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        self.cv.notify_all();
    }

    fn wait(&self) -> Result<()> {
        let mut g = self.result.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = g.as_ref() {
                return r.clone();
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn test(&self) -> Option<Result<()>> {
        self.result
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Request {
    fn wait(&self) -> Result<()> {
        match &self.pending {
            Pending::Host(d) => d.wait(),
            Pending::Device(c) => c.wait(),
        }
    }

    fn test(&self) -> Result<bool> {
        match &self.pending {
            Pending::Host(d) => d.test().map_or(Ok(false), |r| r.map(|()| true)),
            Pending::Device(c) => c.test(),
        }
    }
}

/// A caller's buffer address, moved to the thread that fills or reads it.
#[derive(Clone, Copy)]
struct Addr(usize);

/// One message: which way, the buffer, its count and dtype, the peer and tag.
#[derive(Clone, Copy)]
struct Message {
    send: bool,
    buf: Addr,
    count: usize,
    dtype: accord_dtype_t,
    peer: c_int,
    tag: c_int,
}

thread_local! {
    /// Open `accord_group_start` depth of this thread, and the host messages its groups
    /// posted (waited for by the outermost end).
    static GROUP: RefCell<(usize, Vec<Request>)> = const { RefCell::new((0, Vec::new())) };
}

fn in_group() -> bool {
    GROUP.with(|g| g.borrow().0 > 0)
}

/// The message's dtype, peer and tag, checked.
fn checked(c: &Communicator, m: Message) -> Result<(accord::DataType, usize, u32)> {
    let what = match m.send {
        true => "peer (destination)",
        false => "peer (source)",
    };
    Ok((
        types::dtype(m.dtype)?,
        types::rank(m.peer, what, c.size())?,
        types::tag(m.tag)?,
    ))
}

/// Start `m` on `c`: a request (host: its place in the order taken now, the data moved on a
/// thread; device: enqueued on `stream`).
///
/// # Safety
/// The buffer holds `m.count` elements until the request is finished.
unsafe fn start(c: &Communicator, m: Message, stream: accord_stream_t) -> Result<Request> {
    let (dt, peer, tag) = checked(c, m)?;
    let ptr = m.buf.0 as *mut c_void;
    let at = place(c, &[("buf", ptr)], stream)?;
    if let Place::Device(..) = at {
        if tag != 0 {
            return Err(invalid(format!(
                "tag {tag} on device memory: device messages are matched in call order (as \
                 NCCL's); pass tag 0"
            )));
        }
        let done = match m.send {
            true => c.send(at.send(ptr, m.count, dt, "buf")?, peer, 0)?,
            false => c.recv(at.recv(ptr, m.count, dt, "buf")?, peer, 0)?,
        };
        return Ok(Request {
            pending: Pending::Device(done),
        });
    }
    // Check the buffer now, so that a bad one fails the call rather than its request.
    at.send(ptr, m.count, dt, "buf")?;
    let turn = match m.send {
        true => c.post_send(peer, tag)?,
        false => c.post_recv(peer, tag)?,
    };
    let done = Arc::new(Done::default());
    let (d2, c2) = (done.clone(), c.clone());
    std::thread::Builder::new()
        .name("accord-c-message".into())
        .spawn(move || {
            let buf = m.buf;
            // SAFETY: the caller keeps the buffer until the request is finished.
            let r = unsafe {
                let ptr = buf.0 as *mut c_void;
                match m.send {
                    true => Place::Host
                        .send(ptr, m.count, dt, "buf")
                        .and_then(|b| c2.send_posted(turn, b)),
                    false => Place::Host
                        .recv(ptr, m.count, dt, "buf")
                        .and_then(|b| c2.recv_posted(turn, b)),
                }
            };
            d2.finish(r);
        })
        .map_err(|e| invalid(format!("cannot start a thread for the message: {e}")))?;
    Ok(Request {
        pending: Pending::Host(done),
    })
}

/// A blocking message: done before it returns (device: enqueued); inside a group, a
/// nonblocking one the group's end waits for.
unsafe fn blocking(
    comm: *mut accord_comm_t,
    what: &str,
    m: Message,
    stream: accord_stream_t,
) -> accord_status_t {
    with_comm(comm, what, |c| {
        if in_group() {
            let req = start(c, m, stream)?;
            if let Pending::Host(_) = req.pending {
                GROUP.with(|g| g.borrow_mut().1.push(req));
            }
            return Ok(());
        }
        let (dt, peer, tag) = checked(c, m)?;
        let ptr = m.buf.0 as *mut c_void;
        let at = place(c, &[("buf", ptr)], stream)?;
        match m.send {
            true => c.send(at.send(ptr, m.count, dt, "buf")?, peer, tag),
            false => c.recv(at.recv(ptr, m.count, dt, "buf")?, peer, tag),
        }
        .map(drop)
    })
}

/// A nonblocking message into `*request`.
unsafe fn nonblocking(
    comm: *mut accord_comm_t,
    what: &str,
    m: Message,
    stream: accord_stream_t,
    request: *mut *mut accord_request_t,
) -> accord_status_t {
    with_comm(comm, what, |c| {
        if request.is_null() {
            return Err(invalid("`request` (the output argument) is NULL"));
        }
        *request = start(c, m, stream)?.into_raw();
        Ok(())
    })
}

fn message(send: bool, buf: *const c_void, count: usize, dtype: accord_dtype_t) -> Message {
    Message {
        send,
        buf: Addr(buf as usize),
        count,
        dtype,
        peer: 0,
        tag: 0,
    }
}

/// Send `count` elements to `peer` with `tag` (host: returns once the data is handed to the
/// transport; device: enqueued on `stream`, tag 0).
#[no_mangle]
pub unsafe extern "C" fn accord_send(
    comm: *mut accord_comm_t,
    buf: *const c_void,
    count: usize,
    dtype: accord_dtype_t,
    peer: c_int,
    tag: c_int,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(comm, send(comm, buf, count, dtype, peer, tag, stream));
    let m = Message {
        peer,
        tag,
        ..message(true, buf, count, dtype)
    };
    blocking(comm, "accord_send", m, stream)
}

/// Receive exactly `count` elements from `peer` with `tag`.
#[no_mangle]
pub unsafe extern "C" fn accord_recv(
    comm: *mut accord_comm_t,
    buf: *mut c_void,
    count: usize,
    dtype: accord_dtype_t,
    peer: c_int,
    tag: c_int,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(comm, recv(comm, buf, count, dtype, peer, tag, stream));
    let m = Message {
        peer,
        tag,
        ..message(false, buf, count, dtype)
    };
    blocking(comm, "accord_recv", m, stream)
}

/// Start sending; `*request` finishes it.
#[no_mangle]
pub unsafe extern "C" fn accord_isend(
    comm: *mut accord_comm_t,
    buf: *const c_void,
    count: usize,
    dtype: accord_dtype_t,
    peer: c_int,
    tag: c_int,
    stream: accord_stream_t,
    request: *mut *mut accord_request_t,
) -> accord_status_t {
    forward!(
        comm,
        isend(comm, buf, count, dtype, peer, tag, stream, request)
    );
    let m = Message {
        peer,
        tag,
        ..message(true, buf, count, dtype)
    };
    nonblocking(comm, "accord_isend", m, stream, request)
}

/// Start receiving; `*request` finishes it.
#[no_mangle]
pub unsafe extern "C" fn accord_irecv(
    comm: *mut accord_comm_t,
    buf: *mut c_void,
    count: usize,
    dtype: accord_dtype_t,
    peer: c_int,
    tag: c_int,
    stream: accord_stream_t,
    request: *mut *mut accord_request_t,
) -> accord_status_t {
    forward!(
        comm,
        irecv(comm, buf, count, dtype, peer, tag, stream, request)
    );
    let m = Message {
        peer,
        tag,
        ..message(false, buf, count, dtype)
    };
    nonblocking(comm, "accord_irecv", m, stream, request)
}

/// Send `sendcount` elements to `dest` and receive `recvcount` from `source` at once (no
/// deadlock between ranks that exchange with each other).
#[no_mangle]
pub unsafe extern "C" fn accord_sendrecv(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    sendcount: usize,
    dest: c_int,
    recvbuf: *mut c_void,
    recvcount: usize,
    source: c_int,
    dtype: accord_dtype_t,
    tag: c_int,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(
        comm,
        sendrecv(comm, sendbuf, sendcount, dest, recvbuf, recvcount, source, dtype, tag, stream)
    );
    with_comm(comm, "accord_sendrecv", |c| {
        let dt = types::dtype(dtype)?;
        let dest = types::rank(dest, "dest", c.size())?;
        let source = types::rank(source, "source", c.size())?;
        let at = place(c, &[("sendbuf", sendbuf), ("recvbuf", recvbuf)], stream)?;
        let tag = types::tag(tag)?;
        at.pair(
            (sendbuf, sendcount),
            (recvbuf, recvcount),
            dt,
            |send, recv| c.sendrecv(send, dest, recv, source, tag),
        )
        .map(drop)
    })
}

/// Wait for a request and free it (NULL: nothing to do). The message's error, if it failed.
#[no_mangle]
pub unsafe extern "C" fn accord_wait(request: *mut accord_request_t) -> accord_status_t {
    if !request.is_null() {
        if let Some(api) = foreign_request(request) {
            let status = (api.wait)(request);
            crate::handle::take_error(api, status);
            return status;
        }
    }
    guard("accord_wait", || match request.is_null() {
        true => Ok(()),
        false => Request::from_raw(request).wait(),
    })
}

/// `*done` = 1 if the request finished (it still needs `accord_wait`), else 0.
#[no_mangle]
pub unsafe extern "C" fn accord_test(
    request: *mut accord_request_t,
    done: *mut c_int,
) -> accord_status_t {
    if !request.is_null() {
        if let Some(api) = foreign_request(request) {
            let status = (api.test)(request, done);
            crate::handle::take_error(api, status);
            return status;
        }
    }
    guard("accord_test", || {
        if request.is_null() || done.is_null() {
            return Err(invalid("`request` or `done` is NULL"));
        }
        *done = (*(*request).private_.cast::<Request>()).test()? as c_int;
        Ok(())
    })
}

/// Wait for every request of `requests[0..count]` and free them all (NULL entries are
/// skipped; each entry is set to NULL); the first error (and its text).
#[no_mangle]
pub unsafe extern "C" fn accord_waitall(
    count: usize,
    requests: *mut *mut accord_request_t,
) -> accord_status_t {
    if requests.is_null() && count > 0 {
        return guard("accord_waitall", || Err(invalid("`requests` is NULL")));
    }
    let mut first: Option<(accord_status_t, String)> = None;
    for i in 0..count {
        let r = std::mem::replace(&mut *requests.add(i), std::ptr::null_mut());
        let status = accord_wait(r);
        if status != ACCORD_SUCCESS && first.is_none() {
            let text = std::ffi::CStr::from_ptr(crate::status::last());
            first = Some((status, text.to_string_lossy().into_owned()));
        }
    }
    match first {
        None => ACCORD_SUCCESS,
        Some((status, text)) => {
            crate::status::set_last(text);
            status
        }
    }
}

/// Start a group on this thread: device operations until the matching `accord_group_end` are
/// launched together (NCCL's group), host messages wait for its end. Groups nest. Groups belong
/// to the library that runs the calls: with a handle lent by another copy of Accord (Python's),
/// call `comm->api->group_start()` / `group_end()` (as `<accord/comms.hpp>` does).
#[no_mangle]
pub extern "C" fn accord_group_start() -> accord_status_t {
    guard("accord_group_start", || {
        accord::gpu::group_start()?;
        GROUP.with(|g| g.borrow_mut().0 += 1);
        Ok(())
    })
}

/// End this thread's innermost group; the outermost launches the device operations and waits
/// for the host messages of the group (the first error).
#[no_mangle]
pub extern "C" fn accord_group_end() -> accord_status_t {
    guard("accord_group_end", || {
        let posted = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.0 == 0 {
                return Err(invalid("accord_group_end without accord_group_start"));
            }
            g.0 -= 1;
            Ok(if g.0 == 0 {
                std::mem::take(&mut g.1)
            } else {
                Vec::new()
            })
        })?;
        let launched = accord::gpu::group_end();
        posted.iter().fold(launched, |r, req| r.and(req.wait()))
    })
}
