//! GPU collectives through NCCL. Without CUDA, a GPU or NCCL every test prints why and passes.
//!
//! - `threads_*`: ranks are threads of this process, one GPU each (needs 2+ GPUs).
//! - `sigkill_*`: this binary re-executes itself as two ranks, one GPU each (needs 2+ GPUs).
//! - `processes_*`: run under the launcher, one process per GPU:
//!   `accord run -n 2 <this test binary> --test-threads 1 --nocapture processes_`
//!   (`ACCORD_GPU_KILL_TEST=1` adds the killed-rank test, `ACCORD_GPU_DESYNC_TEST=1` the desync
//!   test, `ACCORD_GPU_JOIN_TEST=1` the rank that never joins NCCL, `ACCORD_GPU_ABORT_TEST=1`
//!   the world abort that reaches an idle GPU communicator (one GPU is enough: each rank's GPU
//!   communicator is its own); they end the job deliberately, so run them separately).

use accord::auth::Token;
use accord::gpu::{self, DeviceBuffer, Stream};
use accord::rendezvous::StoreServer;
use accord::transport::{inproc::InProcess, Transport};
use accord::{Communicator, Completion, Element, Error, Parts, RecvBuf, ReduceOp, SendBuf};
use half::{bf16, f16};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn skip(test: &str) -> bool {
    if let Some(why) = gpu::unavailable_reason() {
        println!("{test}: skipping: {why}");
        return true;
    }
    false
}

fn device_count() -> usize {
    gpu::cuda::driver()
        .and_then(|d| d.device_count())
        .unwrap_or(0)
}

trait Num: Element + PartialEq + std::fmt::Debug {
    const FLOAT: bool;
    fn of(v: i64) -> Self;
}
macro_rules! ints {
    ($($t:ty),*) => {$( impl Num for $t { const FLOAT: bool = false; fn of(v: i64) -> Self { v as $t } } )*};
}
ints!(i32, i64, u8);
impl Num for f32 {
    const FLOAT: bool = true;
    fn of(v: i64) -> Self {
        v as f32
    }
}
impl Num for f64 {
    const FLOAT: bool = true;
    fn of(v: i64) -> Self {
        v as f64
    }
}
impl Num for f16 {
    const FLOAT: bool = true;
    fn of(v: i64) -> Self {
        f16::from_f32(v as f32)
    }
}
impl Num for bf16 {
    const FLOAT: bool = true;
    fn of(v: i64) -> Self {
        bf16::from_f32(v as f32)
    }
}

/// Rank r's value at index i: small integers, exact in every type (sums stay under 256).
fn val<T: Num>(r: usize, i: usize) -> T {
    T::of(((r + 1) * (i % 7 + 1)) as i64)
}

fn expect<T: Num>(what: &str, got: &[T], want: impl Fn(usize) -> T) -> Result<(), String> {
    for (i, g) in got.iter().enumerate() {
        let w = want(i);
        if *g != w {
            return Err(format!(
                "{what} ({}): element {i} is {g:?}, expected {w:?}",
                T::DTYPE
            ));
        }
    }
    Ok(())
}

fn e2s(e: Error) -> String {
    e.to_string()
}

thread_local! {
    /// Set where ranks are threads of one process: see [`sync`].
    static LOCKSTEP: std::cell::RefCell<Option<Communicator>> = const { std::cell::RefCell::new(None) };
}

/// Where several GPUs are driven by threads of one process, a thread that allocates or frees
/// device memory while another's NCCL kernel waits for it can deadlock (peer mappings make
/// cuMemAlloc/cuMemFree wait for the other device). Such tests meet on a host barrier before
/// each launch, so no rank allocates while a peer's kernel waits for it.
fn sync() {
    LOCKSTEP.with(|l| {
        if let Some(h) = l.borrow().as_ref() {
            h.barrier().expect("host barrier");
        }
    });
}

/// The communicator of one GPU per process over `host` (collective over `host`).
fn gpu_comm(host: &Communicator, dev: usize) -> accord::Result<Communicator> {
    Ok(host.attach_devices(&[dev])?.remove(0))
}

/// `b` as an operation's input, read on `stream`.
fn src<T: Element>(b: &DeviceBuffer<T>, stream: Stream) -> SendBuf<'static> {
    SendBuf::device(b.slice(), stream)
}

/// `b` as an operation's output (or input and output), written on `stream`.
fn dst<T: Element>(b: &DeviceBuffer<T>, stream: Stream) -> RecvBuf<'static> {
    RecvBuf::device(b.slice(), stream)
}

/// Launch and wait for an operation, naming it in the error.
fn done(what: &str, f: impl FnOnce() -> accord::Result<Completion>) -> Result<(), String> {
    sync();
    f().and_then(|r| r.wait())
        .map_err(|e| format!("{what}: {e}"))
}

/// Every primitive for one element type at one per-rank count.
fn check_type<T: Num>(g: &Communicator, count: usize, stream: Stream) -> Result<(), String> {
    check_type_inner::<T>(g, count, stream)
        .map_err(|e| format!("{} x {count} on {stream:?}: {e}", T::DTYPE))
}

fn check_type_inner<T: Num>(g: &Communicator, count: usize, stream: Stream) -> Result<(), String> {
    let n = g.size();
    let me = g.rank();
    let up = |v: &[T]| g.device_copy(v).map_err(e2s);
    let zeros = |len: usize| up(&vec![T::of(0); len]);
    let mine: Vec<T> = (0..count).map(|i| val(me, i)).collect();
    let send = up(&mine)?;
    let tri = (n * (n + 1) / 2) as i64;

    // allreduce: sum, max, in place, avg for floats.
    let recv = zeros(count)?;
    done("all_reduce", || {
        g.all_reduce((src(&send, stream), dst(&recv, stream)), ReduceOp::Sum)
    })?;
    expect("allreduce sum", &recv.to_host().map_err(e2s)?, |i| {
        T::of(tri * (i % 7 + 1) as i64)
    })?;
    done("all_reduce", || {
        g.all_reduce((src(&send, stream), dst(&recv, stream)), ReduceOp::Max)
    })?;
    expect("allreduce max", &recv.to_host().map_err(e2s)?, |i| {
        val(n - 1, i)
    })?;
    let inplace = up(&mine)?;
    done("all_reduce", || {
        g.all_reduce(dst(&inplace, stream), ReduceOp::Min)
    })?;
    expect(
        "allreduce min in place",
        &inplace.to_host().map_err(e2s)?,
        |i| val(0, i),
    )?;
    if T::FLOAT {
        // Every rank contributes (n+1)/2 * k * 2 / (n+1)... use equal values so avg is exact.
        let same = up(&(0..count)
            .map(|i| T::of((i % 7) as i64 * 2))
            .collect::<Vec<_>>())?;
        done("all_reduce", || {
            g.all_reduce((src(&same, stream), dst(&recv, stream)), ReduceOp::Avg)
        })?;
        expect("allreduce avg", &recv.to_host().map_err(e2s)?, |i| {
            T::of((i % 7) as i64 * 2)
        })?;
    }

    // broadcast from the last rank.
    let root = n - 1;
    let b = if me == root {
        up(&mine)?
    } else {
        zeros(count)?
    };
    done("broadcast", || g.broadcast(dst(&b, stream), root))?;
    expect("broadcast", &b.to_host().map_err(e2s)?, |i| val(root, i))?;

    // reduce to rank 0.
    let r0 = zeros(count)?;
    done("reduce", || {
        g.reduce((src(&send, stream), dst(&r0, stream)), ReduceOp::Sum, 0)
    })?;
    if me == 0 {
        expect("reduce", &r0.to_host().map_err(e2s)?, |i| {
            T::of(tri * (i % 7 + 1) as i64)
        })?;
    }

    // allgather / allgatherv (uneven counts: count + r).
    let ag = zeros(count * n)?;
    done("all_gather", || {
        g.all_gather(src(&send, stream), dst(&ag, stream))
    })?;
    expect("allgather", &ag.to_host().map_err(e2s)?, |j| {
        val(j / count, j % count)
    })?;
    let counts: Vec<usize> = (0..n).map(|r| count + r).collect();
    let offs: Vec<usize> = counts
        .iter()
        .scan(0, |acc, c| {
            let o = *acc;
            *acc += c;
            Some(o)
        })
        .collect();
    let total: usize = counts.iter().sum();
    let owner = |j: usize| (0..n).rev().find(|&r| offs[r] <= j).unwrap();
    let mine_v = up(&(0..counts[me]).map(|i| val(me, i)).collect::<Vec<_>>())?;
    let agv = zeros(total)?;
    done("all_gather_v", || {
        g.all_gather(src(&mine_v, stream), Parts::new(dst(&agv, stream), &counts))
    })?;
    expect("allgatherv", &agv.to_host().map_err(e2s)?, |j| {
        let r = owner(j);
        val(r, j - offs[r])
    })?;

    // gather / gatherv to rank 1 % n.
    let groot = 1 % n;
    let gb = zeros(if me == groot { count * n } else { 0 })?;
    done("gather", || {
        g.gather(src(&send, stream), dst(&gb, stream), groot)
    })?;
    if me == groot {
        expect("gather", &gb.to_host().map_err(e2s)?, |j| {
            val(j / count, j % count)
        })?;
    }
    let gv = zeros(if me == groot { total } else { 0 })?;
    done("gather_v", || {
        g.gather(
            src(&mine_v, stream),
            Parts::new(dst(&gv, stream), &counts),
            groot,
        )
    })?;
    if me == groot {
        expect("gatherv", &gv.to_host().map_err(e2s)?, |j| {
            let r = owner(j);
            val(r, j - offs[r])
        })?;
    }

    // scatter / scatterv from rank 0.
    let all: Vec<T> = (0..count * n).map(|j| val(j / count, j % count)).collect();
    let sc_src = if me == 0 { up(&all)? } else { zeros(0)? };
    let sc = zeros(count)?;
    done("scatter", || {
        g.scatter(src(&sc_src, stream), dst(&sc, stream), 0)
    })?;
    expect("scatter", &sc.to_host().map_err(e2s)?, |i| val(me, i))?;
    let allv: Vec<T> = (0..total)
        .map(|j| {
            let r = owner(j);
            val(r, j - offs[r])
        })
        .collect();
    let scv_src = if me == 0 { up(&allv)? } else { zeros(0)? };
    let scv = zeros(counts[me])?;
    done("scatter_v", || {
        g.scatter(
            Parts::new(src(&scv_src, stream), &counts),
            dst(&scv, stream),
            0,
        )
    })?;
    expect("scatterv", &scv.to_host().map_err(e2s)?, |i| val(me, i))?;

    // reduce_scatter / reduce_scatterv.
    let rs_send = up(&(0..count * n).map(|j| val(me, j)).collect::<Vec<_>>())?;
    let rs = zeros(count)?;
    done("reduce_scatter", || {
        g.reduce_scatter(src(&rs_send, stream), dst(&rs, stream), ReduceOp::Sum)
    })?;
    expect("reduce_scatter", &rs.to_host().map_err(e2s)?, |i| {
        T::of(tri * ((me * count + i) % 7 + 1) as i64)
    })?;
    let rsv_send = up(&(0..total).map(|j| val(me, j)).collect::<Vec<_>>())?;
    let rsv = zeros(counts[me])?;
    done("reduce_scatter_v", || {
        g.reduce_scatter(
            Parts::new(src(&rsv_send, stream), &counts),
            dst(&rsv, stream),
            ReduceOp::Sum,
        )
    })?;
    expect("reduce_scatterv", &rsv.to_host().map_err(e2s)?, |i| {
        T::of(tri * ((offs[me] + i) % 7 + 1) as i64)
    })?;

    // alltoall / alltoallv: rank s sends rank d the block (s*3 + d + i) % 100.
    let a2a = |s: usize, d: usize, i: usize| T::of(((s * 3 + d + i) % 100) as i64);
    let at_send = up(&(0..count * n)
        .map(|j| a2a(me, j / count, j % count))
        .collect::<Vec<_>>())?;
    let at = zeros(count * n)?;
    done("all_to_all", || {
        g.all_to_all(src(&at_send, stream), dst(&at, stream))
    })?;
    expect("alltoall", &at.to_host().map_err(e2s)?, |j| {
        a2a(j / count, me, j % count)
    })?;
    // rank s sends rank d count + s + d elements.
    let sc_: Vec<usize> = (0..n).map(|d| count + me + d).collect();
    let rc_: Vec<usize> = (0..n).map(|s| count + s + me).collect();
    let mut sendv = Vec::new();
    for (d, &c) in sc_.iter().enumerate() {
        sendv.extend((0..c).map(|i| a2a(me, d, i)));
    }
    let mut wantv = Vec::new();
    for (s, &c) in rc_.iter().enumerate() {
        wantv.extend((0..c).map(|i| a2a(s, me, i)));
    }
    let atv_send = up(&sendv)?;
    let atv = zeros(wantv.len())?;
    done("all_to_all_v", || {
        g.all_to_all(
            Parts::new(src(&atv_send, stream), &sc_),
            Parts::new(dst(&atv, stream), &rc_),
        )
    })?;
    expect("alltoallv", &atv.to_host().map_err(e2s)?, |j| wantv[j])?;

    // send/recv around a ring, then as separate calls between ranks 0 and 1.
    let ring = zeros(count)?;
    done("sendrecv", || {
        g.sendrecv(
            src(&send, stream),
            (me + 1) % n,
            dst(&ring, stream),
            (me + n - 1) % n,
            0,
        )
    })?;
    expect("sendrecv", &ring.to_host().map_err(e2s)?, |i| {
        val((me + n - 1) % n, i)
    })?;
    let p = zeros(count)?;
    sync();
    if n >= 2 && me < 2 {
        let req = if me == 0 {
            g.send(src(&send, stream), 1, 0)
        } else {
            g.recv(dst(&p, stream), 0, 0)
        };
        req.and_then(|r| r.wait()).map_err(e2s)?;
        if me == 1 {
            expect("send/recv", &p.to_host().map_err(e2s)?, |i| val(0, i))?;
        }
    }

    sync();
    g.barrier().map_err(|e| format!("barrier: {e}"))?;
    Ok(())
}

/// Every primitive, every dtype, uneven and odd counts; then errors for unsupported ops.
fn check_all(g: &Communicator) -> Result<usize, String> {
    let own = gpu::cuda::driver()
        .and_then(|d| d.new_stream())
        .map_err(e2s)? as usize;
    let mut checks = 0;
    for (k, count) in [1usize, 7, 1000, 65537].into_iter().enumerate() {
        let stream = if k % 2 == 0 {
            Stream::Comm
        } else {
            Stream::Raw(own)
        };
        check_type::<f32>(g, count, stream)?;
        check_type::<f64>(g, count, stream)?;
        check_type::<i32>(g, count, stream)?;
        check_type::<i64>(g, count, stream)?;
        check_type::<u8>(g, count, stream)?;
        check_type::<f16>(g, count, stream)?;
        check_type::<bf16>(g, count, stream)?;
        checks += 7;
    }
    // NCCL has no bitwise operators: Accord's own kernels run them where they are on (one
    // host, ACCORD_GPU_ENGINE not nccl); otherwise the call is refused, saying why.
    let mine = [6i32, 5, 3, -1];
    let b = g.device_copy(&mine).map_err(e2s)?;
    match g
        .all_reduce(dst(&b, Stream::Comm), ReduceOp::BXor)
        .and_then(|c| c.wait())
    {
        Ok(()) => {
            let odd = g.size() % 2 == 1;
            expect("bxor", &b.to_host().map_err(e2s)?, |i| {
                if odd {
                    mine[i]
                } else {
                    0
                }
            })?;
        }
        Err(Error::Unsupported(m)) if m.contains("bitwise") => {}
        other => return Err(format!("bxor on GPU: got {other:?}")),
    }
    // A usage error is reported and leaves the communicator usable.
    let small = g.device_alloc::<f32>(1).map_err(e2s)?;
    let big = g.device_alloc::<f32>(8).map_err(e2s)?;
    if g.all_reduce(
        (src(&big, Stream::Comm), dst(&small, Stream::Comm)),
        ReduceOp::Sum,
    )
    .is_ok()
    {
        return Err("a too-small receive buffer was accepted".into());
    }
    // Its ranks are GPUs: host buffers are refused, naming why, and it stays usable.
    match g.all_reduce(&mut [1.0f32; 4][..], ReduceOp::Sum) {
        Err(Error::InvalidArgument(m)) if m.contains("device buffers only") => {}
        other => return Err(format!("host buffers on a GPU communicator: got {other:?}")),
    }
    g.barrier().map_err(|e| format!("barrier: {e}"))?;
    g.synchronize().map_err(e2s)?;
    Ok(checks)
}

/// Split into even/odd ranks and check an allreduce in each; also two communicators at once.
fn check_split_and_two_comms(host: &Communicator, g: &Communicator) -> Result<(), String> {
    let n = g.size();
    let me = g.rank();
    sync();
    let sub = g
        .split(Some((me % 2) as u32), me as i64)
        .map_err(e2s)?
        .ok_or("split returned no communicator")?;
    let members: Vec<usize> = (0..n).filter(|r| r % 2 == me % 2).collect();
    if sub.size() != members.len() {
        return Err(format!("split size {} != {}", sub.size(), members.len()));
    }
    let v = sub.device_copy(&[me as f32 + 1.0; 33]).map_err(e2s)?;
    sync();
    sub.all_reduce(dst(&v, Stream::Comm), ReduceOp::Sum)
        .and_then(|r| r.wait())
        .map_err(e2s)?;
    let want: f32 = members.iter().map(|r| *r as f32 + 1.0).sum();
    expect("split allreduce", &v.to_host().map_err(e2s)?, |_| want)?;

    let second = gpu_comm(host, g.attached_device().unwrap()).map_err(e2s)?;
    let a = g.device_copy(&[1i32; 100]).map_err(e2s)?;
    let b = second.device_copy(&[2i32; 100]).map_err(e2s)?;
    sync();
    let ra = g
        .all_reduce(dst(&a, Stream::Comm), ReduceOp::Sum)
        .map_err(e2s)?;
    let rb = second
        .all_reduce(dst(&b, Stream::Comm), ReduceOp::Sum)
        .map_err(e2s)?;
    ra.wait().map_err(e2s)?;
    rb.wait().map_err(e2s)?;
    expect("first comm", &a.to_host().map_err(e2s)?, |_| n as i32)?;
    expect("second comm", &b.to_host().map_err(e2s)?, |_| 2 * n as i32)?;
    Ok(())
}

#[test]
fn threads_every_primitive() {
    if skip("threads_every_primitive") {
        return;
    }
    let ndev = device_count();
    if ndev < 2 {
        println!("threads_every_primitive: skipping: needs 2 GPUs, found {ndev}");
        return;
    }
    let world = ndev.min(4);
    let results = accord::testing::run_world(world, |host| {
        LOCKSTEP.with(|l| *l.borrow_mut() = Some(host.clone()));
        let g = gpu_comm(&host, host.rank()).map_err(e2s)?;
        let checks = check_all(&g)?;
        check_split_and_two_comms(&host, &g)?;
        Ok::<_, String>(checks)
    });
    for (r, res) in results.iter().enumerate() {
        match res {
            Ok(c) => println!("threads_every_primitive: rank {r}: {c} dtype x size checks passed"),
            Err(e) => panic!("rank {r}: {e}"),
        }
    }
}

/// One grouped allreduce of `rank + 1` over `comms` (this process's GPUs of one communicator),
/// checked on every device.
fn grouped_allreduce_agrees(comms: &[&Communicator], len: usize) {
    let bufs: Vec<_> = comms
        .iter()
        .map(|c| c.device_copy(&vec![c.rank() as f32 + 1.0; len]).unwrap())
        .collect();
    let reqs = gpu::group(|| {
        comms
            .iter()
            .zip(&bufs)
            .map(|(c, b)| c.all_reduce(dst(b, Stream::Comm), ReduceOp::Sum))
            .collect::<accord::Result<Vec<_>>>()
    })
    .unwrap();
    for r in reqs {
        r.wait().unwrap();
    }
    let want: f32 = (1..=comms[0].size()).map(|v| v as f32).sum();
    for b in &bufs {
        assert!(b.to_host().unwrap().iter().all(|v| *v == want));
    }
}

#[test]
fn threads_several_gpus_per_process() {
    if skip("threads_several_gpus_per_process") {
        return;
    }
    let ndev = device_count();
    if ndev < 2 {
        println!("threads_several_gpus_per_process: skipping: needs 2 GPUs, found {ndev}");
        return;
    }
    let devices: Vec<usize> = (0..ndev.min(4)).collect();
    accord::testing::run_world(1, |host| {
        let comms = host.attach_devices(&devices).unwrap();
        assert_eq!(comms.len(), devices.len());
        grouped_allreduce_agrees(&comms.iter().collect::<Vec<_>>(), 4099);
        // Split all of them at once: one child with the ranks reversed (key = -rank), and with
        // the last device opting out.
        let k = devices.len();
        let how: Vec<(Option<u32>, i64)> = (0..k)
            .map(|i| {
                (
                    if i + 1 < k || k == 2 { Some(0) } else { None },
                    -(i as i64),
                )
            })
            .collect();
        let kids = Communicator::split_devices(&comms, &how).unwrap();
        let members = how.iter().filter(|h| h.0.is_some()).count();
        grouped_allreduce_agrees(&kids.iter().flatten().collect::<Vec<_>>(), 33);
        for (i, kid) in kids.iter().enumerate() {
            match (kid, how[i].0) {
                (Some(c), Some(_)) => {
                    assert_eq!(c.size(), members);
                    assert_eq!(c.rank(), members - 1 - i, "key -rank reverses the order");
                }
                (None, None) => {}
                _ => panic!("device {i}: split result does not match its color"),
            }
        }
        assert!(
            comms[0].split(Some(0), 0).is_err(),
            "split of one of several GPUs"
        );
        println!(
            "threads_several_gpus_per_process: {k} GPUs in one process agree; split_group into \
             {members} reversed ranks agrees"
        );
    });
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

fn local_device(host: &Communicator) -> usize {
    let local: usize = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(host.rank());
    local % device_count().max(1)
}

#[test]
fn processes_every_primitive() {
    let Some(host) = launched("processes_every_primitive") else {
        return;
    };
    let g = gpu_comm(&host, local_device(&host)).unwrap();
    let (v, path) = g.device_info().expect("a device engine").version;
    let checks = check_all(&g).unwrap_or_else(|e| panic!("rank {}: {e}", g.rank()));
    check_split_and_two_comms(&host, &g).unwrap_or_else(|e| panic!("rank {}: {e}", g.rank()));
    println!(
        "processes_every_primitive: rank {} of {} on GPU {}: {checks} dtype x size checks, split \
         and two communicators passed (NCCL {v} from {path})",
        g.rank(),
        g.size(),
        g.attached_device().unwrap()
    );
}

#[test]
fn processes_rank_killed() {
    if std::env::var("ACCORD_GPU_KILL_TEST").is_err() {
        println!("processes_rank_killed: skipping: set ACCORD_GPU_KILL_TEST=1 (ends rank 1)");
        return;
    }
    let Some(host) = launched("processes_rank_killed") else {
        return;
    };
    let g = gpu_comm(&host, local_device(&host)).unwrap();
    g.set_timeout(Duration::from_secs(5));
    let b = g.device_copy(&vec![1.0f32; 1 << 16]).unwrap();
    for _ in 0..10 {
        g.all_reduce(dst(&b, Stream::Comm), ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
    }
    host.barrier().unwrap();
    if g.rank() == 1 {
        println!("processes_rank_killed: rank 1 exits without warning");
        // SAFETY: ends the process at once, as a crash would (exit status 0 keeps the launcher
        // from stopping the others first).
        unsafe { libc::_exit(0) };
    }
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let r = g
        .all_reduce(dst(&b, Stream::Comm), ReduceOp::Sum)
        .and_then(|r| r.wait());
    let took = start.elapsed();
    let e = r.expect_err("an allreduce with a dead peer succeeded");
    println!(
        "processes_rank_killed: rank {} failed after {took:.2?}: {e}",
        g.rank()
    );
    // The host communicator saw rank 1's connection close while the GPU communicator was idle.
    assert!(
        matches!(e, Error::PeerLost { rank: 1, .. }),
        "expected rank 1 named as lost, got {e}"
    );
    assert!(took < Duration::from_secs(2), "took {took:?}");
    // Later calls fail at once with the same error.
    let again = g.all_reduce(dst(&b, Stream::Comm), ReduceOp::Sum);
    assert!(again.is_err());
}

/// A world abort by one rank reaches another rank's idle GPU communicator: its next call fails
/// within [`DEATH_NAMED_WITHIN`] naming the rank that gave up, whatever the timeout. Each rank's
/// GPU communicator spans only itself (over a host group of one), so this runs on one GPU.
#[test]
fn processes_world_abort_reaches_an_idle_gpu_communicator() {
    let test = "processes_world_abort_reaches_an_idle_gpu_communicator";
    if std::env::var("ACCORD_GPU_ABORT_TEST").is_err() {
        println!("{test}: skipping: set ACCORD_GPU_ABORT_TEST=1 (aborts the world)");
        return;
    }
    let Some(host) = launched(test) else {
        return;
    };
    if host.size() < 2 {
        println!("{test}: skipping: needs 2 ranks (accord run -n 2)");
        return;
    }
    host.set_timeout(Duration::from_secs(120));
    let alone = host
        .split(Some(host.rank() as u32), 0)
        .unwrap()
        .expect("a group of one");
    let g = gpu_comm(&alone, local_device(&host)).unwrap();
    g.set_timeout(Duration::from_secs(120));
    let b = g.device_copy(&vec![1.0f32; 1024]).unwrap();
    g.all_reduce(dst(&b, Stream::Comm), ReduceOp::Sum)
        .and_then(|r| r.wait())
        .unwrap();
    host.barrier().unwrap();
    if host.rank() == 1 {
        host.abort("rank 1 stops the job");
        println!("{test}: rank 1 aborted the world");
        return;
    }
    let start = Instant::now();
    while g.poisoned().is_none() && start.elapsed() < DEATH_NAMED_WITHIN {
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = start.elapsed();
    let e = g
        .all_reduce(dst(&b, Stream::Comm), ReduceOp::Sum)
        .expect_err("a GPU call after a world abort succeeded");
    println!("{test}: rank 0 after {took:.2?}: {e}");
    assert!(
        matches!(&e, Error::Aborted { reason } if reason.contains("rank 1 gave up")),
        "expected the abort by rank 1, got {e}"
    );
    assert!(took < DEATH_NAMED_WITHIN, "took {took:?}");
}

/// What a GPU communicator's watchdog asks the host communicator (no GPU needed): a member whose
/// process ended is named at once, with no host call in flight; a rank outside the members
/// given is not anyone's concern; a world abort concerns everyone.
#[test]
fn host_names_a_lost_member_without_any_call_in_flight() {
    let transports = InProcess::world(3);
    let comms: Vec<Communicator> = transports
        .iter()
        .map(|t| Communicator::new(t.clone() as Arc<dyn Transport>))
        .collect();
    assert_eq!(comms[0].members_failure(&[0, 1, 2]), None);
    transports[2].kill();
    match comms[0].members_failure(&[0, 1, 2]) {
        Some(Error::PeerLost { rank: 2, cause }) => assert!(cause.contains("killed"), "{cause}"),
        other => panic!("expected rank 2 lost, got {other:?}"),
    }
    assert_eq!(comms[0].members_failure(&[0, 1]), None);
    comms[1].abort("giving up");
    match comms[0].members_failure(&[0]) {
        Some(Error::Aborted { reason }) => assert!(reason.contains("rank 1"), "{reason}"),
        other => panic!("expected the abort by rank 1, got {other:?}"),
    }
}

/// The bound on finding a dead rank, whatever `ACCORD_TIMEOUT` is (the ranks use 120 s).
const DEATH_NAMED_WITHIN: Duration = Duration::from_secs(2);

/// A rank SIGKILLed while its peer is inside an allreduce with it: the survivor's pending
/// allreduce fails within [`DEATH_NAMED_WITHIN`] naming the dead rank (the host communicator's
/// connection to it closes at once), and so do the next call of a second GPU communicator that
/// was idle, and later calls. This binary re-executes itself as the two ranks
/// ([`sigkill_rank_main`]) with a store of its own, so no launcher stops the survivor first.
/// Needs 2 GPUs: `cargo test --release -p accord --test gpu_collectives -- --nocapture sigkill_`.
/// `ACCORD_SOAK=<n>` repeats it n times.
#[test]
fn sigkill_mid_allreduce_is_named_within_two_seconds() {
    let test = "sigkill_mid_allreduce_is_named_within_two_seconds";
    if std::env::var("ACCORD_GPU_SIGKILL_RANK").is_ok() || skip(test) {
        return;
    }
    if device_count() < 2 {
        println!("{test}: skipping: needs 2 GPUs, found {}", device_count());
        return;
    }
    if std::env::var("ACCORD_RANK").is_ok() {
        println!("{test}: skipping: starts its own ranks; run it without `accord run`");
        return;
    }
    let reps: usize = accord::testing::soak();
    for rep in 0..reps {
        let server = StoreServer::bind("127.0.0.1:0", Token::new("gpu-sigkill")).unwrap();
        let exe = std::env::current_exe().unwrap();
        let mut children: Vec<_> = (0..2)
            .map(|r| {
                Command::new(&exe)
                    .args(["sigkill_rank_main", "--exact", "--nocapture"])
                    .args(["--test-threads=1"])
                    .env("ACCORD_GPU_SIGKILL_RANK", "1")
                    .env("ACCORD_RANK", r.to_string())
                    .env("ACCORD_WORLD_SIZE", "2")
                    .env("LOCAL_RANK", r.to_string())
                    .env("ACCORD_STORE", server.addr().to_string())
                    .env("ACCORD_STORE_EXTERNAL", "1")
                    .env("ACCORD_TOKEN", "gpu-sigkill")
                    .env("ACCORD_TIMEOUT", "120")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .unwrap()
            })
            .collect();
        // Bounded: a survivor still running after the limit is killed and fails the test.
        let limit = Instant::now() + Duration::from_secs(90);
        let mut outcomes = Vec::new();
        for c in &mut children {
            while c.try_wait().unwrap().is_none() && Instant::now() < limit {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
        }
        for c in children {
            let out = c.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            outcomes.push((out.status, text));
        }
        let (survivor, victim) = (&outcomes[0], &outcomes[1]);
        assert_eq!(
            victim.0.signal(),
            Some(libc::SIGKILL),
            "rank 1 should have died of SIGKILL: {:?}\n{}",
            victim.0,
            victim.1
        );
        assert!(
            survivor.0.success() && survivor.1.contains("SURVIVOR-OK"),
            "rank 0 ({:?}):\n{}",
            survivor.0,
            survivor.1
        );
        for line in survivor.1.lines().filter(|l| l.contains("SURVIVOR")) {
            println!("{test}: run {rep}: {line}");
        }
    }
}

/// One rank of [`sigkill_mid_allreduce_is_named_within_two_seconds`] (does nothing unless that
/// test started it).
#[test]
fn sigkill_rank_main() {
    if std::env::var("ACCORD_GPU_SIGKILL_RANK").is_err() {
        return;
    }
    let host = accord::init().expect("host communicator");
    let dev = local_device(&host);
    let g = gpu_comm(&host, dev).unwrap();
    let idle = gpu_comm(&host, dev).unwrap();
    assert!(g.timeout() >= Duration::from_secs(60), "{:?}", g.timeout());
    let b = g.device_copy(&vec![1.0f32; 1 << 20]).unwrap();
    let c = idle.device_copy(&vec![1.0f32; 1024]).unwrap();
    for (comm, buf) in [(&g, &b), (&idle, &c)] {
        for _ in 0..3 {
            comm.all_reduce(dst(buf, Stream::Comm), ReduceOp::Max)
                .and_then(|r| r.wait())
                .unwrap();
        }
    }
    if host.rank() == 1 {
        host.barrier().unwrap();
        // SAFETY: kill(2) on this process: it dies at once, as under the OOM killer.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        std::thread::sleep(Duration::from_secs(60));
        unreachable!("survived SIGKILL");
    }
    // Rank 1 never enters this allreduce: it dies while rank 0's kernel waits for it.
    let pending = g.all_reduce(dst(&b, Stream::Comm), ReduceOp::Sum).unwrap();
    host.barrier().unwrap();
    let start = Instant::now();
    let e = pending
        .wait()
        .expect_err("an allreduce with a killed peer succeeded");
    let took = start.elapsed();
    let named = |what: &str, e: &Error| {
        assert!(
            matches!(e, Error::PeerLost { rank: 1, .. }) && e.to_string().contains("rank 1"),
            "{what}: expected rank 1 named as lost, got {e}"
        );
    };
    named("pending allreduce", &e);
    assert!(
        took < DEATH_NAMED_WITHIN,
        "pending allreduce: took {took:?}"
    );
    // The idle communicator heard of it too: its next call fails at once, naming rank 1.
    while idle.poisoned().is_none() && start.elapsed() < DEATH_NAMED_WITHIN {
        std::thread::sleep(Duration::from_millis(5));
    }
    let t = Instant::now();
    let idle_err = idle
        .all_reduce(dst(&c, Stream::Comm), ReduceOp::Sum)
        .expect_err("a call on the idle communicator succeeded");
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    named("idle communicator", &idle_err);
    let again = g
        .all_reduce(dst(&b, Stream::Comm), ReduceOp::Sum)
        .expect_err("a later call succeeded");
    named("later call", &again);
    println!("SURVIVOR-OK pending allreduce failed after {took:.2?}: {e}; idle: {idle_err}");
}

#[test]
fn processes_rank_never_joins_nccl() {
    if std::env::var("ACCORD_GPU_JOIN_TEST").is_err() {
        println!("processes_rank_never_joins_nccl: skipping: set ACCORD_GPU_JOIN_TEST=1");
        return;
    }
    let Some(host) = launched("processes_rank_never_joins_nccl") else {
        return;
    };
    host.set_timeout(Duration::from_secs(5));
    let last = host.size() - 1;
    let dev = local_device(&host);
    let expect_timeout = |what: &str, e: Error, start: Instant| {
        let took = start.elapsed();
        println!(
            "processes_rank_never_joins_nccl: {what}: rank {} after {took:.2?}: {e}",
            host.rank()
        );
        assert!(
            matches!(&e, Error::Timeout { waiting_for, .. } if waiting_for == &vec![last]),
            "{what}: expected a timeout naming rank {last}, got {e}"
        );
        assert!(
            took < Duration::from_secs(9),
            "{what}: took {took:?} with a 5 s timeout"
        );
    };

    // 1. Initialisation: the last rank knows the id but never calls NCCL.
    let mut uid = if host.rank() == 0 {
        gpu::unique_id().unwrap()
    } else {
        gpu::nccl::NcclUniqueId { internal: [0; 128] }
    };
    host.broadcast(&mut uid.internal, 0).unwrap();
    if host.rank() == last {
        std::thread::sleep(Duration::from_secs(7));
    } else {
        let start = Instant::now();
        let e = host
            .attach_devices_with_id(&uid, &[dev])
            .expect_err("NCCL init completed without the last rank");
        expect_timeout("init", e, start);
    }

    // 2. Split: everyone has a communicator; the last rank never calls split.
    let g = gpu_comm(&host, dev).unwrap();
    if host.rank() == last {
        std::thread::sleep(Duration::from_secs(7));
    } else {
        let start = Instant::now();
        let e = g
            .split(Some(0), 0)
            .expect_err("split completed without the last rank");
        expect_timeout("split", e, start);
    }
    // The peers' communicators are in different states: leave them to process exit.
    std::mem::forget(g);
}

#[test]
fn processes_desync_detected() {
    if std::env::var("ACCORD_GPU_DESYNC_TEST").is_err() {
        println!("processes_desync_detected: skipping: set ACCORD_GPU_DESYNC_TEST=1");
        return;
    }
    let Some(host) = launched("processes_desync_detected") else {
        return;
    };
    let g = gpu_comm(&host, local_device(&host)).unwrap();
    g.set_timeout(Duration::from_secs(20));
    let b = g.device_copy(&vec![1.0f32; 1024]).unwrap();
    g.all_reduce(dst(&b, Stream::Comm), ReduceOp::Sum)
        .unwrap()
        .wait()
        .unwrap();
    let start = Instant::now();
    // Rank 0 broadcasts 1024 elements, the others reduce 1000: a programming error.
    let r = if g.rank() == 0 {
        g.broadcast(dst(&b, Stream::Comm), 0)
    } else {
        g.all_reduce(b.slice().sub(0, 1000).unwrap(), ReduceOp::Sum)
    }
    .and_then(|r| r.wait());
    // NCCL may finish mismatched calls with garbage instead of hanging: then the watchdog's
    // cadence (about a second) still reports the desync.
    let e = match r {
        Err(e) => e,
        Ok(()) => {
            std::thread::sleep(Duration::from_secs(4));
            g.poisoned().expect("mismatched calls went unnoticed")
        }
    };
    let took = start.elapsed();
    println!(
        "processes_desync_detected: rank {} after {took:.2?}: {e}",
        g.rank()
    );
    assert!(
        matches!(e, Error::Desync { .. }),
        "expected a desync, got {e}"
    );
    assert!(took < Duration::from_secs(10));
}

#[test]
fn unavailable_reason_explains_itself() {
    // Always runs: on a machine without CUDA it must name what is missing.
    if let Some(why) = gpu::unavailable_reason() {
        assert!(
            why.contains("libcuda") || why.contains("device") || why.contains("NCCL"),
            "{why}"
        );
        println!("gpu unavailable here: {why}");
    }
}
