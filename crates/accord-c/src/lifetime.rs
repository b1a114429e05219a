//! Making, splitting and ending communicators; rank and size; barrier, abort, deadlines, the
//! device and its streams.

use crate::handle::{accord_comm_t, finalize, forward, handle, new_handle, with_comm};
use crate::status::{self, accord_status_t, guard, invalid};
use crate::types::accord_stream_t;
use accord::gpu::Stream;
use accord::rendezvous::{self, InitMethod};
use accord::Communicator;
use std::ffi::{c_char, c_double, c_int, CStr};
use std::time::Duration;

/// Store a new owned handle in `*out`.
unsafe fn give(out: *mut *mut accord_comm_t, comm: Communicator) -> accord::Result<()> {
    *out = new_handle(comm, true);
    Ok(())
}

unsafe fn out_ok(out: *mut *mut accord_comm_t) -> accord::Result<()> {
    match out.is_null() {
        true => Err(invalid("`comm` (the output argument) is NULL")),
        false => Ok(()),
    }
}

unsafe fn text<'a>(s: *const c_char, what: &str) -> accord::Result<&'a str> {
    if s.is_null() {
        return Err(invalid(format!("`{what}` is NULL")));
    }
    CStr::from_ptr(s)
        .to_str()
        .map_err(|_| invalid(format!("`{what}` is not UTF-8")))
}

/// `-1`: from the environment; otherwise a count.
fn opt(v: c_int, what: &str) -> accord::Result<Option<usize>> {
    match v {
        -1 => Ok(None),
        v => usize::try_from(v).map(Some).map_err(|_| {
            invalid(format!(
                "`{what}` is {v}; pass -1 to read it from the environment"
            ))
        }),
    }
}

/// Join the job the environment describes (`accord run`, torchrun, mpirun with `MASTER_ADDR` /
/// `MASTER_PORT`, Slurm) and store the world communicator in `*comm`.
#[no_mangle]
pub unsafe extern "C" fn accord_init(comm: *mut *mut accord_comm_t) -> accord_status_t {
    guard("accord_init", || {
        out_ok(comm)?;
        give(comm, accord::init()?)
    })
}

/// Join through `url` (`env://`, `tcp://host:port`, `file:///shared/path`); `rank` and `size`
/// override the environment unless -1.
#[no_mangle]
pub unsafe extern "C" fn accord_init_url(
    url: *const c_char,
    rank: c_int,
    size: c_int,
    comm: *mut *mut accord_comm_t,
) -> accord_status_t {
    guard("accord_init_url", || {
        out_ok(comm)?;
        let url = text(url, "url")?;
        give(
            comm,
            accord::init_with(url, opt(rank, "rank")?, opt(size, "size")?)?,
        )
    })
}

/// Join a group whose rendezvous store already runs at `address` (`host:port`, e.g. a store of
/// `accord store` or of Python's `accord.StoreServer`) with `token`, as rank `rank` of `size`.
#[no_mangle]
pub unsafe extern "C" fn accord_init_store(
    address: *const c_char,
    token: *const c_char,
    rank: c_int,
    size: c_int,
    comm: *mut *mut accord_comm_t,
) -> accord_status_t {
    guard("accord_init_store", || {
        out_ok(comm)?;
        let method = InitMethod::parse(&format!("tcp://{}", text(address, "address")?))?;
        let token = text(token, "token")?.to_string();
        let (rank, size) = (opt(rank, "rank")?, opt(size, "size")?);
        if rank.is_none() || size.is_none() {
            return Err(invalid(
                "accord_init_store needs `rank` and `size` (not -1)",
            ));
        }
        let timeout = accord::comm::timeout_from_env();
        let vars = move |k: &str| match k {
            "ACCORD_TOKEN" => Some(token.clone()),
            "ACCORD_STORE_EXTERNAL" => Some("1".into()),
            _ => std::env::var(k).ok(),
        };
        let rdv = rendezvous::init_with_vars(&method, rank, size, Some(timeout), vars)?;
        give(comm, accord::from_rendezvous(rdv, timeout)?)
    })
}

/// Close the communicator (the world's says goodbye to its peers) and free the handle. Only
/// for handles made by `accord_init*` or `accord_comm_split`.
#[no_mangle]
pub unsafe extern "C" fn accord_finalize(comm: *mut accord_comm_t) -> accord_status_t {
    forward!(comm, finalize(comm));
    finalize(comm)
}

/// This rank (0-based), or -1 for a bad handle.
#[no_mangle]
pub unsafe extern "C" fn accord_comm_rank(comm: *const accord_comm_t) -> c_int {
    forward!(value comm, comm_rank(comm));
    handle(comm).map_or(-1, |h| h.comm.rank() as c_int)
}

/// Number of ranks, or -1 for a bad handle.
#[no_mangle]
pub unsafe extern "C" fn accord_comm_size(comm: *const accord_comm_t) -> c_int {
    forward!(value comm, comm_size(comm));
    handle(comm).map_or(-1, |h| h.comm.size() as c_int)
}

/// Split by `color` (ranks of one color form a communicator, ordered by `key`, then by rank);
/// `*out` is NULL on ranks that pass `ACCORD_UNDEFINED`. Collective.
#[no_mangle]
pub unsafe extern "C" fn accord_comm_split(
    comm: *mut accord_comm_t,
    color: c_int,
    key: c_int,
    out: *mut *mut accord_comm_t,
) -> accord_status_t {
    forward!(comm, comm_split(comm, color, key, out));
    with_comm(comm, "accord_comm_split", |c| {
        out_ok(out)?;
        let color =
            match color {
                crate::types::ACCORD_UNDEFINED => None,
                c => Some(u32::try_from(c).map_err(|_| {
                    invalid(format!("color {c} is negative (ACCORD_UNDEFINED is -1)"))
                })?),
            };
        *out = std::ptr::null_mut();
        match c.split(color, key as i64)? {
            Some(child) => give(out, child),
            None => Ok(()),
        }
    })
}

/// The deadline of every later blocking call, in seconds (default `ACCORD_TIMEOUT` or 300).
#[no_mangle]
pub unsafe extern "C" fn accord_comm_set_timeout(
    comm: *mut accord_comm_t,
    seconds: c_double,
) -> accord_status_t {
    forward!(comm, comm_set_timeout(comm, seconds));
    with_comm(comm, "accord_comm_set_timeout", |c| {
        if !(seconds.is_finite() && seconds > 0.0) {
            return Err(invalid(format!(
                "timeout {seconds} is not a positive number of seconds"
            )));
        }
        c.set_timeout(Duration::from_secs_f64(seconds));
        Ok(())
    })
}

/// Wait until every rank has entered the barrier.
#[no_mangle]
pub unsafe extern "C" fn accord_barrier(comm: *mut accord_comm_t) -> accord_status_t {
    forward!(comm, barrier(comm));
    with_comm(comm, "accord_barrier", |c| c.barrier())
}

/// Give up on the whole world: the peers' pending and later calls fail naming this rank and
/// `reason` (may be NULL).
#[no_mangle]
pub unsafe extern "C" fn accord_abort(
    comm: *mut accord_comm_t,
    reason: *const c_char,
) -> accord_status_t {
    forward!(comm, abort(comm, reason));
    with_comm(comm, "accord_abort", |c| {
        let why = match reason.is_null() {
            true => "accord_abort".to_string(),
            false => CStr::from_ptr(reason).to_string_lossy().into_owned(),
        };
        c.abort(&why);
        Ok(())
    })
}

/// Attach CUDA device `device` to the communicator (collective). Calls on device memory do it
/// themselves the first time; call it first where the first device call is not collective
/// (e.g. a point-to-point message).
#[no_mangle]
pub unsafe extern "C" fn accord_attach_device(
    comm: *mut accord_comm_t,
    device: c_int,
) -> accord_status_t {
    forward!(comm, attach_device(comm, device));
    with_comm(comm, "accord_attach_device", |c| {
        let d =
            usize::try_from(device).map_err(|_| invalid(format!("device {device} is negative")))?;
        c.attach_device(d)
    })
}

/// Wait until everything enqueued on `stream` so far has finished (the caller's kernels too),
/// within the communicator's timeout: ACCORD_SUCCESS, or the communicator's failure (a peer
/// lost, an abort, a desync, a timeout naming who is missing) as soon as it is known. RAFT's
/// `sync_stream`. Before a device is attached, the stream is waited for in the calling thread's
/// current CUDA context (nothing to wait for in a process without CUDA).
#[no_mangle]
pub unsafe extern "C" fn accord_stream_sync(
    comm: *mut accord_comm_t,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(comm, stream_sync(comm, stream));
    with_comm(comm, "accord_stream_sync", |c| {
        if c.attached_device().is_none() && crate::memory::cuda_loaded() {
            let cu = accord::gpu::cuda::driver()?;
            if !cu.wait_stream(stream as usize, c.timeout())? {
                return Err(accord::Error::Timeout {
                    op: "sync_stream".into(),
                    seq: 0,
                    comm: c.name().into(),
                    waiting_for: vec![],
                    after: c.timeout(),
                    hint: "; the work on the stream did not finish (no device is attached to \
                           the communicator: it is the caller's own)"
                        .into(),
                });
            }
        }
        c.sync_stream(Stream::Raw(stream as usize))
    })
}

/// `ACCORD_SUCCESS` if the communicator can still be used, else why not (it failed, was
/// aborted, or lost a peer): RAFT's `sync_stream` result without a stream.
#[no_mangle]
pub unsafe extern "C" fn accord_comm_check(comm: *const accord_comm_t) -> accord_status_t {
    forward!(comm, comm_check(comm));
    guard("accord_comm_check", || {
        let c = &handle(comm)?.comm;
        c.poisoned().map_or(Ok(()), Err)
    })
}

/// The text of this thread's last error (empty if none); valid until this thread's next
/// failing call.
#[no_mangle]
pub extern "C" fn accord_last_error() -> *const c_char {
    status::last()
}

/// The name of a status code, e.g. `"ACCORD_ERROR_TIMEOUT"`.
#[no_mangle]
pub extern "C" fn accord_status_name(status: accord_status_t) -> *const c_char {
    status::name(status).as_ptr().cast()
}

/// Accord's version, e.g. `"0.1.0"`.
#[no_mangle]
pub extern "C" fn accord_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
