//! One local transform: a batch of 1-D FFTs along one axis of a C-order array that a rank holds
//! whole along that axis. The distributed FFT is a sequence of these and redistributions.
//!
//! Transforms here are unnormalised (as FFTW and cuFFT compute them); the plan scales once at
//! the end where the caller's normalisation asks for it.

/// Floating-point precision of a transform: complex64/float32 or complex128/float64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// 32-bit reals, complex of two of them.
    F32,
    /// 64-bit reals, complex of two of them.
    F64,
}

impl Precision {
    /// Bytes of one real number.
    pub fn real_size(self) -> usize {
        match self {
            Precision::F32 => 4,
            Precision::F64 => 8,
        }
    }

    /// Bytes of one complex number.
    pub fn complex_size(self) -> usize {
        2 * self.real_size()
    }
}

/// What one local transform computes along its axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LineKind {
    /// Complex to complex, `exp(-2 pi i jk/n)`.
    Forward,
    /// Complex to complex, `exp(+2 pi i jk/n)`, unscaled.
    Inverse,
    /// Real to complex (`n` reals give `n/2 + 1` complex numbers); the axis is the last one.
    RealForward,
    /// Complex to real, unscaled: `n/2 + 1` complex numbers give `n` reals; the axis is the
    /// last one. The input may be overwritten (cuFFT and realfft both use it as scratch).
    RealInverse {
        /// The real length along the axis (even or odd: the input alone cannot say).
        n: usize,
    },
}

/// A batch of 1-D transforms along `axis` of a C-order array of `shape`, in `precision`.
///
/// `shape` is the shape the transform reads: real for [`LineKind::RealForward`], complex for
/// the others. [`LineTransform::output_shape`] is the shape it writes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LineTransform {
    /// Local shape of the input, C order.
    pub shape: Vec<usize>,
    /// The axis the 1-D transforms run along.
    pub axis: usize,
    /// What they compute.
    pub kind: LineKind,
    /// Precision of the numbers.
    pub precision: Precision,
}

impl LineTransform {
    /// The shape the transform writes.
    pub fn output_shape(&self) -> Vec<usize> {
        let mut out = self.shape.clone();
        match self.kind {
            LineKind::Forward | LineKind::Inverse => {}
            LineKind::RealForward => out[self.axis] = self.shape[self.axis] / 2 + 1,
            LineKind::RealInverse { n } => out[self.axis] = n,
        }
        out
    }

    /// Bytes of one input element.
    pub fn input_element(&self) -> usize {
        match self.kind {
            LineKind::RealForward => self.precision.real_size(),
            _ => self.precision.complex_size(),
        }
    }

    /// Bytes of one output element.
    pub fn output_element(&self) -> usize {
        match self.kind {
            LineKind::RealInverse { .. } => self.precision.real_size(),
            _ => self.precision.complex_size(),
        }
    }

    /// The transform length along the axis (the real length for the real kinds).
    pub fn length(&self) -> usize {
        match self.kind {
            LineKind::RealInverse { n } => n,
            _ => self.shape[self.axis],
        }
    }

    /// Elements before the axis (`outer`), and after it (`inner`, the stride of the axis):
    /// element `(o, j, i)` sits at `(o * shape[axis] + j) * inner + i`.
    pub fn outer_inner(&self) -> (usize, usize) {
        let outer = self.shape[..self.axis].iter().product();
        let inner = self.shape[self.axis + 1..].iter().product();
        (outer, inner)
    }
}
