//! Inputs and expected results.
//!
//! Inputs are random elements that every rank regenerates from a seed, so each rank knows every
//! rank's contribution without communicating. Expected reductions are computed here, one element
//! at a time in rank order, wide (integers as `i128`, floats as `f64`) and without the library's
//! reduction loops, so a bug there cannot hide in the reference. Integers and float min/max must
//! match exactly; float sums, averages and products may differ by the rounding that any
//! summation order can introduce, which [`Expect::Approx`] bounds per element.

use crate::dtype::{DataType, ReduceOp};
use half::{bf16, f16};

/// splitmix64: a small deterministic stream, identical on every rank for one seed.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One seed from several words (a case and a rank, say).
pub(super) fn seed_of(words: &[u64]) -> u64 {
    words
        .iter()
        .fold(0x5eed, |s, &w| Rng::new(s ^ w.rotate_left(17)).next_u64())
}

/// `count` random elements of `dtype` as bytes, for an operation that reduces with `op` or
/// (`None`) only moves data.
///
/// Moved data is random bits, so any byte out of place shows. Reduced integers are random bits
/// too (sums and products wrap, as the library's do); reduced bools are 0 or 1. Reduced floats
/// (and both components of a complex) are finite: products use magnitudes in `[0.5, 2)` so
/// that no product over a few ranks overflows or underflows even in `f16`; everything else
/// uses `[-8, 8)`.
pub(super) fn random(dtype: DataType, op: Option<ReduceOp>, count: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(count * dtype.size());
    let (scalar, lanes) = (dtype.component(), lanes(dtype));
    for _ in 0..count * lanes {
        if op.is_some() && dtype == DataType::Bool {
            out.push((rng.next_u64() & 1) as u8);
            continue;
        }
        if op.is_none() || !scalar.is_float() {
            out.extend_from_slice(&rng.next_u64().to_le_bytes()[..scalar.size()]);
            continue;
        }
        let v = if op == Some(ReduceOp::Prod) {
            let sign = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
            sign * rng.uniform(0.5, 2.0)
        } else {
            rng.uniform(-8.0, 8.0)
        };
        out.extend_from_slice(&encode_float(scalar, v));
    }
    out
}

/// Real components per element: 2 for complex types, else 1. Approximate expectations hold
/// one value per component.
fn lanes(dtype: DataType) -> usize {
    if dtype.is_complex() {
        2
    } else {
        1
    }
}

/// What an output must hold.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Expect {
    /// Exactly these bytes.
    Exact(Vec<u8>),
    /// Per element, a value and how far the result may be from it.
    Approx {
        /// Expected values.
        want: Vec<f64>,
        /// Allowed absolute difference, per element.
        tol: Vec<f64>,
    },
}

impl Expect {
    /// Elements `start..start + len` (of `dtype`).
    pub(super) fn slice(&self, dtype: DataType, start: usize, len: usize) -> Expect {
        match self {
            Expect::Exact(b) => {
                let s = dtype.size();
                Expect::Exact(b[start * s..(start + len) * s].to_vec())
            }
            Expect::Approx { want, tol } => {
                let (a, b) = (start * lanes(dtype), (start + len) * lanes(dtype));
                Expect::Approx {
                    want: want[a..b].to_vec(),
                    tol: tol[a..b].to_vec(),
                }
            }
        }
    }
}

/// The first element of `got` that differs from `want`: its index and a description of both.
pub(super) fn first_mismatch(dtype: DataType, got: &[u8], want: &Expect) -> Option<String> {
    let s = dtype.size();
    match want {
        Expect::Exact(w) => {
            if got.len() != w.len() {
                return Some(format!("holds {} bytes, want {}", got.len(), w.len()));
            }
            let i = got
                .chunks_exact(s)
                .zip(w.chunks_exact(s))
                .position(|(g, w)| g != w)?;
            let (g, w) = (&got[i * s..(i + 1) * s], &w[i * s..(i + 1) * s]);
            Some(format!(
                "element {i}: got {}, want {}",
                show(dtype, g),
                show(dtype, w)
            ))
        }
        Expect::Approx { want, tol } => {
            let (scalar, lanes) = (dtype.component(), lanes(dtype));
            if got.len() * lanes != want.len() * s {
                return Some(format!(
                    "holds {} bytes, want {}",
                    got.len(),
                    want.len() * s / lanes
                ));
            }
            let part = |j: usize| match (lanes, j % 2) {
                (1, _) => String::new(),
                (_, 0) => " (real part)".into(),
                _ => " (imaginary part)".into(),
            };
            got.chunks_exact(scalar.size())
                .zip(want.iter().zip(tol))
                .enumerate()
                .find_map(|(j, (g, (&w, &t)))| {
                    let g = decode_float(scalar, g);
                    // Written so that a NaN result fails.
                    let close = (g - w).abs() <= t;
                    (!close).then(|| {
                        format!(
                            "element {}{}: got {}, want {} (tolerance {t:.1e})",
                            j / lanes,
                            part(j),
                            num(g),
                            num(w)
                        )
                    })
                })
        }
    }
}

/// The result of reducing `inputs` (one per rank, all the same length) elementwise with `op`,
/// folded in rank order.
pub(super) fn reduce(dtype: DataType, op: ReduceOp, inputs: &[Vec<u8>]) -> Expect {
    let s = dtype.size();
    let count = inputs.first().map_or(0, |i| i.len() / s);
    let elem = |r: usize, i: usize| &inputs[r][i * s..(i + 1) * s];
    if dtype == DataType::Bool {
        let f: fn(bool, bool) -> bool = match op {
            ReduceOp::Sum | ReduceOp::Max | ReduceOp::BOr => |a, b| a || b,
            ReduceOp::Prod | ReduceOp::Min | ReduceOp::BAnd => |a, b| a && b,
            ReduceOp::BXor => |a, b| a != b,
            ReduceOp::Avg => unreachable!("avg is not defined for bool"),
        };
        let out = (0..count)
            .map(|i| {
                let truth = |r: usize| elem(r, i)[0] != 0;
                (1..inputs.len()).fold(truth(0), |acc, r| f(acc, truth(r))) as u8
            })
            .collect();
        return Expect::Exact(out);
    }
    if dtype.is_complex() {
        return reduce_complex(dtype, op, inputs);
    }
    if !dtype.is_float() {
        let mut out = Vec::with_capacity(count * s);
        for i in 0..count {
            let mut acc = decode_int(dtype, elem(0, i));
            for r in 1..inputs.len() {
                let x = decode_int(dtype, elem(r, i));
                acc = match op {
                    ReduceOp::Sum => acc.wrapping_add(x),
                    ReduceOp::Prod => acc.wrapping_mul(x),
                    ReduceOp::Min => acc.min(x),
                    ReduceOp::Max => acc.max(x),
                    ReduceOp::BAnd => acc & x,
                    ReduceOp::BOr => acc | x,
                    ReduceOp::BXor => acc ^ x,
                    ReduceOp::Avg => unreachable!("avg is defined for floats only"),
                };
            }
            // Two's complement: the low bytes are the result modulo 2^bits, as wrapping gives.
            out.extend_from_slice(&acc.to_le_bytes()[..s]);
        }
        return Expect::Exact(out);
    }
    let n = inputs.len() as f64;
    let u = unit_roundoff(dtype);
    let (mut want, mut tol) = (Vec::with_capacity(count), Vec::with_capacity(count));
    for i in 0..count {
        let xs = (0..inputs.len()).map(|r| decode_float(dtype, elem(r, i)));
        let (w, t) = match op {
            ReduceOp::Sum | ReduceOp::Avg => {
                let (sum, abs) = xs.fold((0.0, 0.0), |(s, a), x| (s + x, a + x.abs()));
                // Any order of n - 1 additions, each rounded: at most (n - 1) u sum|x|. Twice
                // that leaves room for engines that round differently (through f32, say).
                let t = 2.0 * n * u * abs;
                if op == ReduceOp::Avg {
                    (sum / n, t / n + 2.0 * u * (sum / n).abs())
                } else {
                    (sum, t)
                }
            }
            ReduceOp::Prod => {
                let p = xs.product::<f64>();
                (p, 2.0 * n * u * p.abs())
            }
            ReduceOp::Min => (xs.fold(f64::INFINITY, f64::min), 0.0),
            ReduceOp::Max => (xs.fold(f64::NEG_INFINITY, f64::max), 0.0),
            _ => unreachable!("bitwise operators are defined for integers only"),
        };
        want.push(w);
        tol.push(t);
    }
    Expect::Approx { want, tol }
}

/// Complex reductions, per component: sums and averages of components are real sums; a product
/// is multiplied out in `f64`, with a tolerance relative to the product of the magnitudes
/// (each complex multiplication rounds each part within a few units of that).
fn reduce_complex(dtype: DataType, op: ReduceOp, inputs: &[Vec<u8>]) -> Expect {
    let scalar = dtype.component();
    if op != ReduceOp::Prod {
        let parts: Vec<Vec<u8>> = inputs.to_vec();
        return reduce(scalar, op, &parts);
    }
    let (s, h) = (dtype.size(), scalar.size());
    let count = inputs.first().map_or(0, |i| i.len() / s);
    let n = inputs.len() as f64;
    let u = unit_roundoff(scalar);
    let (mut want, mut tol) = (Vec::with_capacity(2 * count), Vec::with_capacity(2 * count));
    for i in 0..count {
        let z = |r: usize| {
            let b = &inputs[r][i * s..(i + 1) * s];
            (decode_float(scalar, &b[..h]), decode_float(scalar, &b[h..]))
        };
        let (mut re, mut im, mut mag) = (1.0f64, 0.0f64, 1.0f64);
        for r in 0..inputs.len() {
            let (a, b) = z(r);
            (re, im) = (re * a - im * b, re * b + im * a);
            mag *= a.hypot(b);
        }
        let t = 4.0 * n * u * mag;
        want.extend([re, im]);
        tol.extend([t, t]);
    }
    Expect::Approx { want, tol }
}

/// Half the distance between 1 and the next value: the relative error of one rounding.
fn unit_roundoff(dtype: DataType) -> f64 {
    match dtype {
        DataType::F16 => 2f64.powi(-11),
        DataType::BF16 => 2f64.powi(-8),
        DataType::F32 => 2f64.powi(-24),
        _ => 2f64.powi(-53),
    }
}

fn encode_float(dtype: DataType, v: f64) -> Vec<u8> {
    match dtype {
        DataType::F16 => f16::from_f64(v).to_le_bytes().to_vec(),
        DataType::BF16 => bf16::from_f64(v).to_le_bytes().to_vec(),
        DataType::F32 => (v as f32).to_le_bytes().to_vec(),
        DataType::F64 => v.to_le_bytes().to_vec(),
        _ => unreachable!("{dtype} is not a float type"),
    }
}

fn decode_float(dtype: DataType, b: &[u8]) -> f64 {
    match dtype {
        DataType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DataType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DataType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        _ => unreachable!("{dtype} is not a float type"),
    }
}

/// An integer element, sign- or zero-extended as its type says.
fn decode_int(dtype: DataType, b: &[u8]) -> i128 {
    match dtype {
        DataType::I8 => i8::from_le_bytes([b[0]]) as i128,
        DataType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as i128,
        DataType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as i128,
        DataType::U8 => b[0] as i128,
        DataType::U32 => u32::from_le_bytes(b.try_into().unwrap()) as i128,
        DataType::U64 => u64::from_le_bytes(b.try_into().unwrap()) as i128,
        DataType::I16 => i16::from_le_bytes(b.try_into().unwrap()) as i128,
        DataType::U16 => u16::from_le_bytes(b.try_into().unwrap()) as i128,
        DataType::Bool => b[0] as i128,
        _ => unreachable!("{dtype} is not an integer type"),
    }
}

/// One element for a message: its value and, for floats (whose bytes may be any pattern when
/// only moved), its bits.
fn show(dtype: DataType, b: &[u8]) -> String {
    if dtype.is_complex() {
        let h = dtype.component().size();
        let (re, im) = b.split_at(h);
        return format!(
            "{} + {}i",
            show(dtype.component(), re),
            show(dtype.component(), im)
        );
    }
    if dtype.is_float() {
        let bits: String = b.iter().rev().map(|x| format!("{x:02x}")).collect();
        format!("{} (0x{bits})", num(decode_float(dtype, b)))
    } else {
        decode_int(dtype, b).to_string()
    }
}

/// A float in as few characters as round-trip: plain when moderate, scientific otherwise.
fn num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 || !a.is_finite() || (1e-4..1e7).contains(&a) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_reference_wraps_like_the_type() {
        let a = vec![200u8, 3];
        let b = vec![100u8, 5];
        assert_eq!(
            reduce(DataType::U8, ReduceOp::Sum, &[a.clone(), b.clone()]),
            Expect::Exact(vec![44, 8])
        );
        assert_eq!(
            reduce(DataType::U8, ReduceOp::Prod, &[a.clone(), b.clone()]),
            Expect::Exact(vec![(200u32 * 100 % 256) as u8, 15])
        );
        // As i8, 200 is -56: the minimum is signed.
        assert_eq!(
            reduce(DataType::I8, ReduceOp::Min, &[a.clone(), b.clone()]),
            Expect::Exact(vec![200, 3])
        );
        assert_eq!(
            reduce(DataType::U8, ReduceOp::Min, &[a, b]),
            Expect::Exact(vec![100, 3])
        );
        let x = (-7i64).to_le_bytes().to_vec();
        let y = 3i64.to_le_bytes().to_vec();
        assert_eq!(
            reduce(DataType::I64, ReduceOp::BXor, &[x, y]),
            Expect::Exact((-7i64 ^ 3).to_le_bytes().to_vec())
        );
    }

    #[test]
    fn float_reference_bounds_rounding_and_catches_a_missing_rank() {
        let inputs: Vec<_> = (0..9)
            .map(|r| random(DataType::F16, Some(ReduceOp::Sum), 64, r))
            .collect();
        let want = reduce(DataType::F16, ReduceOp::Sum, &inputs);
        // The library's own f16 loop (rounding after every step) is within the tolerance.
        let mut acc = inputs[0].clone();
        for x in &inputs[1..] {
            crate::dtype::reduce_into(DataType::F16, ReduceOp::Sum, &mut acc, x);
        }
        assert_eq!(first_mismatch(DataType::F16, &acc, &want), None);
        // Leaving a rank out is not.
        let mut short = inputs[0].clone();
        for x in &inputs[1..8] {
            crate::dtype::reduce_into(DataType::F16, ReduceOp::Sum, &mut short, x);
        }
        let msg = first_mismatch(DataType::F16, &short, &want).expect("a mismatch");
        assert!(msg.starts_with("element "), "{msg}");
    }

    #[test]
    fn avg_and_prod_have_relative_tolerances() {
        let a = encode_float(DataType::F32, 1.5);
        let b = encode_float(DataType::F32, -0.75);
        let Expect::Approx { want, tol } =
            reduce(DataType::F32, ReduceOp::Avg, &[a.clone(), b.clone()])
        else {
            panic!("floats are approximate")
        };
        assert_eq!(want, [0.375]);
        assert!(tol[0] > 0.0 && tol[0] < 1e-5);
        let Expect::Approx { want, .. } = reduce(DataType::F32, ReduceOp::Prod, &[a, b]) else {
            panic!("floats are approximate")
        };
        assert_eq!(want, [-1.125]);
    }

    #[test]
    fn complex_products_multiply_out_and_name_the_part() {
        let z = |re: f32, im: f32| [re.to_le_bytes(), im.to_le_bytes()].concat();
        let inputs = [z(1.0, 2.0), z(3.0, -1.0)];
        let want = reduce(DataType::C64, ReduceOp::Prod, &inputs);
        assert_eq!(first_mismatch(DataType::C64, &z(5.0, 5.0), &want), None);
        let msg = first_mismatch(DataType::C64, &z(5.0, -5.0), &want).expect("a mismatch");
        assert!(msg.starts_with("element 0 (imaginary part)"), "{msg}");
        let sum = reduce(DataType::C64, ReduceOp::Sum, &inputs);
        assert_eq!(first_mismatch(DataType::C64, &z(4.0, 1.0), &sum), None);
        assert_eq!(
            sum.slice(DataType::C64, 0, 1),
            sum,
            "one complex element holds two values"
        );
    }

    #[test]
    fn bool_reference_is_logic() {
        let (a, b) = (vec![0u8, 1, 1, 0], vec![0u8, 1, 0, 1]);
        let r = |op| reduce(DataType::Bool, op, &[a.clone(), b.clone()]);
        assert_eq!(r(ReduceOp::Sum), Expect::Exact(vec![0, 1, 1, 1]));
        assert_eq!(r(ReduceOp::Prod), Expect::Exact(vec![0, 1, 0, 0]));
        assert_eq!(r(ReduceOp::BXor), Expect::Exact(vec![0, 0, 1, 1]));
        let x = random(DataType::Bool, Some(ReduceOp::Min), 64, 3);
        assert!(x.iter().all(|&v| v <= 1) && x.contains(&1) && x.contains(&0));
    }

    #[test]
    fn exact_mismatch_names_the_element() {
        let want = Expect::Exact(vec![1, 2, 3, 4]);
        assert_eq!(first_mismatch(DataType::U8, &[1, 2, 3, 4], &want), None);
        assert_eq!(
            first_mismatch(DataType::U8, &[1, 2, 9, 4], &want).unwrap(),
            "element 2: got 9, want 3"
        );
        assert!(first_mismatch(DataType::U8, &[1, 2], &want).is_some());
        assert_eq!(want.slice(DataType::U8, 1, 2), Expect::Exact(vec![2, 3]));
    }

    #[test]
    fn inputs_depend_on_the_seed_only() {
        let a = random(DataType::BF16, Some(ReduceOp::Prod), 100, 7);
        assert_eq!(a, random(DataType::BF16, Some(ReduceOp::Prod), 100, 7));
        assert_ne!(a, random(DataType::BF16, Some(ReduceOp::Prod), 100, 8));
        for c in a.chunks_exact(2) {
            let v = bf16::from_le_bytes([c[0], c[1]]).to_f64().abs();
            assert!((0.5..=2.0).contains(&v), "{v}");
        }
        assert_ne!(seed_of(&[1, 2]), seed_of(&[2, 1]));
    }
}
