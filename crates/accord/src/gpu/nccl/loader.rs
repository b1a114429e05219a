//! Finding and loading NCCL at run time, and the handful of its symbols Accord calls.
//!
//! ## Search order
//!
//! 1. `ACCORD_NCCL_LIBRARY`: a path or file name. When set, it is the only candidate, so a
//!    mistake in it is an error rather than a silent fall-back to another copy.
//! 2. `libnccl.so.2`, by soname. If PyTorch (or anything else) already loaded NCCL into the
//!    process, the dynamic loader returns that copy, so both share one library; otherwise the
//!    usual `LD_LIBRARY_PATH` / `ldconfig` search applies.
//! 3. The `nvidia/nccl/lib/libnccl.so.2` of a Python environment (the `nvidia-nccl-cu*` wheel that
//!    PyTorch depends on). We do not start a Python interpreter to ask for its `site-packages`
//!    (that takes a second); instead we look in the `lib/python3*/{site,dist}-packages` folders of
//!    these prefixes, in order: `VIRTUAL_ENV`, `CONDA_PREFIX`, the parent of every `PATH` folder
//!    named `bin` that holds a `python3`, `~/.local`, `/usr/local` and `/usr`; and directly in
//!    every `PYTHONPATH` entry.
//! 4. `libnccl.so` (a development install without the versioned link).
//!
//! The first candidate that opens and has every symbol wins. If none does, the error lists each
//! candidate tried and why it failed.

use crate::error::{Error, Result};
use libloading::Library;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclComm_t`.
pub type NcclComm = *mut c_void;

/// `ncclInProgress`: a nonblocking call has not finished yet.
pub const NCCL_IN_PROGRESS: NcclResult = 7;

/// The leading fields of `ncclConfig_t` (`size`, `magic`, `version`, `blocking`).
///
/// NCCL copies `size` bytes of the caller's struct over its own defaults and honours only the
/// fields that `version` had; version 2.14 had just `blocking`, which is all Accord sets, so
/// this prefix works with every NCCL from 2.14 on. A nonblocking init or split returns at once,
/// so the caller can wait with a deadline and abort instead of blocking forever on a peer that
/// never joins. Operations on a nonblocking communicator pay for it (NCCL launches every group
/// from a helper thread, about 100 us), so the communicators that carry operations are
/// blocking. `NCCL_COMM_BLOCKING` in the environment overrides the field (=1: no deadline;
/// =0: slow operations).
#[repr(C)]
pub struct NcclConfig {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    /// Where 2.17 put `cgaClusterSize` (ignored at version 2.14): NCCL copies `size` bytes,
    /// so this is `NCCL_CONFIG_UNDEF_INT` rather than uninitialised padding.
    undefined: c_int,
}

impl NcclConfig {
    /// `NCCL_CONFIG_INITIALIZER` as of 2.14, with the given `blocking`.
    pub fn new(blocking: bool) -> Self {
        NcclConfig {
            size: std::mem::size_of::<NcclConfig>(),
            magic: 0xcafe_beef,
            version: 21400,
            blocking: c_int::from(blocking),
            undefined: c_int::MIN,
        }
    }
}

/// `ncclUniqueId`: 128 opaque bytes, created by one rank and given to all.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    /// The bytes.
    pub internal: [u8; 128],
}

macro_rules! nccl_api {
    ($( $field:ident : $sym:literal => fn($($arg:ty),*) -> $ret:ty; )*) => {
        /// Function pointers into a loaded NCCL.
        pub struct Nccl {
            _lib: Library,
            /// Where it was loaded from.
            pub path: String,
            /// `ncclGetVersion`'s code, e.g. 22809 for 2.28.9.
            pub version: i32,
            $( #[allow(missing_docs)] pub $field: unsafe extern "C" fn($($arg),*) -> $ret, )*
        }

        impl Nccl {
            fn from_library(lib: Library, path: String) -> std::result::Result<Nccl, String> {
                // SAFETY: each symbol is declared with its signature from nccl.h; the library
                // lives in `_lib` as long as the pointers.
                let mut n = unsafe {
                    $( let $field = *lib
                        .get::<unsafe extern "C" fn($($arg),*) -> $ret>(concat!($sym, "\0").as_bytes())
                        .map_err(|_| format!("has no symbol {}", $sym))?; )*
                    Nccl { _lib: lib, path, version: 0, $( $field, )* }
                };
                let mut v = 0;
                // SAFETY: writes one int.
                let rc = unsafe { (n.get_version)(&mut v) };
                if rc != 0 {
                    return Err(format!("ncclGetVersion failed with {rc}"));
                }
                n.version = v;
                Ok(n)
            }
        }
    };
}

nccl_api! {
    get_version: "ncclGetVersion" => fn(*mut c_int) -> NcclResult;
    get_unique_id: "ncclGetUniqueId" => fn(*mut NcclUniqueId) -> NcclResult;
    comm_init_rank_config: "ncclCommInitRankConfig" => fn(*mut NcclComm, c_int, NcclUniqueId, c_int, *mut NcclConfig) -> NcclResult;
    comm_split: "ncclCommSplit" => fn(NcclComm, c_int, c_int, *mut NcclComm, *mut NcclConfig) -> NcclResult;
    comm_count: "ncclCommCount" => fn(NcclComm, *mut c_int) -> NcclResult;
    comm_user_rank: "ncclCommUserRank" => fn(NcclComm, *mut c_int) -> NcclResult;
    comm_finalize: "ncclCommFinalize" => fn(NcclComm) -> NcclResult;
    comm_abort: "ncclCommAbort" => fn(NcclComm) -> NcclResult;
    comm_destroy: "ncclCommDestroy" => fn(NcclComm) -> NcclResult;
    comm_get_async_error: "ncclCommGetAsyncError" => fn(NcclComm, *mut NcclResult) -> NcclResult;
    all_reduce: "ncclAllReduce" => fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, *mut c_void) -> NcclResult;
    broadcast: "ncclBroadcast" => fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, *mut c_void) -> NcclResult;
    reduce: "ncclReduce" => fn(*const c_void, *mut c_void, usize, c_int, c_int, c_int, NcclComm, *mut c_void) -> NcclResult;
    all_gather: "ncclAllGather" => fn(*const c_void, *mut c_void, usize, c_int, NcclComm, *mut c_void) -> NcclResult;
    reduce_scatter: "ncclReduceScatter" => fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, *mut c_void) -> NcclResult;
    send: "ncclSend" => fn(*const c_void, usize, c_int, c_int, NcclComm, *mut c_void) -> NcclResult;
    recv: "ncclRecv" => fn(*mut c_void, usize, c_int, c_int, NcclComm, *mut c_void) -> NcclResult;
    group_start: "ncclGroupStart" => fn() -> NcclResult;
    group_end: "ncclGroupEnd" => fn() -> NcclResult;
    get_error_string: "ncclGetErrorString" => fn(NcclResult) -> *const c_char;
    get_last_error: "ncclGetLastError" => fn(NcclComm) -> *const c_char;
}

impl Nccl {
    /// `2.28.9` from the version code.
    pub fn version_string(&self) -> String {
        version_string(self.version)
    }

    /// NCCL's text for `rc` plus its last detailed message, with the code.
    pub(crate) fn describe(&self, rc: NcclResult, comm: NcclComm) -> String {
        format!("{} (ncclResult {rc})", self.text(rc, comm))
    }

    /// NCCL's text for `rc` plus its last detailed message on `comm` (null: none).
    pub(crate) fn text(&self, rc: NcclResult, comm: NcclComm) -> String {
        // SAFETY: both return static or library-owned NUL-terminated strings (or null).
        let (s, last) = unsafe { ((self.get_error_string)(rc), (self.get_last_error)(comm)) };
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: non-null and NUL-terminated, per nccl.h.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        let (s, last) = (text(s), text(last));
        if last.is_empty() {
            s
        } else {
            format!("{s}: {last}")
        }
    }

    /// [`Error::Gpu`] for `call` failing with `rc` (on `comm`, if not null; on `rank`).
    pub(crate) fn error(
        &self,
        call: &str,
        rc: NcclResult,
        comm: NcclComm,
        rank: Option<usize>,
    ) -> Error {
        Error::Gpu {
            library: "nccl",
            call: call.to_string(),
            code: rc,
            text: self.text(rc, comm),
            rank,
        }
    }
}

/// `22809` -> `2.28.9` (and the pre-2.9 scheme `2708` -> `2.7.8`).
pub fn version_string(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

/// The candidates, in order, given an environment lookup (a parameter so tests can fake it).
pub fn candidates(env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    if let Some(p) = env("ACCORD_NCCL_LIBRARY").filter(|p| !p.is_empty()) {
        return vec![p];
    }
    let mut out = vec!["libnccl.so.2".to_string()];
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = env(var).filter(|p| !p.is_empty()) {
            prefixes.push(p.into());
        }
    }
    if let Some(path) = env("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.file_name().is_some_and(|n| n == "bin") && dir.join("python3").exists() {
                if let Some(parent) = dir.parent() {
                    prefixes.push(parent.to_path_buf());
                }
            }
        }
    }
    if let Some(home) = env("HOME").filter(|p| !p.is_empty()) {
        prefixes.push(Path::new(&home).join(".local"));
    }
    prefixes.push("/usr/local".into());
    prefixes.push("/usr".into());
    let mut seen = std::collections::HashSet::new();
    for prefix in prefixes {
        for sp in python_package_dirs(&prefix) {
            let lib = sp.join("nvidia/nccl/lib/libnccl.so.2");
            if lib.exists() && seen.insert(lib.clone()) {
                out.push(lib.to_string_lossy().into_owned());
            }
        }
    }
    if let Some(pp) = env("PYTHONPATH") {
        for dir in std::env::split_paths(&pp) {
            let lib = dir.join("nvidia/nccl/lib/libnccl.so.2");
            if lib.exists() && seen.insert(lib.clone()) {
                out.push(lib.to_string_lossy().into_owned());
            }
        }
    }
    out.push("libnccl.so".to_string());
    out
}

/// `prefix/lib/python3*/{site,dist}-packages` and `prefix/lib/python3/dist-packages`.
fn python_package_dirs(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        let mut names: Vec<_> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("python3"))
            .collect();
        names.sort();
        names.reverse(); // newest minor version first
        for n in names {
            for pk in ["site-packages", "dist-packages"] {
                let d = prefix.join(lib).join(&n).join(pk);
                if d.is_dir() {
                    out.push(d);
                }
            }
        }
    }
    out
}

/// Try `candidates` in order; the error lists every attempt.
pub fn load_from(candidates: &[String]) -> std::result::Result<Nccl, String> {
    let mut tried = Vec::new();
    for c in candidates {
        // SAFETY: loading NCCL runs its initialisers, which have no preconditions.
        match unsafe { Library::new(c) } {
            Ok(lib) => match Nccl::from_library(lib, c.clone()) {
                Ok(n) => return Ok(n),
                Err(e) => tried.push(format!("{c}: {e}")),
            },
            Err(e) => tried.push(format!("{c}: {e}")),
        }
    }
    Err(format!(
        "NCCL not found; tried, in order:\n  {}\nSet ACCORD_NCCL_LIBRARY to the path of libnccl.so.2, \
         or install the nvidia-nccl-cu12/cu13 wheel",
        tried.join("\n  ")
    ))
}

static NCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();

/// Whether NCCL was loaded in this process (without loading it).
pub(crate) fn loaded() -> bool {
    matches!(NCCL.get(), Some(Ok(_)))
}

/// The process's NCCL, loaded on first use by the search order above.
pub fn nccl() -> Result<&'static Nccl> {
    NCCL.get_or_init(|| load_from(&candidates(&|k| std::env::var(k).ok())))
        .as_ref()
        .map_err(|e| Error::Unsupported(e.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn explicit_library_is_the_only_candidate() {
        let env = env_of(&[
            ("ACCORD_NCCL_LIBRARY", "/opt/x/libnccl.so.2".into()),
            ("VIRTUAL_ENV", "/venv".into()),
        ]);
        assert_eq!(candidates(&env), vec!["/opt/x/libnccl.so.2".to_string()]);
    }

    #[test]
    fn soname_first_then_python_environments_then_unversioned() {
        let dir = std::env::temp_dir().join(format!("accord-nccl-test-{}", std::process::id()));
        let venv = dir.join("venv");
        let conda = dir.join("conda");
        let pathpy = dir.join("tool");
        let mk = |root: &Path, sp: &str| {
            let lib = root.join(sp).join("nvidia/nccl/lib");
            std::fs::create_dir_all(&lib).unwrap();
            std::fs::write(lib.join("libnccl.so.2"), b"").unwrap();
            lib.join("libnccl.so.2").to_string_lossy().into_owned()
        };
        let a = mk(&venv, "lib/python3.12/site-packages");
        let b = mk(&conda, "lib/python3.11/site-packages");
        let c = mk(&pathpy, "lib/python3.10/dist-packages");
        std::fs::create_dir_all(pathpy.join("bin")).unwrap();
        std::fs::write(pathpy.join("bin/python3"), b"").unwrap();
        let env = env_of(&[
            ("VIRTUAL_ENV", venv.to_string_lossy().into()),
            ("CONDA_PREFIX", conda.to_string_lossy().into()),
            ("PATH", pathpy.join("bin").to_string_lossy().into()),
        ]);
        let got = candidates(&env);
        assert_eq!(got.first().map(String::as_str), Some("libnccl.so.2"));
        assert_eq!(got.last().map(String::as_str), Some("libnccl.so"));
        let pos = |s: &str| got.iter().position(|g| g == s).unwrap();
        assert!(pos(&a) < pos(&b) && pos(&b) < pos(&c), "{got:?}");
        // Each copy once, even when two prefixes name the same environment.
        let env2 = env_of(&[
            ("VIRTUAL_ENV", venv.to_string_lossy().into()),
            ("CONDA_PREFIX", venv.to_string_lossy().into()),
        ]);
        assert_eq!(candidates(&env2).iter().filter(|g| **g == a).count(), 1);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn failure_lists_every_attempt() {
        let cands = vec![
            "/nonexistent/libnccl.so.2".to_string(),
            "libaccord-no-such-nccl.so".to_string(),
        ];
        let Err(e) = load_from(&cands) else {
            panic!("loaded a library that does not exist")
        };
        assert!(e.contains("/nonexistent/libnccl.so.2"), "{e}");
        assert!(e.contains("libaccord-no-such-nccl.so"), "{e}");
        assert!(e.contains("ACCORD_NCCL_LIBRARY"), "{e}");
    }

    #[test]
    fn a_library_without_nccl_symbols_is_refused_by_name() {
        // libc opens fine but is not NCCL.
        let Err(e) = load_from(&["libc.so.6".to_string()]) else {
            panic!("accepted libc as NCCL")
        };
        assert!(e.contains("libc.so.6: has no symbol ncclGetVersion"), "{e}");
    }

    #[test]
    fn version_codes() {
        assert_eq!(version_string(22809), "2.28.9");
        assert_eq!(version_string(2708), "2.7.8");
    }
}
