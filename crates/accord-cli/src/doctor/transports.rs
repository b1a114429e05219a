//! Whether ranks of this host can reach each other: Accord's shared-memory segments, the
//! `/dev/shm` that NCCL uses, and TCP on loopback.

use super::report::{bytes, Check, Section, Status};
use std::ffi::CString;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

pub fn section(np: usize) -> Section {
    Section {
        id: "transports",
        title: "Transports",
        checks: vec![shared_memory(np), dev_shm(), tcp_loopback()],
    }
}

/// Bytes of the segment each rank of `np` local ranks maps (`accord::transport::shm`).
pub fn segment_bytes(np: usize) -> u64 {
    accord::transport::shm::segment_bytes(np) as u64
}

/// Accord's shared memory: an anonymous `memfd` segment per rank that peers map by opening
/// `/proc/<pid>/fd/<fd>`. Tried here at the size a rank of `np` would create.
fn shared_memory(np: usize) -> Check {
    const ID: &str = "shared_memory";
    const NAME: &str = "shared memory";
    if !accord::config::get().shm {
        return Check::new(
            ID,
            NAME,
            Status::Info,
            "off: ACCORD_TRANSPORT=tcp, so ranks of one host talk over TCP".into(),
        )
        .fact("enabled", false);
    }
    let per_rank = segment_bytes(np);
    let check = match accord::transport::shm::probe_segment(np) {
        Ok(()) => Check::new(
            ID,
            NAME,
            Status::Ok,
            format!(
                "memfd segments map through /proc/<pid>/fd; {np} ranks map {} each, {} in all",
                bytes(per_rank),
                bytes(per_rank * np as u64)
            ),
        ),
        Err(e) => Check::new(
            ID,
            NAME,
            Status::Fail,
            format!(
                "{e}; every run with two ranks on this host would fail at init \
                 (set ACCORD_TRANSPORT=tcp to run over TCP only)"
            ),
        ),
    };
    check
        .fact("enabled", true)
        .fact("segment_bytes_per_rank", per_rank)
        .fact("segment_bytes_total", per_rank * np as u64)
}

/// Below this, NCCL's shared-memory transport can run out (NVIDIA suggests `--shm-size=1g`
/// for containers; Docker's default is 64 MiB).
const DEV_SHM_ADVISED: u64 = 1 << 30;

/// `/dev/shm`: Accord's host transport does not use it, NCCL's shared-memory transport does.
fn dev_shm() -> Check {
    const ID: &str = "dev_shm";
    const NAME: &str = "/dev/shm";
    let why = "NCCL keeps its shared-memory buffers there; Accord's host transport does not use it";
    let (total, free) = match statvfs("/dev/shm") {
        Ok(v) => v,
        Err(e) => {
            return Check::new(ID, NAME, Status::Warn, format!("missing: {e}"))
                .note(why)
                .fact("present", false)
                .fact("writable", false)
        }
    };
    let probe =
        std::path::Path::new("/dev/shm").join(format!("accord-doctor-{}", std::process::id()));
    let writable = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .and_then(|mut f| f.write_all(b"accord"));
    let _ = std::fs::remove_file(&probe);
    let (status, summary) = match &writable {
        Err(e) => (Status::Warn, format!("not writable: {e}")),
        Ok(()) if total < DEV_SHM_ADVISED => (
            Status::Warn,
            format!(
                "only {} ({} free): NCCL can run out below 1 GiB (containers: --shm-size=1g)",
                bytes(total),
                bytes(free)
            ),
        ),
        Ok(()) => (
            Status::Ok,
            format!("writable, {} ({} free)", bytes(total), bytes(free)),
        ),
    };
    Check::new(ID, NAME, status, summary)
        .note(why)
        .fact("present", true)
        .fact("writable", writable.is_ok())
        .fact("size_bytes", total)
        .fact("free_bytes", free)
}

/// Size and space available to unprivileged users of the filesystem at `path`.
fn statvfs(path: &str) -> Result<(u64, u64), String> {
    let c = CString::new(path).map_err(|_| format!("{path}: a NUL in the path"))?;
    // SAFETY: a plain-data struct the call fills in.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a struct to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(format!("{path}: {}", std::io::Error::last_os_error()));
    }
    let unit = s.f_frsize as u64;
    Ok((s.f_blocks as u64 * unit, s.f_bavail as u64 * unit))
}

/// TCP on 127.0.0.1: the rendezvous store and every rank's connections to its peers use TCP,
/// so every run needs it (shared memory only adds to it).
fn tcp_loopback() -> Check {
    const ID: &str = "tcp_loopback";
    const NAME: &str = "TCP loopback";
    let host = hostname();
    let resolved: Vec<String> = (host.as_str(), 0)
        .to_socket_addrs()
        .map(|a| a.map(|a| a.ip().to_string()).collect())
        .unwrap_or_default();
    let names = match resolved.as_slice() {
        [] => format!(
            "host name {host:?} does not resolve: set ACCORD_ADVERTISE_HOST to this host's \
             address for runs across hosts"
        ),
        a => format!("host name {host:?} resolves to {}", a.join(", ")),
    };
    let check = match echo_round_trips(200) {
        Ok(rtt) => Check::new(
            ID,
            NAME,
            Status::Ok,
            format!(
                "127.0.0.1 accepts, connects and echoes; round trip {:.1} us (median of 200)",
                rtt.as_secs_f64() * 1e6
            ),
        )
        .fact("usable", true)
        .fact("round_trip_us", rtt.as_secs_f64() * 1e6),
        Err(e) => Check::new(
            ID,
            NAME,
            Status::Fail,
            format!("{e}: the rendezvous store and the ranks' connections need TCP"),
        )
        .fact("usable", false)
        .fact("error", e),
    };
    check
        .note(names)
        .fact("hostname", host)
        .fact("hostname_addresses", resolved)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Bind, connect, accept, and time `n` one-byte echoes; the median round trip.
fn echo_round_trips(n: usize) -> Result<Duration, String> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot bind 127.0.0.1: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut b = [0u8; 1];
        while s.read(&mut b)? == 1 {
            s.write_all(&b)?;
        }
        Ok(())
    });
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let io = |e: std::io::Error| format!("echo over {addr} failed: {e}");
    s.set_nodelay(true).map_err(io)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(io)?;
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        s.write_all(&[i as u8]).map_err(io)?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b).map_err(io)?;
        if b[0] != i as u8 {
            return Err(format!("echo over {addr} returned the wrong byte"));
        }
        times.push(t.elapsed());
    }
    drop(s);
    let _ = echo.join();
    times.sort();
    Ok(times[times.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_maps_twice_and_both_mappings_agree() {
        accord::transport::shm::probe_segment(2).unwrap();
    }

    #[test]
    fn segments_grow_by_one_ring_per_local_rank() {
        let ring = accord::config::get().shm_ring_bytes as u64;
        assert_eq!(segment_bytes(9) - segment_bytes(8), ring);
    }

    #[test]
    fn loopback_echoes() {
        assert!(echo_round_trips(5).unwrap() < Duration::from_secs(2));
    }
}
