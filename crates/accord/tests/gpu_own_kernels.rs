//! Accord's own GPU kernels against a sequential host reference, bit for bit. Run under the
//! launcher with the kernels forced (processes may share one GPU; NCCL is then not used):
//!
//! `ACCORD_GPU_ENGINE=accord accord run -n 3 <this test binary> --test-threads 1 --nocapture processes_`
//!
//! `ACCORD_GPU_CHUNK_BYTES=65536` makes the larger counts take several rounds. The killed-rank
//! and desync tests end or confuse ranks on purpose: `ACCORD_GPU_KILL_TEST=1`,
//! `ACCORD_GPU_DESYNC_TEST=1`. Without CUDA, or outside the launcher, every test prints why it
//! skips.

use accord::dtype::{finalize, reduce_into};
use accord::gpu::cuda::{self, CuStream};
use accord::gpu::{DeviceBuffer, DeviceSlice, Stream};
use accord::{Communicator, DataType, Error, Parts, RecvBuf, ReduceOp, SendBuf};
use half::{bf16, f16};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The job's host communicator and its device communicator, shared by the tests of a process.
fn launched(test: &str) -> Option<&'static (Communicator, Communicator)> {
    match cuda::driver().map(|cu| cu.device_count()) {
        Err(e) => {
            println!("{test}: skipping: {e}");
            return None;
        }
        Ok(Ok(0)) | Ok(Err(_)) => {
            println!("{test}: skipping: no CUDA device visible");
            return None;
        }
        Ok(Ok(_)) => {}
    }
    if std::env::var("ACCORD_RANK").is_err() {
        println!("{test}: skipping: not started by `accord run -n N`");
        return None;
    }
    static WORLD: OnceLock<(Communicator, Communicator)> = OnceLock::new();
    Some(WORLD.get_or_init(|| {
        let host = accord::init().expect("host communicator");
        let n = cuda::driver().unwrap().device_count().unwrap();
        let local: usize = std::env::var("LOCAL_RANK")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(host.rank());
        host.attach_device(local % n).expect("attach the GPU");
        let g = host.clone();
        (host, g)
    }))
}

/// Whether `ACCORD_GPU_ENGINE=accord` gives every call the kernels can run to them.
fn kernels_forced() -> bool {
    std::env::var("ACCORD_GPU_ENGINE").as_deref() == Ok("accord")
}

/// [`launched`] for tests that need every size on the kernels; skips (saying so) otherwise.
fn launched_forced(test: &str) -> Option<&'static Communicator> {
    let (_, g) = launched(test)?;
    if !kernels_forced() {
        println!("{test}: skipping: needs ACCORD_GPU_ENGINE=accord (every size to the kernels)");
        return None;
    }
    Some(g)
}

/// splitmix64: the same stream on every rank for the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// `count` random elements of `dtype` for `rank` (finite floats of mixed magnitude).
fn values(dtype: DataType, rank: usize, seed: u64, count: usize) -> Vec<u8> {
    let mut r = Rng(seed ^ ((rank as u64 + 1) << 40) ^ ((dtype as u64) << 56));
    let mut out = Vec::with_capacity(count * dtype.size());
    for _ in 0..count {
        let x = r.next();
        let f = ((x % 2001) as f64 - 1000.0) / (1u64 << (x >> 60)) as f64;
        match dtype {
            DataType::F16 => out.extend(f16::from_f64(f).to_le_bytes()),
            DataType::BF16 => out.extend(bf16::from_f64(f).to_le_bytes()),
            DataType::F32 => out.extend((f as f32).to_le_bytes()),
            DataType::F64 => out.extend(f.to_le_bytes()),
            _ => out.extend(&x.to_le_bytes()[..dtype.size()]),
        }
    }
    out
}

/// The reduction of `inputs` (one per rank) in rank order, as the host library computes it.
fn reduced(dtype: DataType, op: ReduceOp, inputs: &[Vec<u8>]) -> Vec<u8> {
    let n = inputs.len();
    let half = matches!(dtype, DataType::F16 | DataType::BF16);
    if op == ReduceOp::Avg && half {
        // Summed in f32, divided, rounded once.
        let wide = |b: &[u8]| -> f32 {
            let v = u16::from_le_bytes([b[0], b[1]]);
            match dtype {
                DataType::F16 => f16::from_bits(v).to_f32(),
                _ => bf16::from_bits(v).to_f32(),
            }
        };
        let mut out = Vec::new();
        for i in (0..inputs[0].len()).step_by(2) {
            let mut acc = wide(&inputs[0][i..]);
            for x in &inputs[1..] {
                acc += wide(&x[i..]);
            }
            let v = acc / n as f32;
            out.extend(match dtype {
                DataType::F16 => f16::from_f32(v).to_le_bytes(),
                _ => bf16::from_f32(v).to_le_bytes(),
            });
        }
        return out;
    }
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        reduce_into(dtype, op, &mut acc, x);
    }
    finalize(dtype, op, &mut acc, n);
    acc
}

/// Equal bit for bit, except that any NaN equals any NaN.
fn same(dtype: DataType, what: &str, got: &[u8], want: &[u8]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} bytes, expected {}",
            got.len(),
            want.len()
        ));
    }
    let es = dtype.size();
    let nan = |b: &[u8]| dtype.is_float() && float_at(dtype, b, 0).is_nan();
    for (i, (g, w)) in got.chunks(es).zip(want.chunks(es)).enumerate() {
        if g != w && !(nan(g) && nan(w)) {
            return Err(format!(
                "{what}: element {i} of {} is {g:02x?}, expected {w:02x?}",
                got.len() / es
            ));
        }
    }
    Ok(())
}

/// Element `i` of a float array as f64.
fn float_at(dtype: DataType, b: &[u8], i: usize) -> f64 {
    let es = dtype.size();
    let e = &b[i * es..(i + 1) * es];
    match dtype {
        DataType::F16 => f16::from_le_bytes([e[0], e[1]]).to_f64(),
        DataType::BF16 => bf16::from_le_bytes([e[0], e[1]]).to_f64(),
        DataType::F32 => f32::from_le_bytes(e.try_into().unwrap()) as f64,
        _ => f64::from_le_bytes(e.try_into().unwrap()),
    }
}

/// Whether NCCL's result may differ from the rank-order reference: float sums, products and
/// averages of more than two ranks round differently in another order.
fn order_dependent(dtype: DataType, op: ReduceOp, n: usize) -> bool {
    dtype.is_float() && matches!(op, ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Avg) && n > 2
}

/// A reduction NCCL ran (under `auto`): exact where the order cannot matter, else within the
/// rounding bound of any order, `(n + 2)` unit roundoffs of the magnitudes involved. Products
/// whose partial products may leave the normal range in some order (overflow, underflow) have
/// no such bound and are counted in `loose` instead of compared.
fn reduced_by_nccl(
    dtype: DataType,
    op: ReduceOp,
    what: &str,
    got: &[u8],
    inputs: &[Vec<u8>],
    loose: &mut usize,
) -> Result<(), String> {
    if !order_dependent(dtype, op, inputs.len()) {
        return same(dtype, what, got, &reduced(dtype, op, inputs));
    }
    let (eps, max, min_normal) = match dtype {
        DataType::F16 => (2f64.powi(-11), 65504.0, 2f64.powi(-14)),
        DataType::BF16 => (2f64.powi(-8), 3.38e38, 2f64.powi(-126)),
        DataType::F32 => (2f64.powi(-24), f32::MAX as f64, 2f64.powi(-126)),
        _ => (2f64.powi(-53), f64::MAX, f64::MIN_POSITIVE),
    };
    let n = inputs.len();
    for i in 0..got.len() / dtype.size() {
        let xs: Vec<f64> = inputs.iter().map(|x| float_at(dtype, x, i)).collect();
        let (exact, scale) = match op {
            ReduceOp::Prod => {
                let big: f64 = xs.iter().map(|x| x.abs().max(1.0)).product();
                let small: f64 = xs
                    .iter()
                    .filter(|x| **x != 0.0)
                    .map(|x| x.abs().min(1.0))
                    .product();
                if big > max || small < min_normal {
                    *loose += 1;
                    continue;
                }
                let p: f64 = xs.iter().product();
                (p, p.abs())
            }
            ReduceOp::Avg => (
                xs.iter().sum::<f64>() / n as f64,
                xs.iter().map(|x| x.abs()).sum::<f64>() / n as f64,
            ),
            _ => (xs.iter().sum(), xs.iter().map(|x| x.abs()).sum()),
        };
        let g = float_at(dtype, got, i);
        let bound = (n + 2) as f64 * eps * scale + min_normal * eps;
        if (g - exact).abs() > bound || !g.is_finite() {
            return Err(format!(
                "{what}: element {i} of {} is {g}, expected {exact} within {bound:e} (NCCL's order)",
                got.len() / dtype.size()
            ));
        }
    }
    Ok(())
}

/// Check a reduction's result: bit for bit against the rank-order reference where Accord's
/// kernels ran it (`kernels`), else as [`reduced_by_nccl`] does.
#[allow(clippy::too_many_arguments)]
fn check_reduced(
    dtype: DataType,
    op: ReduceOp,
    what: &str,
    got: &[u8],
    want: &[u8],
    inputs: &[Vec<u8>],
    kernels: bool,
    loose: &mut usize,
) -> Result<(), String> {
    if kernels {
        return same(dtype, what, got, want);
    }
    if kernels_forced() && !got.is_empty() {
        return Err(format!(
            "{what}: ran on NCCL under ACCORD_GPU_ENGINE=accord"
        ));
    }
    reduced_by_nccl(dtype, op, what, got, inputs, loose)
}

/// Make a call, wait for it, and say whether Accord's kernels took it (rather than NCCL).
fn on_kernels(
    what: &str,
    call: impl FnOnce() -> accord::Result<accord::Completion>,
) -> Result<bool, String> {
    let before = accord::testing::gpu_kernel_calls();
    wait(what, call())?;
    Ok(accord::testing::gpu_kernel_calls() > before)
}

/// A device array of a test: an ordinary allocation, or a piece of the symmetric heap.
enum Arr {
    Plain(DeviceBuffer<u8>),
    /// Address, device.
    Heap(u64, usize),
}

/// The driver, with `device`'s primary context current on this thread.
fn on_device(device: usize) -> &'static cuda::Driver {
    let cu = cuda::driver().unwrap();
    let ctx = cu.primary_context(device).unwrap();
    // SAFETY: the device's primary context, retained by the driver for the process.
    cu.check(unsafe { (cu.ctx_set_current)(ctx) }, "cuCtxSetCurrent")
        .unwrap();
    cu
}

impl Arr {
    fn ptr(&self) -> u64 {
        match self {
            Arr::Plain(b) => b.slice().ptr(),
            Arr::Heap(p, _) => *p,
        }
    }

    fn copy_from_host(&self, bytes: &[u8]) -> accord::Result<()> {
        match self {
            Arr::Plain(b) => b.copy_from_host(bytes),
            Arr::Heap(p, device) => {
                let cu = on_device(*device);
                // SAFETY: `up` placed at least `bytes.len()` bytes at p, in the heap buffer.
                cu.check(
                    unsafe { (cu.memcpy_htod)(*p, bytes.as_ptr().cast(), bytes.len()) },
                    "cuMemcpyHtoD",
                )
            }
        }
    }
}

/// Where `up` places arrays while a test runs on the symmetric heap: the buffer and the next
/// free byte.
static HEAP: std::sync::Mutex<Option<(accord::gpu::symm::SymmetricBuffer, usize)>> =
    std::sync::Mutex::new(None);

/// Run `f` with `up` placing arrays in `buf` (from its start), then give the buffer back.
fn on_heap<R>(
    buf: accord::gpu::symm::SymmetricBuffer,
    f: impl FnOnce() -> R,
) -> (R, accord::gpu::symm::SymmetricBuffer) {
    *HEAP.lock().unwrap() = Some((buf, 0));
    let r = f();
    let (buf, _) = HEAP.lock().unwrap().take().unwrap();
    (r, buf)
}

fn up(g: &Communicator, bytes: &[u8]) -> Arr {
    let mut b = bytes.to_vec();
    if b.is_empty() {
        b.push(0);
    }
    let mut heap = HEAP.lock().unwrap();
    if let Some((buf, next)) = heap.as_mut() {
        // 16-byte aligned, plus an odd multiple of 16 so arrays start anywhere in a buffer.
        let at = next.next_multiple_of(16) + 16;
        assert!(at + b.len() <= buf.len(), "the test's heap buffer is full");
        *next = at + b.len();
        let a = Arr::Heap(buf.ptr() + at as u64, buf.device());
        a.copy_from_host(&b).expect("upload to the heap");
        return a;
    }
    Arr::Plain(g.device_copy(&b).expect("device copy"))
}

fn slice(b: &Arr, count: usize, dtype: DataType) -> DeviceSlice {
    // SAFETY: the array holds at least count * size bytes (or is a one-byte stand-in for
    // count 0) and outlives the call, which is waited for.
    unsafe { DeviceSlice::from_raw(b.ptr(), count, dtype) }
}

fn down(b: &Arr, bytes: usize) -> Vec<u8> {
    let device = match b {
        Arr::Plain(b) => {
            let mut v = b.to_host().expect("download");
            v.truncate(bytes);
            return v;
        }
        Arr::Heap(_, device) => *device,
    };
    let mut v = vec![0u8; bytes];
    let cu = on_device(device);
    // SAFETY: the array holds at least `bytes` (it was uploaded with them).
    cu.check(
        unsafe { (cu.memcpy_dtoh)(v.as_mut_ptr().cast(), b.ptr(), bytes) },
        "cuMemcpyDtoH",
    )
    .expect("download");
    v
}

fn s(x: DeviceSlice) -> SendBuf<'static> {
    SendBuf::device(x, Stream::Comm)
}

fn r(x: DeviceSlice) -> RecvBuf<'static> {
    RecvBuf::device(x, Stream::Comm)
}

fn wait(what: &str, c: accord::Result<accord::Completion>) -> Result<(), String> {
    c.and_then(|c| c.wait()).map_err(|e| format!("{what}: {e}"))
}

fn ops_for(dtype: DataType) -> Vec<ReduceOp> {
    ReduceOp::ALL
        .into_iter()
        .filter(|o| o.check(dtype).is_ok())
        .collect()
}

/// Every kernel for `dtype` at `count` elements per rank (per block for the gathering ones).
fn check_dtype(
    g: &Communicator,
    dtype: DataType,
    count: usize,
    seed: u64,
    loose: &mut usize,
) -> Result<(), String> {
    let (n, me, es) = (g.size(), g.rank(), dtype.size());
    let inputs: Vec<Vec<u8>> = (0..n).map(|q| values(dtype, q, seed, count)).collect();
    let mine = &inputs[me];

    for op in ops_for(dtype) {
        let want = reduced(dtype, op, &inputs);
        // Out of place.
        let (a, b) = (up(g, mine), up(g, &vec![0xa5; count * es]));
        let what = format!("allreduce {op}");
        let k = on_kernels(&what, || {
            g.all_reduce((s(slice(&a, count, dtype)), r(slice(&b, count, dtype))), op)
        })?;
        let got = down(&b, count * es);
        check_reduced(dtype, op, &what, &got, &want, &inputs, k, loose)?;
        // In place.
        let what = format!("allreduce {op} in place");
        let k = on_kernels(&what, || g.all_reduce(r(slice(&a, count, dtype)), op))?;
        let got = down(&a, count * es);
        check_reduced(dtype, op, &what, &got, &want, &inputs, k, loose)?;

        // reduce_scatter: rank q gets block q of the reduction of everyone's n blocks.
        let blocks: Vec<Vec<u8>> = (0..n)
            .map(|q| values(dtype, q, seed + 1, count * n))
            .collect();
        let whole = reduced(dtype, op, &blocks);
        let (a, b) = (up(g, &blocks[me]), up(g, &vec![0; count * es]));
        let what = format!("reduce_scatter {op}");
        let k = on_kernels(&what, || {
            g.reduce_scatter(
                s(slice(&a, count * n, dtype)),
                r(slice(&b, count, dtype)),
                op,
            )
        })?;
        let mine_of = |x: &Vec<u8>| x[me * count * es..(me + 1) * count * es].to_vec();
        let block_inputs: Vec<Vec<u8>> = blocks.iter().map(mine_of).collect();
        check_reduced(
            dtype,
            op,
            &what,
            &down(&b, count * es),
            &whole[me * count * es..(me + 1) * count * es],
            &block_inputs,
            k,
            loose,
        )?;
    }

    // allgather.
    let (a, b) = (up(g, mine), up(g, &vec![0; n * count * es]));
    wait(
        "allgather",
        g.all_gather(s(slice(&a, count, dtype)), r(slice(&b, n * count, dtype))),
    )?;
    same(
        dtype,
        "allgather",
        &down(&b, n * count * es),
        &inputs.concat(),
    )?;

    // broadcast from every root, in and out of place.
    for (root, theirs) in inputs.iter().enumerate() {
        let b = up(g, &vec![0x5a; count * es]);
        let what = format!("broadcast from {root}");
        wait(
            &what,
            g.broadcast(
                (s(slice(&a, count, dtype)), r(slice(&b, count, dtype))),
                root,
            ),
        )?;
        same(dtype, &what, &down(&b, count * es), theirs)?;
        let c = up(g, mine);
        wait(&what, g.broadcast(r(slice(&c, count, dtype)), root))?;
        same(
            dtype,
            &format!("{what} in place"),
            &down(&c, count * es),
            theirs,
        )?;
    }

    // alltoall: block j of rank q's send lands in block q of rank j's receive.
    let sends: Vec<Vec<u8>> = (0..n)
        .map(|q| values(dtype, q, seed + 2, count * n))
        .collect();
    let (a, b) = (up(g, &sends[me]), up(g, &vec![0; n * count * es]));
    wait(
        "alltoall",
        g.all_to_all(
            s(slice(&a, n * count, dtype)),
            r(slice(&b, n * count, dtype)),
        ),
    )?;
    let want: Vec<u8> = (0..n)
        .flat_map(|q| sends[q][me * count * es..(me + 1) * count * es].to_vec())
        .collect();
    same(dtype, "alltoall", &down(&b, n * count * es), &want)?;

    // alltoallv: rank q sends rank j (q + 2j) % 3 + count / (j + 1) elements.
    let pair = |q: usize, j: usize| (q + 2 * j) % 3 + count / (j + 1);
    let to_each: Vec<usize> = (0..n).map(|j| pair(me, j)).collect();
    let from_each: Vec<usize> = (0..n).map(|q| pair(q, me)).collect();
    let send_total: usize = to_each.iter().sum();
    let recv_total: usize = from_each.iter().sum();
    let sends: Vec<Vec<u8>> = (0..n)
        .map(|q| values(dtype, q, seed + 3, (0..n).map(|j| pair(q, j)).sum()))
        .collect();
    let (a, b) = (up(g, &sends[me]), up(g, &vec![0; recv_total * es]));
    wait(
        "alltoallv",
        g.all_to_all(
            Parts::new(s(slice(&a, send_total, dtype)), &to_each),
            Parts::new(r(slice(&b, recv_total, dtype)), &from_each),
        ),
    )?;
    let mut want = Vec::new();
    for q in 0..n {
        let off: usize = (0..me).map(|j| pair(q, j)).sum();
        want.extend_from_slice(&sends[q][off * es..(off + pair(q, me)) * es]);
    }
    same(dtype, "alltoallv", &down(&b, recv_total * es), &want)?;
    Ok(())
}

#[test]
fn processes_every_kernel_dtype_and_op_matches_the_host() {
    let test = "processes_every_kernel_dtype_and_op_matches_the_host";
    let Some((host, g)) = launched(test) else {
        return;
    };
    let info = g.device_info().expect("a device engine");
    // Counts: none, one, odd, a one-shot allreduce that fills many packets, and one that takes
    // the two-shot kernel over several rounds (with ACCORD_GPU_CHUNK_BYTES=65536).
    let counts = [0usize, 1, 7, 1000, 70_001];
    let start = Instant::now();
    let (mut checks, mut loose) = (0, 0);
    let kernel_calls = accord::testing::gpu_kernel_calls();
    for (k, &count) in counts.iter().enumerate() {
        // The kernels' own types; the others reach them re-expressed (the conformance suite
        // covers those on device memory).
        for dtype in &DataType::ALL[..10] {
            let dtype = *dtype;
            check_dtype(g, dtype, count, 1000 + k as u64, &mut loose)
                .unwrap_or_else(|e| panic!("rank {}: {dtype} x {count}: {e}", g.rank()));
            checks += 1;
        }
    }
    g.barrier().unwrap();
    let kernel_calls = accord::testing::gpu_kernel_calls() - kernel_calls;
    // Under `auto` NCCL takes some calls: its float sums and products of more than two ranks
    // are held to a rounding bound instead, and products that may overflow or underflow in
    // its order are left out (counted here).
    println!(
        "{test}: rank {} of {}: {checks} dtype x count sets match the host reference in {:.1} s \
         ({kernel_calls} calls on Accord's kernels, bit-identical; the rest on {}; {loose} \
         elements of float products on NCCL not comparable)",
        host.rank(),
        host.size(),
        start.elapsed().as_secs_f64(),
        info.engine
    );
    if kernels_forced() {
        assert_eq!(loose, 0, "every call should have run on the kernels");
    }
}

/// Bulk calls of many rounds whose last round (or a pair of an alltoallv) is shorter, with the
/// ranks set out of step before each batch: every block must keep to the slot bytes its
/// namesakes use, or a fast block overwrites what a slow one is still reading (seen as data of
/// the same slot two rounds later). Run with ACCORD_GPU_CHUNK_BYTES=65536 to keep it short.
#[test]
fn processes_many_rounds_with_short_last_rounds_stay_exact() {
    let test = "processes_many_rounds_with_short_last_rounds_stay_exact";
    let Some(g) = launched_forced(test) else {
        return;
    };
    let chunk: usize = std::env::var("ACCORD_GPU_CHUNK_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 20);
    // Four full rounds and a third of one, per rank and per pair.
    let count = (4 * chunk + chunk / 3) / 4 + 1;
    for i in 0..10u64 {
        // A different rank starts late each time, by up to 3 ms.
        if g.rank() == i as usize % g.size() {
            std::thread::sleep(Duration::from_micros(300 * (i + 1)));
        }
        check_dtype(g, DataType::F32, count, 9000 + i, &mut 0)
            .unwrap_or_else(|e| panic!("rank {}: batch {i}: {e}", g.rank()));
    }
    println!(
        "{test}: rank {}: 10 batches of {count} f32 per rank exact",
        g.rank()
    );
}

/// Arrays of the symmetric heap go zero-copy in the bulk kernels, on every rank (one round, no
/// scratch) or on even ranks only (the others copy through the scratch; each rank reads some
/// peers where they lie and others from its slots), bit for bit like ordinary arrays.
#[test]
fn processes_symmetric_heap_arrays_go_zero_copy_and_match_the_host() {
    let test = "processes_symmetric_heap_arrays_go_zero_copy_and_match_the_host";
    let Some(g) = launched_forced(test) else {
        return;
    };
    let mut buf = g.alloc_symmetric(128 << 20).expect("symmetric heap");
    let dtypes = [DataType::F32, DataType::BF16, DataType::I64, DataType::U8];
    for (k, mode) in ["every rank", "even ranks"].into_iter().enumerate() {
        let mine = k == 0 || g.rank() % 2 == 0;
        let before = accord::testing::gpu_zero_copy_calls();
        let mut expected = 0;
        for (i, dtype) in dtypes.into_iter().enumerate() {
            // Above the packet kernels' 256 KiB, so the bulk kernels run, in several rounds
            // through the scratch with ACCORD_GPU_CHUNK_BYTES=65536.
            let count = 300_000 / dtype.size() + 1;
            let seed = 7000 + 10 * k as u64 + i as u64;
            let run = || check_dtype(g, dtype, count, seed, &mut 0);
            let done = match mine {
                true => {
                    let (r, b) = on_heap(buf, run);
                    buf = b;
                    r
                }
                false => run(),
            };
            done.unwrap_or_else(|e| panic!("rank {}: heap on {mode}: {dtype}: {e}", g.rank()));
            // Per operator: allreduce out of place and in place, reduce_scatter; then
            // allgather, broadcast as the root (out of place and in place), alltoall(v).
            expected += 3 * ops_for(dtype).len() + 5;
        }
        let zero_copy = accord::testing::gpu_zero_copy_calls() - before;
        let want = if mine { expected as u64 } else { 0 };
        assert_eq!(
            zero_copy,
            want,
            "rank {}: heap on {mode}: calls that went zero-copy",
            g.rank()
        );
        println!(
            "{test}: rank {}: heap on {mode}: {zero_copy} calls zero-copy, results bit-identical",
            g.rank()
        );
    }
    buf.free().expect("free the heap buffer");
}

/// A stream of our own, to capture on (the legacy default stream cannot be captured).
fn new_stream() -> CuStream {
    cuda::driver().unwrap().new_stream().unwrap()
}

#[test]
fn processes_graph_capture_replays_with_changing_data() {
    let test = "processes_graph_capture_replays_with_changing_data";
    let Some((_, g)) = launched(test) else {
        return;
    };
    let cu = cuda::driver().unwrap();
    let launch = cu.launch().unwrap();
    let (n, me) = (g.size(), g.rank());
    let count = 3001usize;
    let dtype = DataType::F32;
    let a = up(g, &vec![0; count * 4]);
    let b = up(g, &vec![0; count * 4]);
    let c = up(g, &vec![0; n * count * 4]);
    let stream = new_stream();
    let on = |x: DeviceSlice| (SendBuf::device(x, Stream::Raw(stream as usize)), x);
    // Capture: allreduce a -> b, then allgather b -> c, on our stream.
    // SAFETY: a live stream of the current context; mode 2 (relaxed) lets other threads work.
    cu.check(
        unsafe { (launch.stream_begin_capture)(stream, 2) },
        "cuStreamBeginCapture",
    )
    .unwrap();
    let (sa, _) = on(slice(&a, count, dtype));
    let rb = RecvBuf::device(slice(&b, count, dtype), Stream::Raw(stream as usize));
    let captured = g.all_reduce((sa, rb), ReduceOp::Sum).and_then(|r| r.wait());
    let sb = SendBuf::device(slice(&b, count, dtype), Stream::Raw(stream as usize));
    let rc = RecvBuf::device(slice(&c, n * count, dtype), Stream::Raw(stream as usize));
    let captured = captured.and_then(|_| g.all_gather(sb, rc).and_then(|r| r.wait()));
    let mut graph = std::ptr::null_mut();
    // SAFETY: ends the capture begun above.
    let end = unsafe { (launch.stream_end_capture)(stream, &mut graph) };
    captured.unwrap();
    cu.check(end, "cuStreamEndCapture").unwrap();
    let mut exec = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; the graph just captured.
    cu.check(
        unsafe { (launch.graph_instantiate)(&mut exec, graph, 0) },
        "cuGraphInstantiate",
    )
    .unwrap();
    for round in 0..100u64 {
        let inputs: Vec<Vec<u8>> = (0..n).map(|q| values(dtype, q, round, count)).collect();
        a.copy_from_host(&inputs[me]).unwrap();
        // SAFETY: the instantiated graph on our stream.
        cu.check(
            unsafe { (launch.graph_launch)(exec, stream) },
            "cuGraphLaunch",
        )
        .unwrap();
        // SAFETY: our stream.
        cu.check(
            unsafe { (cu.stream_synchronize)(stream) },
            "cuStreamSynchronize",
        )
        .unwrap();
        let sum = reduced(dtype, ReduceOp::Sum, &inputs);
        same(
            dtype,
            &format!("replay {round} allreduce"),
            &down(&b, count * 4),
            &sum,
        )
        .unwrap_or_else(|e| panic!("rank {me}: {e}"));
        same(
            dtype,
            &format!("replay {round} allgather"),
            &down(&c, n * count * 4),
            &sum.repeat(n),
        )
        .unwrap_or_else(|e| panic!("rank {me}: {e}"));
        // Every rank must have read its inputs before anyone uploads the next ones.
        g.barrier().unwrap();
    }
    // SAFETY: ours, no longer running.
    unsafe {
        (launch.graph_exec_destroy)(exec);
        (launch.graph_destroy)(graph);
        (cu.stream_destroy)(stream);
    }
    // The communicator still works outside the graph.
    let x = up(g, &1.0f32.to_le_bytes().repeat(5));
    wait(
        "allreduce after the graph",
        g.all_reduce(r(slice(&x, 5, dtype)), ReduceOp::Sum),
    )
    .unwrap();
    assert_eq!(down(&x, 20), (n as f32).to_le_bytes().repeat(5));
    println!(
        "{test}: rank {me}: 100 replays of a captured allreduce + allgather with new data matched"
    );
}

#[test]
fn processes_unsupported_calls_say_why() {
    let test = "processes_unsupported_calls_say_why";
    let Some((_, g)) = launched(test) else {
        return;
    };
    let info = g.device_info().unwrap();
    if info.engine != "Accord" {
        println!(
            "{test}: skipping: NCCL runs what the kernels do not ({})",
            info.engine
        );
        return;
    }
    let a = up(g, &[0; 64]);
    let e = g
        .reduce(
            (
                s(slice(&a, 4, DataType::F32)),
                r(slice(&a, 4, DataType::F32)),
            ),
            ReduceOp::Sum,
            0,
        )
        .and_then(|c| c.wait())
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("NCCL"), "{e}");
    // The refusal came before the call took its place: collectives still work.
    let x = up(g, &2i32.to_le_bytes().repeat(3));
    wait(
        "allreduce",
        g.all_reduce(r(slice(&x, 3, DataType::I32)), ReduceOp::BXor),
    )
    .unwrap();
    let want = if g.size() % 2 == 0 { 0i32 } else { 2 };
    assert_eq!(down(&x, 12), want.to_le_bytes().repeat(3));
    println!(
        "{test}: rank {}: reduce refused naming NCCL; bitwise allreduce ran",
        g.rank()
    );
}

#[test]
fn processes_desync_is_named_before_any_output_is_written() {
    let test = "processes_desync_is_named_before_any_output_is_written";
    if std::env::var("ACCORD_GPU_DESYNC_TEST").is_err() {
        println!("{test}: skipping: set ACCORD_GPU_DESYNC_TEST=1 (fails the communicator)");
        return;
    }
    let Some((_, g)) = launched(test) else {
        return;
    };
    let me = g.rank();
    // Rank 0 allgathers 64 f32 while the others allgather 32: the counts differ.
    let count = if me == 0 { 64 } else { 32 };
    let a = up(g, &vec![1; count * 4]);
    let b = up(g, &vec![0x77; g.size() * count * 4]);
    let started = Instant::now();
    let got = g
        .all_gather(
            s(slice(&a, count, DataType::F32)),
            r(slice(&b, g.size() * count, DataType::F32)),
        )
        .and_then(|c| c.wait());
    let e = got.expect_err("a desync must fail");
    assert!(matches!(e, Error::Desync { .. }), "rank {me}: {e}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Nothing was written into the output.
    let out = down(&b, g.size() * count * 4);
    let written: Vec<usize> = (0..out.len()).filter(|&i| out[i] != 0x77).collect();
    assert!(
        written.is_empty(),
        "rank {me}: output written at {} of {} bytes, from byte {:?}: {:02x?}",
        written.len(),
        out.len(),
        written.first(),
        &out[written.first().copied().unwrap_or(0)..][..16.min(out.len())]
    );
    println!(
        "{test}: rank {me}: {e} after {:?}; output untouched",
        started.elapsed()
    );
}

#[test]
fn processes_rank_killed_is_named() {
    let test = "processes_rank_killed_is_named";
    if std::env::var("ACCORD_GPU_KILL_TEST").is_err() {
        println!("{test}: skipping: set ACCORD_GPU_KILL_TEST=1 (ends rank 1)");
        return;
    }
    let Some((_, g)) = launched(test) else {
        return;
    };
    let me = g.rank();
    let x = up(g, &[0; 4096]);
    wait(
        "warm-up",
        g.all_reduce(r(slice(&x, 1024, DataType::F32)), ReduceOp::Sum),
    )
    .unwrap();
    g.barrier().unwrap();
    if me == 1 {
        println!("{test}: rank 1 exits without warning");
        // SAFETY: ends the process at once, as a crash would (exit status 0 keeps the launcher
        // from stopping the others first).
        unsafe { libc::_exit(0) };
    }
    // Two calls: the second is launched after the peer is gone (its kernel waits on the GPU).
    let started = Instant::now();
    let e = g
        .all_reduce(r(slice(&x, 1024, DataType::F32)), ReduceOp::Sum)
        .and_then(|c| c.wait())
        .and_then(|_| g.all_reduce(r(slice(&x, 1024, DataType::F32)), ReduceOp::Sum))
        .and_then(|c| c.wait())
        .expect_err("the peer is gone");
    let took = started.elapsed();
    println!("{test}: rank {me}: {e} after {took:?}");
    assert!(
        matches!(e, Error::PeerLost { rank: 1, .. }),
        "rank {me}: {e}"
    );
    assert!(took < Duration::from_secs(2), "rank {me}: {took:?}");
    // Later calls fail at once.
    assert!(g
        .all_reduce(r(slice(&x, 1024, DataType::F32)), ReduceOp::Sum)
        .is_err());
    // Stay a moment: a survivor that exits now would be the next rank the others see leave.
    std::thread::sleep(Duration::from_secs(2));
}

/// Under `auto`, where the call's arrays lie picks the engine (heap arrays go to the kernels at
/// sizes where ordinary ones go to NCCL): ranks that disagree must get a desync naming it, not
/// a hang. Needs NCCL (one GPU per rank) and ACCORD_GPU_ENGINE=auto.
#[test]
fn processes_desync_when_only_some_ranks_pass_heap_arrays_under_auto() {
    let test = "processes_desync_when_only_some_ranks_pass_heap_arrays_under_auto";
    if std::env::var("ACCORD_GPU_DESYNC_TEST").is_err() {
        println!("{test}: skipping: set ACCORD_GPU_DESYNC_TEST=1 (fails the communicator)");
        return;
    }
    if std::env::var("ACCORD_GPU_ENGINE").as_deref() != Ok("auto") {
        println!("{test}: skipping: needs ACCORD_GPU_ENGINE=auto");
        return;
    }
    let Some((_, g)) = launched(test) else {
        return;
    };
    if g.device_info().is_some_and(|i| i.engine != "NCCL") {
        println!("{test}: skipping: NCCL cannot run here (ranks share a GPU?)");
        return;
    }
    let (me, n) = (g.rank(), g.size());
    // A 64 MiB reduce-scatter: the kernel zero-copy on heap arrays at every world size, NCCL
    // on ordinary ones (blocks above 1 MiB per rank up to 16 ranks).
    let per = (16 << 20) / n;
    let heap = g
        .alloc_symmetric((per * n + per) * 4)
        .expect("symmetric heap");
    let plain_in = up(g, &vec![0; per * n * 4]);
    let plain_out = up(g, &vec![0; per * 4]);
    let (x, y) = match me {
        // SAFETY: the heap buffer holds per * n + per f32 and outlives the call (forgotten
        // below).
        0 => unsafe {
            (
                DeviceSlice::from_raw(heap.ptr(), per * n, DataType::F32),
                DeviceSlice::from_raw(heap.ptr() + (per * n * 4) as u64, per, DataType::F32),
            )
        },
        _ => (
            slice(&plain_in, per * n, DataType::F32),
            slice(&plain_out, per, DataType::F32),
        ),
    };
    let started = Instant::now();
    let e = g
        .reduce_scatter(s(x), r(y), ReduceOp::Sum)
        .and_then(|c| c.wait())
        .expect_err("ranks on different engines must fail");
    let took = started.elapsed();
    println!("{test}: rank {me}: {e} after {took:?}");
    assert!(matches!(e, Error::Desync { .. }), "rank {me}: {e}");
    assert!(e.to_string().contains("symmetric-heap"), "rank {me}: {e}");
    assert!(took < Duration::from_secs(10), "rank {me}: {took:?}");
    // The device communicator failed; its memory goes with the process.
    std::mem::forget(heap);
}
