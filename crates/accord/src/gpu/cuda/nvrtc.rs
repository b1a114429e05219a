//! Compiling CUDA C++ at run time with NVRTC, with Accord's headers on the include path.
//!
//! `libnvrtc` is opened on first use, like the driver, from (in this order):
//! `ACCORD_NVRTC_LIBRARY`; `$CUDA_HOME/lib64` and `/usr/local/cuda/lib64`; the pip wheels'
//! `nvidia/cuda_nvrtc/lib` and `nvidia/cu13/lib` under `$VIRTUAL_ENV`, `/opt/*/.venv` and the
//! system's `site-packages`/`dist-packages`; then the plain names `libnvrtc.so.13`,
//! `libnvrtc.so.12`, `libnvrtc.so`. Without it, compiling fails with
//! [`Error::Unsupported`] naming where it looked; nothing else is affected.
//!
//! [`compile`] builds for the device's own architecture (`sm_XY`, a CUBIN), or, where this NVRTC
//! does not know it, for `compute_XY` (PTX the driver finishes). Accord's headers
//! (`<accord/channel.cuh>` ...) are passed to NVRTC from the library itself, so no files are
//! needed; [`include_dir`] writes them out for other compilers. Results are cached per
//! (source, options, architecture) in the process and on disk (`disk_cache`:
//! `~/.cache/accord/kernels-<version>`, off with `ACCORD_KERNEL_CACHE=0`), and
//! [`load_kernel`]'s kernels per device too.

use super::module::{Kernel, Module};
use crate::error::{Error, Result};
use libloading::Library;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// Accord's headers: (include name, text).
pub const HEADERS: &[(&str, &str)] = &[
    (
        "accord/channel.cuh",
        include_str!("../../../include/accord/channel.cuh"),
    ),
    (
        "accord/all.cuh",
        include_str!("../../../include/accord/all.cuh"),
    ),
];

type Program = *mut c_void;
type NvResult = c_int;
const NVRTC_ERROR_INVALID_OPTION: NvResult = 5;
const NVRTC_ERROR_COMPILATION: NvResult = 6;

super::symbol_table! {
    /// Function pointers into NVRTC.
    Nvrtc {
        create: "nvrtcCreateProgram" => fn(*mut Program, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char) -> NvResult;
        compile: "nvrtcCompileProgram" => fn(Program, c_int, *const *const c_char) -> NvResult;
        destroy: "nvrtcDestroyProgram" => fn(*mut Program) -> NvResult;
        log_size: "nvrtcGetProgramLogSize" => fn(Program, *mut usize) -> NvResult;
        log: "nvrtcGetProgramLog" => fn(Program, *mut c_char) -> NvResult;
        cubin_size: "nvrtcGetCUBINSize" => fn(Program, *mut usize) -> NvResult;
        cubin: "nvrtcGetCUBIN" => fn(Program, *mut c_char) -> NvResult;
        ptx_size: "nvrtcGetPTXSize" => fn(Program, *mut usize) -> NvResult;
        ptx: "nvrtcGetPTX" => fn(Program, *mut c_char) -> NvResult;
        error_string: "nvrtcGetErrorString" => fn(NvResult) -> *const c_char;
    }
}

/// The loaded NVRTC.
struct Loaded {
    calls: Nvrtc,
    path: String,
    _lib: Library,
}

// SAFETY: NVRTC's entry points may be called from any thread (programs are not shared).
unsafe impl Send for Loaded {}
// SAFETY: as above.
unsafe impl Sync for Loaded {}

static NVRTC: OnceLock<std::result::Result<Loaded, String>> = OnceLock::new();

fn nvrtc() -> Result<&'static Loaded> {
    NVRTC
        .get_or_init(load)
        .as_ref()
        .map_err(|e| Error::Unsupported(format!("NVRTC is unavailable: {e}")))
}

/// Where NVRTC may be, in the order tried.
fn candidates() -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(p) = std::env::var("ACCORD_NVRTC_LIBRARY") {
        if !p.trim().is_empty() {
            return vec![p];
        }
    }
    let dirs = super::search::library_dirs(&|k| std::env::var(k).ok(), "cuda_nvrtc");
    for d in dirs {
        for name in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
            let p = d.join(name);
            if p.exists() {
                out.push(p.to_string_lossy().into_owned());
            }
        }
    }
    out.extend(["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"].map(String::from));
    out
}

fn load() -> std::result::Result<Loaded, String> {
    let mut tried = Vec::new();
    for c in candidates() {
        // SAFETY: opening NVRTC runs its initialisers, which have no preconditions.
        match unsafe { Library::new(&c) } {
            Ok(lib) => {
                let resolve = |name: &CStr| {
                    // SAFETY: only the address is read; `resolve` gives it its type.
                    unsafe { lib.get::<*mut c_void>(name.to_bytes_with_nul()) }
                        .ok()
                        .map(|s| *s)
                };
                let calls =
                    Nvrtc::resolve(&resolve).map_err(|m| format!("{c} lacks {}", m.join(", ")))?;
                return Ok(Loaded {
                    calls,
                    path: c,
                    _lib: lib,
                });
            }
            Err(e) => tried.push(format!("{c}: {e}")),
        }
    }
    Err(format!(
        "libnvrtc not found (set ACCORD_NVRTC_LIBRARY, or install the CUDA toolkit or the \
         nvidia-cuda-nvrtc wheel); tried {}",
        tried.join("; ")
    ))
}

impl Loaded {
    fn text(&self, rc: NvResult) -> String {
        // SAFETY: NVRTC returns a static string for any code.
        let p = unsafe { (self.calls.error_string)(rc) };
        match p.is_null() {
            true => format!("NVRTC error {rc}"),
            false => format!("{}", unsafe { CStr::from_ptr(p) }.to_string_lossy()),
        }
    }

    fn check(&self, rc: NvResult, what: &str) -> Result<()> {
        match rc {
            0 => Ok(()),
            _ => Err(Error::Gpu {
                library: "nvrtc",
                call: what.into(),
                code: rc,
                text: self.text(rc),
                rank: None,
            }),
        }
    }
}

/// A compiled image: a CUBIN, or NUL-terminated PTX.
#[derive(Debug)]
pub struct Compiled {
    /// The image, for `cuModuleLoadData`.
    pub image: Vec<u8>,
    /// The architecture option it was built with, e.g. `--gpu-architecture=sm_90`.
    pub arch: String,
    /// NVRTC's log (warnings).
    pub log: String,
}

type Key = (String, Vec<String>, (i32, i32));
static COMPILED: OnceLock<Mutex<HashMap<Key, Arc<Compiled>>>> = OnceLock::new();
/// (compiled key, kernel name, device).
type KernelKey = (Key, String, usize);
static KERNELS: OnceLock<Mutex<HashMap<KernelKey, Kernel>>> = OnceLock::new();

/// Compile `source` for device `ordinal`'s architecture with `options` (NVRTC options such as
/// `-DNAME=1`); `name` names the source in messages. Compile errors are
/// [`Error::InvalidArgument`] holding NVRTC's whole log. Cached.
pub fn compile(
    source: &str,
    name: &str,
    options: &[String],
    ordinal: usize,
) -> Result<Arc<Compiled>> {
    let cu = super::driver()?;
    let cc = cu.compute_capability(ordinal)?;
    let key: Key = (source.to_string(), options.to_vec(), cc);
    let cache = COMPILED.get_or_init(Default::default);
    if let Some(c) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(c.clone());
    }
    let on_disk = super::disk_cache::path(source, options, cc);
    if let Some((image, arch)) = on_disk.as_ref().and_then(super::disk_cache::load) {
        let c = Arc::new(Compiled {
            image,
            arch,
            log: String::new(),
        });
        cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, c.clone());
        return Ok(c);
    }
    let n = nvrtc()?;
    let sm = format!("--gpu-architecture=sm_{}{}", cc.0, cc.1);
    let compiled = match build(n, source, name, options, &sm, false) {
        Ok(r) => r?,
        Err(Rejected(_)) => {
            let ptx = format!("--gpu-architecture=compute_{}{}", cc.0, cc.1);
            match build(n, source, name, options, &ptx, true) {
                Ok(r) => r?,
                Err(Rejected(rc)) => {
                    return Err(Error::Unsupported(format!(
                        "NVRTC ({}) cannot build for compute capability {}.{}: {}",
                        n.path,
                        cc.0,
                        cc.1,
                        n.text(rc)
                    )))
                }
            }
        }
    };
    if let Some(p) = &on_disk {
        super::disk_cache::store(p, &compiled.image, &compiled.arch);
    }
    let c = Arc::new(compiled);
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, c.clone());
    Ok(c)
}

/// NVRTC refused the architecture option (with this code).
struct Rejected(NvResult);

/// Build with `arch`: `Err(Rejected)` if NVRTC refuses the option, else the image or the error.
fn build(
    n: &Loaded,
    source: &str,
    name: &str,
    options: &[String],
    arch: &str,
    ptx: bool,
) -> std::result::Result<Result<Compiled>, Rejected> {
    let run = || -> Result<std::result::Result<Compiled, NvResult>> {
        let src = CString::new(source)
            .map_err(|_| Error::invalid("kernel source contains a NUL byte"))?;
        let cname = CString::new(name).unwrap_or_else(|_| CString::new("kernel").expect("no NUL"));
        let texts: Vec<CString> = HEADERS
            .iter()
            .map(|(_, t)| CString::new(*t).expect("headers have no NUL"))
            .collect();
        let names: Vec<CString> = HEADERS
            .iter()
            .map(|(n, _)| CString::new(*n).expect("names have no NUL"))
            .collect();
        let tp: Vec<*const c_char> = texts.iter().map(|c| c.as_ptr()).collect();
        let np: Vec<*const c_char> = names.iter().map(|c| c.as_ptr()).collect();
        let mut opts: Vec<CString> = vec![
            CString::new(arch).expect("no NUL"),
            CString::new("-std=c++17").expect("no NUL"),
        ];
        for o in options {
            opts.push(
                CString::new(o.as_str())
                    .map_err(|_| Error::invalid(format!("option {o:?} contains a NUL byte")))?,
            );
        }
        let op: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: every string is NUL-terminated and outlives the call; counts match.
        let rc = unsafe {
            (n.calls.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                tp.len() as c_int,
                tp.as_ptr(),
                np.as_ptr(),
            )
        };
        n.check(rc, "nvrtcCreateProgram")?;
        // SAFETY: a live program; options as above.
        let rc = unsafe { (n.calls.compile)(prog, op.len() as c_int, op.as_ptr()) };
        let log = program_log(n, prog);
        let out = match rc {
            0 => {
                let (size_of, get, what) = match ptx {
                    true => (n.calls.ptx_size, n.calls.ptx, "nvrtcGetPTX"),
                    false => (n.calls.cubin_size, n.calls.cubin, "nvrtcGetCUBIN"),
                };
                let mut size = 0usize;
                // SAFETY: a compiled program; out-pointers sized by the first call.
                let image = unsafe {
                    n.check(size_of(prog, &mut size), what)?;
                    let mut image = vec![0u8; size];
                    n.check(get(prog, image.as_mut_ptr().cast()), what)?;
                    image
                };
                Ok(Ok(Compiled {
                    image,
                    arch: arch.to_string(),
                    log,
                }))
            }
            NVRTC_ERROR_COMPILATION => Err(Error::invalid(format!(
                "compiling {name} ({arch}) failed:\n{log}"
            ))),
            rc => Ok(Err(rc)),
        };
        // SAFETY: created above, destroyed once.
        unsafe { (n.calls.destroy)(&mut prog) };
        out
    };
    match run() {
        Ok(Ok(c)) => Ok(Ok(c)),
        Ok(Err(rc)) if rc == NVRTC_ERROR_INVALID_OPTION => Err(Rejected(rc)),
        Ok(Err(rc)) => Ok(Err(Error::Gpu {
            library: "nvrtc",
            call: "nvrtcCompileProgram".into(),
            code: rc,
            text: n.text(rc),
            rank: None,
        })),
        Err(e) => Ok(Err(e)),
    }
}

fn program_log(n: &Loaded, prog: Program) -> String {
    let mut size = 0usize;
    // SAFETY: a live program; the buffer is as large as NVRTC says.
    unsafe {
        if (n.calls.log_size)(prog, &mut size) != 0 || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        if (n.calls.log)(prog, buf.as_mut_ptr().cast()) != 0 {
            return String::new();
        }
        String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .trim()
            .to_string()
    }
}

/// Compile `source` (cached) and return its kernel `kernel_name` loaded on device `ordinal`.
pub fn load_kernel(
    source: &str,
    kernel_name: &str,
    options: &[String],
    ordinal: usize,
) -> Result<Kernel> {
    let cu = super::driver()?;
    let cc = cu.compute_capability(ordinal)?;
    let key = (
        (source.to_string(), options.to_vec(), cc),
        kernel_name.to_string(),
        ordinal,
    );
    let cache = KERNELS.get_or_init(Default::default);
    if let Some(k) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(k.clone());
    }
    let c = compile(source, kernel_name, options, ordinal)?;
    let module = Module::load(cu, ordinal, &c.image)?;
    let k = module.kernel(kernel_name)?;
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, k.clone());
    Ok(k)
}

/// A directory holding Accord's headers (`accord/channel.cuh` ...), written once per version:
/// `$XDG_CACHE_HOME/accord/include-<version>`, else `~/.cache/...`, else the temporary
/// directory. For nvcc, CuPy's `RawModule` and other compilers.
pub fn include_dir() -> Result<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    let dir = base
        .join("accord")
        .join(format!("include-{}", env!("CARGO_PKG_VERSION")));
    for (name, text) in HEADERS {
        let path = dir.join(name);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(*text) {
            continue;
        }
        let parent = path.parent().expect("headers live in a directory");
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
        // Written aside and renamed: a concurrent reader never sees half a header.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, text)
            .map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &path)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_written_once_and_kept_whole() {
        let d = include_dir().unwrap();
        for (name, text) in HEADERS {
            assert_eq!(std::fs::read_to_string(d.join(name)).unwrap(), *text);
        }
        assert_eq!(include_dir().unwrap(), d);
    }

    #[test]
    fn the_search_honours_the_override() {
        // Without the variable the list ends with the plain names.
        let c = candidates();
        assert!(
            c.ends_with(&[
                "libnvrtc.so.13".into(),
                "libnvrtc.so.12".into(),
                "libnvrtc.so".into()
            ]) || std::env::var("ACCORD_NVRTC_LIBRARY").is_ok()
        );
    }
}
