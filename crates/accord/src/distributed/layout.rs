//! Boxes and the distributions that hand them out: which part of a global array each rank holds.

use crate::error::{Error, Result};

/// A box of a global N-d array: indices `lower[a] <= i < upper[a]` on every axis `a` (nvmath's
/// `Box`). A box with `lower[a] == upper[a]` on some axis is empty: a rank may hold nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Region {
    /// First index on each axis.
    pub lower: Vec<usize>,
    /// One past the last index on each axis.
    pub upper: Vec<usize>,
}

impl Region {
    /// The box `lower..upper`; an error when the corners have different lengths or `upper` lies
    /// below `lower` on some axis.
    pub fn new(lower: Vec<usize>, upper: Vec<usize>) -> Result<Region> {
        if lower.len() != upper.len() {
            return Err(Error::invalid(format!(
                "box: lower corner {lower:?} has {} coordinates but upper corner {upper:?} has {}",
                lower.len(),
                upper.len()
            )));
        }
        if let Some(a) = (0..lower.len()).find(|&a| upper[a] < lower[a]) {
            return Err(Error::invalid(format!(
                "box: upper corner {upper:?} lies below lower corner {lower:?} on axis {a}"
            )));
        }
        Ok(Region { lower, upper })
    }

    /// The whole of an array of `shape`.
    pub fn whole(shape: &[usize]) -> Region {
        Region {
            lower: vec![0; shape.len()],
            upper: shape.to_vec(),
        }
    }

    /// Number of axes.
    pub fn ndim(&self) -> usize {
        self.lower.len()
    }

    /// The local array's shape: the box's extent on each axis.
    pub fn shape(&self) -> Vec<usize> {
        self.lower
            .iter()
            .zip(&self.upper)
            .map(|(l, u)| u - l)
            .collect()
    }

    /// Number of elements.
    pub fn volume(&self) -> usize {
        self.shape().iter().product()
    }

    /// Whether the box holds no element.
    pub fn is_empty(&self) -> bool {
        self.volume() == 0
    }

    /// The common part of two boxes, `None` when they share no element.
    pub fn intersect(&self, other: &Region) -> Option<Region> {
        let lower: Vec<usize> = self
            .lower
            .iter()
            .zip(&other.lower)
            .map(|(a, b)| *a.max(b))
            .collect();
        let upper: Vec<usize> = self
            .upper
            .iter()
            .zip(&other.upper)
            .map(|(a, b)| *a.min(b))
            .collect();
        lower
            .iter()
            .zip(&upper)
            .all(|(l, u)| l < u)
            .then_some(Region { lower, upper })
    }

    /// Whether the box holds global index `at`.
    pub fn contains(&self, at: &[usize]) -> bool {
        at.iter()
            .enumerate()
            .all(|(a, &i)| self.lower[a] <= i && i < self.upper[a])
    }
}

impl std::fmt::Display for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{:?}, {:?})", self.lower, self.upper)
    }
}

/// How a global array is split among the ranks of a communicator.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Distribution {
    /// Split along one axis (0 is nvmath's `Slab.X`, 1 `Slab.Y`, 2 `Slab.Z`): of `n` planes
    /// over `P` ranks, the first `n % P` ranks get `n / P + 1`, the others `n / P`.
    Slab(usize),
    /// Split over a process grid (pencils, for a grid with two parts above one): axis `a` is
    /// split into `grid[a]` parts as a slab would be, and rank `r` holds the part at `r`'s
    /// row-major coordinates in the grid (the last grid axis varies fastest).
    Grid(Vec<usize>),
}

impl Distribution {
    /// The box rank `rank` of `size` holds of an array of `shape`.
    pub fn region(&self, shape: &[usize], rank: usize, size: usize) -> Result<Region> {
        let grid = match self {
            Distribution::Slab(axis) => {
                if *axis >= shape.len() {
                    return Err(Error::invalid(format!(
                        "slab distribution along axis {axis} of a {}-d array",
                        shape.len()
                    )));
                }
                let mut g = vec![1; shape.len()];
                g[*axis] = size;
                g
            }
            Distribution::Grid(g) => {
                if g.len() != shape.len() || g.iter().product::<usize>() != size {
                    return Err(Error::invalid(format!(
                        "process grid {g:?} does not fit a {}-d array over {size} ranks (it \
                         needs one entry per axis and their product equal to the rank count)",
                        shape.len()
                    )));
                }
                g.clone()
            }
        };
        let mut left = rank;
        let mut lower = vec![0; shape.len()];
        let mut upper = vec![0; shape.len()];
        for a in (0..shape.len()).rev() {
            let (lo, hi) = split(shape[a], grid[a], left % grid[a]);
            (lower[a], upper[a]) = (lo, hi);
            left /= grid[a];
        }
        Ok(Region { lower, upper })
    }

    /// Every rank's box, in rank order.
    pub fn regions(&self, shape: &[usize], size: usize) -> Result<Vec<Region>> {
        (0..size).map(|r| self.region(shape, r, size)).collect()
    }
}

/// Part `index` of `n` items split into `parts`: the first `n % parts` parts one larger.
pub fn split(n: usize, parts: usize, index: usize) -> (usize, usize) {
    let (base, extra) = (n / parts, n % parts);
    let lo = index * base + index.min(extra);
    (lo, lo + base + usize::from(index < extra))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slabs_give_the_first_ranks_the_extra_planes() {
        let d = Distribution::Slab(0);
        let shapes: Vec<_> = (0..3)
            .map(|r| d.region(&[7, 4], r, 3).unwrap().shape())
            .collect();
        assert_eq!(shapes, [vec![3, 4], vec![2, 4], vec![2, 4]]);
        let r = Distribution::Slab(1).region(&[7, 4], 2, 3).unwrap();
        assert_eq!((r.lower, r.upper), (vec![0, 3], vec![7, 4]));
        // More ranks than planes: the last ones hold nothing.
        assert!(Distribution::Slab(0)
            .region(&[2, 4], 3, 4)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn grids_are_row_major() {
        let d = Distribution::Grid(vec![2, 3, 1]);
        let r = d.region(&[4, 6, 5], 4, 6).unwrap();
        assert_eq!((r.lower, r.upper), (vec![2, 2, 0], vec![4, 4, 5]));
        assert!(d.region(&[4, 6, 5], 0, 5).is_err());
    }

    #[test]
    fn boxes_intersect() {
        let a = Region::new(vec![0, 0], vec![4, 2]).unwrap();
        let b = Region::new(vec![2, 1], vec![6, 6]).unwrap();
        assert_eq!(
            a.intersect(&b),
            Some(Region::new(vec![2, 1], vec![4, 2]).unwrap())
        );
        let c = Region::new(vec![4, 0], vec![5, 2]).unwrap();
        assert_eq!(a.intersect(&c), None);
        assert!(Region::new(vec![2], vec![1]).is_err());
    }
}
