//! Where CUDA's run-time libraries (NVRTC, cuFFT...) may be installed: the toolkit, then the
//! NVIDIA pip wheels of the Python environments on this host.

use std::path::{Path, PathBuf};

/// Directories that may hold a library of the wheel `nvidia/{wheel}/lib`, in the order to try
/// them: `$CUDA_HOME/lib64`, `/usr/local/cuda/lib64`, then in every site-packages found
/// (`$VIRTUAL_ENV`, `/opt/*/.venv`, the system's dist-packages) the wheel's own directory and
/// CUDA 13's shared `nvidia/cu13/lib`. `env` looks variables up (a parameter so tests can fake
/// it); empty values count as unset.
pub(crate) fn library_dirs(env: &dyn Fn(&str) -> Option<String>, wheel: &str) -> Vec<PathBuf> {
    let var = |k: &str| env(k).filter(|v| !v.is_empty());
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(h) = var("CUDA_HOME") {
        dirs.push(Path::new(&h).join("lib64"));
    }
    dirs.push("/usr/local/cuda/lib64".into());
    let mut site: Vec<PathBuf> = Vec::new();
    if let Some(v) = var("VIRTUAL_ENV") {
        site.extend(python_dirs(&Path::new(&v).join("lib"), "site-packages"));
    }
    if let Ok(opt) = std::fs::read_dir("/opt") {
        for e in opt.flatten() {
            site.extend(python_dirs(&e.path().join(".venv/lib"), "site-packages"));
        }
    }
    site.extend(python_dirs(Path::new("/usr/local/lib"), "dist-packages"));
    site.extend(python_dirs(Path::new("/usr/lib"), "dist-packages"));
    for s in site {
        dirs.push(s.join("nvidia").join(wheel).join("lib"));
        dirs.push(s.join("nvidia/cu13/lib"));
    }
    dirs
}

/// `{dir}/python3.*/{leaf}` directories.
fn python_dirs(dir: &Path, leaf: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join(leaf))
        .filter(|p| p.is_dir())
        .collect()
}
