//! Redistribution between random layouts at 1-9 ranks: every element lands where the output
//! layout says, round trips are exact, and bad layouts fail on every rank with the ranks named.

use accord::distributed::{Distribution, Redistribute, Region};
use accord::testing::run_world;
use accord::{DataType, RecvBuf, SendBuf};

#[path = "common/layouts.rs"]
mod layouts;
use layouts::{fill, random_layout, Rng};

#[test]
fn random_layouts_land_every_element_and_round_trip() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut cases = 0;
    for size in 1..=9 {
        for case in 0..6 {
            let ndim = 1 + rng.below(3);
            // Primes, ones and sizes not divisible by the rank count.
            let pick = [1usize, 2, 3, 5, 7, 8, 11, 13];
            let shape: Vec<usize> = (0..ndim).map(|_| pick[rng.below(pick.len())]).collect();
            let from = random_layout(&mut rng, &shape, size);
            let to = random_layout(&mut rng, &shape, size);
            let dtype = DataType::ALL[(size * 6 + case) % DataType::ALL.len()];
            let seed = rng.next();
            run_world(size, |comm| {
                let r = comm.rank();
                let (mine, theirs) = (&from[r], &to[r]);
                let plan = Redistribute::new(&comm, mine, theirs, dtype).unwrap();
                assert_eq!(plan.output().shape(), &shape[..]);
                let w = dtype.size();
                let input = fill(seed, &shape, mine, w);
                let mut out = vec![0xeeu8; theirs.volume() * w];
                plan.execute(
                    &comm,
                    SendBuf::bytes(&input, dtype),
                    RecvBuf::bytes(&mut out, dtype),
                )
                .unwrap();
                assert_eq!(
                    out,
                    fill(seed, &shape, theirs, w),
                    "{shape:?} {from:?} -> {to:?}"
                );
                // And back, with a plan made the other way, twice (the plan is reusable).
                let back = Redistribute::new(&comm, theirs, mine, dtype).unwrap();
                for _ in 0..2 {
                    let mut again = vec![0u8; input.len()];
                    back.execute(
                        &comm,
                        SendBuf::bytes(&out, dtype),
                        RecvBuf::bytes(&mut again, dtype),
                    )
                    .unwrap();
                    assert_eq!(again, input);
                }
            });
            cases += 1;
        }
    }
    assert_eq!(cases, 54);
}

#[test]
fn wide_elements_move_as_bytes() {
    // 12-byte elements (say a numpy structured dtype) moved as u8.
    run_world(3, |comm| {
        let shape = [5, 4];
        let (r, p) = (comm.rank(), comm.size());
        let from = Distribution::Slab(0).region(&shape, r, p).unwrap();
        let to = Distribution::Slab(1).region(&shape, r, p).unwrap();
        let plan = Redistribute::with_element(&comm, &from, &to, DataType::U8, 12).unwrap();
        let input = fill(7, &shape, &from, 12);
        let mut out = vec![0u8; to.volume() * 12];
        plan.execute(
            &comm,
            SendBuf::bytes(&input, DataType::U8),
            RecvBuf::bytes(&mut out, DataType::U8),
        )
        .unwrap();
        assert_eq!(out, fill(7, &shape, &to, 12));
    });
}

fn boxed(lower: &[usize], upper: &[usize]) -> Region {
    Region::new(lower.to_vec(), upper.to_vec()).unwrap()
}

/// Every rank's error for a plan over `boxes` (input) to a slab.
fn plan_errors(boxes: &[Region], dtypes: &[DataType]) -> Vec<String> {
    run_world(boxes.len(), |comm| {
        let r = comm.rank();
        let shape = [4, 4];
        let to = Distribution::Slab(0)
            .region(&shape, r, comm.size())
            .unwrap();
        Redistribute::new(&comm, &boxes[r], &to, dtypes[r])
            .unwrap_err()
            .to_string()
    })
}

#[test]
fn bad_layouts_fail_on_every_rank_naming_the_ranks() {
    let overlap = plan_errors(
        &[boxed(&[0, 0], &[3, 4]), boxed(&[2, 0], &[4, 4])],
        &[DataType::F32; 2],
    );
    for e in &overlap {
        assert!(
            e.contains("ranks 0") && e.contains("and 1") && e.contains("overlap"),
            "{e}"
        );
    }
    let gap = plan_errors(
        &[boxed(&[0, 0], &[1, 4]), boxed(&[2, 0], &[4, 4])],
        &[DataType::F32; 2],
    );
    for e in &gap {
        assert!(
            e.contains("cover 12 of the 16") && e.contains("index [1, 0]"),
            "{e}"
        );
    }
    let types = plan_errors(
        &[boxed(&[0, 0], &[2, 4]), boxed(&[2, 0], &[4, 4])],
        &[DataType::F32, DataType::F64],
    );
    assert!(
        types.iter().all(|e| e.contains("same element type")),
        "{types:?}"
    );
    let axes = run_world(2, |comm| {
        let mine = match comm.rank() {
            0 => boxed(&[0, 0], &[2, 4]),
            _ => boxed(&[2, 0, 0], &[4, 4, 1]),
        };
        Redistribute::new(&comm, &mine, &mine, DataType::F32)
            .unwrap_err()
            .to_string()
    });
    assert!(axes.iter().all(|e| e.contains("axes")), "{axes:?}");
    // A wrong buffer size is named with the rank's box, before anything moves.
    let sizes = run_world(2, |comm| {
        let shape = [4, 4];
        let (r, p) = (comm.rank(), comm.size());
        let b = Distribution::Slab(0).region(&shape, r, p).unwrap();
        let plan = Redistribute::new(&comm, &b, &b, DataType::F32).unwrap();
        let mut out = vec![0f32; 8];
        let short = vec![0f32; 7];
        plan.execute(&comm, &short, &mut out)
            .unwrap_err()
            .to_string()
    });
    assert!(
        sizes[0].contains("rank 0's input has 28 bytes but its box [2, 4]"),
        "{sizes:?}"
    );
    assert!(sizes[1].contains("rank 1's input"), "{sizes:?}");
}
