//! The distributed FFT: local transforms along the axes a rank holds whole, and
//! redistributions that make the remaining axes whole in turn.
//!
//! A plan is a list of stages every rank computes alike from the global layouts. For a 3-D
//! array in X slabs, a complex transform is: 1-D FFTs along Z and Y (both local), a
//! redistribution to Y slabs, FFTs along X, and (unless the caller takes the Y slabs as they
//! are, nvmath's `redistribute=False`) a redistribution back to X slabs. Pencils take one
//! redistribution more. A real-to-complex transform starts with the last axis (halving it to
//! `n/2 + 1`), a complex-to-real one ends with it.
//!
//! Every transform is unnormalised; the plan scales once, after its last local transform,
//! where [`Norm`] asks (numpy's conventions: `Backward`, the default, scales the inverse by
//! `1/N`).

use super::device::DeviceLines;
use super::host_lines::{self, HostLines};
use super::layout::{Distribution, Region};
use super::lines::{LineKind, LineTransform, Precision};
use super::redistribute::Redistribute;
use super::tiling::Layout;
use crate::buffer::{AsRecv, AsSend, RecvBuf, RecvData, SendBuf, SendData};
use crate::comm::{Communicator, Completion};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What the transform takes and gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FftKind {
    /// Complex to complex, forward or inverse.
    C2C,
    /// Real to complex (forward): the last axis `n` becomes `n/2 + 1` complex numbers.
    R2C,
    /// Complex to real (inverse): the last axis `m` becomes `2(m - 1)` reals, or `2(m - 1) + 1`
    /// with `odd` (nvmath's `last_axis_parity`).
    C2R {
        /// Whether the real length along the last axis is odd.
        odd: bool,
    },
}

/// Which way a transform goes: `exp(-2 pi i jk/n)` forward, `exp(+2 pi i jk/n)` inverse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// The forward transform.
    Forward,
    /// The inverse transform.
    Inverse,
}

/// Where the `1/N` goes, as numpy's `norm=` says (N: the number of points transformed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Norm {
    /// Forward unscaled, inverse scaled by `1/N` (numpy's default).
    #[default]
    Backward,
    /// Both scaled by `1/sqrt(N)`.
    Ortho,
    /// Forward scaled by `1/N`, inverse unscaled.
    Forward,
    /// Neither scaled (cuFFT's and nvmath's convention).
    None,
}

/// One step of a plan.
#[derive(Debug)]
pub(crate) enum Stage {
    /// A local transform; a complex one is planned as forward and flipped for an inverse run.
    Lines(LineTransform),
    /// A redistribution, moving elements of the given type.
    Move(Box<Redistribute>),
}

/// A distributed FFT over a communicator: planned once from the ranks' boxes, executed on any
/// number of arrays of that layout, on the host or (with a GPU attached) on device memory.
///
/// ```
/// use accord::distributed::{Direction, DistributedFft, Distribution, FftKind, Norm, Precision};
/// use accord::testing::run_world;
/// use num_complex::Complex;
/// // A 4 x 6 complex array in row slabs over 2 ranks: a delta at (0, 0) transforms to ones.
/// let out = run_world(2, |comm| {
///     let (r, p) = (comm.rank(), comm.size());
///     let mine = Distribution::Slab(0).region(&[4, 6], r, p).unwrap();
///     let fft = DistributedFft::new(&comm, &mine, Some(&mine), FftKind::C2C, Precision::F64).unwrap();
///     let mut a = vec![Complex::<f64>::default(); mine.volume()];
///     if r == 0 {
///         a[0] = Complex::new(1.0, 0.0);
///     }
///     let mut b = a.clone();
///     fft.execute(&comm, &a, &mut b, Direction::Forward, Norm::Backward).unwrap();
///     b
/// });
/// assert!(out.iter().flatten().all(|v| (v - Complex::new(1.0, 0.0)).norm() < 1e-12));
/// ```
#[derive(Debug)]
pub struct DistributedFft {
    rank: usize,
    kind: FftKind,
    pub(super) precision: Precision,
    input: Layout,
    output: Layout,
    pub(super) stages: Vec<Stage>,
    /// Index of the last local transform: scaling follows it.
    pub(super) last_lines: Option<usize>,
    /// Points transformed (the real shape's for the real kinds): what `Norm` divides by.
    points: usize,
    host_plans: Mutex<HashMap<(usize, Direction), Arc<HostLines>>>,
    /// cuFFT plans by (stage, direction, device), made on first use.
    pub(super) device_plans: Mutex<HashMap<(usize, Direction, usize), Arc<DeviceLines>>>,
    /// Host work buffers (8-byte aligned), kept between executions.
    work: Mutex<(Vec<u64>, Vec<u64>)>,
}

impl DistributedFft {
    /// Plan the transform of arrays laid out as this rank's `input` box says (complex, or real
    /// for [`FftKind::R2C`]), into `output` boxes, or, with `None`, into whatever layout the
    /// last stage leaves (the complementary slab for slab input: no final redistribution).
    /// Collective: every rank tells its boxes; both layouts are checked to tile their arrays.
    pub fn new(
        comm: &Communicator,
        input: &Region,
        output: Option<&Region>,
        kind: FftKind,
        precision: Precision,
    ) -> Result<DistributedFft> {
        let (in_type, out_type) = kind_types(kind, precision);
        let what = "FFT (input boxes)";
        let from = Layout::gather(comm, input, in_type, in_type.size(), what)?;
        let shape = from.shape().to_vec();
        if shape.len() < 2 {
            return Err(Error::invalid(format!(
                "FFT: a distributed transform needs an array of 2 or more axes, not shape {shape:?}"
            )));
        }
        if let Some(a) = shape.iter().position(|&n| n == 0) {
            return Err(Error::invalid(format!(
                "FFT: axis {a} of the global shape {shape:?} is empty; there is nothing to transform"
            )));
        }
        let last = shape.len() - 1;
        let out_shape = match kind {
            FftKind::C2C => shape.clone(),
            FftKind::R2C => with_last(&shape, shape[last] / 2 + 1),
            FftKind::C2R { odd } => with_last(&shape, 2 * (shape[last] - 1) + usize::from(odd)),
        };
        if matches!(kind, FftKind::C2R { .. }) && out_shape[last] == 0 {
            return Err(Error::invalid(format!(
                "FFT: a complex-to-real transform of last axis 1 gives 0 reals; pass odd parity \
                 for 1 (shape {shape:?})"
            )));
        }
        let wanted = match output {
            Some(o) => {
                let what = "FFT (output boxes)";
                let to = Layout::gather(comm, o, out_type, out_type.size(), what)?;
                if to.shape() != &out_shape[..] {
                    return Err(Error::invalid(format!(
                        "FFT: the output boxes cover a global shape of {:?} but the transform of \
                         {shape:?} gives {out_shape:?}",
                        to.shape()
                    )));
                }
                Some(to)
            }
            None => None,
        };
        let real_shape = if kind == FftKind::R2C {
            &shape
        } else {
            &out_shape
        };
        let points = match kind {
            FftKind::C2C => shape.iter().product(),
            _ => real_shape.iter().product(),
        };
        let planner = Planner {
            rank: comm.rank(),
            size: comm.size(),
            precision,
            stages: Vec::new(),
        };
        let (stages, output) = planner.plan(kind, from.clone(), wanted)?;
        let last_lines = stages.iter().rposition(|s| matches!(s, Stage::Lines(_)));
        Ok(DistributedFft {
            rank: comm.rank(),
            kind,
            precision,
            input: from,
            output,
            stages,
            last_lines,
            points,
            host_plans: Mutex::new(HashMap::new()),
            device_plans: Mutex::new(HashMap::new()),
            work: Mutex::new((Vec::new(), Vec::new())),
        })
    }

    /// The input layout.
    pub fn input(&self) -> &Layout {
        &self.input
    }

    /// The output layout.
    pub fn output(&self) -> &Layout {
        &self.output
    }

    /// Shape of this rank's input array.
    pub fn input_shape(&self) -> Vec<usize> {
        self.input.region(self.rank).shape()
    }

    /// Shape of this rank's output array.
    pub fn output_shape(&self) -> Vec<usize> {
        self.output.region(self.rank).shape()
    }

    /// Element types of the input and output arrays.
    pub fn types(&self) -> (DataType, DataType) {
        kind_types(self.kind, self.precision)
    }

    /// The redistributions of the plan, in order: what it moves between ranks.
    pub fn moves(&self) -> impl Iterator<Item = &Redistribute> {
        self.stages.iter().filter_map(|s| match s {
            Stage::Move(m) => Some(m.as_ref()),
            Stage::Lines(_) => None,
        })
    }

    /// Transform `input` (this rank's part of the input layout, C order) into `output`. The
    /// input is left as it was. Host buffers are done when this returns; device buffers (on
    /// one stream) complete on it.
    pub fn execute<'s, 'r>(
        &self,
        comm: &Communicator,
        input: impl AsSend<'s>,
        output: impl AsRecv<'r>,
        direction: Direction,
        norm: Norm,
    ) -> Result<Completion> {
        let (input, output) = (input.into_send(), output.into_recv());
        self.check(&input, &output, direction)?;
        let factor = self.factor(direction, norm);
        match (input.data, output.data) {
            (SendData::Host(src), RecvData::Host(dst)) => {
                self.host(comm, src, dst, direction, factor)
            }
            (SendData::Device(src, s), RecvData::Device(dst, _)) => {
                self.device(comm, src, dst, s, direction, factor)
            }
            _ => Err(Error::invalid(
                "FFT: the input and the output must both be in host memory or both in device \
                 memory",
            )),
        }
    }

    fn check(&self, input: &SendBuf<'_>, output: &RecvBuf<'_>, direction: Direction) -> Result<()> {
        match (self.kind, direction) {
            (FftKind::R2C, Direction::Inverse) => {
                return Err(Error::invalid(
                    "FFT: a real-to-complex transform runs forward only",
                ))
            }
            (FftKind::C2R { .. }, Direction::Forward) => {
                return Err(Error::invalid(
                    "FFT: a complex-to-real transform runs inverse only",
                ))
            }
            _ => {}
        }
        let (in_type, out_type) = self.types();
        for (what, dtype, bytes, want_type, shape) in [
            (
                "input",
                input.dtype,
                input.byte_len(),
                in_type,
                self.input_shape(),
            ),
            (
                "output",
                output.dtype,
                output.byte_len(),
                out_type,
                self.output_shape(),
            ),
        ] {
            if dtype != want_type {
                return Err(Error::invalid(format!(
                    "FFT: the {what} holds {dtype} but this transform's {what} is {want_type}"
                )));
            }
            let want = shape.iter().product::<usize>() * want_type.size();
            if bytes != want {
                return Err(Error::invalid(format!(
                    "FFT: rank {}'s {what} has {bytes} bytes but its box {shape:?} of \
                     {want_type} needs {want}",
                    self.rank
                )));
            }
        }
        Ok(())
    }

    /// What to multiply by after the last local transform (1: nothing).
    fn factor(&self, direction: Direction, norm: Norm) -> f64 {
        let n = self.points as f64;
        match (norm, direction) {
            (Norm::Backward, Direction::Inverse) | (Norm::Forward, Direction::Forward) => 1.0 / n,
            (Norm::Ortho, _) => 1.0 / n.sqrt(),
            _ => 1.0,
        }
    }

    /// The transform of stage `i` run in `direction` (complex stages flip for the inverse).
    pub(super) fn oriented(t: &LineTransform, direction: Direction) -> LineTransform {
        let mut t = t.clone();
        if t.kind == LineKind::Forward && direction == Direction::Inverse {
            t.kind = LineKind::Inverse;
        }
        t
    }

    fn host_lines(
        &self,
        i: usize,
        t: &LineTransform,
        direction: Direction,
    ) -> Result<Arc<HostLines>> {
        let mut plans = self.host_plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plans.get(&(i, direction)) {
            return Ok(p.clone());
        }
        let p = Arc::new(HostLines::new(&Self::oriented(t, direction))?);
        plans.insert((i, direction), p.clone());
        Ok(p)
    }

    fn host(
        &self,
        comm: &Communicator,
        src: &[u8],
        dst: &mut [u8],
        direction: Direction,
        factor: f64,
    ) -> Result<Completion> {
        let mut work = self.work.lock().unwrap_or_else(|e| e.into_inner());
        let (a, b) = &mut *work;
        // The last stage that writes a new array writes it into `dst` when only in-place
        // transforms follow (they need `dst` aligned; a move does not): one pass over the array
        // fewer than finishing in a work buffer and copying. With no such stage at all, the
        // transforms run in `dst` from the start.
        let n = self.stages.len();
        let last_fresh = self.stages.iter().rposition(Stage::writes_new_array);
        let aligned = (dst.as_ptr() as usize).is_multiple_of(8);
        let mut in_dst = aligned && last_fresh.is_none();
        let mut len = src.len();
        match in_dst {
            true => dst.copy_from_slice(src),
            false => bytes_mut(a, len).copy_from_slice(src),
        }
        for (i, stage) in self.stages.iter().enumerate() {
            let to_dst = Some(i) == last_fresh && (aligned || i + 1 == n);
            match stage {
                Stage::Lines(t) => {
                    let out_len = t.output_shape().iter().product::<usize>() * t.output_element();
                    if out_len > 0 {
                        let lines = self.host_lines(i, t, direction)?;
                        if !stage.writes_new_array() {
                            let data = if in_dst { &mut *dst } else { bytes_mut(a, len) };
                            lines.run(data, &mut [])?;
                        } else if to_dst {
                            lines.run(bytes_mut(a, len), dst)?;
                        } else {
                            lines.run(bytes_mut(a, len), bytes_mut(b, out_len))?;
                            std::mem::swap(a, b);
                        }
                    }
                    in_dst |= to_dst;
                    len = out_len;
                    if Some(i) == self.last_lines && factor != 1.0 {
                        let data = if in_dst { &mut *dst } else { bytes_mut(a, len) };
                        host_lines::scale(data, self.precision, factor)?;
                    }
                }
                Stage::Move(m) => {
                    let out_len = m.output_shape().iter().product::<usize>() * m.dtype.size();
                    // A move's input is never in `dst`: only in-place stages follow the one
                    // that fills it.
                    let send = SendBuf::bytes(bytes(a, len), m.dtype);
                    if to_dst {
                        m.execute(comm, send, RecvBuf::bytes(dst, m.dtype))?;
                        in_dst = true;
                    } else {
                        m.execute(comm, send, RecvBuf::bytes(bytes_mut(b, out_len), m.dtype))?;
                        std::mem::swap(a, b);
                    }
                    len = out_len;
                }
            }
        }
        if !in_dst {
            dst.copy_from_slice(bytes(a, len));
        }
        Ok(Completion::done())
    }
}

impl Stage {
    /// Whether the stage writes a new array rather than transforming one in place: a move, or
    /// a real transform (its input and output differ in type).
    pub(super) fn writes_new_array(&self) -> bool {
        match self {
            Stage::Move(_) => true,
            Stage::Lines(t) => t.input_element() != t.output_element(),
        }
    }
}

/// The first `len` bytes of an aligned work buffer, growing it as needed.
fn bytes_mut(buf: &mut Vec<u64>, len: usize) -> &mut [u8] {
    let words = len.div_ceil(8);
    if buf.len() < words {
        buf.resize(words, 0);
    }
    &mut bytemuck::cast_slice_mut(buf.as_mut_slice())[..len]
}

fn bytes(buf: &[u64], len: usize) -> &[u8] {
    &bytemuck::cast_slice(buf)[..len]
}

/// Element types of a transform's input and output.
fn kind_types(kind: FftKind, precision: Precision) -> (DataType, DataType) {
    let (real, complex) = match precision {
        Precision::F32 => (DataType::F32, DataType::C64),
        Precision::F64 => (DataType::F64, DataType::C128),
    };
    match kind {
        FftKind::C2C => (complex, complex),
        FftKind::R2C => (real, complex),
        FftKind::C2R { .. } => (complex, real),
    }
}

fn with_last(shape: &[usize], n: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    *s.last_mut().expect("2 or more axes") = n;
    s
}

/// Builds a plan's stages.
struct Planner {
    rank: usize,
    size: usize,
    precision: Precision,
    stages: Vec<Stage>,
}

impl Planner {
    /// The stages from `input` to `wanted` (or to where they end), and the final layout.
    fn plan(
        mut self,
        kind: FftKind,
        input: Layout,
        wanted: Option<Layout>,
    ) -> Result<(Vec<Stage>, Layout)> {
        let (in_type, out_type) = kind_types(kind, self.precision);
        let complex = match kind {
            FftKind::C2R { .. } => in_type,
            _ => out_type,
        };
        let ndim = input.shape().len();
        let last = ndim - 1;
        let mut cur = input;
        let pending: Vec<usize> = match kind {
            FftKind::C2C => (0..ndim).collect(),
            FftKind::R2C => {
                cur = self.make_whole(cur, last, in_type)?;
                self.lines(&cur, last, LineKind::RealForward);
                let m = cur.shape()[last] / 2 + 1;
                cur = resize_last(&cur, m)?;
                (0..last).collect()
            }
            FftKind::C2R { .. } => (0..last).collect(),
        };
        let direction = match kind {
            FftKind::C2R { .. } => LineKind::Inverse,
            _ => LineKind::Forward,
        };
        let mut pending = pending;
        while !pending.is_empty() {
            // Every pending axis held whole goes now, innermost first (shortest strides).
            let mut local: Vec<usize> = pending
                .iter()
                .copied()
                .filter(|&a| cur.is_whole_along(a))
                .collect();
            local.sort_unstable_by(|a, b| b.cmp(a));
            for &a in &local {
                self.lines(&cur, a, direction);
            }
            pending.retain(|a| !local.contains(a));
            if let Some(&next) = pending.iter().max() {
                cur = self.make_whole(cur, next, complex)?;
            }
        }
        if let FftKind::C2R { odd } = kind {
            cur = self.make_whole(cur, last, complex)?;
            let n = 2 * (cur.shape()[last] - 1) + usize::from(odd);
            self.lines(&cur, last, LineKind::RealInverse { n });
            cur = resize_last(&cur, n)?;
        }
        if let Some(to) = wanted {
            if to != cur {
                self.push_move(cur, to.clone(), out_type);
                cur = to;
            }
        }
        Ok((self.stages, cur))
    }

    fn lines(&mut self, cur: &Layout, axis: usize, kind: LineKind) {
        let shape = cur.region(self.rank).shape();
        self.stages.push(Stage::Lines(LineTransform {
            shape,
            axis,
            kind,
            precision: self.precision,
        }));
    }

    fn push_move(&mut self, from: Layout, to: Layout, dtype: DataType) {
        let plan = Redistribute::from_layouts(self.rank, from, to, dtype, dtype.size());
        self.stages.push(Stage::Move(Box::new(plan)));
    }

    /// `cur` if every rank holds `axis` whole, else a move to the best layout that does.
    fn make_whole(&mut self, cur: Layout, axis: usize, dtype: DataType) -> Result<Layout> {
        if cur.is_whole_along(axis) {
            return Ok(cur);
        }
        let next = best_layout(&cur, axis, self.size)?;
        self.push_move(cur, next.clone(), dtype);
        Ok(next)
    }
}

/// Of the process grids over the axes other than `axis`, the one whose largest box is
/// smallest; then the one whose ranks exchange with the fewest peers coming from `cur`; then
/// the one that splits the outer axes most (X slabs before Y slabs, as nvmath pairs them).
fn best_layout(cur: &Layout, axis: usize, size: usize) -> Result<Layout> {
    let shape = cur.shape();
    let others: Vec<usize> = (0..shape.len()).filter(|&a| a != axis).collect();
    // (largest box, most peers, grid preference): smaller is better.
    type Score = (usize, usize, std::cmp::Reverse<Vec<usize>>);
    let mut best: Option<(Score, Layout)> = None;
    for factors in factorizations(size, others.len()) {
        let mut grid = vec![1; shape.len()];
        for (a, f) in others.iter().zip(&factors) {
            grid[*a] = *f;
        }
        let regions = Distribution::Grid(grid.clone()).regions(shape, size)?;
        let volume = regions.iter().map(Region::volume).max().unwrap_or(0);
        let peers = (0..size)
            .map(|r| {
                let mine = cur.region(r);
                regions
                    .iter()
                    .enumerate()
                    .filter(|(j, b)| *j != r && mine.intersect(b).is_some())
                    .count()
            })
            .max()
            .unwrap_or(0);
        let score = (volume, peers, std::cmp::Reverse(grid));
        if best.as_ref().is_none_or(|(s, _)| score < *s) {
            best = Some((score, Layout::new(shape.to_vec(), regions)?));
        }
    }
    best.map(|(_, l)| l)
        .ok_or_else(|| Error::invalid("FFT: no process grid fits (no ranks?)"))
}

/// Every way of writing `n` as an ordered product of `k` factors.
fn factorizations(n: usize, k: usize) -> Vec<Vec<usize>> {
    if k == 1 {
        return vec![vec![n]];
    }
    (1..=n)
        .filter(|f| n.is_multiple_of(*f))
        .flat_map(|f| {
            factorizations(n / f, k - 1)
                .into_iter()
                .map(move |mut rest| {
                    rest.insert(0, f);
                    rest
                })
        })
        .collect()
}

/// The same boxes over an array whose last axis (held whole by every rank) is now `n` long.
fn resize_last(cur: &Layout, n: usize) -> Result<Layout> {
    let last = cur.shape().len() - 1;
    let regions = cur
        .regions()
        .iter()
        .map(|b| {
            let mut b = b.clone();
            if b.is_empty() {
                (b.lower[last], b.upper[last]) = (0, 0);
            } else {
                (b.lower[last], b.upper[last]) = (0, n);
            }
            b
        })
        .collect();
    Layout::new(with_last(cur.shape(), n), regions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factorizations_are_complete() {
        assert_eq!(factorizations(4, 2), [vec![1, 4], vec![2, 2], vec![4, 1]]);
        assert_eq!(factorizations(6, 1), [vec![6]]);
        assert_eq!(factorizations(12, 3).len(), 18);
    }

    #[test]
    fn x_slabs_pair_with_y_slabs() {
        let shape = vec![8, 8, 8];
        let x = Layout::new(
            shape.clone(),
            Distribution::Slab(0).regions(&shape, 4).unwrap(),
        )
        .unwrap();
        let y = Layout::new(
            shape.clone(),
            Distribution::Slab(1).regions(&shape, 4).unwrap(),
        )
        .unwrap();
        assert_eq!(best_layout(&x, 0, 4).unwrap(), y);
        assert_eq!(best_layout(&y, 1, 4).unwrap(), x);
        // More ranks than planes: pencils keep every rank busy.
        let small = vec![2, 2, 8];
        let x = Layout::new(
            small.clone(),
            Distribution::Slab(2).regions(&small, 4).unwrap(),
        )
        .unwrap();
        let p = best_layout(&x, 2, 4).unwrap();
        assert!(p.regions().iter().all(|b| b.volume() == 8), "{p:?}");
    }
}
