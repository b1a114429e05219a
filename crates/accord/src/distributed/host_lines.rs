//! [`LineTransform`]s on host memory, with rustfft (complex) and realfft (real input/output).
//!
//! rustfft transforms contiguous lines. Along the last axis the lines are contiguous already;
//! along another axis a tile of lines is gathered into scratch (a small transpose), transformed
//! as one batch and scattered back, so that the FFT always streams through memory.

use super::lines::{LineKind, LineTransform, Precision};
use crate::error::{Error, Result};
use num_complex::Complex;
use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};
use rustfft::{Fft, FftDirection, FftNum, FftPlanner};
use std::sync::Arc;

/// Lines gathered per tile along a strided axis: enough to amortise the FFT call, few enough
/// for the tile to stay in cache.
const TILE: usize = 16;

/// A planned transform in one precision.
enum Planned<T: FftNum> {
    Complex(Arc<dyn Fft<T>>),
    RealForward(Arc<dyn RealToComplex<T>>),
    RealInverse(Arc<dyn ComplexToReal<T>>),
}

enum Either {
    F32(Planned<f32>),
    F64(Planned<f64>),
}

/// A [`LineTransform`] planned for the host.
pub(crate) struct HostLines {
    t: LineTransform,
    plan: Either,
}

impl std::fmt::Debug for HostLines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostLines({:?})", self.t)
    }
}

fn plan<T: FftNum>(t: &LineTransform) -> Planned<T> {
    let n = t.length();
    match t.kind {
        LineKind::Forward => Planned::Complex(FftPlanner::new().plan_fft(n, FftDirection::Forward)),
        LineKind::Inverse => Planned::Complex(FftPlanner::new().plan_fft(n, FftDirection::Inverse)),
        LineKind::RealForward => Planned::RealForward(RealFftPlanner::new().plan_fft_forward(n)),
        LineKind::RealInverse { .. } => {
            Planned::RealInverse(RealFftPlanner::new().plan_fft_inverse(n))
        }
    }
}

impl HostLines {
    /// Plan `t` (the real kinds only along the last axis).
    pub(crate) fn new(t: &LineTransform) -> Result<HostLines> {
        let real = !matches!(t.kind, LineKind::Forward | LineKind::Inverse);
        if real && t.axis + 1 != t.shape.len() {
            return Err(Error::invalid(format!(
                "a real-to-complex or complex-to-real transform runs along the last axis, not \
                 axis {} of {:?}",
                t.axis, t.shape
            )));
        }
        let plan = match t.precision {
            Precision::F32 => Either::F32(plan(t)),
            Precision::F64 => Either::F64(plan(t)),
        };
        Ok(HostLines { t: t.clone(), plan })
    }

    /// Run the transform: complex kinds in place on `data` (the output is `data` too, `out`
    /// unused); the real kinds from `data` (overwritten) into `out`.
    pub(crate) fn run(&self, data: &mut [u8], out: &mut [u8]) -> Result<()> {
        let (outer, inner) = self.t.outer_inner();
        match &self.plan {
            Either::F32(p) => run(p, &self.t, outer, inner, data, out),
            Either::F64(p) => run(p, &self.t, outer, inner, data, out),
        }
    }
}

fn cast<'a, T: bytemuck::Pod>(bytes: &'a mut [u8], what: &str) -> Result<&'a mut [T]> {
    let (len, at) = (bytes.len(), bytes.as_ptr());
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| {
        Error::invalid(format!(
            "FFT {what}: {len} bytes at {at:p} do not hold whole aligned {}-byte numbers ({e})",
            std::mem::size_of::<T>()
        ))
    })
}

fn run<T: FftNum + bytemuck::Pod>(
    p: &Planned<T>,
    t: &LineTransform,
    outer: usize,
    inner: usize,
    data: &mut [u8],
    out: &mut [u8],
) -> Result<()>
where
    Complex<T>: bytemuck::Pod,
{
    let n = t.length();
    match p {
        Planned::Complex(fft) => {
            let data: &mut [Complex<T>] = cast(data, "data")?;
            if n == 0 || data.is_empty() {
                return Ok(());
            }
            if inner == 1 {
                let mut scratch =
                    vec![Complex::new(T::zero(), T::zero()); fft.get_inplace_scratch_len()];
                fft.process_with_scratch(data, &mut scratch);
                return Ok(());
            }
            strided(fft.as_ref(), data, outer, n, inner);
        }
        Planned::RealForward(r2c) => {
            let (input, output): (&mut [T], &mut [Complex<T>]) =
                (cast(data, "input")?, cast(out, "output")?);
            let m = n / 2 + 1;
            let mut scratch = r2c.make_scratch_vec();
            for (line, spec) in input
                .chunks_exact_mut(n.max(1))
                .zip(output.chunks_exact_mut(m))
            {
                r2c.process_with_scratch(line, spec, &mut scratch)
                    .map_err(|e| Error::invalid(format!("real-to-complex FFT: {e}")))?;
            }
        }
        Planned::RealInverse(c2r) => {
            let (input, output): (&mut [Complex<T>], &mut [T]) =
                (cast(data, "input")?, cast(out, "output")?);
            let m = n / 2 + 1;
            let mut scratch = c2r.make_scratch_vec();
            for (spec, line) in input
                .chunks_exact_mut(m)
                .zip(output.chunks_exact_mut(n.max(1)))
            {
                match c2r.process_with_scratch(spec, line, &mut scratch) {
                    // A non-zero imaginary part where a real signal's spectrum has none: the
                    // transform ignored it, as numpy's irfft and cuFFT do.
                    Ok(()) | Err(realfft::FftError::InputValues(..)) => {}
                    Err(e) => return Err(Error::invalid(format!("complex-to-real FFT: {e}"))),
                }
            }
        }
    }
    Ok(())
}

/// Transform along a strided axis: for each of the `outer` slices (an `n` x `inner` matrix),
/// gather `TILE` columns into rows of scratch, transform them as one batch, scatter back.
fn strided<T: FftNum>(
    fft: &dyn Fft<T>,
    data: &mut [Complex<T>],
    outer: usize,
    n: usize,
    inner: usize,
) {
    let mut tile = vec![Complex::new(T::zero(), T::zero()); TILE * n];
    let mut scratch = vec![Complex::new(T::zero(), T::zero()); fft.get_inplace_scratch_len()];
    for o in 0..outer {
        let slice = &mut data[o * n * inner..(o + 1) * n * inner];
        let mut c0 = 0;
        while c0 < inner {
            let w = TILE.min(inner - c0);
            for j in 0..n {
                let row = &slice[j * inner + c0..j * inner + c0 + w];
                for (c, v) in row.iter().enumerate() {
                    tile[c * n + j] = *v;
                }
            }
            fft.process_with_scratch(&mut tile[..w * n], &mut scratch);
            for j in 0..n {
                let row = &mut slice[j * inner + c0..j * inner + c0 + w];
                for (c, v) in row.iter_mut().enumerate() {
                    *v = tile[c * n + j];
                }
            }
            c0 += w;
        }
    }
}

/// Multiply every real number in `data` (complex numbers count as two) by `factor`.
pub(crate) fn scale(data: &mut [u8], precision: Precision, factor: f64) -> Result<()> {
    match precision {
        Precision::F32 => cast::<f32>(data, "scaling")?
            .iter_mut()
            .for_each(|x| *x *= factor as f32),
        Precision::F64 => cast::<f64>(data, "scaling")?
            .iter_mut()
            .for_each(|x| *x *= factor),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DFT by its definition, along `axis` of a C-order complex array.
    fn naive(shape: &[usize], axis: usize, x: &[Complex<f64>], sign: f64) -> Vec<Complex<f64>> {
        let n = shape[axis];
        let inner: usize = shape[axis + 1..].iter().product();
        let mut y = vec![Complex::default(); x.len()];
        for (i, out) in y.iter_mut().enumerate() {
            let (o, k, c) = (i / (n * inner), (i / inner) % n, i % inner);
            for j in 0..n {
                let w = sign * 2.0 * std::f64::consts::PI * (j * k) as f64 / n as f64;
                *out += x[(o * n + j) * inner + c] * Complex::new(w.cos(), w.sin());
            }
        }
        y
    }

    fn data(len: usize) -> Vec<Complex<f64>> {
        (0..len)
            .map(|i| Complex::new(((i * 37) % 11) as f64 - 5.0, ((i * 17) % 7) as f64 * 0.5))
            .collect()
    }

    fn close(a: &[Complex<f64>], b: &[Complex<f64>]) {
        let scale = b.iter().map(|v| v.norm()).fold(1.0, f64::max);
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).norm() <= 1e-12 * scale, "{x} vs {y}");
        }
    }

    #[test]
    fn complex_lines_match_the_definition_on_every_axis() {
        for shape in [vec![3, 5, 4], vec![2, 7, 9], vec![1, 8, 1], vec![17, 33]] {
            for axis in 0..shape.len() {
                for (kind, sign) in [(LineKind::Forward, -1.0), (LineKind::Inverse, 1.0)] {
                    let x = data(shape.iter().product());
                    let t = LineTransform {
                        shape: shape.clone(),
                        axis,
                        kind,
                        precision: Precision::F64,
                    };
                    let mut y = x.clone();
                    HostLines::new(&t)
                        .unwrap()
                        .run(bytemuck::cast_slice_mut(&mut y), &mut [])
                        .unwrap();
                    close(&y, &naive(&shape, axis, &x, sign));
                }
            }
        }
    }

    #[test]
    fn real_lines_match_the_complex_transform() {
        for n in [1usize, 6, 7] {
            let shape = vec![3, n];
            let real: Vec<f64> = (0..3 * n).map(|i| ((i * 13) % 5) as f64 - 2.0).collect();
            let t = LineTransform {
                shape: shape.clone(),
                axis: 1,
                kind: LineKind::RealForward,
                precision: Precision::F64,
            };
            let mut spec = vec![Complex::<f64>::default(); 3 * (n / 2 + 1)];
            let mut input = real.clone();
            HostLines::new(&t)
                .unwrap()
                .run(
                    bytemuck::cast_slice_mut(&mut input),
                    bytemuck::cast_slice_mut(&mut spec),
                )
                .unwrap();
            let full = naive(
                &shape,
                1,
                &real
                    .iter()
                    .map(|&r| Complex::new(r, 0.0))
                    .collect::<Vec<_>>(),
                -1.0,
            );
            let half: Vec<_> = full
                .chunks(n)
                .flat_map(|l| l[..n / 2 + 1].to_vec())
                .collect();
            close(&spec, &half);
            // And back: n times the input (unnormalised).
            let back = LineTransform {
                shape: vec![3, n / 2 + 1],
                axis: 1,
                kind: LineKind::RealInverse { n },
                precision: Precision::F64,
            };
            let mut out = vec![0f64; 3 * n];
            HostLines::new(&back)
                .unwrap()
                .run(
                    bytemuck::cast_slice_mut(&mut spec),
                    bytemuck::cast_slice_mut(&mut out),
                )
                .unwrap();
            for (a, b) in out.iter().zip(&real) {
                assert!((a - n as f64 * b).abs() < 1e-9, "{out:?} vs {real:?}");
            }
        }
        let bad = LineTransform {
            shape: vec![4, 3],
            axis: 0,
            kind: LineKind::RealForward,
            precision: Precision::F32,
        };
        assert!(HostLines::new(&bad)
            .unwrap_err()
            .to_string()
            .contains("last axis"));
    }
}
