//! Device buffers through the one `Communicator`: the conformance suite on GPU memory, and the
//! API a Rust user of one GPU per process writes. Needs CUDA and NCCL; without them every test
//! prints why it skipped. One GPU runs the one-rank tests; the `processes_` tests run under
//! `accord run -n N ./gpu_unified processes_` (one process per GPU, as NCCL requires).

use accord::dtype::DataType;
use accord::gpu::{self, DeviceBuffer, DeviceSlice, Stream};
use accord::testing::conformance::{self, Buffer, Memory, Options};
use accord::testing::run_world;
use accord::{Communicator, RecvBuf, ReduceOp, SendBuf};

fn skip(test: &str) -> bool {
    match gpu::unavailable_reason() {
        Some(why) => {
            println!("{test}: skipping: {why}");
            true
        }
        None => false,
    }
}

/// Conformance buffers on the communicator's GPU, lent on its own stream.
struct Gpu<'c>(&'c Communicator);

struct GpuBuf {
    buf: DeviceBuffer<u8>,
    slice: DeviceSlice,
}

impl Memory for Gpu<'_> {
    fn name(&self) -> String {
        format!("cuda:{}", self.0.attached_device().unwrap_or(0))
    }

    fn upload(&self, dtype: DataType, bytes: &[u8]) -> Box<dyn Buffer + '_> {
        let buf = self.0.device_copy(bytes).expect("device copy");
        // SAFETY: the allocation lives as long as the slice (both in GpuBuf).
        let slice =
            unsafe { DeviceSlice::from_raw(buf.slice().ptr(), bytes.len() / dtype.size(), dtype) };
        Box::new(GpuBuf { buf, slice })
    }
}

impl Buffer for GpuBuf {
    fn send(&self) -> SendBuf<'_> {
        SendBuf::device(self.slice, Stream::Comm)
    }

    fn recv(&mut self) -> RecvBuf<'_> {
        RecvBuf::device(self.slice, Stream::Comm)
    }

    fn download(&self) -> Vec<u8> {
        self.buf.to_host().expect("device to host")
    }
}

/// What NCCL offers: no bitwise reductions, and what the device engines reduce at all.
fn device_options(engine: &str) -> Options {
    let mut o = Options::new(engine);
    o.reduce_ops = vec![
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];
    o.reduces = accord::gpu::reduces_on_device;
    o
}

fn conform_on_device(comm: &Communicator, engine: &str) -> String {
    let summary = conformance::check(comm, &Gpu(comm), &device_options(engine))
        .unwrap_or_else(|f| panic!("rank {}: {f}", comm.rank()));
    format!("{summary:?}")
}

#[test]
fn one_rank_conforms_on_device_memory() {
    if skip("one_rank_conforms_on_device_memory") {
        return;
    }
    let out = run_world(1, |comm| {
        comm.attach_device(0).unwrap();
        conform_on_device(&comm, "nccl, 1 rank")
    });
    println!("one_rank_conforms_on_device_memory: {}", out[0]);
}

/// Scan is refused inside a launch group, before anything is enqueued; the communicator still
/// works after.
#[test]
fn one_rank_scan_is_refused_inside_a_group() {
    if skip("one_rank_scan_is_refused_inside_a_group") {
        return;
    }
    run_world(1, |comm| {
        comm.attach_device(0).unwrap();
        let mut dev = comm.device_copy(&[2.0f32; 4]).unwrap();
        let e = gpu::group(|| comm.scan(&mut dev, ReduceOp::Sum).map(|_| ()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("inside gpu::group"), "{e}");
        comm.scan(&mut dev, ReduceOp::Sum).unwrap().wait().unwrap();
        assert_eq!(dev.to_host().unwrap(), vec![2.0f32; 4]);
    });
}

#[test]
fn device_buffers_need_an_attached_device_and_one_memory_per_call() {
    if skip("device_buffers_need_an_attached_device_and_one_memory_per_call") {
        return;
    }
    run_world(1, |comm| {
        // SAFETY: never dereferenced: the call is refused before any work.
        let d = unsafe { DeviceSlice::from_raw(0x1000, 4, DataType::F32) };
        let e = comm.all_reduce(d, ReduceOp::Sum).unwrap_err().to_string();
        assert!(e.contains("attach_device"), "{e}");
        comm.attach_device(0).unwrap();
        let mut dev = comm.device_copy(&[1.0f32; 4]).unwrap();
        let host = [0.0f32; 4];
        let e = comm
            .all_reduce((&host, &mut dev), ReduceOp::Sum)
            .unwrap_err()
            .to_string();
        assert!(e.contains("host memory and the other on a GPU"), "{e}");
        let e = comm.attach_device(1).unwrap_err().to_string();
        assert!(e.contains("cannot also use GPU 1"), "{e}");
        // The communicator still works after refused calls.
        comm.all_reduce(&mut dev, ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(dev.to_host().unwrap(), vec![1.0f32; 4]);
    });
}

/// Attach the GPU of this process's local rank (ranks share GPUs where there are fewer).
fn attach_local_gpu(comm: &Communicator) {
    let count = gpu::cuda::driver().and_then(|d| d.device_count()).unwrap();
    let local: usize = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(comm.rank());
    comm.attach_device(local % count.max(1)).unwrap();
}

fn launched(test: &str) -> Option<Communicator> {
    if skip(test) {
        return None;
    }
    if std::env::var("ACCORD_RANK").is_err() {
        println!("{test}: skipping: not started by `accord run -n N` (one process per GPU)");
        return None;
    }
    Some(accord::init().expect("host communicator"))
}

#[test]
fn processes_conform_on_device_memory() {
    let Some(comm) = launched("processes_conform_on_device_memory") else {
        return;
    };
    attach_local_gpu(&comm);
    let summary = conform_on_device(&comm, &format!("nccl, {} processes", comm.size()));
    // The same communicator runs host buffers too, in the same order.
    let mut v = vec![comm.rank() as u32 + 1; 5];
    comm.all_reduce(&mut v, ReduceOp::Sum).unwrap();
    let n = comm.size() as u32;
    assert_eq!(v, vec![n * (n + 1) / 2; 5]);
    println!(
        "processes_conform_on_device_memory: rank {} of {} on GPU {:?}: {summary}",
        comm.rank(),
        comm.size(),
        comm.attached_device()
    );
}

/// The types the device engines lack (bool, 16-bit integers, complex), re-expressed for Accord's
/// own kernels, which run where ranks share a GPU:
/// `ACCORD_GPU_ENGINE=accord accord run -n 2 ./gpu_unified lowered_types` (no NCCL needed, so
/// scan, which runs on NCCL, and point-to-point are left out).
#[test]
fn processes_lowered_types_conform_on_own_kernels() {
    let test = "processes_lowered_types_conform_on_own_kernels";
    // Before `launched`: the other `processes_` tests of a job initialise the process's
    // communicator.
    if std::env::var("ACCORD_GPU_ENGINE").as_deref() != Ok("accord") {
        println!("{test}: skipping: run with ACCORD_GPU_ENGINE=accord");
        return;
    }
    let Some(comm) = launched(test) else {
        return;
    };
    attach_local_gpu(&comm);
    let mut o = device_options("accord kernels, lowered types");
    o.dtypes = vec![
        DataType::Bool,
        DataType::I16,
        DataType::U16,
        DataType::C64,
        DataType::C128,
    ];
    o.reduces = gpu::reduces_on_device;
    o.kinds.retain(|k| {
        use accord::fingerprint::OpKind::*;
        !matches!(k, Scan | ExScan | SendRecv)
    });
    let summary = conformance::check(&comm, &Gpu(&comm), &o)
        .unwrap_or_else(|f| panic!("rank {}: {f}", comm.rank()));
    println!(
        "{test}: rank {} of {}: {summary:?}",
        comm.rank(),
        comm.size()
    );
}
