//! Sub-communicators and nonblocking requests.

use accord::testing::run_world;
use accord::Parts;
use accord::ReduceOp;

#[test]
fn split_by_parity_and_interleave() {
    for n in 1..=9 {
        run_world(n, |world| {
            let me = world.rank();
            let half = world
                .split(Some((me % 2) as u32), -(me as i64))
                .unwrap()
                .unwrap();
            let members: Vec<usize> = (0..n).filter(|r| r % 2 == me % 2).collect();
            assert_eq!(half.size(), members.len());
            // key = -rank reverses the order.
            assert_eq!(
                half.rank(),
                members.len() - 1 - members.iter().position(|&r| r == me).unwrap()
            );
            for round in 0..3 {
                let mut a = [me as u64 + round];
                half.all_reduce(&mut a, ReduceOp::Sum).unwrap();
                let mut b = [1u32];
                world.all_reduce(&mut b, ReduceOp::Sum).unwrap();
                assert_eq!(a[0], members.iter().map(|&r| r as u64 + round).sum::<u64>());
                assert_eq!(b[0] as usize, n);
            }
            let none = world
                .split(if me == 0 { None } else { Some(0) }, 0)
                .unwrap();
            assert_eq!(none.is_none(), me == 0);
            if let Some(c) = none {
                assert_eq!(c.size(), n - 1);
                c.barrier().unwrap();
            }
        });
    }
}

#[test]
fn subgroup_in_given_order() {
    run_world(5, |world| {
        let g = world.subgroup(&[4, 1, 2]).unwrap();
        match world.rank() {
            0 | 3 => assert!(g.is_none()),
            r => {
                let g = g.unwrap();
                assert_eq!(g.rank(), [4, 1, 2].iter().position(|&x| x == r).unwrap());
                let mut v = [0i64; 2];
                if g.rank() == 0 {
                    v = [7, 8];
                }
                g.broadcast(&mut v, 0).unwrap();
                assert_eq!(v, [7, 8]);
            }
        }
        let e = world.subgroup(&[1, 1]).unwrap_err();
        assert!(e.to_string().contains("twice"));
    });
}

#[test]
fn several_requests_in_flight() {
    for n in [1, 2, 3, 5] {
        run_world(n, |comm| {
            let me = comm.rank();
            let mut a = vec![me as f32; 10_000];
            let mut b = vec![0u8; 33];
            if me == 0 {
                b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
            }
            let send: Vec<u32> = vec![me as u32; 4];
            let mut gathered = vec![0u32; 4 * n];
            std::thread::scope(|s| {
                let r1 = comm.spawn(s, |c| c.all_reduce(&mut a, ReduceOp::Sum));
                let r2 = comm.spawn(s, |c| c.broadcast(&mut b, 0));
                let r3 = comm.spawn(s, |c| c.all_gather(&send, &mut gathered));
                let r4 = comm.spawn(s, |c| c.barrier());
                r4.wait().unwrap();
                r3.wait().unwrap();
                let _ = r2.test();
                r2.wait().unwrap();
                r1.wait().unwrap();
            });
            let total = (0..n).sum::<usize>() as f32;
            assert!(a.iter().all(|&x| x == total));
            assert_eq!(b, (0..33).collect::<Vec<u8>>());
            assert_eq!(
                gathered,
                (0..n).flat_map(|r| [r as u32; 4]).collect::<Vec<_>>()
            );
            // Blocking calls after requests keep working.
            comm.barrier().unwrap();
        });
    }
}

#[test]
fn variable_count_requests_and_irecv() {
    for n in [1, 3, 4] {
        run_world(n, |comm| {
            let me = comm.rank();
            let counts: Vec<usize> = (0..n).map(|r| r + 1).collect();
            let mine = vec![me as i32; counts[me]];
            let mut all = vec![0i32; counts.iter().sum()];
            let big: Vec<f64> = (0..counts.iter().sum::<usize>())
                .map(|i| i as f64)
                .collect();
            let mut part = vec![0f64; counts[me]];
            let mut got = [0u8; 3];
            std::thread::scope(|s| {
                let r0 = comm.irecv(s, &mut got, (me + n - 1) % n, 4);
                comm.send(&[me as u8; 3], (me + 1) % n, 4).unwrap();
                let r1 = comm.spawn(s, |c| c.all_gather(&mine, Parts::new(&mut all, &counts)));
                let r2 = comm.spawn(s, |c| {
                    c.reduce_scatter(Parts::new(&big, &counts), &mut part, ReduceOp::Sum)
                });
                r2.wait().unwrap();
                r1.wait().unwrap();
                r0.wait().unwrap();
            });
            let want: Vec<i32> = (0..n).flat_map(|r| vec![r as i32; r + 1]).collect();
            assert_eq!(all, want);
            let start: usize = counts[..me].iter().sum();
            assert_eq!(
                part,
                (start..start + counts[me])
                    .map(|i| (i * n) as f64)
                    .collect::<Vec<_>>()
            );
            assert_eq!(got, [((me + n - 1) % n) as u8; 3]);
        });
    }
}
