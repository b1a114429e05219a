//! `accord bench OP --device cuda`: the same table as the host benchmark, on GPU buffers of a
//! communicator with a device attached. One process per GPU; `LOCAL_RANK` selects the device.
//!
//! Timing follows nccl-tests and PyTorch's usual method: CUDA events around `iters`
//! back-to-back operations on the communicator's stream, divided by `iters`; the slowest rank's
//! time is reported. Results are checked once per size (small integers, exact in every type).
//!
//! `--symmetric` places the buffers in the symmetric heap (`alloc_symmetric`, on the process's
//! own communicator with the device attached), which Accord's kernels take zero-copy.

use crate::bench::{size_unit, BenchOpts, Row};
use accord::gpu::symm::SymmetricBuffer;
use accord::gpu::{cuda, DeviceBuffer, DeviceSlice};
use accord::{Communicator, DataType, Error, ReduceOp, Result};

fn val(r: usize, i: usize) -> f32 {
    ((r + 1) * (i % 7 + 1)) as f32
}

struct Bufs {
    send: DeviceSlice,
    recv: DeviceSlice,
    /// The memory behind the slices.
    own: Memory,
}

enum Memory {
    Plain(DeviceBuffer<f32>, DeviceBuffer<f32>),
    Heap(SymmetricBuffer),
}

impl Bufs {
    /// Give the memory back (a heap buffer collectively, as allocated).
    fn release(self) -> Result<()> {
        match self.own {
            Memory::Plain(s, r) => {
                drop((s, r));
                Ok(())
            }
            Memory::Heap(h) => h.free(),
        }
    }
}

/// `v` into the heap at `at` (the device's context current, as the communicator left it).
fn upload(at: u64, v: &[f32]) -> Result<()> {
    let cu = cuda::driver()?;
    // SAFETY: `at` starts at least `v.len()` f32 of heap memory (`make`).
    cu.check(
        unsafe { (cu.memcpy_htod)(at, v.as_ptr().cast(), std::mem::size_of_val(v)) },
        "cuMemcpyHtoD",
    )
}

fn download(x: DeviceSlice) -> Result<Vec<f32>> {
    let mut v = vec![0f32; x.count()];
    let cu = cuda::driver()?;
    // SAFETY: the slice covers `count` f32 of device memory.
    cu.check(
        unsafe { (cu.memcpy_dtoh)(v.as_mut_ptr().cast(), x.ptr(), x.bytes()) },
        "cuMemcpyDtoH",
    )?;
    Ok(v)
}

/// Enqueue one operation on the communicator's stream (the barrier also waits for it).
fn run_once(g: &Communicator, op: &str, b: &Bufs) -> Result<()> {
    let n = g.size();
    let me = g.rank();
    let (s, r) = (b.send, b.recv);
    let req = match op {
        // In place, as torch's `all_reduce(x)`: out of place doubles the memory touched, which
        // from 8 to 32 MiB no longer fits the GPU's L2 across iterations.
        "allreduce" => g.all_reduce(r, ReduceOp::Sum),
        // In place, as torch.distributed.broadcast is (out of place adds a copy on the root).
        "broadcast" => g.broadcast(r, 0),
        "reduce" => g.reduce((s, r), ReduceOp::Sum, 0),
        "allgather" => g.all_gather(s, r),
        "gather" => g.gather(s, r, 0),
        "scatter" => g.scatter(s, r, 0),
        "reduce_scatter" => g.reduce_scatter(s, r, ReduceOp::Sum),
        "alltoall" => g.all_to_all(s, r),
        "sendrecv" => g.sendrecv(s, (me + 1) % n, r, (me + n - 1) % n, 0),
        "barrier" => return g.barrier(),
        _ => return Err(Error::invalid(format!("unknown benchmark op {op:?}"))),
    };
    req.map(|_| ())
}

fn make(g: &Communicator, op: &str, count: usize, symmetric: bool) -> Result<Bufs> {
    let n = g.size();
    let me = g.rank();
    let block = count / n.max(1);
    let (send, recv): (Vec<f32>, usize) = match op {
        "allgather" | "gather" => ((0..block).map(|i| val(me, i)).collect(), block * n),
        "scatter" => (
            (0..block * n)
                .map(|j| val(j / block.max(1), j % block.max(1)))
                .collect(),
            block,
        ),
        "reduce_scatter" => ((0..block * n).map(|i| val(me, i)).collect(), block),
        "alltoall" => (
            (0..block * n)
                .map(|j| (me * 100 + j / block.max(1)) as f32)
                .collect(),
            block * n,
        ),
        "barrier" => (vec![], 0),
        _ => ((0..count).map(|i| val(me, i)).collect(), count),
    };
    // An in-place broadcast starts from each rank's own data; only the root's must survive.
    let first = if op == "broadcast" || op == "allreduce" {
        send.clone()
    } else {
        vec![0f32; recv]
    };
    if symmetric {
        // Both buffers in one heap allocation, the receive one 256-byte aligned after the send.
        let at = (send.len() * 4).next_multiple_of(256);
        let heap = g.alloc_symmetric(at + first.len().max(1) * 4)?;
        upload(heap.ptr(), &send)?;
        upload(heap.ptr() + at as u64, &first)?;
        // SAFETY: both ranges lie inside the heap buffer, which `own` keeps.
        let (s, r) = unsafe {
            (
                DeviceSlice::from_raw(heap.ptr(), send.len(), DataType::F32),
                DeviceSlice::from_raw(heap.ptr() + at as u64, first.len(), DataType::F32),
            )
        };
        return Ok(Bufs {
            send: s,
            recv: r,
            own: Memory::Heap(heap),
        });
    }
    let (s, r) = (g.device_copy(&send)?, g.device_copy(&first)?);
    Ok(Bufs {
        send: s.slice(),
        recv: r.slice(),
        own: Memory::Plain(s, r),
    })
}

fn wrong(g: &Communicator, op: &str, b: &Bufs) -> Result<u64> {
    let n = g.size();
    let me = g.rank();
    let got = download(b.recv)?;
    let block = got.len() / n.max(1);
    let tri = (n * (n + 1) / 2) as f32;
    let bad = |want: &dyn Fn(usize) -> f32| {
        got.iter()
            .enumerate()
            .filter(|(i, v)| **v != want(*i))
            .count() as u64
    };
    Ok(match op {
        "allreduce" => bad(&|i| tri * (i % 7 + 1) as f32),
        "reduce" if me == 0 => bad(&|i| tri * (i % 7 + 1) as f32),
        "broadcast" => bad(&|i| val(0, i)),
        "allgather" => bad(&|j| val(j / block.max(1), j % block.max(1))),
        "gather" if me == 0 => bad(&|j| val(j / block.max(1), j % block.max(1))),
        "scatter" => bad(&|i| val(me, i)),
        "reduce_scatter" => {
            let c = got.len();
            bad(&|i| tri * ((me * c + i) % 7 + 1) as f32)
        }
        "alltoall" => bad(&|j| ((j / block.max(1)) * 100 + me) as f32),
        "sendrecv" => bad(&|i| val((me + n - 1) % n, i)),
        _ => 0,
    })
}

/// (warm-up, timed) iterations: GPU calls are cheap, so more than on the host, which steadies
/// the mean (bench/nccl_torch.py uses the same policy).
fn iterations(bytes: usize, forced: usize) -> (usize, usize) {
    if forced > 0 {
        return (forced.div_ceil(10).max(1), forced);
    }
    let iters = ((2usize << 30) / bytes.max(1 << 12)).clamp(20, 300);
    (iters / 10 + 2, iters)
}

/// Time `iters` operations between two CUDA events on the communicator's stream (µs each).
fn time_loop(g: &Communicator, op: &str, b: &Bufs, iters: usize) -> Result<f64> {
    let cu = cuda::driver()?;
    let info = g
        .device_info()
        .ok_or_else(|| Error::invalid("no device attached"))?;
    let s = info.stream as cuda::CuStream;
    let e0 = cu.new_event(cuda::CU_EVENT_DEFAULT)?;
    let e1 = cu.new_event(cuda::CU_EVENT_DEFAULT)?;
    // SAFETY: live events on the communicator's stream; destroyed below.
    unsafe {
        cu.check((cu.event_record)(e0, s), "cuEventRecord")?;
        for _ in 0..iters {
            run_once(g, op, b)?;
        }
        cu.check((cu.event_record)(e1, s), "cuEventRecord")?;
    }
    g.synchronize()?;
    let mut ms = 0f32;
    // SAFETY: both events were recorded and have completed.
    unsafe {
        cu.check((cu.event_synchronize)(e1), "cuEventSynchronize")?;
        cu.check((cu.event_elapsed)(&mut ms, e0, e1), "cuEventElapsedTime")?;
        (cu.event_destroy)(e0);
        (cu.event_destroy)(e1);
    }
    Ok(ms as f64 * 1000.0 / iters as f64)
}

fn bench(host: &Communicator, g: &Communicator, o: &BenchOpts) -> Result<Vec<Row>> {
    let n = g.size();
    let esz = 4;
    let mut rows = Vec::new();
    let mut bytes = o.min_bytes.max(if o.op == "barrier" { 0 } else { esz });
    let total = match o.op.as_str() {
        "barrier" => 1,
        _ => crate::progress::steps(bytes, o.max_bytes, o.factor),
    };
    let progress = crate::progress::Progress::for_rank(host.rank(), total, &o.op);
    for step in 0.. {
        progress.at(step, bytes);
        let unit = size_unit(&o.op, n, esz);
        let count = (bytes / unit) * unit / esz;
        let shown = count * esz;
        let b = make(g, &o.op, count, o.symmetric)?;
        let (warm, iters) = iterations(shown, o.iters);
        // Check one call on fresh buffers (in place, later calls keep reducing the result).
        run_once(g, &o.op, &b)?;
        g.synchronize()?;
        let mut w = [wrong(g, &o.op, &b)?];
        for _ in 0..warm {
            run_once(g, &o.op, &b)?;
        }
        g.synchronize()?;
        host.barrier()?;
        let mut t = [time_loop(g, &o.op, &b, iters)?];
        host.all_reduce(&mut t, ReduceOp::Max)?;
        host.all_reduce(&mut w, ReduceOp::Sum)?;
        rows.push(Row::new(&o.op, n, shown, count, t[0], w[0]));
        b.release()?;
        if bytes >= o.max_bytes || o.op == "barrier" {
            break;
        }
        bytes = (bytes * o.factor.max(2)).min(o.max_bytes);
    }
    Ok(rows)
}

/// Body of one GPU benchmark rank. Returns the process exit code.
pub fn rank_main(o: &BenchOpts) -> i32 {
    if o.dtype != DataType::F32 {
        eprintln!("accord bench --device cuda: only f32 is benchmarked");
        return 2;
    }
    let host = match accord::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("accord bench: init failed: {e}");
            return 1;
        }
    };
    let ndev = cuda::driver().and_then(|d| d.device_count()).unwrap_or(0);
    let local: usize = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(host.rank());
    // A communicator of one GPU per process: its barrier runs on the device. The symmetric heap
    // belongs to a communicator with host buffers: the process's own, with the device attached.
    let attached = match o.symmetric {
        true => host
            .attach_device(local % ndev.max(1))
            .map(|_| host.clone()),
        false => host
            .attach_devices(&[local % ndev.max(1)])
            .map(|mut g| g.remove(0)),
    };
    let g = match attached {
        Ok(g) => g,
        Err(e) => {
            eprintln!("accord bench: rank {}: {e}", host.rank());
            return 1;
        }
    };
    let rows = match bench(&host, &g, o) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("accord bench: rank {}: {e}", host.rank());
            return 1;
        }
    };
    let engine = accord::config::get().gpu_engine.name();
    let what = match g.device_info() {
        Some(i) if i.engine == "NCCL" => format!("cuda (engine {engine}; NCCL {})", i.version.0),
        Some(i) => format!("cuda (engine {engine}; {} kernels only)", i.engine),
        None => "cuda".into(),
    };
    crate::bench::report(&host, o, &rows, &what, "cuda")
}
