//! Copying a sub-box between two C-order arrays: what packing a block for a peer and unpacking
//! one from it are.
//!
//! A sub-box of `extent` elements sits at `src_start` in an array of `src_shape` and goes to
//! `dst_start` in one of `dst_shape`. Axes on which the block spans both arrays whole merge
//! into the contiguous run below them, so a slab's block is one `memcpy` and a pencil's a few
//! long rows; what remains is a loop nest of runs ([`BlockCopy`]), which the host walks with
//! `copy_from_slice` and the device turns into 3-D copies.

/// One block copy as byte strides: `dims` (outermost first) of `(count, src_stride,
/// dst_stride)` around a contiguous run of `run` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockCopy {
    /// Bytes copied contiguously at each position of the loop nest.
    pub run: usize,
    /// The loops around the run, outermost first: (count, source stride, destination stride).
    pub dims: Vec<(usize, usize, usize)>,
    /// Byte offset of the block's first element in the source.
    pub src_offset: usize,
    /// Byte offset of the block's first element in the destination.
    pub dst_offset: usize,
}

/// Element strides of a C-order array of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * shape[a + 1];
    }
    s
}

/// Linear element offset of `at` in a C-order array of `shape`.
pub(crate) fn offset(shape: &[usize], at: &[usize]) -> usize {
    strides(shape).iter().zip(at).map(|(s, i)| s * i).sum()
}

/// Whether a block of `extent` at `start` in an array of `shape` is one contiguous range: the
/// axes below the first partial one are whole, those above it one element thick.
pub(crate) fn is_contiguous(shape: &[usize], extent: &[usize]) -> bool {
    match (0..shape.len()).find(|&a| extent[a] != 1) {
        None => true,
        Some(first) => (first + 1..shape.len()).all(|a| extent[a] == shape[a]),
    }
}

impl BlockCopy {
    /// The copy of a block of `extent` elements of `element` bytes from `src_start` in an array
    /// of `src_shape` to `dst_start` in one of `dst_shape`.
    pub(crate) fn new(
        element: usize,
        extent: &[usize],
        src_shape: &[usize],
        src_start: &[usize],
        dst_shape: &[usize],
        dst_start: &[usize],
    ) -> BlockCopy {
        let (ss, ds) = (strides(src_shape), strides(dst_shape));
        let src_offset = offset(src_shape, src_start) * element;
        let dst_offset = offset(dst_shape, dst_start) * element;
        // Walk up from the innermost axis, growing the run while axes are whole in both arrays.
        let mut run = element;
        let mut a = extent.len();
        while a > 0 {
            a -= 1;
            run *= extent[a];
            if extent[a] != src_shape[a] || extent[a] != dst_shape[a] {
                break;
            }
        }
        let dims = (0..a)
            .filter(|&k| extent[k] != 1)
            .map(|k| (extent[k], ss[k] * element, ds[k] * element))
            .collect();
        BlockCopy {
            run: if extent.contains(&0) { 0 } else { run },
            dims,
            src_offset,
            dst_offset,
        }
    }

    /// Bytes copied in all.
    pub(crate) fn bytes(&self) -> usize {
        self.run * self.dims.iter().map(|d| d.0).product::<usize>()
    }

    /// Run the copy between host buffers.
    pub(crate) fn host(&self, src: &[u8], dst: &mut [u8]) {
        if self.run == 0 {
            return;
        }
        walk(&self.dims, self.src_offset, self.dst_offset, &mut |s, d| {
            dst[d..d + self.run].copy_from_slice(&src[s..s + self.run]);
        });
    }
}

/// Call `f(src, dst)` at every position of the loop nest `dims`.
pub(crate) fn walk(
    dims: &[(usize, usize, usize)],
    s: usize,
    d: usize,
    f: &mut impl FnMut(usize, usize),
) {
    match dims.split_first() {
        None => f(s, d),
        Some((&(n, ss, ds), rest)) => {
            for i in 0..n {
                walk(rest, s + i * ss, d + i * ds, f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Element-by-element reference.
    fn naive(
        extent: &[usize],
        ss: &[usize],
        s0: &[usize],
        ds: &[usize],
        d0: &[usize],
        src: &[u16],
        dst: &mut [u16],
    ) {
        let n: usize = extent.iter().product();
        for mut k in 0..n {
            let mut idx = vec![0; extent.len()];
            for a in (0..extent.len()).rev() {
                idx[a] = k % extent[a];
                k /= extent[a];
            }
            let si: Vec<usize> = idx.iter().zip(s0).map(|(i, o)| i + o).collect();
            let di: Vec<usize> = idx.iter().zip(d0).map(|(i, o)| i + o).collect();
            dst[offset(ds, &di)] = src[offset(ss, &si)];
        }
    }

    #[test]
    fn block_copies_match_the_element_loop() {
        // (extent, source shape, source start, destination shape, destination start)
        type Case<'a> = (
            &'a [usize],
            &'a [usize],
            &'a [usize],
            &'a [usize],
            &'a [usize],
        );
        let cases: &[Case] = &[
            (&[2, 3, 4], &[5, 3, 4], &[1, 0, 0], &[2, 3, 4], &[0, 0, 0]),
            (&[2, 2, 3], &[5, 3, 4], &[3, 1, 1], &[4, 4, 3], &[1, 2, 0]),
            (&[1, 3, 1], &[1, 3, 1], &[0, 0, 0], &[2, 3, 1], &[1, 0, 0]),
            (&[0, 3], &[2, 3], &[0, 0], &[2, 3], &[0, 0]),
            (&[4], &[9], &[5], &[4], &[0]),
            (
                &[2, 1, 2, 2],
                &[3, 2, 2, 2],
                &[1, 1, 0, 0],
                &[2, 1, 2, 2],
                &[0, 0, 0, 0],
            ),
        ];
        for &(extent, ss, s0, ds, d0) in cases {
            let src: Vec<u16> = (0..ss.iter().product::<usize>() as u16).collect();
            let mut want = vec![u16::MAX; ds.iter().product()];
            naive(extent, ss, s0, ds, d0, &src, &mut want);
            let mut got = vec![u16::MAX; ds.iter().product()];
            let c = BlockCopy::new(2, extent, ss, s0, ds, d0);
            c.host(
                bytemuck::cast_slice(&src),
                bytemuck::cast_slice_mut(&mut got),
            );
            assert_eq!(got, want, "{extent:?} {c:?}");
            assert_eq!(c.bytes(), 2 * extent.iter().product::<usize>());
        }
        // A slab's block is a single run.
        let c = BlockCopy::new(
            8,
            &[2, 3, 4],
            &[5, 3, 4],
            &[1, 0, 0],
            &[2, 3, 4],
            &[0, 0, 0],
        );
        assert!(c.dims.is_empty() && c.run == 8 * 24, "{c:?}");
    }

    #[test]
    fn contiguity() {
        assert!(is_contiguous(&[4, 3, 2], &[2, 3, 2]));
        assert!(is_contiguous(&[4, 3, 2], &[1, 1, 2]));
        assert!(is_contiguous(&[4, 3, 2], &[1, 2, 2]));
        assert!(!is_contiguous(&[4, 3, 2], &[2, 2, 2]));
        assert!(!is_contiguous(&[4, 3, 2], &[1, 2, 1]));
    }
}
