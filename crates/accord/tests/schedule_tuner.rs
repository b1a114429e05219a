//! The tuner's table is printable and its choice is always buildable and correct.

use accord::schedule::tuner::{explain, select, CostModel};
use accord::schedule::{algorithms, check, Collective};

#[test]
fn schedule_choice_builds_and_verifies() {
    for model in [CostModel::tcp(), CostModel::shm(), CostModel::inproc()] {
        for world in [1, 3, 6, 8] {
            for count in [1, 5000, 1 << 20] {
                let colls = [
                    Collective::AllReduce { count },
                    Collective::Broadcast {
                        count,
                        root: world - 1,
                    },
                    Collective::Reduce {
                        count,
                        root: world / 2,
                    },
                ];
                for c in &colls {
                    let algo = select(c, world, 4, &model);
                    assert!(algorithms::applicable(c).contains(&algo));
                    if count <= 5000 {
                        check::verify(c, world, algo).unwrap();
                    }
                }
            }
        }
    }
    let table = explain(
        &Collective::AllReduce { count: 1 << 20 },
        16,
        4,
        &CostModel::tcp(),
    );
    assert_eq!(table.matches('*').count(), 1, "{table}");
    println!("{table}");
}

#[test]
fn a_call_in_pieces_is_explained_piece_by_piece() {
    // 64 MiB of f32 runs in eight pieces of 8 MiB (the default ACCORD_PIECE_BYTES): the table
    // is the one the library chose each piece's algorithm by, not the whole call's.
    let f32 = accord::DataType::F32;
    let tables = accord::testing::run_world(2, |comm| {
        (
            comm.explain(&Collective::AllReduce { count: 16 << 20 }, f32),
            comm.explain(&Collective::AllReduce { count: 1 << 10 }, f32),
        )
    });
    for (big, small) in tables {
        assert!(
            big.starts_with("in pieces of 2097152 elements, each:\n")
                && big.contains("allreduce on 2 ranks, 2097152 elements"),
            "{big}"
        );
        assert!(
            small.starts_with("allreduce on 2 ranks, 1024 elements"),
            "{small}"
        );
    }
}
