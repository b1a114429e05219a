//! Compiled kernels kept on disk between processes, so that the second run of a job (and every
//! rank after the first on a host) loads an image instead of compiling it: NVRTC takes about a
//! second per module.
//!
//! Files live in `$XDG_CACHE_HOME/accord/kernels-<version>` (else `~/.cache/...`, else the
//! temporary directory), named by a hash of the source, the options and the architecture;
//! `ACCORD_KERNEL_CACHE=0` turns the cache off. A file that cannot be read or does not start
//! with the expected header is ignored and rewritten; a file that cannot be written is skipped.

use std::path::PathBuf;

const MAGIC: &[u8] = b"accord-kernel v1\n";

/// The cache file for this compilation, or `None` with the cache off.
pub(super) fn path(source: &str, options: &[String], cc: (i32, i32)) -> Option<PathBuf> {
    if std::env::var("ACCORD_KERNEL_CACHE").is_ok_and(|v| v.trim() == "0") {
        return None;
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    let mut key = Vec::new();
    key.extend_from_slice(source.as_bytes());
    for o in options {
        key.push(0);
        key.extend_from_slice(o.as_bytes());
    }
    key.extend_from_slice(format!("\0sm_{}{}", cc.0, cc.1).as_bytes());
    // Two differently seeded 64-bit FNV-1a hashes: 128 bits name the file.
    let fnv = |seed: u64| {
        key.iter().fold(seed, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    };
    let name = format!(
        "{:016x}{:016x}",
        fnv(0xcbf2_9ce4_8422_2325),
        fnv(0x8422_2325_cbf2_9ce4)
    );
    Some(
        base.join("accord")
            .join(format!("kernels-{}", env!("CARGO_PKG_VERSION")))
            .join(name),
    )
}

/// The image and architecture option stored at `path`, if it holds a valid entry.
pub(super) fn load(path: &PathBuf) -> Option<(Vec<u8>, String)> {
    let bytes = std::fs::read(path).ok()?;
    let rest = bytes.strip_prefix(MAGIC)?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let arch = std::str::from_utf8(&rest[..nl]).ok()?.to_string();
    let image = rest[nl + 1..].to_vec();
    (!image.is_empty()).then_some((image, arch))
}

/// Store an entry (written aside and renamed: readers never see half a file).
pub(super) fn store(path: &PathBuf, image: &[u8], arch: &str) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut data = MAGIC.to_vec();
    data.extend_from_slice(arch.as_bytes());
    data.push(b'\n');
    data.extend_from_slice(image);
    if std::fs::write(&tmp, &data).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_bad_files_are_ignored() {
        let dir = std::env::temp_dir().join(format!("accord-kc-{}", std::process::id()));
        let p = dir.join("entry");
        store(&p, b"\x7fELF image", "--gpu-architecture=sm_90");
        assert_eq!(
            load(&p),
            Some((b"\x7fELF image".to_vec(), "--gpu-architecture=sm_90".into()))
        );
        std::fs::write(&p, b"something else").unwrap();
        assert_eq!(load(&p), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn names_depend_on_source_options_and_architecture() {
        let a = path("k", &[], (9, 0));
        if a.is_none() {
            return; // ACCORD_KERNEL_CACHE=0 in this environment
        }
        assert_ne!(a, path("k2", &[], (9, 0)));
        assert_ne!(a, path("k", &["-DX".into()], (9, 0)));
        assert_ne!(a, path("k", &[], (8, 0)));
        assert_eq!(a, path("k", &[], (9, 0)));
    }
}
