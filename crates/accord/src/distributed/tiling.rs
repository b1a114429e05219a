//! Every rank's box together, checked to tile the global array exactly.

use super::layout::Region;
use crate::comm::Communicator;
use crate::dtype::DataType;
use crate::error::{Error, Result};

/// The boxes of all ranks (in rank order) of one global array: they cover it exactly, with
/// neither gaps nor overlaps. Every rank holds the same `Layout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    shape: Vec<usize>,
    regions: Vec<Region>,
}

impl Layout {
    /// Check that `regions` tile an array of `shape`: every box inside it, no two overlapping,
    /// nothing left over. Errors name the ranks whose boxes are wrong.
    pub fn new(shape: Vec<usize>, regions: Vec<Region>) -> Result<Layout> {
        for (r, b) in regions.iter().enumerate() {
            if b.ndim() != shape.len() {
                return Err(Error::invalid(format!(
                    "rank {r}'s box {b} has {} axes but the global array has {} (shape {shape:?})",
                    b.ndim(),
                    shape.len()
                )));
            }
            if let Some(a) = (0..shape.len()).find(|&a| b.upper[a] > shape[a]) {
                return Err(Error::invalid(format!(
                    "rank {r}'s box {b} reaches past the global shape {shape:?} on axis {a}"
                )));
            }
        }
        for (i, a) in regions.iter().enumerate() {
            for (j, b) in regions.iter().enumerate().skip(i + 1) {
                if let Some(both) = a.intersect(b) {
                    return Err(Error::invalid(format!(
                        "the boxes of ranks {i} ({a}) and {j} ({b}) overlap in {both}: each \
                         element of the global array must belong to one rank"
                    )));
                }
            }
        }
        let covered: usize = regions.iter().map(Region::volume).sum();
        let total: usize = shape.iter().product();
        if covered != total {
            let hole = uncovered(&shape, &regions)
                .map(|at| format!(" (index {at:?} is in none)"))
                .unwrap_or_default();
            let listed: Vec<String> = regions
                .iter()
                .enumerate()
                .map(|(r, b)| format!("rank {r}: {b}"))
                .collect();
            return Err(Error::invalid(format!(
                "the ranks' boxes cover {covered} of the {total} elements of the global shape \
                 {shape:?}{hole}; boxes: {}",
                listed.join(", ")
            )));
        }
        Ok(Layout { shape, regions })
    }

    /// Every rank's box of one array, told by each rank for itself (a collective call): the
    /// global shape is where the boxes end. `dtype` and the element size are checked to agree
    /// too, since ranks moving different element sizes would move wrong data. `what` names
    /// the operation in messages.
    pub fn gather(
        comm: &Communicator,
        mine: &Region,
        dtype: DataType,
        element: usize,
        what: &str,
    ) -> Result<Layout> {
        let size = comm.size();
        let head = [mine.ndim() as u64, dtype as u64, element as u64];
        let mut heads = vec![0u64; 3 * size];
        comm.all_gather(&head[..], &mut heads[..])?;
        for (r, h) in heads.chunks(3).enumerate() {
            if h[0] != head[0] {
                return Err(Error::invalid(format!(
                    "{what}: rank {r}'s box has {} axes but rank {}'s has {}",
                    h[0],
                    comm.rank(),
                    head[0]
                )));
            }
            if h[1] != head[1] || h[2] != head[2] {
                let theirs = DataType::from_u8(h[1] as u8)
                    .map_or_else(|| format!("type code {}", h[1]), |d| d.to_string());
                return Err(Error::invalid(format!(
                    "{what}: rank {r} moves {theirs} ({} bytes each) but rank {} {dtype} ({element} \
                     bytes each); every rank must pass the same element type",
                    h[2],
                    comm.rank()
                )));
            }
        }
        let ndim = mine.ndim();
        let corners: Vec<u64> = mine
            .lower
            .iter()
            .chain(&mine.upper)
            .map(|&x| x as u64)
            .collect();
        let mut all = vec![0u64; 2 * ndim * size];
        comm.all_gather(&corners[..], &mut all[..])?;
        let regions: Vec<Region> = all
            .chunks(2 * ndim)
            .map(|c| Region {
                lower: c[..ndim].iter().map(|&x| x as usize).collect(),
                upper: c[ndim..].iter().map(|&x| x as usize).collect(),
            })
            .collect();
        // A box with upper below lower never leaves `Region::new`; one built by hand is named.
        if let Some((r, b)) = regions
            .iter()
            .enumerate()
            .find(|(_, b)| b.lower.iter().zip(&b.upper).any(|(l, u)| u < l))
        {
            return Err(Error::invalid(format!(
                "{what}: rank {r}'s box {b} has an upper corner below its lower one"
            )));
        }
        let shape = (0..ndim)
            .map(|a| regions.iter().map(|b| b.upper[a]).max().unwrap_or(0))
            .collect();
        Layout::new(shape, regions).map_err(|e| match e {
            Error::InvalidArgument(m) => Error::invalid(format!("{what}: {m}")),
            other => other,
        })
    }

    /// The global shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Every rank's box, in rank order.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// Rank `r`'s box.
    pub fn region(&self, r: usize) -> &Region {
        &self.regions[r]
    }

    /// Whether every rank holds the whole extent of `axis` (or nothing).
    pub fn is_whole_along(&self, axis: usize) -> bool {
        self.regions
            .iter()
            .all(|b| b.is_empty() || (b.lower[axis] == 0 && b.upper[axis] == self.shape[axis]))
    }
}

/// A global index no box holds, looked for among the boxes' corners (where a gap must begin);
/// `None` when that search would be too long to be worth it.
fn uncovered(shape: &[usize], regions: &[Region]) -> Option<Vec<usize>> {
    let candidates: Vec<Vec<usize>> = (0..shape.len())
        .map(|a| {
            let mut c: Vec<usize> = std::iter::once(0)
                .chain(regions.iter().flat_map(|b| [b.lower[a], b.upper[a]]))
                .filter(|&i| i < shape[a])
                .collect();
            c.sort_unstable();
            c.dedup();
            c
        })
        .collect();
    let count = candidates
        .iter()
        .try_fold(1usize, |n, c| n.checked_mul(c.len()))?;
    if count > 1 << 20 {
        return None;
    }
    (0..count).find_map(|mut k| {
        let at: Vec<usize> = candidates
            .iter()
            .rev()
            .map(|c| {
                let i = c[k % c.len()];
                k /= c.len();
                i
            })
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        (!regions.iter().any(|b| b.contains(&at))).then_some(at)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(lower: &[usize], upper: &[usize]) -> Region {
        Region::new(lower.to_vec(), upper.to_vec()).unwrap()
    }

    #[test]
    fn a_tiling_passes_and_empty_boxes_are_allowed() {
        let l = Layout::new(
            vec![4, 4],
            vec![
                b(&[0, 0], &[2, 2]),
                b(&[2, 0], &[4, 2]),
                b(&[0, 2], &[4, 4]),
                b(&[0, 0], &[0, 4]),
            ],
        )
        .unwrap();
        assert!(!l.is_whole_along(0));
        assert!(Layout::new(vec![3, 2], vec![b(&[0, 0], &[3, 2])])
            .unwrap()
            .is_whole_along(1));
    }

    #[test]
    fn overlaps_and_gaps_name_the_ranks_and_an_index() {
        let e =
            Layout::new(vec![4, 4], vec![b(&[0, 0], &[3, 4]), b(&[2, 0], &[4, 4])]).unwrap_err();
        assert!(
            e.to_string().contains("ranks 0 ([[0, 0], [3, 4])) and 1"),
            "{e}"
        );
        let e =
            Layout::new(vec![4, 4], vec![b(&[0, 0], &[2, 4]), b(&[3, 0], &[4, 4])]).unwrap_err();
        assert!(e.to_string().contains("index [2, 0] is in none"), "{e}");
        let e =
            Layout::new(vec![4, 4], vec![b(&[0, 0], &[2, 5]), b(&[2, 0], &[4, 4])]).unwrap_err();
        assert!(e.to_string().contains("rank 0's box"), "{e}");
    }
}
