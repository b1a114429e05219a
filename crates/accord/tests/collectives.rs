//! What the conformance suite (`tests/conformance.rs`) does not check: message tags, argument
//! errors and forced algorithms. Ranks are threads over the in-process transport.

use accord::fingerprint::OpKind;
use accord::schedule::Algorithm;
use accord::testing::{run_world, run_world_with_timeout};
use accord::ReduceOp;

/// Tags keep messages apart even when they are received in another order than sent.
#[test]
fn tags_keep_messages_apart() {
    for n in 1..=4 {
        run_world(n, |comm| {
            let me = comm.rank();
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            comm.send(&[1u8], next, 1).unwrap();
            comm.send(&[2u8], next, 2).unwrap();
            let mut b = [0u8];
            comm.recv(&mut b, prev, 2).unwrap();
            assert_eq!(b, [2]);
            comm.recv(&mut b, prev, 1).unwrap();
            assert_eq!(b, [1]);
        });
    }
}

#[test]
fn avg_is_rejected_for_integers_and_bitwise_for_floats() {
    run_world(2, |comm| {
        let mut v = [1i32; 4];
        let e = comm.all_reduce(&mut v, ReduceOp::Avg).unwrap_err();
        assert!(e.to_string().contains("avg"), "{e}");
        let mut f = [1f32; 4];
        assert!(comm.all_reduce(&mut f, ReduceOp::BXor).is_err());
        // Nothing was sent, so the communicator still works.
        comm.all_reduce(&mut f, ReduceOp::Sum).unwrap();
        assert_eq!(f, [2.0; 4]);
    });
}

#[test]
fn force_algorithm_is_per_kind() {
    run_world(3, |comm| {
        comm.force_algorithm(OpKind::AllReduce, Some(Algorithm::Direct));
        let mut v = [comm.rank() as f64; 5];
        comm.all_reduce(&mut v, ReduceOp::Max).unwrap();
        assert_eq!(v, [2.0; 5]);
    });
}

/// Ranks that force different algorithms for one call fail, naming both, instead of reading
/// each other's blocks: with three ranks, a ring reduce-scatter's first message (rank 0's block
/// 2, to rank 1) has the size of the direct algorithm's (rank 0's block 1, to rank 1).
#[test]
fn ranks_forcing_different_algorithms_all_fail() {
    let errors = run_world_with_timeout(3, std::time::Duration::from_secs(20), |comm| {
        let algo = match comm.rank() {
            0 => Algorithm::Ring,
            _ => Algorithm::Direct,
        };
        comm.force_algorithm(OpKind::ReduceScatter, Some(algo));
        let input = vec![1f32 + comm.rank() as f32; 3 * 64];
        let mut out = vec![0f32; 64];
        comm.reduce_scatter(&input, &mut out, ReduceOp::Sum)
            .expect_err("ranks that forced different algorithms")
            .to_string()
    });
    assert!(
        errors
            .iter()
            .any(|e| e.contains("by ring") && e.contains("by direct")),
        "{errors:?}"
    );
}
