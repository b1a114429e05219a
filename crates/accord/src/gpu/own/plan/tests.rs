use super::*;
use crate::dtype::{DataType, ReduceOp};
use crate::op::{Extent, Request};

fn op(kind: OpKind, dtype: DataType, send: &[usize], recv: &[usize], size: usize) -> Op {
    let reduce = matches!(
        kind,
        OpKind::AllReduce | OpKind::ReduceScatter | OpKind::ReduceScatterV | OpKind::Reduce
    )
    .then_some(ReduceOp::Sum);
    let root = matches!(kind, OpKind::Broadcast | OpKind::Reduce).then_some(0);
    fn ext(c: &[usize]) -> Extent<'_> {
        match c.len() {
            1 => Extent::len(c[0]),
            _ => Extent::parts(c.iter().sum(), c),
        }
    }
    let req = Request {
        kind,
        dtype,
        reduce,
        root,
        send: Some(ext(send)),
        recv: ext(recv),
    };
    Op::new(req, 0, size).unwrap()
}

#[test]
fn allreduce_is_one_shot_up_to_the_packet_limit_then_two_shot() {
    let n = LL_MAX_BYTES / 4;
    let small = op(OpKind::AllReduce, DataType::F32, &[n], &[n], 4);
    assert_eq!(
        algorithm(&small, 4, LL_MAX_BYTES),
        Ok(Algo::AllReduceOneShot)
    );
    let big = op(OpKind::AllReduce, DataType::F32, &[n + 1], &[n + 1], 4);
    assert_eq!(algorithm(&big, 4, LL_MAX_BYTES), Ok(Algo::AllReduceTwoShot));
}

#[test]
fn v_variants_plan_by_kind_not_by_this_ranks_counts() {
    // allgatherv with equal counts here still goes to NCCL: other ranks may differ.
    let agv = op(OpKind::AllGather, DataType::F32, &[2], &[2, 2, 2], 3);
    assert_eq!(agv.kind(), OpKind::AllGatherV);
    assert!(algorithm(&agv, 3, LL_MAX_BYTES).is_err());
    let ag = op(OpKind::AllGather, DataType::F32, &[2], &[6], 3);
    assert_eq!(algorithm(&ag, 3, LL_MAX_BYTES), Ok(Algo::AllGatherLl));
    assert_eq!(algorithm(&ag, 3, 4), Ok(Algo::AllGather));
    let a2av = op(OpKind::AllToAll, DataType::I8, &[1, 1], &[1, 1], 2);
    assert_eq!(a2av.kind(), OpKind::AllToAllV);
    assert_eq!(algorithm(&a2av, 2, LL_MAX_BYTES), Ok(Algo::AllToAll));
    assert!(chosen(GpuEngine::Auto, &a2av, Algo::AllToAll, ORDINARY2).is_err());
    assert!(chosen(GpuEngine::Accord, &a2av, Algo::AllToAll, ORDINARY2).is_ok());
    let red = op(OpKind::Reduce, DataType::F32, &[4], &[4], 2);
    assert!(algorithm(&red, 2, LL_MAX_BYTES)
        .unwrap_err()
        .contains("NCCL"));
}

const ORDINARY2: Facts = Facts {
    heap: false,
    size: 2,
};
const HEAP2: Facts = Facts {
    heap: true,
    size: 2,
};
const ORDINARY8: Facts = Facts {
    heap: false,
    size: 8,
};

/// An f32 allreduce of `bytes` on two ranks.
fn f32s(bytes: usize) -> Op {
    op(
        OpKind::AllReduce,
        DataType::F32,
        &[bytes / 4],
        &[bytes / 4],
        2,
    )
}

#[test]
fn too_many_ranks_are_refused_with_the_limit() {
    let ar = op(OpKind::AllReduce, DataType::F32, &[4], &[4], 17);
    assert!(algorithm(&ar, 17, LL_MAX_BYTES).unwrap_err().contains("16"));
}

#[test]
fn auto_sends_calls_outside_the_measured_ranges_to_nccl_and_the_switch_overrides() {
    let two = Algo::AllReduceTwoShot;
    let (above, upto) = auto_range(two, ORDINARY2);
    assert!(chosen(GpuEngine::Auto, &f32s(upto), two, ORDINARY2).is_ok());
    assert!(chosen(GpuEngine::Auto, &f32s(above + 4), two, ORDINARY2).is_ok());
    let why = chosen(GpuEngine::Auto, &f32s(upto + 4), two, ORDINARY2).unwrap_err();
    assert!(why.contains("ACCORD_GPU_ENGINE=accord"), "{why}");
    assert!(chosen(GpuEngine::Auto, &f32s(above), two, ORDINARY2).is_err());
    assert!(chosen(GpuEngine::Accord, &f32s(upto + 4), two, ORDINARY2).is_ok());
    assert!(chosen(GpuEngine::Nccl, &f32s(upto), two, ORDINARY2).is_err());
    // Packets and the barrier always beat NCCL's latency.
    let small = f32s(64);
    assert!(chosen(GpuEngine::Auto, &small, Algo::AllReduceOneShot, ORDINARY2).is_ok());
    let (_, ag) = auto_range(Algo::AllGather, ORDINARY8);
    let per = ag / 8 / 4;
    let gather = op(OpKind::AllGather, DataType::F32, &[per], &[per * 8], 8);
    assert!(chosen(GpuEngine::Auto, &gather, Algo::AllGather, ORDINARY8).is_ok());
    let gather = op(
        OpKind::AllGather,
        DataType::F32,
        &[per + 1],
        &[(per + 1) * 8],
        8,
    );
    assert!(chosen(GpuEngine::Auto, &gather, Algo::AllGather, ORDINARY8).is_err());
}

#[test]
fn segments_start_aligned_and_cover_the_whole() {
    for size in 1..=9 {
        for elem in [1, 2, 4, 8] {
            for count in [0, 1, 7, 100, 1001, 65_537] {
                let seg = segment(count, elem, size);
                assert_eq!(
                    (seg * elem) % 16,
                    0,
                    "count {count} elem {elem} size {size}"
                );
                assert!(seg * size >= count);
                assert!(seg < count.div_ceil(size) + 16);
            }
        }
    }
}

#[test]
fn grids_grow_with_the_round_and_stop_at_the_cap() {
    assert_eq!(bulk_blocks(0), 1);
    assert_eq!(bulk_blocks(1), 1);
    assert_eq!(bulk_blocks(BYTES_PER_BLOCK + 1), 2);
    assert_eq!(bulk_blocks(usize::MAX / 2), BULK_BLOCKS);
    const { assert!(BULK_BLOCKS <= MAX_BLOCKS && LL_BLOCKS <= MAX_BLOCKS) };
    const { assert!(MAX_RANKS as u32 <= THREADS) };
}

#[test]
fn packets_carry_small_blocks_up_to_the_limit() {
    let per = 1000;
    let ag = op(OpKind::AllGather, DataType::U8, &[per], &[per * 4], 4);
    assert_eq!(algorithm(&ag, 4, per), Ok(Algo::AllGatherLl));
    assert_eq!(algorithm(&ag, 4, per - 1), Ok(Algo::AllGather));
    let rs = op(OpKind::ReduceScatter, DataType::U8, &[per * 4], &[per], 4);
    assert_eq!(algorithm(&rs, 4, per), Ok(Algo::ReduceScatterLl));
    assert_eq!(algorithm(&rs, 4, per - 1), Ok(Algo::ReduceScatter));
    // alltoall: the block per pair counts.
    let a2a = op(OpKind::AllToAll, DataType::U8, &[per * 4], &[per * 4], 4);
    assert_eq!(algorithm(&a2a, 4, per), Ok(Algo::AllToAllLl));
    assert_eq!(algorithm(&a2a, 4, per - 1), Ok(Algo::AllToAll));
    // The limit never exceeds the packet area.
    let n = LL_MAX_BYTES + 8;
    let ar = op(OpKind::AllReduce, DataType::U8, &[n], &[n], 2);
    assert_eq!(algorithm(&ar, 2, usize::MAX), Ok(Algo::AllReduceTwoShot));
    for a in [
        Algo::AllReduceOneShot,
        Algo::AllGatherLl,
        Algo::ReduceScatterLl,
    ] {
        assert!(a.kernel().ends_with("_ll"));
    }
}

#[test]
fn the_quick_answers_agree_with_the_explained_ones() {
    let mut ops = Vec::new();
    for bytes in [0usize, 8, 4096, 1 << 20, (1 << 20) + 16, 3 << 20, 64 << 20] {
        let n = bytes / 4;
        ops.push(op(OpKind::AllReduce, DataType::F32, &[n], &[n], 4));
        ops.push(op(
            OpKind::AllGather,
            DataType::F32,
            &[n / 4],
            &[n / 4 * 4],
            4,
        ));
        ops.push(op(
            OpKind::ReduceScatter,
            DataType::F32,
            &[n / 4 * 4],
            &[n / 4],
            4,
        ));
        ops.push(op(
            OpKind::AllToAll,
            DataType::F32,
            &[n / 4 * 4],
            &[n / 4 * 4],
            4,
        ));
        ops.push(op(OpKind::Broadcast, DataType::F32, &[n], &[n], 4));
        ops.push(op(OpKind::Reduce, DataType::F32, &[n], &[n], 4));
    }
    ops.push(op(
        OpKind::AllToAll,
        DataType::I8,
        &[1, 2, 3, 4],
        &[1, 2, 3, 4],
        4,
    ));
    for o in &ops {
        for size in [4, 17] {
            let algo = algorithm(o, size, LL_MAX_BYTES);
            assert_eq!(
                kernel_for(o, size, LL_MAX_BYTES),
                algo.clone().ok(),
                "{}",
                o.fp
            );
            if let Ok(a) = algo {
                for heap in [false, true] {
                    let f = Facts { heap, size };
                    let slow = chosen(GpuEngine::Auto, o, a, f).is_ok();
                    assert_eq!(in_auto_range(o, a, f), slow, "{}", o.fp);
                }
            }
        }
    }
}

#[test]
fn auto_gives_symmetric_heap_arrays_to_the_kernels_at_every_measured_winning_size() {
    let two = Algo::AllReduceTwoShot;
    let big = f32s(256 << 20);
    // Through the scratch NCCL wins at 256 MiB; zero-copy the kernel does.
    assert!(chosen(GpuEngine::Auto, &big, two, ORDINARY2).is_err());
    assert!(chosen(GpuEngine::Auto, &big, two, HEAP2).is_ok());
    // At 1 MiB NCCL's allreduce is faster either way.
    let why = chosen(GpuEngine::Auto, &f32s(1 << 20), two, HEAP2).unwrap_err();
    assert!(why.contains("symmetric-heap"), "{why}");
    // Broadcast: non-roots cannot know where the root's array lies, so NCCL keeps it.
    let b = op(OpKind::Broadcast, DataType::F32, &[1 << 24], &[1 << 24], 2);
    assert!(chosen(GpuEngine::Auto, &b, Algo::Broadcast, ORDINARY2).is_err());
    assert!(chosen(GpuEngine::Auto, &b, Algo::Broadcast, HEAP2).is_err());
}

#[test]
fn auto_gives_bitwise_reductions_to_the_kernels_at_every_size_since_nccl_has_none() {
    for count in [0usize, 1 << 24] {
        let req = Request {
            kind: OpKind::AllReduce,
            dtype: DataType::I32,
            reduce: Some(ReduceOp::BXor),
            root: None,
            send: Some(Extent::len(count)),
            recv: Extent::len(count),
        };
        let o = Op::new(req, 0, 2).unwrap();
        let algo = algorithm(&o, 2, LL_MAX_BYTES).unwrap();
        assert!(
            chosen(GpuEngine::Auto, &o, algo, ORDINARY2).is_ok(),
            "{count}"
        );
    }
}

#[test]
fn peers_read_an_input_in_place_only_where_no_write_can_disturb_the_read() {
    let (a, b) = ((0x1000, 4096), (0x9000, 4096));
    let bulk = [
        Algo::AllReduceTwoShot,
        Algo::Broadcast,
        Algo::AllGather,
        Algo::ReduceScatter,
        Algo::AllToAll,
    ];
    for algo in bulk {
        assert!(readable_in_place(algo, a, b), "{algo:?} out of place");
    }
    // In place: the two-shot allreduce and the broadcast only.
    for algo in bulk {
        let ok = matches!(algo, Algo::AllReduceTwoShot | Algo::Broadcast);
        assert_eq!(readable_in_place(algo, a, a), ok, "{algo:?} in place");
    }
    // Overlapping without being the same array: none.
    for algo in bulk {
        assert!(!readable_in_place(algo, a, (0x1800, 4096)), "{algo:?}");
    }
    // The packet kernels always send packets.
    for algo in [Algo::AllReduceOneShot, Algo::AllGatherLl, Algo::AllToAllLl] {
        assert!(!readable_in_place(algo, a, b), "{algo:?}");
    }
}

#[test]
fn auto_follows_the_four_rank_measurement_from_three_ranks_up() {
    const MIB: usize = 1 << 20;
    let kernels = |kind: OpKind, total: usize, size: usize, heap: bool| {
        let per = total / 4 / size;
        let (send, recv) = match kind {
            OpKind::AllGather => (per, per * size),
            OpKind::ReduceScatter => (per * size, per),
            _ => (per * size, per * size),
        };
        let o = op(kind, DataType::F32, &[send], &[recv], size);
        // The bulk kernels' ranges, whatever the packet limit would take.
        let ll = match kind {
            OpKind::AllReduce => LL_MAX_BYTES,
            _ => 4,
        };
        let algo = algorithm(&o, size, ll).unwrap();
        chosen(GpuEngine::Auto, &o, algo, Facts { heap, size }).is_ok()
    };
    for size in [3, 4, 8] {
        for heap in [false, true] {
            // One-shot allreduce up to 64 KiB; no two-shot allreduce at all.
            assert!(kernels(OpKind::AllReduce, 64 << 10, size, heap));
            assert!(!kernels(OpKind::AllReduce, 256 << 10, size, heap));
            assert!(!kernels(OpKind::AllReduce, 4 * MIB, size, heap));
            assert!(!kernels(OpKind::AllReduce, 256 * MIB, size, heap));
            // Gathers while every rank's block is at most 1 MiB.
            assert!(kernels(OpKind::AllGather, size * MIB, size, heap));
            assert!(!kernels(OpKind::AllGather, 4 * size * MIB, size, heap));
        }
        // Reduce-scatter: to 1 MiB blocks through the scratch, every size zero-copy.
        assert!(kernels(OpKind::ReduceScatter, size * MIB, size, false));
        assert!(!kernels(OpKind::ReduceScatter, 4 * size * MIB, size, false));
        assert!(kernels(OpKind::ReduceScatter, 256 * MIB, size, true));
        // Alltoall: 1 MiB in all through the scratch, 1 MiB per rank zero-copy.
        assert!(kernels(OpKind::AllToAll, MIB, size, false));
        assert!(!kernels(OpKind::AllToAll, 4 * MIB, size, false));
        assert!(kernels(OpKind::AllToAll, size * MIB, size, true));
        assert!(!kernels(OpKind::AllToAll, 4 * size * MIB, size, true));
    }
    assert!(!kernels(OpKind::AllReduce, 96 << 10, 3, false));
    // Two ranks keep their own measurement: two-shot allreduce between 1 and 4 MiB, the bulk
    // gathers to 1 MiB per rank (reduce-scatter won at 2 MiB, lost at 8), and every zero-copy
    // bulk kernel at every size.
    assert!(kernels(OpKind::AllReduce, 4 * MIB, 2, false));
    assert!(kernels(OpKind::ReduceScatter, 2 * MIB, 2, false));
    assert!(!kernels(OpKind::ReduceScatter, 8 * MIB, 2, false));
    assert!(kernels(OpKind::AllGather, 2 * MIB, 2, false));
    assert!(!kernels(OpKind::AllGather, 8 * MIB, 2, false));
    assert!(kernels(OpKind::AllReduce, 256 * MIB, 2, true));
    assert!(kernels(OpKind::AllGather, 256 * MIB, 2, true));
    // The reason names the world size.
    let o = op(OpKind::AllReduce, DataType::F32, &[MIB], &[MIB], 4);
    let why = chosen(
        GpuEngine::Auto,
        &o,
        Algo::AllReduceTwoShot,
        Facts {
            heap: false,
            size: 4,
        },
    )
    .unwrap_err();
    assert!(
        why.contains("4 ranks") && why.contains("at no size"),
        "{why}"
    );
}
