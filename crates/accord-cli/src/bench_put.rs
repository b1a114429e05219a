//! `accord bench put --device cuda`: memory channels between two GPUs over the symmetric heap.
//!
//! Two tables. `put`: both ranks put `size` bytes into the other's buffer at once (one block per
//! 64 KiB, at most 32; each block signals when its part is written and waits for the peer's
//! matching part): the time of one exchange and the bandwidth per direction. `put_packets`: one
//! block sends `size` bytes as LL packets and reads the peer's: the one-way latency of a packet
//! message. CUDA events around back-to-back kernels on a stream of the benchmark's own; every
//! size's data is checked once. Ranks sharing a GPU run (to check) but their kernels are
//! time-sliced, so such timings mean nothing: the table says so.

use crate::bench::{self, BenchOpts, Row};
use accord::gpu::cuda::{self, nvrtc, CuStream, Driver, Kernel, KernelArgs};
use accord::gpu::symm::{MemoryChannels, SymmetricBuffer};
use accord::{Communicator, Error, ReduceOp, Result};

const SOURCE: &str = r#"
#include <accord/channel.cuh>

// Block b puts part b of `bytes` from offset 0 to the peer's `recv`, signals, and waits for the
// peer's part b.
extern "C" __global__ void put_exchange(accord::MemoryChannel* ch, int peer,
                                        unsigned long long bytes, unsigned long long recv) {
  unsigned long long part = (bytes + gridDim.x - 1) / gridDim.x;
  unsigned long long off = part * blockIdx.x;
  unsigned long long n = off >= bytes ? 0 : (bytes - off < part ? bytes - off : part);
  ch[peer].put(recv + off, off, n, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    ch[peer].signal();
    ch[peer].wait();
  }
}

// `bytes` as packets into the peer's landing area; the peer's unpacked to `recv`.
extern "C" __global__ void packet_exchange(accord::MemoryChannel* ch, int peer,
                                           unsigned long long bytes, unsigned long long recv,
                                           unsigned long long landing, unsigned int flag) {
  ch[peer].put_packets(landing, 0, bytes, flag, threadIdx.x, blockDim.x);
  ch[peer].read_packets(recv, landing, bytes, flag, threadIdx.x, blockDim.x);
}
"#;

/// Where things live in each rank's symmetric buffer: the data sent, the data received, and two
/// packet landing areas used by turns (a peer one call ahead writes the other area, never the
/// one still being read).
struct Layout {
    recv: u64,
    landing: [u64; 2],
    total: usize,
}

impl Layout {
    fn for_max(max: usize) -> Layout {
        let max = max.next_multiple_of(16) as u64;
        let area = 2 * max + 16;
        Layout {
            recv: max,
            landing: [2 * max, 2 * max + area],
            total: (2 * max + 2 * area) as usize,
        }
    }
}

struct Bench<'a> {
    cu: &'static Driver,
    comm: &'a Communicator,
    buf: SymmetricBuffer,
    ch: MemoryChannels,
    put: Kernel,
    packets: Kernel,
    stream: CuStream,
    layout: Layout,
    peer: usize,
    flag: u32,
}

fn pattern(rank: usize, bytes: usize) -> Vec<u8> {
    (0..bytes)
        .map(|i| (rank * 101 + i * 13 % 251) as u8)
        .collect()
}

impl Bench<'_> {
    /// Launch one exchange of `bytes` (`packets`: as LL packets).
    fn once(&mut self, bytes: usize, packets: bool) -> Result<()> {
        let args = KernelArgs::new()
            .ptr(self.ch.device_ptr())
            .i32(self.peer as i32)
            .u64(bytes as u64)
            .u64(self.layout.recv);
        // SAFETY: the arguments match the kernels' parameter lists; the channels and buffers
        // they point at outlive the launch (synchronised before they are dropped).
        unsafe {
            if packets {
                self.flag = self.flag.wrapping_add(1).max(1);
                let landing = self.layout.landing[(self.flag & 1) as usize];
                let a = args.u64(landing).u32(self.flag);
                self.packets
                    .launch([1, 1, 1], [512, 1, 1], 0, self.stream, a.as_bytes())
            } else {
                let blocks = (bytes / (64 << 10)).clamp(1, 32) as u32;
                self.put
                    .launch([blocks, 1, 1], [512, 1, 1], 0, self.stream, args.as_bytes())
            }
        }
    }

    /// Whether one exchange of `bytes` delivers the peer's data: the number of wrong bytes.
    fn check(&mut self, bytes: usize, packets: bool) -> Result<u64> {
        let me = self.comm.rank();
        upload(self.cu, self.buf.ptr(), &pattern(me, bytes))?;
        upload(
            self.cu,
            self.buf.ptr() + self.layout.recv,
            &vec![0u8; bytes],
        )?;
        self.comm.barrier()?;
        self.once(bytes, packets)?;
        self.ch.check()?;
        let got = download(self.cu, self.buf.ptr() + self.layout.recv, bytes)?;
        let want = pattern(self.peer, bytes);
        Ok(got.iter().zip(&want).filter(|(g, w)| g != w).count() as u64)
    }

    /// Microseconds per exchange over `iters` launches.
    fn time(&mut self, bytes: usize, packets: bool, iters: usize) -> Result<f64> {
        let cu = self.cu;
        let e0 = cu.new_event(cuda::CU_EVENT_DEFAULT)?;
        let e1 = cu.new_event(cuda::CU_EVENT_DEFAULT)?;
        self.comm.barrier()?;
        // SAFETY: live events on the benchmark's stream, destroyed below.
        unsafe { cu.check((cu.event_record)(e0, self.stream), "cuEventRecord")? };
        for _ in 0..iters {
            self.once(bytes, packets)?;
        }
        let mut ms = 0f32;
        // SAFETY: as above; both recorded before they are read.
        unsafe {
            cu.check((cu.event_record)(e1, self.stream), "cuEventRecord")?;
            cu.check((cu.event_synchronize)(e1), "cuEventSynchronize")?;
            cu.check((cu.event_elapsed)(&mut ms, e0, e1), "cuEventElapsedTime")?;
            (cu.event_destroy)(e0);
            (cu.event_destroy)(e1);
        }
        self.ch.check()?;
        Ok(ms as f64 * 1000.0 / iters as f64)
    }
}

fn upload(cu: &Driver, ptr: u64, data: &[u8]) -> Result<()> {
    // SAFETY: `ptr` starts this rank's symmetric buffer region of at least `data.len()` bytes.
    cu.check(
        unsafe { (cu.memcpy_htod)(ptr, data.as_ptr().cast(), data.len()) },
        "cuMemcpyHtoD",
    )?;
    // SAFETY: no arguments; the copy from pageable memory may still be in flight otherwise.
    cu.check(unsafe { (cu.ctx_synchronize)() }, "cuCtxSynchronize")
}

fn download(cu: &Driver, ptr: u64, len: usize) -> Result<Vec<u8>> {
    let mut v = vec![0u8; len];
    // SAFETY: as in `upload`.
    cu.check(
        unsafe { (cu.memcpy_dtoh)(v.as_mut_ptr().cast(), ptr, len) },
        "cuMemcpyDtoH",
    )?;
    Ok(v)
}

fn run(comm: &Communicator, o: &BenchOpts) -> Result<(Vec<Row>, Vec<Row>, bool)> {
    if comm.size() != 2 {
        return Err(Error::invalid("accord bench put runs on 2 ranks (-n 2)"));
    }
    let cu = cuda::driver()?;
    let ndev = cu.device_count()?;
    let local: usize = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(comm.rank());
    let dev = local % ndev.max(1);
    let shared = ndev < 2;
    let layout = Layout::for_max(o.max_bytes.max(16));
    let buf = comm.alloc_symmetric_on(dev, layout.total)?;
    let ch = comm.memory_channels(&buf)?;
    let put = nvrtc::load_kernel(SOURCE, "put_exchange", &[], dev)?;
    let packets = nvrtc::load_kernel(SOURCE, "packet_exchange", &[], dev)?;
    let stream = cu.new_stream()?;
    let mut b = Bench {
        cu,
        comm,
        buf,
        ch,
        put,
        packets,
        stream,
        layout,
        peer: 1 - comm.rank(),
        flag: 0,
    };
    let (mut puts, mut pkts) = (Vec::new(), Vec::new());
    let mut bytes = o.min_bytes.max(1);
    loop {
        let iters = if o.iters > 0 {
            o.iters
        } else {
            ((1usize << 30) / bytes.max(1 << 12)).clamp(10, 200)
        };
        for (packets, rows, op) in [(false, &mut puts, "put"), (true, &mut pkts, "put_packets")] {
            let mut w = [b.check(bytes, packets)? as f64];
            for _ in 0..iters.div_ceil(10) {
                b.once(bytes, packets)?;
            }
            let mut t = [b.time(bytes, packets, iters)?];
            comm.all_reduce(&mut t, ReduceOp::Max)?;
            comm.all_reduce(&mut w, ReduceOp::Sum)?;
            rows.push(Row::new(op, 2, bytes, bytes, t[0], w[0] as u64));
        }
        if bytes >= o.max_bytes {
            break;
        }
        bytes = (bytes * o.factor.max(2)).min(o.max_bytes);
    }
    b.ch.check()?;
    Ok((puts, pkts, shared))
}

/// Body of one rank of `accord bench put --device cuda`. Returns the process exit code.
pub fn rank_main(o: &BenchOpts) -> i32 {
    let comm = match accord::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("accord bench: init failed: {e}");
            return 1;
        }
    };
    match run(&comm, o) {
        Ok((puts, pkts, shared)) => {
            let label = match shared {
                true => {
                    "cuda channels (ranks share one GPU: timings are time-sliced, not meaningful)"
                }
                false => "cuda channels",
            };
            let code = bench::report(&comm, o, &puts, label, "cuda-channels");
            let packets = BenchOpts {
                op: "put_packets".into(),
                json: None,
                plot: None,
                ..o.clone()
            };
            code.max(bench::report(
                &comm,
                &packets,
                &pkts,
                label,
                "cuda-channels",
            ))
        }
        Err(e) => {
            eprintln!("accord bench put: rank {}: {e}", comm.rank());
            1
        }
    }
}
