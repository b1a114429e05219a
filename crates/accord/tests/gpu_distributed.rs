//! Redistribution and the distributed FFT on device memory: one process per GPU under
//! `accord run -n N gpu_distributed --test-threads 1 processes_` (N = 1 runs on one GPU).
//! Redistributions are checked element by element; device transforms against the host's, which
//! `distributed_fft.rs` checks against the DFT's definition. Without a GPU each test says why it
//! skips.

use accord::distributed::{
    Direction, DistributedFft, Distribution, FftKind, Norm, Precision, Redistribute, Region,
};
use accord::dtype::Complex;
use accord::gpu::{self, DeviceSlice, Stream};
use accord::{Communicator, DataType, RecvBuf, SendBuf};

#[path = "common/layouts.rs"]
mod layouts;
use layouts::{fill, random_layout, Rng};

/// The world communicator with a GPU attached, made once per process (both tests share it).
fn launched(test: &str) -> Option<&'static Communicator> {
    if let Some(why) = gpu::unavailable_reason() {
        println!("{test}: skipping: {why}");
        return None;
    }
    if std::env::var("ACCORD_RANK").is_err() {
        println!("{test}: skipping: not started by `accord run -n N` (one process per GPU)");
        return None;
    }
    static WORLD: std::sync::OnceLock<Communicator> = std::sync::OnceLock::new();
    Some(WORLD.get_or_init(|| {
        let comm = accord::init().expect("host communicator");
        let count = gpu::cuda::driver()
            .and_then(|d| d.device_count())
            .unwrap_or(1);
        let local: usize = std::env::var("LOCAL_RANK")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(comm.rank());
        comm.attach_device(local % count.max(1))
            .expect("attach a GPU");
        comm
    }))
}

/// `bytes` of device memory seen as elements of `dtype`.
fn view(ptr: u64, bytes: usize, dtype: DataType) -> DeviceSlice {
    // SAFETY: every caller passes a live allocation of `bytes` bytes.
    unsafe { DeviceSlice::from_raw(ptr, bytes / dtype.size(), dtype) }
}

/// A stream of the test's own on the attached device (made current on this thread first).
fn own_stream(comm: &Communicator) -> usize {
    let cu = gpu::cuda::driver().unwrap();
    let ctx = cu.primary_context(comm.attached_device().unwrap()).unwrap();
    // SAFETY: a retained primary context.
    cu.check(unsafe { (cu.ctx_set_current)(ctx) }, "cuCtxSetCurrent")
        .unwrap();
    cu.new_stream().unwrap() as usize
}

/// A stream of the caller's own for every other case, the communicator's for the rest.
fn stream_for(case: usize, own: usize) -> Stream {
    if case.is_multiple_of(2) {
        Stream::Raw(own)
    } else {
        Stream::Comm
    }
}

#[test]
fn processes_redistribute_on_device() {
    let Some(comm) = launched("processes_redistribute_on_device") else {
        return;
    };
    let own = own_stream(comm);
    let (rank, size) = (comm.rank(), comm.size());
    let mut rng = Rng(0x005e_ed0f_d15c);
    for case in 0..40 {
        let ndim = 1 + rng.below(3);
        let pick = [1usize, 2, 3, 5, 7, 8, 11, 64];
        let shape: Vec<usize> = (0..ndim).map(|_| pick[rng.below(pick.len())]).collect();
        let (from, to) = (
            random_layout(&mut rng, &shape, size),
            random_layout(&mut rng, &shape, size),
        );
        let dtype = DataType::ALL[case % DataType::ALL.len()];
        let seed = rng.next();
        let w = dtype.size();
        let plan = Redistribute::new(comm, &from[rank], &to[rank], dtype).unwrap();
        let input = fill(seed, &shape, &from[rank], w);
        let src = comm.device_copy(&input).unwrap();
        let dst = comm
            .device_copy(&vec![0xeeu8; to[rank].volume() * w])
            .unwrap();
        let s = stream_for(case, own);
        plan.execute(
            comm,
            SendBuf::device(view(src.slice().ptr(), input.len(), dtype), s),
            RecvBuf::device(view(dst.slice().ptr(), dst.len(), dtype), s),
        )
        .unwrap()
        .wait()
        .unwrap();
        let got = dst.to_host().unwrap();
        let want = fill(seed, &shape, &to[rank], w);
        assert_eq!(
            got, want,
            "rank {rank} case {case}: {shape:?} {dtype} {from:?} -> {to:?}"
        );
    }
    println!("processes_redistribute_on_device: rank {rank} of {size}: 40 layouts passed");
}

/// The largest difference between two complex arrays, relative to the larger's largest value.
fn rel_err(a: &[Complex<f64>], b: &[Complex<f64>]) -> f64 {
    let scale = b.iter().map(|v| v.norm()).fold(1e-300, f64::max);
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).norm())
        .fold(0.0, f64::max)
        / scale
}

/// Run `fft` on the host and on the device with the same input; the relative difference.
fn host_vs_device<I: accord::Element + Copy, O: accord::Element + Copy + Default>(
    comm: &Communicator,
    fft: &DistributedFft,
    input: &[I],
    direction: Direction,
    norm: Norm,
    stream: Stream,
    widen: impl Fn(&[O]) -> Vec<Complex<f64>>,
) -> f64 {
    let out_len = fft.output_shape().iter().product::<usize>();
    let mut host = vec![O::default(); out_len];
    fft.execute(comm, input, &mut host, direction, norm)
        .unwrap();
    let src = comm.device_copy(input).unwrap();
    let dst = comm.device_alloc::<O>(out_len).unwrap();
    let (it, ot) = fft.types();
    let send = SendBuf::device(view(src.slice().ptr(), input.len() * it.size(), it), stream);
    let recv = RecvBuf::device(view(dst.slice().ptr(), out_len * ot.size(), ot), stream);
    fft.execute(comm, send, recv, direction, norm)
        .unwrap()
        .wait()
        .unwrap();
    let device = dst.to_host().unwrap();
    // Once more into an output 8 bytes off cuFFT's alignment: the last stages then run in work
    // buffers instead of the output, with the same bytes.
    let bytes = out_len * ot.size();
    let off = comm.device_alloc::<u8>(bytes + 8).unwrap();
    let send = SendBuf::device(view(src.slice().ptr(), input.len() * it.size(), it), stream);
    let recv = RecvBuf::device(view(off.slice().ptr() + 8, bytes, ot), stream);
    fft.execute(comm, send, recv, direction, norm)
        .unwrap()
        .wait()
        .unwrap();
    let shifted = off.to_host().unwrap();
    // SAFETY: `device` holds `out_len` plain numbers of `bytes` bytes in all.
    let aligned = unsafe { std::slice::from_raw_parts(device.as_ptr().cast::<u8>(), bytes) };
    assert_eq!(
        &shifted[8..],
        aligned,
        "an unaligned output got other bytes"
    );
    rel_err(&widen(&device), &widen(&host))
}

fn layouts_for(shape: &[usize], size: usize) -> Vec<Vec<Region>> {
    let mut out: Vec<Vec<Region>> = (0..shape.len())
        .map(|a| Distribution::Slab(a).regions(shape, size).unwrap())
        .collect();
    if shape.len() == 3 && size.is_multiple_of(2) {
        out.push(
            Distribution::Grid(vec![2, size / 2, 1])
                .regions(shape, size)
                .unwrap(),
        );
    }
    out
}

#[test]
fn processes_fft_on_device() {
    let Some(comm) = launched("processes_fft_on_device") else {
        return;
    };
    let own = own_stream(comm);
    let (rank, size) = (comm.rank(), comm.size());
    let wide64 = |v: &[Complex<f64>]| v.to_vec();
    let wide32 = |v: &[Complex<f32>]| {
        v.iter()
            .map(|c| Complex::new(c.re as f64, c.im as f64))
            .collect()
    };
    let real64 = |v: &[f64]| v.iter().map(|&r| Complex::new(r, 0.0)).collect();
    let value = |i: usize| ((i * 7919) % 23) as f64 / 7.0 - 1.5;
    let mut checks = 0;
    for shape in [vec![8usize, 6, 5], vec![7, 9], vec![16, 16, 16]] {
        for (li, boxes) in layouts_for(&shape, size).into_iter().enumerate() {
            let mine = &boxes[rank];
            let s = stream_for(li, own);
            let c: Vec<Complex<f64>> = (0..mine.volume())
                .map(|i| Complex::new(value(i + rank), value(3 * i)))
                .collect();
            for keep in [true, false] {
                let out = keep.then_some(mine);
                let f64p =
                    DistributedFft::new(comm, mine, out, FftKind::C2C, Precision::F64).unwrap();
                for d in [Direction::Forward, Direction::Inverse] {
                    let e = host_vs_device(comm, &f64p, &c, d, Norm::Backward, s, wide64);
                    assert!(
                        e < 1e-12,
                        "rank {rank}: C2C f64 {shape:?} layout {li} {d:?}: {e:e}"
                    );
                    checks += 1;
                }
                let c32: Vec<Complex<f32>> = c
                    .iter()
                    .map(|v| Complex::new(v.re as f32, v.im as f32))
                    .collect();
                let f32p =
                    DistributedFft::new(comm, mine, out, FftKind::C2C, Precision::F32).unwrap();
                let e = host_vs_device(
                    comm,
                    &f32p,
                    &c32,
                    Direction::Forward,
                    Norm::Ortho,
                    s,
                    wide32,
                );
                assert!(
                    e < 1e-5,
                    "rank {rank}: C2C f32 {shape:?} layout {li}: {e:e}"
                );
                checks += 1;
            }
            // Real to complex and back, each direction's device result against the host's.
            let r: Vec<f64> = (0..mine.volume()).map(|i| value(5 * i + rank)).collect();
            let r2c = DistributedFft::new(comm, mine, None, FftKind::R2C, Precision::F64).unwrap();
            let e = host_vs_device(
                comm,
                &r2c,
                &r,
                Direction::Forward,
                Norm::Backward,
                s,
                wide64,
            );
            assert!(e < 1e-12, "rank {rank}: R2C {shape:?} layout {li}: {e:e}");
            let spec_box = r2c.output().region(rank).clone();
            let mut spec = vec![Complex::<f64>::default(); spec_box.volume()];
            r2c.execute(comm, &r, &mut spec, Direction::Forward, Norm::Backward)
                .unwrap();
            let odd = shape[shape.len() - 1] % 2 == 1;
            let c2r = DistributedFft::new(
                comm,
                &spec_box,
                Some(mine),
                FftKind::C2R { odd },
                Precision::F64,
            )
            .unwrap();
            let e = host_vs_device(
                comm,
                &c2r,
                &spec,
                Direction::Inverse,
                Norm::Backward,
                s,
                real64,
            );
            assert!(e < 1e-12, "rank {rank}: C2R {shape:?} layout {li}: {e:e}");
            checks += 2;
        }
    }
    println!("processes_fft_on_device: rank {rank} of {size}: {checks} device transforms matched the host's");
}
