//! The distributed FFT's device primitives on one GPU: cuFFT line transforms (every kind, both
//! precisions, every axis of 3-D arrays) against a naive DFT on the host, the 3-D strided copy
//! against a host copy, and the scale kernel. Without CUDA, NVRTC or cuFFT every test prints
//! why it skips.

use accord::distributed::device::{copy_3d, scale, Copy3d, DeviceLines};
use accord::distributed::lines::{LineKind, LineTransform, Precision};
use accord::gpu::cuda::{self, cufft, nvrtc, CuStream, Driver};

fn ready(test: &str) -> bool {
    let why = match cuda::driver().and_then(|d| d.device_count()) {
        Ok(0) => Some("no CUDA device visible".to_string()),
        Ok(_) => nvrtc::compile("extern \"C\" __global__ void k() {}", "probe", &[], 0)
            .and_then(|_| cufft::cufft())
            .err()
            .map(|e| e.to_string()),
        Err(e) => Some(e.to_string()),
    };
    if let Some(why) = &why {
        println!("{test}: skipping: {why}");
    }
    why.is_none()
}

/// The driver, with device 0's primary context current on this thread.
fn cu() -> &'static Driver {
    let cu = cuda::driver().unwrap();
    let ctx = cu.primary_context(0).unwrap();
    // SAFETY: a context the driver just handed out.
    cu.check(unsafe { (cu.ctx_set_current)(ctx) }, "cuCtxSetCurrent")
        .unwrap();
    cu
}

/// Device memory, freed on drop.
struct Dev {
    ptr: u64,
    bytes: usize,
}

impl Dev {
    fn new(bytes: usize) -> Dev {
        let cu = cu();
        let mut ptr = 0;
        // SAFETY: out-pointer to a local.
        cu.check(
            unsafe { (cu.mem_alloc)(&mut ptr, bytes.max(1)) },
            "cuMemAlloc",
        )
        .unwrap();
        Dev { ptr, bytes }
    }

    fn from(data: &[u8]) -> Dev {
        let d = Dev::new(data.len());
        d.write(data);
        d
    }

    fn write(&self, data: &[u8]) {
        assert!(data.len() <= self.bytes);
        let cu = cu();
        // SAFETY: `data.len()` bytes fit the allocation. The context-wide synchronisation makes
        // the copy complete before work on non-blocking streams starts.
        unsafe {
            cu.check(
                (cu.memcpy_htod)(self.ptr, data.as_ptr().cast(), data.len()),
                "cuMemcpyHtoD",
            )
            .unwrap();
            cu.check((cu.ctx_synchronize)(), "cuCtxSynchronize")
                .unwrap();
        }
    }

    fn read(&self) -> Vec<u8> {
        let cu = cu();
        let mut out = vec![0u8; self.bytes];
        // SAFETY: the whole allocation, after every stream's work has finished.
        unsafe {
            cu.check((cu.ctx_synchronize)(), "cuCtxSynchronize")
                .unwrap();
            cu.check(
                (cu.memcpy_dtoh)(out.as_mut_ptr().cast(), self.ptr, self.bytes),
                "cuMemcpyDtoH",
            )
            .unwrap();
        }
        out
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let cu = cu();
        // SAFETY: allocated in `new`, freed once.
        unsafe { (cu.mem_free)(self.ptr) };
    }
}

/// A non-blocking stream, destroyed on drop.
struct Stream(CuStream);

impl Stream {
    fn new() -> Stream {
        Stream(cu().new_stream().unwrap())
    }
    fn raw(&self) -> usize {
        self.0 as usize
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let cu = cu();
        // SAFETY: created in `new`; synchronised first so nothing is pending on it.
        unsafe {
            (cu.stream_synchronize)(self.0);
            (cu.stream_destroy)(self.0);
        }
    }
}

/// xorshift64*: reproducible data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Reals rounded to `p` (so the host reference sees what the device sees).
fn rounded(v: f64, p: Precision) -> f64 {
    match p {
        Precision::F32 => v as f32 as f64,
        Precision::F64 => v,
    }
}

fn to_bytes(v: &[f64], p: Precision) -> Vec<u8> {
    match p {
        Precision::F32 => v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect(),
        Precision::F64 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

fn from_bytes(b: &[u8], p: Precision) -> Vec<f64> {
    match p {
        Precision::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        Precision::F64 => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
    }
}

/// `X[k] = sum_j x[j] exp(sign 2 pi i jk / n)`, the O(n^2) definition.
fn dft(x: &[(f64, f64)], sign: f64) -> Vec<(f64, f64)> {
    let n = x.len();
    (0..n)
        .map(|k| {
            x.iter()
                .enumerate()
                .fold((0.0, 0.0), |(re, im), (j, &(a, b))| {
                    let angle = sign * 2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
                    let (s, c) = angle.sin_cos();
                    (re + a * c - b * s, im + a * s + b * c)
                })
        })
        .collect()
}

fn is_complex_in(k: LineKind) -> bool {
    !matches!(k, LineKind::RealForward)
}

fn is_complex_out(k: LineKind) -> bool {
    !matches!(k, LineKind::RealInverse { .. })
}

/// What `t` computes, on the host, from `input` (reals; complex numbers as pairs).
fn reference(t: &LineTransform, input: &[f64]) -> Vec<f64> {
    let (outer, inner) = t.outer_inner();
    let m_in = t.shape[t.axis];
    let m_out = t.output_shape()[t.axis];
    let n = t.length();
    let (cin, cout) = (is_complex_in(t.kind), is_complex_out(t.kind));
    let mut out = vec![0.0; outer * m_out * inner * if cout { 2 } else { 1 }];
    for o in 0..outer {
        for i in 0..inner {
            let get = |j: usize| {
                let e = (o * m_in + j) * inner + i;
                if cin {
                    (input[2 * e], input[2 * e + 1])
                } else {
                    (input[e], 0.0)
                }
            };
            let line: Vec<(f64, f64)> = match t.kind {
                // The full spectrum the half one stands for: X[n - k] = conj(X[k]).
                LineKind::RealInverse { .. } => (0..n)
                    .map(|k| match k <= n / 2 {
                        true => get(k),
                        false => {
                            let (a, b) = get(n - k);
                            (a, -b)
                        }
                    })
                    .collect(),
                _ => (0..n).map(get).collect(),
            };
            let sign = match t.kind {
                LineKind::Forward | LineKind::RealForward => -1.0,
                _ => 1.0,
            };
            let res = dft(&line, sign);
            for (j, &(re, im)) in res.iter().enumerate().take(m_out) {
                let e = (o * m_out + j) * inner + i;
                if cout {
                    out[2 * e] = re;
                    out[2 * e + 1] = im;
                } else {
                    out[e] = re;
                }
            }
        }
    }
    out
}

/// Random input for `t`, rounded to its precision. A half spectrum's first (and, for even n,
/// last) element is real, as the spectrum of real data is.
fn input_for(t: &LineTransform, rng: &mut Rng) -> Vec<f64> {
    let count: usize = t.shape.iter().product();
    let per = if is_complex_in(t.kind) { 2 } else { 1 };
    let mut v: Vec<f64> = (0..count * per)
        .map(|_| rounded(rng.unit(), t.precision))
        .collect();
    if let LineKind::RealInverse { n } = t.kind {
        let (outer, inner) = t.outer_inner();
        let m = t.shape[t.axis];
        for o in 0..outer {
            for i in 0..inner {
                v[2 * (o * m * inner + i) + 1] = 0.0;
                if n % 2 == 0 {
                    v[2 * ((o * m + m - 1) * inner + i) + 1] = 0.0;
                }
            }
        }
    }
    v
}

/// Largest error relative to the largest magnitude of the reference.
fn relative_error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-300);
    let err = got
        .iter()
        .zip(want)
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    err / scale
}

fn tolerance(p: Precision) -> f64 {
    match p {
        Precision::F32 => 1e-5,
        Precision::F64 => 1e-12,
    }
}

/// Bytes past the output that no transform may touch.
const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xa5;

/// Run `t` once on `stream`, in place or not, and compare with the host's DFT. `shift`: bytes
/// by which the real array (input or output) starts past its allocation's aligned start.
fn check(
    t: &LineTransform,
    in_place: bool,
    shift: usize,
    stream: &Stream,
    rng: &mut Rng,
) -> Result<(), String> {
    let input = input_for(t, rng);
    let want = reference(t, &input);
    let out_bytes = t.output_shape().iter().product::<usize>() * t.output_element();
    let plan = DeviceLines::new(t, 0).map_err(|e| format!("{t:?}: plan: {e}"))?;
    let bytes = to_bytes(&input, t.precision);
    let (got, guard) = if in_place {
        let mut padded = bytes.clone();
        padded.resize(bytes.len() + GUARD, GUARD_BYTE);
        let buf = Dev::from(&padded);
        // SAFETY: the buffer holds the input (= output) shape; the stream is live.
        unsafe { plan.run(buf.ptr, buf.ptr, stream.raw()) }.map_err(|e| format!("{t:?}: {e}"))?;
        let all = buf.read();
        (all[..out_bytes].to_vec(), all[out_bytes..].to_vec())
    } else {
        let (si, so) = match t.kind {
            LineKind::RealForward => (shift, 0),
            LineKind::RealInverse { .. } => (0, shift),
            _ => (0, 0),
        };
        let src = Dev::from(&[vec![0; si], bytes].concat());
        let dst = Dev::from(&vec![GUARD_BYTE; so + out_bytes + GUARD]);
        // SAFETY: both buffers hold their shapes past the shifts; the stream is live.
        unsafe { plan.run(src.ptr + si as u64, dst.ptr + so as u64, stream.raw()) }
            .map_err(|e| format!("{t:?}: {e}"))?;
        let all = dst.read();
        if all[..so].iter().any(|&b| b != GUARD_BYTE) {
            return Err(format!("{t:?}: wrote before the start of its output"));
        }
        (
            all[so..so + out_bytes].to_vec(),
            all[so + out_bytes..].to_vec(),
        )
    };
    if guard.iter().any(|&b| b != GUARD_BYTE) {
        return Err(format!("{t:?}: wrote past the end of its output"));
    }
    let err = relative_error(&from_bytes(&got, t.precision), &want);
    if err > tolerance(t.precision) {
        return Err(format!(
            "{t:?} ({}): relative error {err:e} > {:e}",
            if in_place { "in place" } else { "out of place" },
            tolerance(t.precision)
        ));
    }
    Ok(())
}

/// Shapes with odd and even lengths on every axis, length 1, and both ways of batching
/// (outer <= inner: runs over outer; outer > inner: runs over inner).
const SHAPES: [[usize; 3]; 5] = [[3, 5, 4], [2, 7, 9], [1, 8, 1], [6, 5, 2], [4, 6, 3]];

fn transforms(real: bool) -> Vec<LineTransform> {
    let mut out = Vec::new();
    for precision in [Precision::F32, Precision::F64] {
        for shape in SHAPES {
            for axis in 0..3 {
                let t = |kind, shape: [usize; 3]| LineTransform {
                    shape: shape.to_vec(),
                    axis,
                    kind,
                    precision,
                };
                if real {
                    let n = shape[axis];
                    out.push(t(LineKind::RealForward, shape));
                    let mut half = shape;
                    half[axis] = n / 2 + 1;
                    out.push(t(LineKind::RealInverse { n }, half));
                } else {
                    out.push(t(LineKind::Forward, shape));
                    out.push(t(LineKind::Inverse, shape));
                }
            }
        }
    }
    out
}

#[test]
fn complex_lines_match_the_dft_in_and_out_of_place() {
    if !ready("complex_lines_match_the_dft_in_and_out_of_place") {
        return;
    }
    let stream = Stream::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut failures = Vec::new();
    let mut ran = 0;
    for t in transforms(false) {
        for in_place in [false, true] {
            ran += 1;
            if let Err(e) = check(&t, in_place, 0, &stream, &mut rng) {
                failures.push(e);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let f = cufft::cufft().unwrap();
    println!(
        "{ran} complex transforms matched the DFT (cuFFT {} from {})",
        cufft::version_string(f.version),
        f.path
    );
}

#[test]
fn real_lines_match_the_dft_for_odd_and_even_lengths() {
    if !ready("real_lines_match_the_dft_for_odd_and_even_lengths") {
        return;
    }
    let stream = Stream::new();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut failures = Vec::new();
    let mut ran = 0;
    for t in transforms(true) {
        // Also with the real array one real past an aligned address, which cuFFT refuses:
        // those runs go through the plan's scratch block.
        for shift in [0, t.precision.real_size()] {
            ran += 1;
            if let Err(e) = check(&t, false, shift, &stream, &mut rng) {
                failures.push(format!("{e} (real array shifted {shift} bytes)"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!("{ran} real transforms matched the DFT");
}

#[test]
fn real_transforms_in_place_are_refused_and_a_wrong_half_length_is_named() {
    if !ready("real_transforms_in_place_are_refused_and_a_wrong_half_length_is_named") {
        return;
    }
    let t = LineTransform {
        shape: vec![4, 6],
        axis: 1,
        kind: LineKind::RealForward,
        precision: Precision::F32,
    };
    let plan = DeviceLines::new(&t, 0).unwrap();
    let buf = Dev::new(4 * 4 * 2 * 8);
    // SAFETY: refused before anything is enqueued.
    let e = unsafe { plan.run(buf.ptr, buf.ptr, 0) }.unwrap_err();
    assert!(matches!(e, accord::Error::InvalidArgument(_)), "{e}");
    let wrong = LineTransform {
        shape: vec![4, 3],
        axis: 1,
        kind: LineKind::RealInverse { n: 6 },
        precision: Precision::F64,
    };
    let e = DeviceLines::new(&wrong, 0).unwrap_err();
    assert!(e.to_string().contains("4 complex numbers"), "{e}");
}

#[test]
fn one_plan_shared_by_two_streams_and_threads_stays_correct() {
    if !ready("one_plan_shared_by_two_streams_and_threads_stays_correct") {
        return;
    }
    // Large enough that runs take a while, so a missing order between streams would show.
    let t = LineTransform {
        shape: vec![64, 256, 64],
        axis: 1,
        kind: LineKind::Forward,
        precision: Precision::F64,
    };
    let plan = std::sync::Arc::new(DeviceLines::new(&t, 0).unwrap());
    let count: usize = t.shape.iter().product();
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u64)
            .map(|k| {
                let plan = plan.clone();
                let t = t.clone();
                s.spawn(move || {
                    let stream = Stream::new();
                    let mut rng = Rng(17 + k);
                    let input: Vec<f64> = (0..2 * count).map(|_| rng.unit()).collect();
                    let src = Dev::from(&to_bytes(&input, t.precision));
                    let dst = Dev::new(src.bytes);
                    for _ in 0..4 {
                        // SAFETY: both buffers hold the shape; the stream is live.
                        unsafe { plan.run(src.ptr, dst.ptr, stream.raw()) }
                            .map_err(|e| e.to_string())?;
                    }
                    let got = from_bytes(&dst.read(), t.precision);
                    // Spot-check lines against the DFT: every line would take too long.
                    let (outer, inner) = t.outer_inner();
                    let n = t.length();
                    for (o, i) in [(0, 0), (outer - 1, inner - 1), (outer / 2, 7)] {
                        let line: Vec<(f64, f64)> = (0..n)
                            .map(|j| {
                                let e = (o * n + j) * inner + i;
                                (input[2 * e], input[2 * e + 1])
                            })
                            .collect();
                        let want: Vec<f64> =
                            dft(&line, -1.0).iter().flat_map(|&(a, b)| [a, b]).collect();
                        let have: Vec<f64> = (0..n)
                            .flat_map(|j| {
                                let e = (o * n + j) * inner + i;
                                [got[2 * e], got[2 * e + 1]]
                            })
                            .collect();
                        let err = relative_error(&have, &want);
                        if err > 1e-12 {
                            return Err(format!("line ({o}, {i}): relative error {err:e}"));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in results {
        r.unwrap();
    }
}

/// Byte `(z, y, x)` of an array of `rows` rows of `pitch` bytes a plane.
fn at(z: usize, y: usize, x: usize, rows: usize, pitch: usize) -> usize {
    (z * rows + y) * pitch + x
}

#[test]
fn copy_3d_moves_random_sub_blocks_like_the_host() {
    if !ready("copy_3d_moves_random_sub_blocks_like_the_host") {
        return;
    }
    let stream = Stream::new();
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    for case in 0..60 {
        // Source and destination arrays: planes x rows x pitch bytes.
        let dims = |rng: &mut Rng| (1 + rng.below(5), 1 + rng.below(9), 1 + rng.below(40));
        let (sd, sr, sp) = dims(&mut rng);
        let (dd, dr, dp) = dims(&mut rng);
        // A block that fits both, at random offsets in each; some cases whole and contiguous.
        let contiguous = case % 10 == 0;
        let (sd, sr, sp, dd, dr, dp) = if contiguous {
            (sd, sr, sp, sd, sr, sp)
        } else {
            (sd, sr, sp, dd, dr, dp)
        };
        let w = if contiguous {
            sp
        } else {
            1 + rng.below(sp.min(dp))
        };
        let h = if contiguous {
            sr
        } else {
            1 + rng.below(sr.min(dr))
        };
        let d = if contiguous {
            sd
        } else {
            1 + rng.below(sd.min(dd))
        };
        let off = |rng: &mut Rng, total: usize, used: usize| rng.below(total - used + 1);
        let (sx, sy, sz) = (
            off(&mut rng, sp, w),
            off(&mut rng, sr, h),
            off(&mut rng, sd, d),
        );
        let (dx, dy, dz) = (
            off(&mut rng, dp, w),
            off(&mut rng, dr, h),
            off(&mut rng, dd, d),
        );
        let src: Vec<u8> = (0..sd * sr * sp).map(|_| rng.next() as u8).collect();
        let mut want: Vec<u8> = (0..dd * dr * dp).map(|_| rng.next() as u8).collect();
        let (s, t) = (Dev::from(&src), Dev::from(&want));
        let c = Copy3d {
            width: w,
            height: h,
            depth: d,
            src: s.ptr + at(sz, sy, sx, sr, sp) as u64,
            src_pitch: sp,
            src_rows: sr,
            dst: t.ptr + at(dz, dy, dx, dr, dp) as u64,
            dst_pitch: dp,
            dst_rows: dr,
        };
        let on = if case % 2 == 0 { stream.raw() } else { 0 };
        // SAFETY: the block lies inside both arrays; the stream is live.
        unsafe { copy_3d(0, &c, on) }.unwrap_or_else(|e| panic!("case {case}, {c:?}: {e}"));
        for z in 0..d {
            for y in 0..h {
                for x in 0..w {
                    want[at(dz + z, dy + y, dx + x, dr, dp)] =
                        src[at(sz + z, sy + y, sx + x, sr, sp)];
                }
            }
        }
        assert!(
            t.read() == want,
            "case {case}: {c:?} differs from the host's copy"
        );
    }
    // An empty block copies nothing; a row wider than its pitch is named.
    let buf = Dev::from(&[7u8; 16]);
    let mut c = Copy3d {
        width: 4,
        height: 0,
        depth: 3,
        src: buf.ptr,
        src_pitch: 4,
        src_rows: 1,
        dst: buf.ptr + 8,
        dst_pitch: 4,
        dst_rows: 1,
    };
    // SAFETY: nothing is copied.
    unsafe { copy_3d(0, &c, 0) }.unwrap();
    c.height = 1;
    c.width = 5;
    // SAFETY: refused before anything is enqueued.
    let e = unsafe { copy_3d(0, &c, 0) }.unwrap_err();
    assert!(e.to_string().contains("do not fit pitches"), "{e}");
}

#[test]
fn scale_multiplies_exactly_the_numbers_named() {
    if !ready("scale_multiplies_exactly_the_numbers_named") {
        return;
    }
    let stream = Stream::new();
    let mut rng = Rng(99);
    for precision in [Precision::F32, Precision::F64] {
        // Past one grid of the kernel (4096 blocks of 256), so the loop inside it runs too.
        for (reals, factor) in [(5usize, 1.0 / 3.0), (1 << 21 | 3, 0.125), (7, 1.0)] {
            let extra = 16;
            let data: Vec<f64> = (0..reals + extra)
                .map(|_| rounded(rng.unit(), precision))
                .collect();
            let buf = Dev::from(&to_bytes(&data, precision));
            // SAFETY: the buffer holds `reals + extra` numbers; the stream is live.
            unsafe { scale(0, buf.ptr, reals, precision, factor, stream.raw()) }.unwrap();
            let got = from_bytes(&buf.read(), precision);
            for (i, (g, x)) in got.iter().zip(&data).enumerate() {
                let want = match (i < reals, precision) {
                    (false, _) => *x,
                    (true, Precision::F32) => (*x as f32 * factor as f32) as f64,
                    (true, Precision::F64) => x * factor,
                };
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "{precision:?}, {reals} reals by {factor}: element {i} is {g}, not {want}"
                );
            }
        }
    }
}
