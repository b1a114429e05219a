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
