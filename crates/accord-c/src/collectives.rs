//! The collectives. Each checks its arguments, finds where its buffers live
//! (`memory::place`) and calls the one core method, on host or device memory alike.
//!
//! Reducing and broadcasting calls work in place when `sendbuf` is NULL or equals `recvbuf`.
//! The `v` variants take per-rank counts (every rank passes the same ones) and optional
//! displacements (NULL: blocks back to back).

use crate::handle::{accord_comm_t, forward, with_comm};
use crate::memory::place;
use crate::status::{accord_status_t, invalid};
use crate::types::{self, accord_dtype_t, accord_op_t, accord_stream_t};
use accord::{Communicator, Completion, Parts, RecvBuf, ReduceOp, Result, SendBuf};
use std::ffi::{c_int, c_void};

/// `count` elements for each of `ranks` ranks, or an error naming the overflow.
fn times(count: usize, ranks: usize, what: &str) -> Result<usize> {
    count
        .checked_mul(ranks)
        .ok_or_else(|| invalid(format!("`{what}` ({count}) times {ranks} ranks overflows")))
}

/// Whether a reducing or broadcasting call works in place.
fn in_place(send: *const c_void, recv: *const c_void) -> bool {
    send.is_null() || send == recv
}

/// `n` counts (or displacements) at `p`, or an error naming them.
unsafe fn counts<'a>(p: *const usize, n: usize, what: &str) -> Result<&'a [usize]> {
    match p.is_null() {
        true => Err(invalid(format!("`{what}` is NULL"))),
        false => Ok(std::slice::from_raw_parts(p, n)),
    }
}

/// Elements a buffer of `counts` blocks at `displs` spans (back to back when `displs` is
/// NULL); empty blocks may sit anywhere (as in MPI) and span nothing.
fn span(counts: &[usize], displs: Option<&[usize]>) -> Result<usize> {
    let overflow = || invalid("the counts and displacements overflow the address space");
    match displs {
        None => counts
            .iter()
            .try_fold(0usize, |a, &c| a.checked_add(c))
            .ok_or_else(overflow),
        Some(d) => counts
            .iter()
            .zip(d)
            .filter(|(&c, _)| c > 0)
            .try_fold(0usize, |a, (&c, &d)| Some(a.max(c.checked_add(d)?)))
            .ok_or_else(overflow),
    }
}

/// `n` displacements at `p`, or `None` for NULL.
unsafe fn displs<'a>(p: *const usize, n: usize) -> Option<&'a [usize]> {
    (!p.is_null()).then(|| std::slice::from_raw_parts(p, n))
}

/// One of the in-place-able reductions, out of place (`Some(send)`) or in place.
type Reducing = fn(&Communicator, Option<SendBuf<'_>>, RecvBuf<'_>, ReduceOp) -> Result<Completion>;

/// The in-place-able reductions: allreduce, scan, exscan.
unsafe fn reducing(
    comm: *mut accord_comm_t,
    what: &str,
    (sendbuf, recvbuf, count): (*const c_void, *mut c_void, usize),
    (dtype, op, stream): (accord_dtype_t, accord_op_t, accord_stream_t),
    call: Reducing,
) -> accord_status_t {
    with_comm(comm, what, |c| {
        let (dt, op) = (types::dtype(dtype)?, types::op(op)?);
        let at = place(c, &[("sendbuf", sendbuf), ("recvbuf", recvbuf)], stream)?;
        match in_place(sendbuf, recvbuf) {
            true => call(c, None, at.recv(recvbuf, count, dt, "recvbuf")?, op),
            false => at.pair((sendbuf, count), (recvbuf, count), dt, |send, recv| {
                call(c, Some(send), recv, op)
            }),
        }
        .map(drop)
    })
}

/// Reduce every rank's `count` elements with `op`; every rank gets the result in `recvbuf`.
#[no_mangle]
pub unsafe extern "C" fn accord_allreduce(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: accord_dtype_t,
    op: accord_op_t,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(
        comm,
        allreduce(comm, sendbuf, recvbuf, count, dtype, op, stream)
    );
    reducing(
        comm,
        "accord_allreduce",
        (sendbuf, recvbuf, count),
        (dtype, op, stream),
        |c, s, r, op| match s {
            None => c.all_reduce(r, op),
            Some(s) => c.all_reduce((s, r), op),
        },
    )
}

/// Inclusive prefix reduction: rank r gets the reduction of ranks 0..=r.
#[no_mangle]
pub unsafe extern "C" fn accord_scan(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: accord_dtype_t,
    op: accord_op_t,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(comm, scan(comm, sendbuf, recvbuf, count, dtype, op, stream));
    reducing(
        comm,
        "accord_scan",
        (sendbuf, recvbuf, count),
        (dtype, op, stream),
        |c, s, r, op| match s {
            None => c.scan(r, op),
            Some(s) => c.scan((s, r), op),
        },
    )
}

/// Exclusive prefix reduction: rank r gets the reduction of ranks 0..r (rank 0's `recvbuf` is
/// left as it was).
#[no_mangle]
pub unsafe extern "C" fn accord_exscan(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: accord_dtype_t,
    op: accord_op_t,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(
        comm,
        exscan(comm, sendbuf, recvbuf, count, dtype, op, stream)
    );
    reducing(
        comm,
        "accord_exscan",
        (sendbuf, recvbuf, count),
        (dtype, op, stream),
        |c, s, r, op| match s {
            None => c.exscan(r, op),
            Some(s) => c.exscan((s, r), op),
        },
    )
}

/// Copy `root`'s `count` elements into every rank's `recvbuf` (`root` reads `sendbuf`, or
/// `recvbuf` in place).
#[no_mangle]
pub unsafe extern "C" fn accord_broadcast(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: accord_dtype_t,
    root: c_int,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(
        comm,
        broadcast(comm, sendbuf, recvbuf, count, dtype, root, stream)
    );
    with_comm(comm, "accord_broadcast", |c| {
        let (dt, root) = (types::dtype(dtype)?, types::rank(root, "root", c.size())?);
        let at = place(c, &[("sendbuf", sendbuf), ("recvbuf", recvbuf)], stream)?;
        // Only the root's send buffer is read: the others work in place.
        if in_place(sendbuf, recvbuf) || c.rank() != root {
            let recv = at.recv(recvbuf, count, dt, "recvbuf")?;
            return c.broadcast(recv, root).map(drop);
        }
        at.pair((sendbuf, count), (recvbuf, count), dt, |send, recv| {
            c.broadcast((send, recv), root)
        })
        .map(drop)
    })
}

/// Reduce every rank's `count` elements with `op` into `root`'s `recvbuf` (other ranks may
/// pass NULL; in place, theirs is left as it was).
#[no_mangle]
pub unsafe extern "C" fn accord_reduce(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: accord_dtype_t,
    op: accord_op_t,
    root: c_int,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(
        comm,
        reduce(comm, sendbuf, recvbuf, count, dtype, op, root, stream)
    );
    with_comm(comm, "accord_reduce", |c| {
        let (dt, op) = (types::dtype(dtype)?, types::op(op)?);
        let root = types::rank(root, "root", c.size())?;
        let at = place(c, &[("sendbuf", sendbuf), ("recvbuf", recvbuf)], stream)?;
        if in_place(sendbuf, recvbuf) {
            let recv = at.recv(recvbuf, count, dt, "recvbuf")?;
            return c.reduce(recv, op, root).map(drop);
        }
        let n_out = if c.rank() == root { count } else { 0 };
        at.pair((sendbuf, count), (recvbuf, n_out), dt, |send, recv| {
            c.reduce((send, recv), op, root)
        })
        .map(drop)
    })
}

/// Rank i's `sendcount` elements land in block i of every rank's `recvbuf` (size * sendcount
/// elements). `sendbuf` may be rank i's own block of `recvbuf` (in place).
#[no_mangle]
pub unsafe extern "C" fn accord_allgather(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    dtype: accord_dtype_t,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(
        comm,
        allgather(comm, sendbuf, recvbuf, sendcount, dtype, stream)
    );
    with_comm(comm, "accord_allgather", |c| {
        let dt = types::dtype(dtype)?;
        let n = times(sendcount, c.size(), "sendcount")?;
        let at = place(c, &[("sendbuf", sendbuf), ("recvbuf", recvbuf)], stream)?;
        at.pair((sendbuf, sendcount), (recvbuf, n), dt, |send, recv| {
            c.all_gather(send, recv)
        })
        .map(drop)
    })
}

/// Like `accord_allgather` with `recvcounts[i]` elements from rank i, placed at element
/// `displs[i]` of `recvbuf` (NULL: back to back).
#[no_mangle]
pub unsafe extern "C" fn accord_allgatherv(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    sendcount: usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    displs: *const usize,
    dtype: accord_dtype_t,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(
        comm,
        allgatherv(comm, sendbuf, sendcount, recvbuf, recvcounts, displs, dtype, stream)
    );
    with_comm(comm, "accord_allgatherv", |c| {
        let dt = types::dtype(dtype)?;
        let cs = counts(recvcounts, c.size(), "recvcounts")?;
        let ds = self::displs(displs, c.size());
        let n = span(cs, ds)?;
        let at = place(c, &[("sendbuf", sendbuf), ("recvbuf", recvbuf)], stream)?;
        at.pair((sendbuf, sendcount), (recvbuf, n), dt, |send, recv| {
            c.all_gather(send, Parts::placed(recv, cs, ds))
        })
        .map(drop)
    })
}

/// Like `accord_allgather`, only `root`'s `recvbuf` is filled (others may pass NULL).
#[no_mangle]
pub unsafe extern "C" fn accord_gather(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    dtype: accord_dtype_t,
    root: c_int,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(
        comm,
        gather(comm, sendbuf, recvbuf, sendcount, dtype, root, stream)
    );
    with_comm(comm, "accord_gather", |c| {
        let (dt, root) = (types::dtype(dtype)?, types::rank(root, "root", c.size())?);
        let n = if c.rank() == root {
            times(sendcount, c.size(), "sendcount")?
        } else {
            0
        };
        let at = place(c, &[("sendbuf", sendbuf), ("recvbuf", recvbuf)], stream)?;
        at.pair((sendbuf, sendcount), (recvbuf, n), dt, |send, recv| {
            c.gather(send, recv, root)
        })
        .map(drop)
    })
}

/// Like `accord_allgatherv`, only `root`'s `recvbuf` is filled (others may pass NULL; every rank
/// passes the same `recvcounts`).
#[no_mangle]
pub unsafe extern "C" fn accord_gatherv(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    sendcount: usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    displs: *const usize,
    dtype: accord_dtype_t,
    root: c_int,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(
        comm,
        gatherv(comm, sendbuf, sendcount, recvbuf, recvcounts, displs, dtype, root, stream)
    );
    with_comm(comm, "accord_gatherv", |c| {
        let (dt, root) = (types::dtype(dtype)?, types::rank(root, "root", c.size())?);
        let cs = counts(recvcounts, c.size(), "recvcounts")?;
        let is_root = c.rank() == root;
        let ds = self::displs(displs, c.size()).filter(|_| is_root);
        let n = if is_root { span(cs, ds)? } else { 0 };
        let at = place(c, &[("sendbuf", sendbuf), ("recvbuf", recvbuf)], stream)?;
        // Non-roots receive nothing but still pass the counts (the call's fingerprint).
        at.pair((sendbuf, sendcount), (recvbuf, n), dt, |send, recv| {
            c.gather(send, Parts::placed(recv, cs, ds), root)
        })
        .map(drop)
    })
}

/// Block i (`recvcount` elements) of `root`'s `sendbuf` lands in rank i's `recvbuf` (others
/// may pass NULL as `sendbuf`).
#[no_mangle]
pub unsafe extern "C" fn accord_scatter(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dtype: accord_dtype_t,
    root: c_int,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(
        comm,
        scatter(comm, sendbuf, recvbuf, recvcount, dtype, root, stream)
    );
    with_comm(comm, "accord_scatter", |c| {
        let (dt, root) = (types::dtype(dtype)?, types::rank(root, "root", c.size())?);
        let n = if c.rank() == root {
            times(recvcount, c.size(), "recvcount")?
        } else {
            0
        };
        let at = place(c, &[("sendbuf", sendbuf), ("recvbuf", recvbuf)], stream)?;
        at.pair((sendbuf, n), (recvbuf, recvcount), dt, |send, recv| {
            c.scatter(send, recv, root)
        })
        .map(drop)
    })
}

/// Like `accord_scatter` with `sendcounts[i]` elements to rank i, taken at element `displs[i]`
/// of `root`'s `sendbuf` (NULL: back to back). Every rank passes the same `sendcounts`.
#[no_mangle]
pub unsafe extern "C" fn accord_scatterv(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    sendcounts: *const usize,
    displs: *const usize,
    recvbuf: *mut c_void,
    recvcount: usize,
    dtype: accord_dtype_t,
    root: c_int,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(
        comm,
        scatterv(comm, sendbuf, sendcounts, displs, recvbuf, recvcount, dtype, root, stream)
    );
    with_comm(comm, "accord_scatterv", |c| {
        let (dt, root) = (types::dtype(dtype)?, types::rank(root, "root", c.size())?);
        let cs = counts(sendcounts, c.size(), "sendcounts")?;
        let is_root = c.rank() == root;
        let ds = self::displs(displs, c.size()).filter(|_| is_root);
        let n = if is_root { span(cs, ds)? } else { 0 };
        let at = place(c, &[("sendbuf", sendbuf), ("recvbuf", recvbuf)], stream)?;
        at.pair((sendbuf, n), (recvbuf, recvcount), dt, |send, recv| {
            c.scatter(Parts::placed(send, cs, ds), recv, root)
        })
        .map(drop)
    })
}

/// Reduce every rank's size * `recvcount` elements with `op`; block i of the result lands in
/// rank i's `recvbuf`.
#[no_mangle]
pub unsafe extern "C" fn accord_reduce_scatter(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dtype: accord_dtype_t,
    op: accord_op_t,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(
        comm,
        reduce_scatter(comm, sendbuf, recvbuf, recvcount, dtype, op, stream)
    );
    with_comm(comm, "accord_reduce_scatter", |c| {
        let (dt, op) = (types::dtype(dtype)?, types::op(op)?);
        let n = times(recvcount, c.size(), "recvcount")?;
        let at = place(c, &[("sendbuf", sendbuf), ("recvbuf", recvbuf)], stream)?;
        at.pair((sendbuf, n), (recvbuf, recvcount), dt, |send, recv| {
            c.reduce_scatter(send, recv, op)
        })
        .map(drop)
    })
}

/// Like `accord_reduce_scatter` with `recvcounts[i]` elements to rank i (the send buffer holds
/// their sum, blocks back to back).
#[no_mangle]
pub unsafe extern "C" fn accord_reduce_scatterv(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    dtype: accord_dtype_t,
    op: accord_op_t,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(
        comm,
        reduce_scatterv(comm, sendbuf, recvbuf, recvcounts, dtype, op, stream)
    );
    with_comm(comm, "accord_reduce_scatterv", |c| {
        let (dt, op) = (types::dtype(dtype)?, types::op(op)?);
        let cs = counts(recvcounts, c.size(), "recvcounts")?;
        let (n, mine) = (span(cs, None)?, cs[c.rank()]);
        let at = place(c, &[("sendbuf", sendbuf), ("recvbuf", recvbuf)], stream)?;
        at.pair((sendbuf, n), (recvbuf, mine), dt, |send, recv| {
            c.reduce_scatter(Parts::new(send, cs), recv, op)
        })
        .map(drop)
    })
}

/// Block j (`count` elements) of `sendbuf` goes to rank j; block j of `recvbuf` comes from rank
/// j.
#[no_mangle]
pub unsafe extern "C" fn accord_alltoall(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: accord_dtype_t,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(comm, alltoall(comm, sendbuf, recvbuf, count, dtype, stream));
    with_comm(comm, "accord_alltoall", |c| {
        let dt = types::dtype(dtype)?;
        let n = times(count, c.size(), "count")?;
        let at = place(c, &[("sendbuf", sendbuf), ("recvbuf", recvbuf)], stream)?;
        at.pair((sendbuf, n), (recvbuf, n), dt, |send, recv| {
            c.all_to_all(send, recv)
        })
        .map(drop)
    })
}

/// `sendcounts[j]` elements at `sdispls[j]` of `sendbuf` go to rank j; `recvcounts[j]` from rank
/// j land at `rdispls[j]` of `recvbuf` (NULL displacements: back to back).
#[no_mangle]
pub unsafe extern "C" fn accord_alltoallv(
    comm: *mut accord_comm_t,
    sendbuf: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    dtype: accord_dtype_t,
    stream: accord_stream_t,
) -> accord_status_t {
    forward!(
        comm,
        alltoallv(comm, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dtype, stream)
    );
    with_comm(comm, "accord_alltoallv", |c| {
        let dt = types::dtype(dtype)?;
        let sc = counts(sendcounts, c.size(), "sendcounts")?;
        let rc = counts(recvcounts, c.size(), "recvcounts")?;
        let (sd, rd) = (displs(sdispls, c.size()), displs(rdispls, c.size()));
        let (ns, nr) = (span(sc, sd)?, span(rc, rd)?);
        let at = place(c, &[("sendbuf", sendbuf), ("recvbuf", recvbuf)], stream)?;
        at.pair((sendbuf, ns), (recvbuf, nr), dt, |send, recv| {
            c.all_to_all(Parts::placed(send, sc, sd), Parts::placed(recv, rc, rd))
        })
        .map(drop)
    })
}
