//! cuFFT, loaded at run time like the driver and NCCL: the handful of calls a batch of 1-D
//! transforms needs (`cufftPlanMany`, `cufftSetStream`, the six `cufftExec*`, `cufftDestroy`).
//!
//! ## Search order
//!
//! 1. `ACCORD_CUFFT_LIBRARY`: a path or file name. When set, it is the only candidate, so a
//!    mistake in it is an error rather than a silent fall-back to another copy.
//! 2. `libcufft.so.12` (CUDA 12 and 13), then `libcufft.so.11` (CUDA 11), by soname: a copy
//!    already in the process (PyTorch's, CuPy's) is the one returned, so both share it;
//!    otherwise the usual `LD_LIBRARY_PATH` / `ldconfig` search applies.
//! 3. Those files in `$CUDA_HOME/lib64`, `/usr/local/cuda/lib64`, and the pip wheels'
//!    `nvidia/cufft/lib` and `nvidia/cu13/lib` under `$VIRTUAL_ENV`, `/opt/*/.venv` and the
//!    system's `dist-packages` (a toolkit or wheel that is installed but not on the loader's
//!    path).
//! 4. `libcufft.so` (a development install without the versioned link).
//!
//! Without any, [`cufft`] is [`Error::Unsupported`] listing every attempt and naming
//! `ACCORD_CUFFT_LIBRARY`; nothing else in Accord needs cuFFT.
//!
//! cuFFT's plans belong to the context current when they are made (it uses the CUDA runtime,
//! which adopts the driver's current context), so callers make the device's primary context
//! current first, as everything in Accord does.

use crate::error::{Error, Result};
use libloading::Library;
use std::ffi::{c_int, c_void, CStr};
use std::path::Path;
use std::sync::OnceLock;

/// `cufftResult`; 0 is success.
pub type CufftResult = c_int;
/// `cufftHandle`: a plan, an integer handle.
pub type CufftHandle = c_int;

/// `cufftType` values.
pub mod kind {
    use std::ffi::c_int;
    /// Real to complex, single precision.
    pub const R2C: c_int = 0x2a;
    /// Complex to real, single precision.
    pub const C2R: c_int = 0x2c;
    /// Complex to complex, single precision.
    pub const C2C: c_int = 0x29;
    /// Real to complex, double precision.
    pub const D2Z: c_int = 0x6a;
    /// Complex to real, double precision.
    pub const Z2D: c_int = 0x6c;
    /// Complex to complex, double precision.
    pub const Z2Z: c_int = 0x69;
}

/// `CUFFT_FORWARD`: the exponent's sign is negative.
pub const FORWARD: c_int = -1;
/// `CUFFT_INVERSE`: the exponent's sign is positive (unscaled).
pub const INVERSE: c_int = 1;

super::symbol_table! {
    /// Function pointers into cuFFT.
    Calls {
        plan_many: "cufftPlanMany" => fn(*mut CufftHandle, c_int, *mut c_int, *mut c_int, c_int, c_int, *mut c_int, c_int, c_int, c_int, c_int) -> CufftResult;
        set_stream: "cufftSetStream" => fn(CufftHandle, *mut c_void) -> CufftResult;
        exec_c2c: "cufftExecC2C" => fn(CufftHandle, *mut c_void, *mut c_void, c_int) -> CufftResult;
        exec_z2z: "cufftExecZ2Z" => fn(CufftHandle, *mut c_void, *mut c_void, c_int) -> CufftResult;
        exec_r2c: "cufftExecR2C" => fn(CufftHandle, *mut c_void, *mut c_void) -> CufftResult;
        exec_d2z: "cufftExecD2Z" => fn(CufftHandle, *mut c_void, *mut c_void) -> CufftResult;
        exec_c2r: "cufftExecC2R" => fn(CufftHandle, *mut c_void, *mut c_void) -> CufftResult;
        exec_z2d: "cufftExecZ2D" => fn(CufftHandle, *mut c_void, *mut c_void) -> CufftResult;
        destroy: "cufftDestroy" => fn(CufftHandle) -> CufftResult;
        get_version: "cufftGetVersion" => fn(*mut c_int) -> CufftResult;
    }
}

/// The loaded cuFFT: its calls (through `Deref`), where it came from and its version.
pub struct Cufft {
    calls: Calls,
    /// The candidate it was loaded from.
    pub path: String,
    /// `cufftGetVersion`'s code, e.g. 12000 for 12.0.0 (0 if the call failed).
    pub version: c_int,
    _lib: Library,
}

impl std::ops::Deref for Cufft {
    type Target = Calls;
    fn deref(&self) -> &Calls {
        &self.calls
    }
}

/// cuFFT's name for a result code (cuFFT has no call that says it).
pub fn result_name(rc: CufftResult) -> &'static str {
    match rc {
        0 => "CUFFT_SUCCESS",
        1 => "CUFFT_INVALID_PLAN",
        2 => "CUFFT_ALLOC_FAILED",
        3 => "CUFFT_INVALID_TYPE",
        4 => "CUFFT_INVALID_VALUE",
        5 => "CUFFT_INTERNAL_ERROR",
        6 => "CUFFT_EXEC_FAILED",
        7 => "CUFFT_SETUP_FAILED",
        8 => "CUFFT_INVALID_SIZE",
        9 => "CUFFT_UNALIGNED_DATA",
        10 => "CUFFT_INCOMPLETE_PARAMETER_LIST",
        11 => "CUFFT_INVALID_DEVICE",
        12 => "CUFFT_PARSE_ERROR",
        13 => "CUFFT_NO_WORKSPACE",
        14 => "CUFFT_NOT_IMPLEMENTED",
        15 => "CUFFT_LICENSE_ERROR",
        16 => "CUFFT_NOT_SUPPORTED",
        17 => "CUFFT_MISSING_DEPENDENCY",
        18 => "CUFFT_NVRTC_FAILURE",
        19 => "CUFFT_NVJITLINK_FAILURE",
        20 => "CUFFT_NVSHMEM_FAILURE",
        _ => "unknown cuFFT result",
    }
}

impl Cufft {
    /// `Ok` for success, else [`Error::Gpu`] naming `call`, the code by name, and the library.
    pub fn check(&self, rc: CufftResult, call: &str) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        Err(Error::Gpu {
            library: "cufft",
            call: call.to_string(),
            code: rc,
            text: format!(
                "{} (cuFFT {} from {})",
                result_name(rc),
                version_string(self.version),
                self.path
            ),
            rank: None,
        })
    }
}

/// `11203` -> `11.2.3` (cuFFT's version code: major * 1000 + minor * 100 + patch).
pub fn version_string(code: c_int) -> String {
    format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
}

/// The candidates, in order, given an environment lookup (a parameter so tests can fake it).
pub fn candidates(env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    if let Some(p) = env("ACCORD_CUFFT_LIBRARY").filter(|p| !p.trim().is_empty()) {
        return vec![p];
    }
    const VERSIONED: [&str; 2] = ["libcufft.so.12", "libcufft.so.11"];
    let mut out: Vec<String> = VERSIONED.map(String::from).to_vec();
    let dirs = super::search::library_dirs(env, "cufft");
    for d in dirs {
        for name in VERSIONED {
            let p = d.join(name).to_string_lossy().into_owned();
            if Path::new(&p).exists() && !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out.push("libcufft.so".into());
    out
}

/// Try `candidates` in order; the error lists every attempt and how to point at a copy.
pub fn load_from(candidates: &[String]) -> std::result::Result<Cufft, String> {
    let mut tried = Vec::new();
    for c in candidates {
        // SAFETY: opening cuFFT runs its initialisers, which have no preconditions.
        let lib = match unsafe { Library::new(c) } {
            Ok(lib) => lib,
            Err(e) => {
                tried.push(format!("{c}: {e}"));
                continue;
            }
        };
        let resolve = |name: &CStr| {
            // SAFETY: only the address is read; `Calls::resolve` gives it its type.
            unsafe { lib.get::<*mut c_void>(name.to_bytes_with_nul()) }
                .ok()
                .map(|s| *s)
        };
        match Calls::resolve(&resolve) {
            Ok(calls) => {
                let mut version = 0;
                // SAFETY: writes one int.
                if unsafe { (calls.get_version)(&mut version) } != 0 {
                    version = 0;
                }
                return Ok(Cufft {
                    calls,
                    path: c.clone(),
                    version,
                    _lib: lib,
                });
            }
            Err(missing) => tried.push(format!("{c}: lacks {}", missing.join(", "))),
        }
    }
    Err(format!(
        "cuFFT not found; tried, in order:\n  {}\nSet ACCORD_CUFFT_LIBRARY to the path of \
         libcufft.so.12 (CUDA 12 or 13; libcufft.so.11 for CUDA 11), or install the CUDA \
         toolkit or the nvidia-cufft wheel",
        tried.join("\n  ")
    ))
}

static CUFFT: OnceLock<std::result::Result<Cufft, String>> = OnceLock::new();

/// The process's cuFFT, loaded on first use by the search order above.
pub fn cufft() -> Result<&'static Cufft> {
    CUFFT
        .get_or_init(|| load_from(&candidates(&|k| std::env::var(k).ok())))
        .as_ref()
        .map_err(|e| Error::Unsupported(e.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_library_is_the_only_candidate() {
        let env =
            |k: &str| (k == "ACCORD_CUFFT_LIBRARY").then(|| "/opt/x/libcufft.so.12".to_string());
        assert_eq!(candidates(&env), vec!["/opt/x/libcufft.so.12".to_string()]);
    }

    #[test]
    fn without_the_variable_the_sonames_come_first_and_the_plain_name_last() {
        let c = candidates(&|_| None);
        assert_eq!(&c[..2], &["libcufft.so.12", "libcufft.so.11"]);
        assert_eq!(c.last().map(String::as_str), Some("libcufft.so"));
    }

    #[test]
    fn a_missing_library_names_what_was_tried_and_the_variable() {
        let env = |k: &str| {
            (k == "ACCORD_CUFFT_LIBRARY").then(|| "/nonexistent/libcufft.so.12".to_string())
        };
        let Err(e) = load_from(&candidates(&env)) else {
            panic!("loaded a library that does not exist")
        };
        assert!(e.contains("/nonexistent/libcufft.so.12"), "{e}");
        assert!(e.contains("ACCORD_CUFFT_LIBRARY"), "{e}");
        // As the process sees it: Unsupported, the variable named.
        let err = Error::Unsupported(e);
        assert!(err.to_string().contains("ACCORD_CUFFT_LIBRARY"), "{err}");
    }

    #[test]
    fn result_codes_are_named() {
        assert_eq!(result_name(8), "CUFFT_INVALID_SIZE");
        assert_eq!(result_name(2), "CUFFT_ALLOC_FAILED");
        assert_eq!(result_name(99), "unknown cuFFT result");
        assert_eq!(version_string(11203), "11.2.3");
    }
}
