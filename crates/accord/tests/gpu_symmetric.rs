//! The symmetric heap on GPUs: run under the launcher, several processes may share one GPU
//! (the heap needs no NCCL):
//!
//! `accord run -n 3 <this test binary> --test-threads 1 --nocapture processes_`
//! (`ACCORD_SYMMETRIC=ipc` runs the same tests over CUDA IPC handles instead of VMM).
//! Without CUDA, or outside the launcher, every test prints why it skips.

use accord::gpu::cuda::{self, Driver};
use accord::{Communicator, Error};
use std::time::Instant;

fn launched(test: &str) -> Option<(Communicator, usize)> {
    let cu = match cuda::driver() {
        Ok(cu) => cu,
        Err(e) => {
            println!("{test}: skipping: {e}");
            return None;
        }
    };
    let n = cu.device_count().unwrap_or(0);
    if n == 0 {
        println!("{test}: skipping: no CUDA device visible");
        return None;
    }
    if std::env::var("ACCORD_RANK").is_err() {
        println!("{test}: skipping: not started by `accord run -n N`");
        return None;
    }
    // One job per process: the tests share its communicator.
    static WORLD: std::sync::OnceLock<Communicator> = std::sync::OnceLock::new();
    let comm = WORLD
        .get_or_init(|| accord::init().expect("host communicator"))
        .clone();
    let local: usize = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(comm.rank());
    Some((comm, local % n))
}

fn cu() -> &'static Driver {
    cuda::driver().unwrap()
}

fn upload(ptr: u64, data: &[u8]) {
    // SAFETY: `ptr` starts a device buffer at least `data.len()` bytes long.
    let rc = unsafe { (cu().memcpy_htod)(ptr, data.as_ptr().cast(), data.len()) };
    cu().check(rc, "cuMemcpyHtoD").unwrap();
    // From pageable memory the copy may still be in flight when the call returns: peers read
    // it after the next barrier, so wait for it.
    // SAFETY: no arguments.
    cu().check(unsafe { (cu().ctx_synchronize)() }, "cuCtxSynchronize")
        .unwrap();
}

fn download(ptr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: `ptr` starts a device buffer at least `len` bytes long.
    let rc = unsafe { (cu().memcpy_dtoh)(v.as_mut_ptr().cast(), ptr, len) };
    cu().check(rc, "cuMemcpyDtoH").unwrap();
    v
}

fn pattern(rank: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (rank * 31 + i * 7 % 251) as u8).collect()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn free_device_memory() -> usize {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: out-pointers to locals; the context is current after an allocation.
    unsafe { (cu().mem_get_info)(&mut free, &mut total) };
    free
}

#[test]
fn processes_every_rank_reads_every_peer() {
    let Some((comm, dev)) = launched("processes_every_rank_reads_every_peer") else {
        return;
    };
    let len = (1 << 20) + 13; // rounded up to the granularity
    let buf = comm.alloc_symmetric_on(dev, len).unwrap();
    assert!(buf.len() >= len && buf.requested() == len);
    let peers = comm.symmetric_peers().unwrap();
    // ACCORD_TEST_HOSTS=k: the ranks were started with ACCORD_HOST_ID=h<rank % k>, k simulated
    // hosts: each rank maps only the ranks of its own.
    let hosts: usize = std::env::var("ACCORD_TEST_HOSTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mine: Vec<usize> = (0..comm.size())
        .filter(|r| r % hosts == comm.rank() % hosts)
        .collect();
    assert_eq!(peers, mine, "the ranks of this host");
    for r in (0..comm.size()).filter(|r| !mine.contains(r)) {
        assert!(
            buf.peer_ptr(r).is_none(),
            "rank {r} of another host is mapped"
        );
    }
    upload(buf.ptr(), &pattern(comm.rank(), len));
    comm.barrier().unwrap();
    for &p in &peers {
        let got = download(buf.peer_ptr(p).unwrap(), len);
        assert!(
            got == pattern(p, len),
            "rank {}: peer {p}'s buffer differs",
            comm.rank()
        );
    }
    // Write into the next rank of this host's buffer through the mapping; it reads its own.
    let at = mine.iter().position(|&r| r == comm.rank()).unwrap();
    let next = mine[(at + 1) % mine.len()];
    let prev = mine[(at + mine.len() - 1) % mine.len()];
    comm.barrier().unwrap();
    upload(
        buf.peer_ptr(next).unwrap(),
        &pattern(100 + comm.rank(), 4096),
    );
    comm.barrier().unwrap();
    assert_eq!(download(buf.ptr(), 4096), pattern(100 + prev, 4096));
    println!(
        "processes_every_rank_reads_every_peer: rank {} of {}: {} bytes ({}), peers {peers:?} \
         read and written",
        comm.rank(),
        comm.size(),
        buf.len(),
        buf.sharing()
    );
    buf.free().unwrap();
}

#[test]
fn processes_sizes_must_match() {
    let Some((comm, dev)) = launched("processes_sizes_must_match") else {
        return;
    };
    let e = comm
        .alloc_symmetric_on(dev, 4096 * (1 + comm.rank()))
        .expect_err("different sizes were accepted");
    let text = e.to_string();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    for r in 0..comm.size() {
        assert!(
            text.contains(&format!("rank {r} asked for {}", 4096 * (1 + r))),
            "{text}"
        );
    }
    // Nothing was allocated and the heap still works.
    let b = comm.alloc_symmetric_on(dev, 4096).unwrap();
    b.free().unwrap();
    println!("processes_sizes_must_match: rank {}: {text}", comm.rank());
}

#[test]
fn processes_ten_thousand_cycles_leak_nothing() {
    let Some((comm, dev)) = launched("processes_ten_thousand_cycles_leak_nothing") else {
        return;
    };
    let cycles: usize = std::env::var("ACCORD_SYMM_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    // Warm up (the first allocation connects the ranks and loads the driver's pools).
    comm.alloc_symmetric_on(dev, 4096).unwrap().free().unwrap();
    let (fds, mem) = (open_fds(), free_device_memory());
    let start = Instant::now();
    for i in 0..cycles {
        let b = comm.alloc_symmetric_on(dev, 4096).unwrap();
        if i % 1000 == 0 {
            upload(b.ptr(), &[i as u8; 64]);
        }
        b.free().unwrap();
    }
    let took = start.elapsed();
    let (fds_after, mem_after) = (open_fds(), free_device_memory());
    println!(
        "processes_ten_thousand_cycles_leak_nothing: rank {}: {cycles} cycles in {took:.2?}; \
         fds {fds} -> {fds_after}; free device memory {} -> {} MiB",
        comm.rank(),
        mem >> 20,
        mem_after >> 20
    );
    assert!(fds_after <= fds, "descriptors leaked: {fds} -> {fds_after}");
    // Other processes on the GPU may allocate meanwhile: allow 64 MiB of their noise.
    assert!(
        mem_after + (64 << 20) >= mem,
        "device memory leaked: {} -> {} MiB",
        mem >> 20,
        mem_after >> 20
    );
}

#[test]
fn processes_channels_are_built_and_clean() {
    let Some((comm, dev)) = launched("processes_channels_are_built_and_clean") else {
        return;
    };
    let buf = comm.alloc_symmetric_on(dev, 1 << 16).unwrap();
    let ch = comm.memory_channels(&buf).unwrap();
    let me = comm.rank();
    let expect: Vec<usize> = buf.peers().iter().copied().filter(|&r| r != me).collect();
    assert_eq!(ch.peers(), expect.as_slice());
    let n = comm.size();
    let handles = download(ch.device_ptr(), 64 * n);
    for t in 0..n {
        let h = &handles[64 * t..64 * (t + 1)];
        let word = |i: usize| u64::from_le_bytes(h[8 * i..8 * i + 8].try_into().unwrap());
        if t == me || buf.peer_ptr(t).is_none() {
            assert!(h.iter().all(|&b| b == 0), "own entry is empty");
            continue;
        }
        assert_eq!(word(0), buf.ptr());
        assert_eq!(word(1), buf.peer_ptr(t).unwrap());
        assert_eq!(
            u32::from_le_bytes(h[56..60].try_into().unwrap()) as usize,
            t
        );
        assert_eq!(
            u32::from_le_bytes(h[60..64].try_into().unwrap()) as usize,
            me
        );
    }
    ch.check().unwrap(); // no kernel ran: nothing recorded
    ch.free().unwrap();
    buf.free().unwrap();
    println!("processes_channels_are_built_and_clean: rank {me}: {n} handles checked");
}
