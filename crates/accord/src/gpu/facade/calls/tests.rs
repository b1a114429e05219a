use super::*;
use crate::dtype::DataType;
use crate::fingerprint::Fingerprint;
use crate::op::Op;

fn f32s(count: usize) -> DeviceSlice {
    // SAFETY: never dereferenced.
    unsafe { DeviceSlice::from_raw(0x1000, count, DataType::F32) }
}

fn at(rank: usize, size: usize) -> Place {
    Place { rank, size }
}

fn op(req: Request<'_>, p: Place) -> crate::Result<Op> {
    Op::new(req, p.rank, p.size)
}

#[test]
fn longer_buffers_are_accepted_and_the_call_uses_what_it_needs() {
    let p = at(0, 2);
    let ar = op(all_reduce(&f32s(5), &f32s(9), ReduceOp::Sum), p).unwrap();
    assert_eq!(ar.coll, crate::op::Collective::AllReduce { count: 5 });
    let ag = op(all_gather(p, &f32s(3), &f32s(100)), p).unwrap();
    assert_eq!(ag.recv_len(0), 6);
    let rs = op(reduce_scatter(p, &f32s(50), &f32s(4), ReduceOp::Max), p).unwrap();
    assert_eq!(rs.send_len(0), 8);
    let a2a = op(all_to_all(&f32s(6), &f32s(7)), p).unwrap();
    assert_eq!(a2a.recv_len(0), 6);
}

#[test]
fn shorter_buffers_are_refused() {
    let p = at(0, 2);
    assert!(op(all_reduce(&f32s(8), &f32s(1), ReduceOp::Sum), p).is_err());
    assert!(op(all_gather(p, &f32s(3), &f32s(5)), p).is_err());
    assert!(op(gather(p, &f32s(3), &f32s(5), 0), p).is_err());
    assert!(op(scatter(p, &f32s(5), &f32s(3), 0), p).is_err());
    assert!(op(reduce(&f32s(4), &f32s(3), ReduceOp::Sum, 0), p).is_err());
    assert!(op(all_gather_v(p, &f32s(1), &f32s(9), &[2, 8]), p).is_err());
    assert!(
        op(all_to_all(&f32s(5), &f32s(5)), p).is_err(),
        "5 into 2 blocks"
    );
    assert!(op(all_to_all_v(&f32s(3), &[1, 2], &f32s(2), &[1, 2]), p).is_err());
}

#[test]
fn buffers_a_rank_does_not_use_may_have_any_length() {
    // Rank 1 of 2, root 0: a gather's and a reduce's receive buffers, a scatter's send buffer,
    // a broadcast's send buffer are not touched here.
    let p = at(1, 2);
    assert!(op(gather(p, &f32s(3), &f32s(0), 0), p).is_ok());
    assert!(op(gather_v(p, &f32s(2), &f32s(0), &[1, 2], 0), p).is_ok());
    assert!(op(reduce(&f32s(4), &f32s(0), ReduceOp::Sum, 0), p).is_ok());
    assert!(op(scatter(p, &f32s(0), &f32s(3), 0), p).is_ok());
    assert!(op(scatter_v(p, &f32s(0), &f32s(2), &[1, 2], 0), p).is_ok());
    assert!(op(broadcast(&f32s(0), &f32s(7), 0), p).is_ok());
}

#[test]
fn roots_and_counts_are_checked_once_by_the_op() {
    let p = at(0, 2);
    assert!(op(broadcast(&f32s(4), &f32s(4), 2), p).is_err());
    assert!(op(all_gather_v(p, &f32s(1), &f32s(3), &[1, 1, 1]), p).is_err());
    assert!(op(
        reduce_scatter_v(p, &f32s(3), &f32s(1), &[1], ReduceOp::Sum),
        p
    )
    .is_err());
}

#[test]
fn fingerprints_are_the_ones_ranks_compared_before() {
    let p = at(0, 2);
    let fp = |r: Request<'_>| op(r, p).unwrap().fp;
    let s = ReduceOp::Sum;
    let f = DataType::F32;
    assert_eq!(
        fp(all_reduce(&f32s(5), &f32s(5), s)),
        Fingerprint::new(OpKind::AllReduce, f, 5).with_op(s)
    );
    assert_eq!(
        fp(broadcast(&f32s(5), &f32s(5), 1)),
        Fingerprint::new(OpKind::Broadcast, f, 5).with_root(1)
    );
    assert_eq!(
        fp(reduce(&f32s(5), &f32s(5), s, 0)),
        Fingerprint::new(OpKind::Reduce, f, 5)
            .with_op(s)
            .with_root(0)
    );
    assert_eq!(
        fp(all_gather(p, &f32s(3), &f32s(6))),
        Fingerprint::new(OpKind::AllGather, f, 3)
    );
    assert_eq!(
        fp(all_gather_v(p, &f32s(1), &f32s(3), &[1, 2])),
        Fingerprint::new(OpKind::AllGatherV, f, 0).with_counts(&[1, 2])
    );
    assert_eq!(
        fp(gather(p, &f32s(3), &f32s(6), 0)),
        Fingerprint::new(OpKind::Gather, f, 3).with_root(0)
    );
    assert_eq!(
        fp(scatter(p, &f32s(6), &f32s(3), 0)),
        Fingerprint::new(OpKind::Scatter, f, 3).with_root(0)
    );
    assert_eq!(
        fp(reduce_scatter(p, &f32s(8), &f32s(4), s)),
        Fingerprint::new(OpKind::ReduceScatter, f, 4).with_op(s)
    );
    assert_eq!(
        fp(reduce_scatter_v(p, &f32s(3), &f32s(1), &[1, 2], s)),
        Fingerprint::new(OpKind::ReduceScatterV, f, 0)
            .with_op(s)
            .with_counts(&[1, 2])
    );
    assert_eq!(
        fp(all_to_all(&f32s(6), &f32s(6))),
        Fingerprint::new(OpKind::AllToAll, f, 3)
    );
    assert_eq!(
        fp(all_to_all_v(&f32s(3), &[1, 2], &f32s(4), &[2, 2])),
        Fingerprint::new(OpKind::AllToAllV, f, 0)
    );
    // gatherv and scatterv now hash their counts too, like every other v variant.
    assert_eq!(
        fp(gather_v(p, &f32s(1), &f32s(3), &[1, 2], 0)),
        Fingerprint::new(OpKind::GatherV, f, 0)
            .with_counts(&[1, 2])
            .with_root(0)
    );
}
