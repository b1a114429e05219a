use super::*;

fn req<'a>(kind: OpKind, send: Option<Extent<'a>>, recv: Extent<'a>) -> Request<'a> {
    Request {
        kind,
        dtype: DataType::F32,
        reduce: None,
        root: None,
        send,
        recv,
    }
}

#[test]
fn allreduce_counts_from_the_receive_buffer_and_checks_the_send_buffer() {
    let mut r = req(OpKind::AllReduce, Some(Extent::len(4)), Extent::len(4));
    r.reduce = Some(ReduceOp::Sum);
    let op = Op::new(r, 1, 3).unwrap();
    assert_eq!(op.coll, Collective::AllReduce { count: 4 });
    assert_eq!(
        op.fp,
        Fingerprint::new(OpKind::AllReduce, DataType::F32, 4).with_op(ReduceOp::Sum)
    );
    assert!(!op.in_place);
    r.send = Some(Extent::len(5));
    let e = Op::new(r, 1, 3).unwrap_err().to_string();
    assert!(
        e.contains("send buffer has 5 elements but this call needs 4"),
        "{e}"
    );
    r.reduce = None;
    assert!(Op::new(r, 1, 3)
        .unwrap_err()
        .to_string()
        .contains("needs a reduce operator"));
}

#[test]
fn roots_must_be_ranks_and_root_only_buffers_are_free_elsewhere() {
    let mut r = req(OpKind::Gather, Some(Extent::len(2)), Extent::len(0));
    r.root = Some(3);
    let e = Op::new(r, 0, 3).unwrap_err().to_string();
    assert!(e.contains("root 3 is not a rank"), "{e}");
    r.root = Some(0);
    // Rank 1 is not the root: its receive buffer is not used.
    let op = Op::new(r, 1, 3).unwrap();
    assert_eq!(
        op.coll,
        Collective::Gather {
            counts: vec![2; 3],
            root: 0
        }
    );
    assert_eq!(
        op.fp,
        Fingerprint::new(OpKind::Gather, DataType::F32, 2).with_root(0)
    );
    // The root's must hold every block.
    assert!(Op::new(r, 0, 3).is_err());
    r.recv = Extent::len(6);
    assert!(Op::new(r, 0, 3).is_ok());
}

#[test]
fn per_rank_counts_make_the_v_variant_and_are_fingerprinted() {
    let counts = [1, 0, 3];
    let r = req(
        OpKind::AllGather,
        Some(Extent::len(0)),
        Extent::parts(4, &counts),
    );
    let op = Op::new(r, 1, 3).unwrap();
    assert_eq!(op.kind(), OpKind::AllGatherV);
    assert_eq!(
        op.fp,
        Fingerprint::new(OpKind::AllGatherV, DataType::F32, 0).with_counts(&counts)
    );
    let short = [1, 2];
    let r = req(
        OpKind::AllGather,
        Some(Extent::len(2)),
        Extent::parts(3, &short),
    );
    let e = Op::new(r, 1, 3).unwrap_err().to_string();
    assert!(
        e.contains("counts has 2 entries but the communicator has 3 ranks"),
        "{e}"
    );
}

#[test]
fn scatter_and_reduce_scatter_take_counts_on_the_send_side() {
    let counts = [2, 1, 1];
    let mut r = req(
        OpKind::Scatter,
        Some(Extent::parts(4, &counts)),
        Extent::len(1),
    );
    r.root = Some(0);
    let op = Op::new(r, 2, 3).unwrap();
    assert_eq!(op.kind(), OpKind::ScatterV);
    // A non-root's send buffer is not used, whatever its length.
    r.send = Some(Extent::len(0));
    assert_eq!(Op::new(r, 2, 3).unwrap().kind(), OpKind::Scatter);
    let mut r = req(OpKind::ReduceScatter, Some(Extent::len(9)), Extent::len(3));
    r.reduce = Some(ReduceOp::Max);
    let op = Op::new(r, 0, 3).unwrap();
    assert_eq!(op.coll, Collective::ReduceScatter { counts: vec![3; 3] });
    r.send = None;
    assert!(Op::new(r, 0, 3)
        .unwrap_err()
        .to_string()
        .contains("no in-place form"));
}

#[test]
fn alltoall_splits_evenly_or_takes_both_count_vectors() {
    let r = req(OpKind::AllToAll, Some(Extent::len(7)), Extent::len(7));
    assert!(Op::new(r, 0, 3)
        .unwrap_err()
        .to_string()
        .contains("not a multiple"));
    let (s, c) = ([1, 2, 0], [0, 0, 4]);
    let r = req(
        OpKind::AllToAll,
        Some(Extent::parts(3, &s)),
        Extent::parts(4, &c),
    );
    let op = Op::new(r, 0, 3).unwrap();
    assert_eq!(op.kind(), OpKind::AllToAllV);
    assert_eq!(op.fp, Fingerprint::new(OpKind::AllToAllV, DataType::F32, 0));
    let r = req(OpKind::AllToAll, Some(Extent::parts(3, &s)), Extent::len(4));
    assert!(Op::new(r, 0, 3).is_err());
}

#[test]
fn reduce_counts_what_a_non_root_sends_and_leaves_its_receive_buffer_alone() {
    let mut r = req(OpKind::Reduce, Some(Extent::len(5)), Extent::len(0));
    r.reduce = Some(ReduceOp::Sum);
    r.root = Some(0);
    let op = Op::new(r, 1, 2).unwrap();
    assert_eq!(op.coll, Collective::Reduce { count: 5, root: 0 });
    assert!(
        Op::new(r, 0, 2).is_err(),
        "the root's receive buffer must hold the result"
    );
    // In place at the root: the buffer is input and output.
    r.send = None;
    r.recv = Extent::len(5);
    let op = Op::new(r, 0, 2).unwrap();
    assert!(op.in_place);
    assert_eq!(
        op.fp,
        Fingerprint::new(OpKind::Reduce, DataType::F32, 5)
            .with_op(ReduceOp::Sum)
            .with_root(0)
    );
}
