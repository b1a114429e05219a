//! Kernels compiled at run time with NVRTC and launched through the driver. One GPU; without
//! CUDA or NVRTC every test prints why it skips. (Channels between processes are tested in
//! `python/tests/test_gpu_channels.py`, which runs the MSCCL++ tutorial port.)

use accord::gpu::cuda::{self, nvrtc, KernelArgs};
use std::sync::Arc;

const ADD: &str = r#"
#include <accord/channel.cuh>
extern "C" __global__ void add(const float* a, const float* b, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
"#;

fn ready(test: &str) -> bool {
    let why = match cuda::driver().and_then(|d| d.device_count()) {
        Ok(0) => Some("no CUDA device visible".to_string()),
        Ok(_) => nvrtc::compile("extern \"C\" __global__ void k() {}", "probe", &[], 0)
            .err()
            .map(|e| e.to_string()),
        Err(e) => Some(e.to_string()),
    };
    if let Some(why) = &why {
        println!("{test}: skipping: {why}");
    }
    why.is_none()
}

fn alloc(bytes: usize) -> u64 {
    let cu = cuda::driver().unwrap();
    let mut p = 0;
    // SAFETY: out-pointer to a local.
    cu.check(unsafe { (cu.mem_alloc)(&mut p, bytes) }, "cuMemAlloc")
        .unwrap();
    p
}

#[test]
fn a_compiled_kernel_runs_and_is_cached() {
    if !ready("a_compiled_kernel_runs_and_is_cached") {
        return;
    }
    let cu = cuda::driver().unwrap();
    let ctx = cu.primary_context(0).unwrap();
    // SAFETY: a context the driver just handed out.
    cu.check(unsafe { (cu.ctx_set_current)(ctx) }, "cuCtxSetCurrent")
        .unwrap();
    let n = 1000usize;
    let (a, b, out) = (alloc(4 * n), alloc(4 * n), alloc(4 * n));
    let av: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let bv: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
    // SAFETY: buffers of 4n bytes each.
    unsafe {
        (cu.memcpy_htod)(a, av.as_ptr().cast(), 4 * n);
        (cu.memcpy_htod)(b, bv.as_ptr().cast(), 4 * n);
    }
    let k = nvrtc::load_kernel(ADD, "add", &[], 0).unwrap();
    let args = KernelArgs::new().ptr(a).ptr(b).ptr(out).i32(n as i32);
    // SAFETY: the arguments match `add`'s parameters; the buffers hold n floats.
    unsafe {
        k.launch(
            [4, 1, 1],
            [256, 1, 1],
            0,
            std::ptr::null_mut(),
            args.as_bytes(),
        )
    }
    .unwrap();
    let mut got = vec![0f32; n];
    // SAFETY: as above; the copy waits for the kernel on the legacy stream.
    unsafe { (cu.memcpy_dtoh)(got.as_mut_ptr().cast(), out, 4 * n) };
    assert!(got.iter().enumerate().all(|(i, v)| *v == 3.0 * i as f32));
    let first = nvrtc::compile(ADD, "add", &[], 0).unwrap();
    let again = nvrtc::compile(ADD, "add", &[], 0).unwrap();
    assert!(
        Arc::ptr_eq(&first, &again),
        "the second compile came from the cache"
    );
    println!(
        "a_compiled_kernel_runs_and_is_cached: built with {}",
        first.arch
    );
}

#[test]
fn a_compile_error_returns_the_log() {
    if !ready("a_compile_error_returns_the_log") {
        return;
    }
    let bad = "extern \"C\" __global__ void k() { undefined_thing(); }";
    let e = nvrtc::compile(bad, "bad.cu", &[], 0).expect_err("bad source compiled");
    let text = e.to_string();
    assert!(
        text.contains("undefined_thing") && text.contains("bad.cu"),
        "{text}"
    );
    let e = nvrtc::load_kernel(ADD, "missing", &[], 0).expect_err("a missing kernel loaded");
    assert!(e.to_string().contains("extern \"C\""), "{e}");
}
