//! Random layouts and the global pattern the redistribution tests fill them from.
#![allow(dead_code)]

use accord::distributed::{Distribution, Region};

/// A small deterministic generator (xorshift64*), one stream per case.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `parts` boxes tiling `shape`, some possibly empty: cut a random box of the list at a random
/// plane until there are enough, then deal them out in random order.
pub fn random_boxes(rng: &mut Rng, shape: &[usize], parts: usize) -> Vec<Region> {
    let mut boxes = vec![Region::whole(shape)];
    while boxes.len() < parts {
        let i = rng.below(boxes.len());
        let b = boxes[i].clone();
        let a = rng.below(shape.len());
        let cut = b.lower[a] + rng.below(b.upper[a] - b.lower[a] + 1);
        let (mut lo, mut hi) = (b.clone(), b);
        lo.upper[a] = cut;
        hi.lower[a] = cut;
        boxes[i] = lo;
        boxes.push(hi);
    }
    for i in (1..boxes.len()).rev() {
        boxes.swap(i, rng.below(i + 1));
    }
    boxes
}

/// A random layout of one of the three kinds: slab, process grid, box list.
pub fn random_layout(rng: &mut Rng, shape: &[usize], size: usize) -> Vec<Region> {
    match rng.below(3) {
        0 => Distribution::Slab(rng.below(shape.len()))
            .regions(shape, size)
            .unwrap(),
        1 => {
            // Deal the rank count's prime factors out over the axes.
            let mut grid = vec![1; shape.len()];
            let (mut n, mut f) = (size, 2);
            while n > 1 {
                while n % f == 0 {
                    grid[rng.below(shape.len())] *= f;
                    n /= f;
                }
                f += 1;
            }
            Distribution::Grid(grid).regions(shape, size).unwrap()
        }
        _ => random_boxes(rng, shape, size),
    }
}

/// The bytes of global element `at` (C order index) of a case: distinct per element and byte.
pub fn element(seed: u64, index: usize, width: usize) -> impl Iterator<Item = u8> {
    (0..width).map(move |k| (seed.wrapping_add(index as u64 * 131 + k as u64 * 7) % 251) as u8)
}

/// The local array of `b`, filled from the global pattern.
pub fn fill(seed: u64, shape: &[usize], b: &Region, width: usize) -> Vec<u8> {
    let local = b.shape();
    let mut out = Vec::with_capacity(b.volume() * width);
    for k in 0..b.volume() {
        let (mut rest, mut index) = (k, 0);
        let mut at = vec![0; local.len()];
        for a in (0..local.len()).rev() {
            at[a] = b.lower[a] + rest % local[a];
            rest /= local[a];
        }
        for (a, i) in at.iter().enumerate() {
            index = index * shape[a] + i;
        }
        out.extend(element(seed, index, width));
    }
    out
}
