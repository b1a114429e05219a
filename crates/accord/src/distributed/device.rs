//! The distributed FFT's work on one GPU: local transforms along one axis ([`DeviceLines`],
//! cuFFT), moving sub-blocks of an array in and out of contiguous buffers ([`copy_3d`], the
//! driver's 3-D copy) and the final normalisation ([`scale`], a kernel compiled with NVRTC).
//!
//! Every call here is stream-ordered: it enqueues work on the `CUstream` it is given (an
//! integer; 0 is the legacy default stream) and returns without waiting, so a pipeline of
//! transforms, copies and sends on one stream needs no synchronisation between its steps.
//! Pointers are device addresses (`CUdeviceptr`) on device `ordinal`; each call makes that
//! device's primary context current on the calling thread first (and leaves it current), so
//! pointers and streams from PyTorch, CuPy or JAX, which share the primary context, work
//! unchanged.
//!
//! A transform of length `n` along axis `k` of a C-order array is a batch of 1-D FFTs whose
//! elements are `inner` apart (the product of the dimensions after `k`), one line for each of
//! the `outer * inner` positions off the axis ([`LineTransform::outer_inner`]). cuFFT's
//! advanced layout has a single batch dimension, so [`DeviceLines`] makes one plan for one of
//! the two loops and runs it once per iteration of the other: `outer` runs of `inner` lines
//! (lines side by side, stride `inner`, next line one element on) or `inner` runs of `outer`
//! lines (stride `inner`, next line `n * inner` on), whichever is fewer runs. The last axis
//! (`inner == 1`) and the first (`outer == 1`) are therefore a single cuFFT call.
//!
//! cuFFT refuses real data (the input of a real-to-complex transform, the output of a
//! complex-to-real one) at an address that is not a multiple of the complex number's size. A
//! run of the real kinds starts `r * n * inner` reals in, which is odd for odd runs when `n`
//! and `inner` are both odd, so those runs copy their real block through an aligned scratch
//! block (made on first need, one run's worth). Complex arrays must be aligned to their
//! element, as any allocation is.

use super::lines::{LineKind, LineTransform, Precision};
use crate::error::{Error, Result};
use crate::gpu::cuda::{
    self, cufft, CuContext, CuStream, CudaMemcpy3d, Driver, KernelArgs, CU_EVENT_DISABLE_TIMING,
    CU_MEMORYTYPE_DEVICE,
};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, OnceLock};

/// The driver with device `ordinal`'s primary context current on this thread. The context's
/// handle is looked up once per device: it stays the same for the life of the process (the
/// driver hands out one primary context per device, and Accord keeps it retained).
fn current(ordinal: usize) -> Result<(&'static Driver, CuContext)> {
    static CONTEXTS: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    let cu = cuda::driver()?;
    let map = CONTEXTS.get_or_init(Default::default);
    let known = map
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&ordinal)
        .copied();
    let ctx = match known {
        Some(c) => c as CuContext,
        None => {
            let c = cu.primary_context(ordinal)?;
            map.lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(ordinal, c as usize);
            c
        }
    };
    cu.make_current(ctx)?;
    Ok((cu, ctx))
}

/// A 3-D block of bytes: `depth` planes of `height` rows of `width` bytes, between two device
/// arrays given by base pointer, row pitch and rows per plane.
///
/// Byte `x` of row `y` of plane `z` is read from `src + (z * src_rows + y) * src_pitch + x`
/// and written to `dst + (z * dst_rows + y) * dst_pitch + x`. A sub-block of a C-order array
/// of shape `(a, b, c)` with elements of `e` bytes, starting at `(i, j, k)`, has
/// `src = base + ((i * b + j) * c + k) * e`, `src_pitch = c * e` and `src_rows = b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy3d {
    /// Bytes in a row.
    pub width: usize,
    /// Rows in a plane.
    pub height: usize,
    /// Planes.
    pub depth: usize,
    /// Where the source's first byte is.
    pub src: u64,
    /// Bytes from one source row to the next.
    pub src_pitch: usize,
    /// Rows from one source plane to the next.
    pub src_rows: usize,
    /// Where the destination's first byte is.
    pub dst: u64,
    /// Bytes from one destination row to the next.
    pub dst_pitch: usize,
    /// Rows from one destination plane to the next.
    pub dst_rows: usize,
}

/// Copy the block `c` on device `ordinal`, ordered on `stream`. An empty block copies nothing;
/// a block that is contiguous on both sides is one linear copy.
///
/// # Safety
/// Both arrays must be device memory of `ordinal` (or peer memory it can reach) covering every
/// byte the block names, the source and destination must not overlap, and `stream` must be a
/// live stream of that device's primary context (or 0) until the copy has run.
pub unsafe fn copy_3d(ordinal: usize, c: &Copy3d, stream: usize) -> Result<()> {
    if c.width == 0 || c.height == 0 || c.depth == 0 {
        return Ok(());
    }
    if c.width > c.src_pitch || c.width > c.dst_pitch {
        return Err(Error::invalid(format!(
            "3-D copy: rows of {} bytes do not fit pitches of {} (source) and {} (destination) \
             bytes",
            c.width, c.src_pitch, c.dst_pitch
        )));
    }
    if c.depth > 1 && (c.height > c.src_rows || c.height > c.dst_rows) {
        return Err(Error::invalid(format!(
            "3-D copy: planes of {} rows do not fit {} rows (source) and {} rows (destination) \
             a plane",
            c.height, c.src_rows, c.dst_rows
        )));
    }
    let (cu, _) = current(ordinal)?;
    let contiguous = c.width == c.src_pitch
        && c.width == c.dst_pitch
        && (c.depth == 1 || (c.height == c.src_rows && c.height == c.dst_rows));
    if contiguous {
        let bytes = c.width * c.height * c.depth;
        // SAFETY: the caller vouches for both ranges and the stream.
        let rc = unsafe { (cu.memcpy_dtod_async)(c.dst, c.src, bytes, stream as CuStream) };
        return cu.check(rc, "cuMemcpyDtoDAsync");
    }
    // With one plane the rows per plane are unused; the driver still checks them against the
    // height, so pass the height there.
    let rows = |r: usize| if c.depth == 1 { c.height } else { r };
    let p = CudaMemcpy3d {
        src_memory_type: CU_MEMORYTYPE_DEVICE,
        src_device: c.src,
        src_pitch: c.src_pitch,
        src_height: rows(c.src_rows),
        dst_memory_type: CU_MEMORYTYPE_DEVICE,
        dst_device: c.dst,
        dst_pitch: c.dst_pitch,
        dst_height: rows(c.dst_rows),
        width_in_bytes: c.width,
        height: c.height,
        depth: c.depth,
        ..Default::default()
    };
    let strided = cu.strided()?;
    // SAFETY: a complete CUDA_MEMCPY3D (the driver reads it before returning); the caller
    // vouches for the memory and the stream.
    let rc = unsafe {
        (strided.memcpy_3d_async)((&p as *const CudaMemcpy3d).cast(), stream as CuStream)
    };
    cu.check(rc, "cuMemcpy3DAsync")
        .map_err(|e| Error::invalid(format!("{e}: copying {c:?}")))
}

/// The scale kernels: a grid-stride loop, so any count runs with a bounded grid.
const SCALE: &str = r#"
extern "C" __global__ void accord_scale_f32(float* p, unsigned long long n, float f) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    p[i] *= f;
}
extern "C" __global__ void accord_scale_f64(double* p, unsigned long long n, double f) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    p[i] *= f;
}
"#;

/// Multiply `reals` real numbers (a complex array counts 2 per element) at `ptr` by `factor`,
/// on `stream`. The kernel is compiled on first use per device (NVRTC) and cached; a factor of
/// exactly 1 launches nothing.
///
/// # Safety
/// `ptr` must be device memory of `ordinal` holding `reals` numbers of `precision`, and
/// `stream` a live stream of that device's primary context (or 0) until the kernel has run.
pub unsafe fn scale(
    ordinal: usize,
    ptr: u64,
    reals: usize,
    precision: Precision,
    factor: f64,
    stream: usize,
) -> Result<()> {
    if reals == 0 || factor == 1.0 {
        return Ok(());
    }
    current(ordinal)?;
    let (name, args) = match precision {
        Precision::F32 => (
            "accord_scale_f32",
            KernelArgs::new()
                .ptr(ptr)
                .u64(reals as u64)
                .f32(factor as f32),
        ),
        Precision::F64 => (
            "accord_scale_f64",
            KernelArgs::new().ptr(ptr).u64(reals as u64).f64(factor),
        ),
    };
    let kernel = cuda::nvrtc::load_kernel(SCALE, name, &[], ordinal)?;
    const BLOCK: usize = 256;
    // Enough blocks to fill any current GPU; beyond that each thread loops.
    let blocks = reals.div_ceil(BLOCK).min(4096) as u32;
    // SAFETY: the arguments match the kernel's (pointer, count, factor); the caller vouches for
    // the memory and the stream.
    unsafe {
        kernel.launch(
            [blocks, 1, 1],
            [BLOCK as u32, 1, 1],
            0,
            stream as CuStream,
            args.as_bytes(),
        )
    }
}

/// How a [`DeviceLines`] computes its transform.
enum Method {
    /// The array is empty: nothing to do.
    Empty,
    /// Length 1: the transform is the identity (a copy, or for the real kinds the real part
    /// moved to or from complex numbers), done with copies rather than asking cuFFT for
    /// transforms of one point.
    Unit {
        /// Lines (elements off the axis).
        count: usize,
        /// Bytes of the input, for the complex kinds' copy.
        bytes: usize,
    },
    /// `runs` executions of one cuFFT plan, the `r`-th at `input + r * in_step` and
    /// `output + r * out_step` (bytes).
    Plan {
        handle: cufft::CufftHandle,
        runs: usize,
        in_step: u64,
        out_step: u64,
        /// Bytes of one run's real data (a contiguous block; 0 for the complex kinds).
        real_block: usize,
    },
}

/// Which stream last ran the plan, an event recorded after that run, and the scratch block
/// that real data at addresses cuFFT refuses goes through (allocated on first need).
struct Order {
    last: Option<usize>,
    done: usize,
    scratch: u64,
}

/// cuFFT plan(s) for one [`LineTransform`] on one device: see the module's docs for the
/// layout. Made once, run any number of times on any pointers of the right shape.
///
/// Safe to share between threads and streams: a plan has one workspace, so runs are
/// serialised, both in being enqueued (a mutex) and on the GPU (a run on a stream other than
/// the previous run's waits for that run to finish, through an event). Runs on one stream
/// cost nothing extra.
pub struct DeviceLines {
    ordinal: usize,
    ctx: usize,
    kind: LineKind,
    precision: Precision,
    method: Method,
    order: Mutex<Order>,
}

impl std::fmt::Debug for DeviceLines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match &self.method {
            Method::Empty => "empty".to_string(),
            Method::Unit { .. } => "length 1".to_string(),
            Method::Plan { runs, .. } => format!("{runs} cuFFT run(s)"),
        };
        write!(
            f,
            "DeviceLines({:?} {:?} on device {}, {how})",
            self.kind, self.precision, self.ordinal
        )
    }
}

/// How the lines of a transform map onto one cuFFT plan run `runs` times. Line `b` of run `r`
/// reads element `x` at `input + r * in_step + (b * idist + x * inner) * input_element` (and
/// writes likewise with `odist`, `out_step`): the axis' stride is always `inner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Batching {
    batch: usize,
    idist: usize,
    odist: usize,
    runs: usize,
    in_step: u64,
    out_step: u64,
}

/// The batching with the fewer runs: `outer` runs of `inner` lines side by side, or `inner`
/// runs of `outer` lines a whole block apart. The real kinds take the first whenever
/// `inner > 1`: cuFFT refuses a real array whose address is not aligned to a complex number
/// (`CUFFT_INVALID_VALUE`), and only there is each run's real data one contiguous block, which
/// a run at an odd address can stage through an aligned scratch block.
fn batching(t: &LineTransform) -> Batching {
    let (outer, inner) = t.outer_inner();
    let real = matches!(t.kind, LineKind::RealForward | LineKind::RealInverse { .. });
    let m_in = t.shape[t.axis];
    let m_out = t.output_shape()[t.axis];
    let (ie, oe) = (t.input_element() as u64, t.output_element() as u64);
    // Distances are in elements of the input's and output's own types, steps in bytes.
    if outer <= inner || (real && inner > 1) {
        Batching {
            batch: inner,
            idist: 1,
            odist: 1,
            runs: outer,
            in_step: (m_in * inner) as u64 * ie,
            out_step: (m_out * inner) as u64 * oe,
        }
    } else {
        Batching {
            batch: outer,
            idist: m_in * inner,
            odist: m_out * inner,
            runs: inner,
            in_step: ie,
            out_step: oe,
        }
    }
}

/// `v` as a cuFFT plan parameter (an `int`).
fn int(v: usize, what: &str, t: &LineTransform) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| {
        Error::Unsupported(format!(
            "cuFFT plan for {t:?}: the {what} ({v}) exceeds cuFFT's 32-bit plan parameters; \
             split the array into smaller local blocks"
        ))
    })
}

impl DeviceLines {
    /// The plan for `t` on device `ordinal` (whose primary context this makes current).
    /// cuFFT allocates the plan's workspace on the device now.
    pub fn new(t: &LineTransform, ordinal: usize) -> Result<Self> {
        if t.axis >= t.shape.len() {
            return Err(Error::invalid(format!(
                "line transform along axis {} of a {}-d array",
                t.axis,
                t.shape.len()
            )));
        }
        if let LineKind::RealInverse { n } = t.kind {
            if t.shape[t.axis] != n / 2 + 1 {
                return Err(Error::invalid(format!(
                    "complex-to-real transform of length {n} reads {} complex numbers along \
                     axis {}, not {}",
                    n / 2 + 1,
                    t.axis,
                    t.shape[t.axis]
                )));
            }
        }
        let (_, ctx) = current(ordinal)?;
        let n = t.length();
        let m_in = t.shape[t.axis];
        let m_out = t.output_shape()[t.axis];
        let (outer, inner) = t.outer_inner();
        let method = if outer * inner * n * m_in * m_out == 0 {
            Method::Empty
        } else if n == 1 {
            Method::Unit {
                count: outer * inner,
                bytes: outer * inner * t.input_element(),
            }
        } else {
            let Batching {
                batch,
                idist,
                odist,
                runs,
                in_step,
                out_step,
            } = batching(t);
            let ty = match (t.kind, t.precision) {
                (LineKind::Forward | LineKind::Inverse, Precision::F32) => cufft::kind::C2C,
                (LineKind::Forward | LineKind::Inverse, Precision::F64) => cufft::kind::Z2Z,
                (LineKind::RealForward, Precision::F32) => cufft::kind::R2C,
                (LineKind::RealForward, Precision::F64) => cufft::kind::D2Z,
                (LineKind::RealInverse { .. }, Precision::F32) => cufft::kind::C2R,
                (LineKind::RealInverse { .. }, Precision::F64) => cufft::kind::Z2D,
            };
            let mut len = [int(n, "length", t)?];
            // Non-null embeds switch the advanced layout on; for one dimension their values
            // are not used in addressing.
            let mut inembed = [int(m_in, "input length", t)?];
            let mut onembed = [int(m_out, "output length", t)?];
            let stride = int(inner, "stride", t)?;
            let (idist, odist) = (int(idist, "distance", t)?, int(odist, "distance", t)?);
            let batch = int(batch, "batch", t)?;
            let f = cufft::cufft()?;
            let mut handle: cufft::CufftHandle = 0;
            // SAFETY: out-pointer to a local; the arrays outlive the call; the device's
            // context is current.
            let rc = unsafe {
                (f.plan_many)(
                    &mut handle,
                    1,
                    len.as_mut_ptr(),
                    inembed.as_mut_ptr(),
                    stride,
                    idist,
                    onembed.as_mut_ptr(),
                    stride,
                    odist,
                    ty,
                    batch,
                )
            };
            f.check(rc, &format!("cufftPlanMany for {t:?}"))?;
            let total_real = outer * n * inner * t.precision.real_size();
            Method::Plan {
                handle,
                runs,
                in_step,
                out_step,
                real_block: if matches!(t.kind, LineKind::Forward | LineKind::Inverse) {
                    0
                } else {
                    total_real / runs
                },
            }
        };
        let done = match method {
            Method::Plan { .. } => match cuda::driver()?.new_event(CU_EVENT_DISABLE_TIMING) {
                Ok(e) => e as usize,
                Err(e) => {
                    if let (Method::Plan { handle, .. }, Ok(f)) = (&method, cufft::cufft()) {
                        // SAFETY: made above, never run.
                        unsafe { (f.destroy)(*handle) };
                    }
                    return Err(e);
                }
            },
            _ => 0,
        };
        Ok(DeviceLines {
            ordinal,
            ctx: ctx as usize,
            kind: t.kind,
            precision: t.precision,
            method,
            order: Mutex::new(Order {
                last: None,
                done,
                scratch: 0,
            }),
        })
    }

    /// Transform `input` into `output` on `stream`. `input == output` (in place) is allowed
    /// for [`LineKind::Forward`] and [`LineKind::Inverse`]; the real kinds need two arrays
    /// (their input and output differ in size), and [`LineKind::RealInverse`] may overwrite
    /// its input. Partly overlapping arrays are never allowed.
    ///
    /// # Safety
    /// `input` and `output` must be device memory of this plan's device holding the
    /// transform's input and output shapes (C order, no padding), and `stream` a live stream
    /// of that device's primary context (or 0) until the work has run.
    pub unsafe fn run(&self, input: u64, output: u64, stream: usize) -> Result<()> {
        let real = matches!(
            self.kind,
            LineKind::RealForward | LineKind::RealInverse { .. }
        );
        if real && input == output {
            return Err(Error::invalid(format!(
                "{:?} transform in place: real transforms need separate input and output \
                 arrays",
                self.kind
            )));
        }
        let cu = cuda::driver()?;
        cu.make_current(self.ctx as CuContext)?;
        match &self.method {
            Method::Empty => Ok(()),
            Method::Unit { count, bytes } => {
                let (r, c) = (self.precision.real_size(), self.precision.complex_size());
                let line = |src_pitch, dst_pitch| Copy3d {
                    width: r,
                    height: *count,
                    depth: 1,
                    src: input,
                    src_pitch,
                    src_rows: *count,
                    dst: output,
                    dst_pitch,
                    dst_rows: *count,
                };
                match self.kind {
                    LineKind::Forward | LineKind::Inverse if input == output => Ok(()),
                    LineKind::Forward | LineKind::Inverse => {
                        // SAFETY: the caller vouches for both arrays and the stream.
                        let rc = unsafe {
                            (cu.memcpy_dtod_async)(output, input, *bytes, stream as CuStream)
                        };
                        cu.check(rc, "cuMemcpyDtoDAsync")
                    }
                    LineKind::RealForward => {
                        // (x, 0): zero the output, then put each real in its first half.
                        // SAFETY: the output holds `count` complex numbers.
                        let rc = unsafe {
                            (cu.memset_d8_async)(output, 0, count * c, stream as CuStream)
                        };
                        cu.check(rc, "cuMemsetD8Async")?;
                        // SAFETY: as above.
                        unsafe { copy_3d(self.ordinal, &line(r, c), stream) }
                    }
                    // SAFETY: the input holds `count` complex numbers, the output reals.
                    LineKind::RealInverse { .. } => unsafe {
                        copy_3d(self.ordinal, &line(c, r), stream)
                    },
                }
            }
            Method::Plan {
                handle,
                runs,
                in_step,
                out_step,
                real_block,
            } => {
                let f = cufft::cufft()?;
                let mut order = self.order.lock().unwrap_or_else(|e| e.into_inner());
                if order.last.is_some_and(|last| last != stream) {
                    // The previous run, on another stream, may still be using the workspace.
                    // SAFETY: a live event of this context, recorded after the previous run.
                    let rc =
                        unsafe { (cu.stream_wait_event)(stream as CuStream, order.done as _, 0) };
                    cu.check(rc, "cuStreamWaitEvent")?;
                }
                // SAFETY: a live plan; the caller vouches for the stream.
                let rc = unsafe { (f.set_stream)(*handle, stream as *mut c_void) };
                f.check(rc, "cufftSetStream")?;
                let align = self.precision.complex_size() as u64;
                let real_in = matches!(self.kind, LineKind::RealForward);
                let real_out = matches!(self.kind, LineKind::RealInverse { .. });
                let s = stream as CuStream;
                for r in 0..*runs as u64 {
                    let (mut i, mut o) = (input + r * in_step, output + r * out_step);
                    // Real data at an address cuFFT refuses goes through the scratch block.
                    let stage_in = real_in && i % align != 0;
                    let stage_out = real_out && o % align != 0;
                    if (stage_in || stage_out) && order.scratch == 0 {
                        let mut p = 0;
                        // SAFETY: out-pointer to a local; the context is current.
                        let rc = unsafe { (cu.mem_alloc)(&mut p, *real_block) };
                        cu.check(rc, "cuMemAlloc (cuFFT staging block)")?;
                        order.scratch = p;
                    }
                    if stage_in {
                        // SAFETY: the run's real input is one block of `real_block` bytes.
                        let rc =
                            unsafe { (cu.memcpy_dtod_async)(order.scratch, i, *real_block, s) };
                        cu.check(rc, "cuMemcpyDtoDAsync")?;
                        i = order.scratch;
                    }
                    let final_out = o;
                    if stage_out {
                        o = order.scratch;
                    }
                    let (i, o) = (i as *mut c_void, o as *mut c_void);
                    // SAFETY: the plan's layout stays inside the arrays the caller vouches
                    // for; the line sets of different runs are disjoint.
                    let (rc, call) = unsafe {
                        match (self.kind, self.precision) {
                            (LineKind::Forward, Precision::F32) => {
                                ((f.exec_c2c)(*handle, i, o, cufft::FORWARD), "cufftExecC2C")
                            }
                            (LineKind::Inverse, Precision::F32) => {
                                ((f.exec_c2c)(*handle, i, o, cufft::INVERSE), "cufftExecC2C")
                            }
                            (LineKind::Forward, Precision::F64) => {
                                ((f.exec_z2z)(*handle, i, o, cufft::FORWARD), "cufftExecZ2Z")
                            }
                            (LineKind::Inverse, Precision::F64) => {
                                ((f.exec_z2z)(*handle, i, o, cufft::INVERSE), "cufftExecZ2Z")
                            }
                            (LineKind::RealForward, Precision::F32) => {
                                ((f.exec_r2c)(*handle, i, o), "cufftExecR2C")
                            }
                            (LineKind::RealForward, Precision::F64) => {
                                ((f.exec_d2z)(*handle, i, o), "cufftExecD2Z")
                            }
                            (LineKind::RealInverse { .. }, Precision::F32) => {
                                ((f.exec_c2r)(*handle, i, o), "cufftExecC2R")
                            }
                            (LineKind::RealInverse { .. }, Precision::F64) => {
                                ((f.exec_z2d)(*handle, i, o), "cufftExecZ2D")
                            }
                        }
                    };
                    f.check(rc, call)?;
                    if stage_out {
                        // SAFETY: the run's real output is one block of `real_block` bytes.
                        let rc = unsafe {
                            (cu.memcpy_dtod_async)(final_out, order.scratch, *real_block, s)
                        };
                        cu.check(rc, "cuMemcpyDtoDAsync")?;
                    }
                }
                // SAFETY: a live event of this context and the caller's stream.
                let rc = unsafe { (cu.event_record)(order.done as _, stream as CuStream) };
                cu.check(rc, "cuEventRecord")?;
                order.last = Some(stream);
                Ok(())
            }
        }
    }
}

impl Drop for DeviceLines {
    fn drop(&mut self) {
        let Method::Plan { handle, .. } = self.method else {
            return;
        };
        let (Ok(cu), Ok(f)) = (cuda::driver(), cufft::cufft()) else {
            return;
        };
        if cu.make_current(self.ctx as CuContext).is_ok() {
            let order = self.order.get_mut().unwrap_or_else(|e| e.into_inner());
            // SAFETY: made in `new`, destroyed once, after the last run has finished with the
            // workspace (an event never recorded counts as complete).
            unsafe {
                (cu.event_synchronize)(order.done as _);
                (f.destroy)(handle);
                (cu.event_destroy)(order.done as _);
                if order.scratch != 0 {
                    (cu.mem_free)(order.scratch);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (run, line, position) of the batching, as the byte offset it reads and writes.
    fn touched(t: &LineTransform) -> (Vec<u64>, Vec<u64>) {
        let b = batching(t);
        let (_, inner) = t.outer_inner();
        let (ie, oe) = (t.input_element() as u64, t.output_element() as u64);
        let (mut reads, mut writes) = (Vec::new(), Vec::new());
        for r in 0..b.runs as u64 {
            for line in 0..b.batch {
                for x in 0..t.shape[t.axis] {
                    reads.push(r * b.in_step + (line * b.idist + x * inner) as u64 * ie);
                }
                for x in 0..t.output_shape()[t.axis] {
                    writes.push(r * b.out_step + (line * b.odist + x * inner) as u64 * oe);
                }
            }
        }
        (reads, writes)
    }

    #[test]
    fn the_batching_covers_every_element_once_on_every_axis() {
        for shape in [[3, 5, 4], [2, 7, 9], [1, 8, 1], [6, 5, 2], [9, 1, 9]] {
            for axis in 0..3 {
                for precision in [Precision::F32, Precision::F64] {
                    let n = shape[axis];
                    let mut half = shape;
                    half[axis] = n / 2 + 1;
                    let kinds = [
                        (LineKind::Forward, shape),
                        (LineKind::RealForward, shape),
                        (LineKind::RealInverse { n }, half),
                    ];
                    for (kind, shape) in kinds {
                        let t = LineTransform {
                            shape: shape.to_vec(),
                            axis,
                            kind,
                            precision,
                        };
                        let (mut reads, mut writes) = touched(&t);
                        let each = |v: &mut Vec<u64>, count: usize, size: usize| {
                            v.sort();
                            let want: Vec<u64> = (0..count).map(|i| (i * size) as u64).collect();
                            assert_eq!(*v, want, "{t:?}");
                        };
                        let ins: usize = t.shape.iter().product();
                        let outs: usize = t.output_shape().iter().product();
                        each(&mut reads, ins, t.input_element());
                        each(&mut writes, outs, t.output_element());
                    }
                }
            }
        }
    }

    #[test]
    fn the_batching_takes_the_fewer_runs() {
        let t = |shape: &[usize], axis| LineTransform {
            shape: shape.to_vec(),
            axis,
            kind: LineKind::Forward,
            precision: Precision::F32,
        };
        // The last and first axes are one run each.
        assert_eq!(batching(&t(&[6, 5, 2], 2)).runs, 1);
        assert_eq!(batching(&t(&[6, 5, 2], 0)).runs, 1);
        // A middle axis: min(outer, inner) runs.
        assert_eq!(batching(&t(&[6, 5, 2], 1)).runs, 2);
        assert_eq!(batching(&t(&[2, 5, 6], 1)).runs, 2);
        // Real data: one contiguous block a run wherever the lines are strided.
        let real = LineTransform {
            kind: LineKind::RealForward,
            ..t(&[6, 5, 2], 1)
        };
        let b = batching(&real);
        assert_eq!((b.runs, b.batch, b.in_step), (6, 2, 5 * 2 * 4));
        let last = LineTransform {
            kind: LineKind::RealForward,
            ..t(&[6, 5, 2], 2)
        };
        assert_eq!(batching(&last).runs, 1);
    }
}
