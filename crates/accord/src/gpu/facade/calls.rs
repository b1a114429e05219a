//! Each [`super::GpuCommunicator`] method's call as a [`Request`] for
//! [`Op::new`](crate::op::Op::new).
//!
//! The methods accept buffers longer than the call needs, as they always have: the request
//! states the lengths the call uses (all it needs when a buffer is long enough, else all the
//! buffer has, which [`Op::new`](crate::op::Op::new) then refuses). Buffers a rank does not use
//! (a non-root's receive buffer of a gather, send buffer of a scatter...) keep their length,
//! which the op does not check.

use crate::dtype::ReduceOp;
use crate::fingerprint::OpKind;
use crate::gpu::DeviceSlice;
use crate::op::{Extent, Request};

/// This rank and the communicator's size.
#[derive(Clone, Copy)]
pub(super) struct Place {
    pub rank: usize,
    pub size: usize,
}

/// Elements of a buffer of `have` that a call needing `want` uses.
fn used(have: usize, want: usize) -> usize {
    have.min(want)
}

fn request<'a>(kind: OpKind, send: &DeviceSlice, s: Extent<'a>, r: Extent<'a>) -> Request<'a> {
    Request {
        kind,
        dtype: send.dtype(),
        reduce: None,
        root: None,
        send: Some(s),
        recv: r,
    }
}

pub(super) fn all_reduce(send: &DeviceSlice, recv: &DeviceSlice, op: ReduceOp) -> Request<'static> {
    let n = send.count();
    Request {
        reduce: Some(op),
        ..request(
            OpKind::AllReduce,
            send,
            Extent::len(n),
            Extent::len(used(recv.count(), n)),
        )
    }
}

pub(super) fn broadcast(send: &DeviceSlice, recv: &DeviceSlice, root: usize) -> Request<'static> {
    let n = recv.count();
    Request {
        root: Some(root),
        ..request(
            OpKind::Broadcast,
            send,
            Extent::len(used(send.count(), n)),
            Extent::len(n),
        )
    }
}

pub(super) fn reduce(
    send: &DeviceSlice,
    recv: &DeviceSlice,
    op: ReduceOp,
    root: usize,
) -> Request<'static> {
    let n = send.count();
    Request {
        reduce: Some(op),
        root: Some(root),
        ..request(
            OpKind::Reduce,
            send,
            Extent::len(n),
            Extent::len(used(recv.count(), n)),
        )
    }
}

pub(super) fn all_gather(at: Place, send: &DeviceSlice, recv: &DeviceSlice) -> Request<'static> {
    let n = send.count();
    let total = n.saturating_mul(at.size);
    request(
        OpKind::AllGather,
        send,
        Extent::len(n),
        Extent::len(used(recv.count(), total)),
    )
}

pub(super) fn all_gather_v<'a>(
    at: Place,
    send: &DeviceSlice,
    recv: &DeviceSlice,
    counts: &'a [usize],
) -> Request<'a> {
    let mine = counts.get(at.rank).copied().unwrap_or(send.count());
    request(
        OpKind::AllGather,
        send,
        Extent::len(used(send.count(), mine)),
        Extent::parts(used(recv.count(), counts.iter().sum()), counts),
    )
}

pub(super) fn gather(
    at: Place,
    send: &DeviceSlice,
    recv: &DeviceSlice,
    root: usize,
) -> Request<'static> {
    let n = send.count();
    let total = n.saturating_mul(at.size);
    Request {
        root: Some(root),
        ..request(
            OpKind::Gather,
            send,
            Extent::len(n),
            Extent::len(used(recv.count(), total)),
        )
    }
}

pub(super) fn gather_v<'a>(
    at: Place,
    send: &DeviceSlice,
    recv: &DeviceSlice,
    counts: &'a [usize],
    root: usize,
) -> Request<'a> {
    let mine = counts.get(at.rank).copied().unwrap_or(send.count());
    let whole = match at.rank == root {
        true => used(recv.count(), counts.iter().sum()),
        false => recv.count(),
    };
    Request {
        root: Some(root),
        ..request(
            OpKind::Gather,
            send,
            Extent::len(used(send.count(), mine)),
            Extent::parts(whole, counts),
        )
    }
}

pub(super) fn scatter(
    at: Place,
    send: &DeviceSlice,
    recv: &DeviceSlice,
    root: usize,
) -> Request<'static> {
    let n = recv.count();
    let whole = match at.rank == root {
        true => used(send.count(), n.saturating_mul(at.size)),
        false => send.count(),
    };
    Request {
        root: Some(root),
        ..request(OpKind::Scatter, send, Extent::len(whole), Extent::len(n))
    }
}

pub(super) fn scatter_v<'a>(
    at: Place,
    send: &DeviceSlice,
    recv: &DeviceSlice,
    counts: &'a [usize],
    root: usize,
) -> Request<'a> {
    let mine = counts.get(at.rank).copied().unwrap_or(recv.count());
    let whole = match at.rank == root {
        true => used(send.count(), counts.iter().sum()),
        false => send.count(),
    };
    Request {
        root: Some(root),
        ..request(
            OpKind::Scatter,
            send,
            Extent::parts(whole, counts),
            Extent::len(used(recv.count(), mine)),
        )
    }
}

pub(super) fn reduce_scatter(
    at: Place,
    send: &DeviceSlice,
    recv: &DeviceSlice,
    op: ReduceOp,
) -> Request<'static> {
    let n = recv.count();
    let total = n.saturating_mul(at.size);
    Request {
        reduce: Some(op),
        ..request(
            OpKind::ReduceScatter,
            send,
            Extent::len(used(send.count(), total)),
            Extent::len(n),
        )
    }
}

pub(super) fn reduce_scatter_v<'a>(
    at: Place,
    send: &DeviceSlice,
    recv: &DeviceSlice,
    counts: &'a [usize],
    op: ReduceOp,
) -> Request<'a> {
    let mine = counts.get(at.rank).copied().unwrap_or(recv.count());
    Request {
        reduce: Some(op),
        ..request(
            OpKind::ReduceScatter,
            send,
            Extent::parts(used(send.count(), counts.iter().sum()), counts),
            Extent::len(used(recv.count(), mine)),
        )
    }
}

pub(super) fn all_to_all(send: &DeviceSlice, recv: &DeviceSlice) -> Request<'static> {
    let n = send.count();
    request(
        OpKind::AllToAll,
        send,
        Extent::len(n),
        Extent::len(used(recv.count(), n)),
    )
}

pub(super) fn all_to_all_v<'a>(
    send: &DeviceSlice,
    send_counts: &'a [usize],
    recv: &DeviceSlice,
    recv_counts: &'a [usize],
) -> Request<'a> {
    request(
        OpKind::AllToAll,
        send,
        Extent::parts(used(send.count(), send_counts.iter().sum()), send_counts),
        Extent::parts(used(recv.count(), recv_counts.iter().sum()), recv_counts),
    )
}

#[cfg(test)]
mod tests;
