//! What GPU work would find here: the CUDA driver and NCCL that Accord loads (and from where),
//! every visible device, and how each pair of devices is linked.
//!
//! Peer access comes from the driver (`cuDeviceCanAccessPeer`). Whether a pair talks over
//! NVLink or PCIe only NVML knows: `libnvidia-ml.so.1` is opened at run time when present, and
//! without it the link kind is reported as unknown. Nothing here fails: each part holds its
//! value or the reason it is missing, for `accord doctor` to print.

use super::cuda::{self, CuResult};
use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

super::cuda::symbol_table! {
    /// Driver queries the inventory needs beyond the table every GPU operation uses.
    Queries {
        driver_get_version: "cuDriverGetVersion" => fn(*mut c_int) -> CuResult;
        device_get_name: "cuDeviceGetName" => fn(*mut c_char, c_int, c_int) -> CuResult;
        device_total_mem: "cuDeviceTotalMem_v2" => fn(*mut usize, c_int) -> CuResult;
        device_get_attribute: "cuDeviceGetAttribute" => fn(*mut c_int, c_int, c_int) -> CuResult;
        device_can_access_peer: "cuDeviceCanAccessPeer" => fn(*mut c_int, c_int, c_int) -> CuResult;
        device_get_pci_bus_id: "cuDeviceGetPCIBusId" => fn(*mut c_char, c_int, c_int) -> CuResult;
    }
}

super::cuda::symbol_table! {
    /// The NVML calls that tell NVLink from PCIe.
    Nvml {
        init: "nvmlInit_v2" => fn() -> c_int;
        shutdown: "nvmlShutdown" => fn() -> c_int;
        error_string: "nvmlErrorString" => fn(c_int) -> *const c_char;
        driver_version: "nvmlSystemGetDriverVersion" => fn(*mut c_char, c_uint) -> c_int;
        handle_by_pci_bus_id: "nvmlDeviceGetHandleByPciBusId_v2" => fn(*const c_char, *mut *mut c_void) -> c_int;
        p2p_status: "nvmlDeviceGetP2PStatus" => fn(*mut c_void, *mut c_void, c_int, *mut c_int) -> c_int;
        common_ancestor: "nvmlDeviceGetTopologyCommonAncestor" => fn(*mut c_void, *mut c_void, *mut c_int) -> c_int;
    }
}

const ATTR_MULTIPROCESSORS: c_int = 16;
const ATTR_CC_MAJOR: c_int = 75;
const ATTR_CC_MINOR: c_int = 76;
const ATTR_VMM_SUPPORTED: c_int = 102;
const ATTR_POSIX_FD_SUPPORTED: c_int = 103;
/// `NVML_P2P_CAPS_INDEX_NVLINK` and `NVML_P2P_STATUS_OK`.
const NVML_CAPS_NVLINK: c_int = 2;
const NVML_P2P_OK: c_int = 0;

/// Everything found, each part with the reason where it is missing.
#[derive(Debug, Clone)]
pub struct Inventory {
    /// The CUDA driver, or why it cannot be used.
    pub driver: Result<DriverInfo, String>,
    /// NCCL as Accord would load it (see [`super::nccl`] for the search), or why not.
    pub nccl: Result<NcclInfo, String>,
    /// Where NVML was loaded from, or why it was not.
    pub nvml: Result<String, String>,
    /// The visible devices, or the query that failed (empty without a driver).
    pub devices: Result<Vec<Device>, String>,
    /// Every pair of visible devices, lower ordinal first.
    pub links: Vec<Link>,
}

/// The loaded CUDA driver.
#[derive(Debug, Clone)]
pub struct DriverInfo {
    /// The file the driver was loaded from.
    pub library: String,
    /// The newest CUDA version the driver supports, e.g. `(12, 4)`.
    pub cuda_version: (i32, i32),
    /// The kernel driver's version (e.g. `550.54.15`), when NVML says.
    pub driver_version: Option<String>,
    /// `Ok` when the driver has the memory-sharing calls (VMM and IPC) that Accord's kernels
    /// need to map one process's GPU memory into another's; else the calls it lacks.
    pub sharing_calls: Result<(), String>,
}

/// The NCCL Accord loads.
#[derive(Debug, Clone)]
pub struct NcclInfo {
    /// The file it was loaded from.
    pub library: String,
    /// Its version, e.g. `2.21.5`.
    pub version: String,
}

/// One visible device.
#[derive(Debug, Clone)]
pub struct Device {
    /// Its CUDA ordinal (after `CUDA_VISIBLE_DEVICES`).
    pub ordinal: usize,
    /// The product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// `(major, minor)`, e.g. `(9, 0)`.
    pub compute_capability: (i32, i32),
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: i32,
    /// The PCI address, e.g. `0000:1B:00.0`.
    pub pci_bus_id: String,
    /// Virtual memory management (`cuMemCreate`, `cuMemMap`) is supported.
    pub vmm: bool,
    /// Allocations can be shared as POSIX file descriptors (how Accord's symmetric heap
    /// shares memory by default; `ACCORD_SYMMETRIC=ipc` uses CUDA IPC handles instead).
    pub posix_fd_handles: bool,
}

/// How two devices are connected.
#[derive(Debug, Clone)]
pub struct Link {
    /// The lower ordinal.
    pub a: usize,
    /// The higher ordinal.
    pub b: usize,
    /// Each can map the other's memory (`cuDeviceCanAccessPeer`, both directions).
    pub peer_access: bool,
    /// NVLink, PCIe, or unknown.
    pub kind: LinkKind,
}

/// The physical path between two devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkKind {
    /// NVLink (directly or through NVSwitch).
    NvLink,
    /// PCIe; the text is the closest common ancestor as `nvidia-smi topo -m` names it, e.g.
    /// `PIX (one PCIe switch)`.
    Pcie(String),
    /// NVML could not tell; the text says why.
    Unknown(String),
}

impl std::fmt::Display for LinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkKind::NvLink => write!(f, "NVLink"),
            LinkKind::Pcie(path) => write!(f, "PCIe, {path}"),
            LinkKind::Unknown(why) => write!(f, "unknown ({why})"),
        }
    }
}

/// Look at the driver, NCCL, every visible device and every pair of them.
pub fn inventory() -> Inventory {
    let nccl = super::nccl::nccl()
        .map(|n| NcclInfo {
            library: library_of(n.get_version as *const c_void).unwrap_or_else(|| n.path.clone()),
            version: n.version_string(),
        })
        .map_err(plain);
    let nvml = NvmlLib::open();
    let mut inv = Inventory {
        driver: Err(String::new()),
        nccl,
        nvml: nvml.as_ref().map(|n| n.path.clone()).map_err(Clone::clone),
        devices: Ok(Vec::new()),
        links: Vec::new(),
    };
    // Opened before the driver proper, so that a missing library reads differently from a
    // driver that fails to start. When the driver is loaded this returns its own handle, which
    // stays loaded as long as `lib`, and `lib` outlives every call through `q`.
    let name = crate::config::get().cuda_library.clone();
    // SAFETY: opening the CUDA driver runs its initialisers, which have no preconditions.
    let lib = match unsafe { Library::new(&name) } {
        Ok(l) => l,
        Err(e) => {
            inv.driver = Err(format!("CUDA driver library not found: {e}"));
            return inv;
        }
    };
    let cu = match cuda::driver() {
        Ok(cu) => cu,
        Err(e) => {
            inv.driver = Err(plain(e));
            return inv;
        }
    };
    let resolve = |sym: &CStr| {
        // SAFETY: only the symbol's address is read; `resolve` gives it its type.
        unsafe { lib.get::<*mut c_void>(sym.to_bytes_with_nul()) }
            .ok()
            .map(|s| *s)
    };
    let q = match Queries::resolve(&resolve) {
        Ok(q) => q,
        Err(missing) => {
            inv.driver = Err(format!("{name} lacks {}", missing.join(", ")));
            return inv;
        }
    };
    let mut version = 0;
    // SAFETY: writes one int.
    let rc = unsafe { (q.driver_get_version)(&mut version) };
    inv.driver = Ok(DriverInfo {
        library: library_of(q.driver_get_version as *const c_void).unwrap_or(name),
        cuda_version: if rc == 0 {
            (version / 1000, version % 1000 / 10)
        } else {
            (0, 0)
        },
        driver_version: nvml.as_ref().ok().and_then(NvmlLib::driver_version),
        sharing_calls: cu.vmm().map(|_| ()).map_err(|e| e.to_string()),
    });
    let devices = match devices(cu, &q) {
        Ok(d) => d,
        Err(e) => {
            inv.devices = Err(e);
            return inv;
        }
    };
    for a in 0..devices.len() {
        for b in a + 1..devices.len() {
            let peer = |x: &Device, y: &Device| {
                let mut can = 0;
                // SAFETY: writes one int; both are valid device handles (ordinals).
                let rc = unsafe {
                    (q.device_can_access_peer)(&mut can, x.ordinal as c_int, y.ordinal as c_int)
                };
                rc == 0 && can == 1
            };
            inv.links.push(Link {
                a,
                b,
                peer_access: peer(&devices[a], &devices[b]) && peer(&devices[b], &devices[a]),
                kind: match &nvml {
                    Ok(n) => n.link(&devices[a].pci_bus_id, &devices[b].pci_bus_id),
                    Err(_) => LinkKind::Unknown("NVML is not available".into()),
                },
            });
        }
    }
    inv.devices = Ok(devices);
    inv
}

/// The message of an error, without the "unsupported" its kind adds.
fn plain(e: crate::Error) -> String {
    match e {
        crate::Error::Unsupported(m) => m,
        e => e.to_string(),
    }
}

/// Every visible device's properties.
fn devices(cu: &cuda::Driver, q: &Queries) -> Result<Vec<Device>, String> {
    let n = cu.device_count().map_err(|e| e.to_string())?;
    let check = |rc: CuResult, what: &str| cu.check(rc, what).map_err(|e| e.to_string());
    let mut out = Vec::with_capacity(n);
    for ordinal in 0..n {
        let mut dev = 0;
        // SAFETY: out-pointers to locals and buffers of the stated lengths; `dev` comes from
        // cuDeviceGet for an ordinal below the device count.
        unsafe {
            check((cu.device_get)(&mut dev, ordinal as c_int), "cuDeviceGet")?;
            let attr = |a: c_int| {
                let mut v = 0;
                check(
                    (q.device_get_attribute)(&mut v, a, dev),
                    "cuDeviceGetAttribute",
                )
                .map(|_| v)
            };
            let mut name = [0 as c_char; 256];
            check(
                (q.device_get_name)(name.as_mut_ptr(), name.len() as c_int, dev),
                "cuDeviceGetName",
            )?;
            let mut bus = [0 as c_char; 64];
            check(
                (q.device_get_pci_bus_id)(bus.as_mut_ptr(), bus.len() as c_int, dev),
                "cuDeviceGetPCIBusId",
            )?;
            let mut bytes = 0usize;
            check((q.device_total_mem)(&mut bytes, dev), "cuDeviceTotalMem")?;
            out.push(Device {
                ordinal,
                name: CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned(),
                compute_capability: (attr(ATTR_CC_MAJOR)?, attr(ATTR_CC_MINOR)?),
                memory_bytes: bytes as u64,
                multiprocessors: attr(ATTR_MULTIPROCESSORS)?,
                pci_bus_id: CStr::from_ptr(bus.as_ptr()).to_string_lossy().into_owned(),
                vmm: attr(ATTR_VMM_SUPPORTED)? == 1,
                posix_fd_handles: attr(ATTR_POSIX_FD_SUPPORTED)? == 1,
            });
        }
    }
    Ok(out)
}

/// The file of the shared library that holds `addr`.
fn library_of(addr: *const c_void) -> Option<String> {
    // SAFETY: dladdr only reads the loader's tables; the name it returns lives as long as the
    // library, which is loaded.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        Some(
            CStr::from_ptr(info.dli_fname)
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// NVML, initialised; shut down when dropped.
struct NvmlLib {
    calls: Nvml,
    path: String,
    _lib: Library,
}

impl NvmlLib {
    fn open() -> Result<NvmlLib, String> {
        const NAME: &str = "libnvidia-ml.so.1";
        // SAFETY: opening NVML runs its initialisers, which have no preconditions.
        let lib = unsafe { Library::new(NAME) }.map_err(|e| e.to_string())?;
        let resolve = |sym: &CStr| {
            // SAFETY: only the symbol's address is read; `resolve` gives it its type.
            unsafe { lib.get::<*mut c_void>(sym.to_bytes_with_nul()) }
                .ok()
                .map(|s| *s)
        };
        let calls =
            Nvml::resolve(&resolve).map_err(|m| format!("{NAME} lacks {}", m.join(", ")))?;
        // SAFETY: no arguments; paired with nvmlShutdown in Drop.
        let rc = unsafe { (calls.init)() };
        if rc != 0 {
            return Err(format!("nvmlInit failed: {}", nvml_text(&calls, rc)));
        }
        Ok(NvmlLib {
            path: library_of(calls.init as *const c_void).unwrap_or_else(|| NAME.into()),
            calls,
            _lib: lib,
        })
    }

    fn text(&self, rc: c_int) -> String {
        nvml_text(&self.calls, rc)
    }

    fn driver_version(&self) -> Option<String> {
        let mut buf = [0 as c_char; 96];
        // SAFETY: writes at most `len` bytes, NUL-terminated.
        let rc = unsafe { (self.calls.driver_version)(buf.as_mut_ptr(), buf.len() as c_uint) };
        // SAFETY: NUL-terminated on success.
        (rc == 0).then(|| {
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        })
    }

    fn handle(&self, bus_id: &str) -> Result<*mut c_void, String> {
        let c = std::ffi::CString::new(bus_id).map_err(|_| "bad PCI bus id".to_string())?;
        let mut h = std::ptr::null_mut();
        // SAFETY: a NUL-terminated string and one out-pointer.
        match unsafe { (self.calls.handle_by_pci_bus_id)(c.as_ptr(), &mut h) } {
            0 => Ok(h),
            rc => Err(format!("NVML does not know {bus_id}: {}", self.text(rc))),
        }
    }

    /// How the devices at PCI addresses `a` and `b` are linked.
    fn link(&self, a: &str, b: &str) -> LinkKind {
        let (ha, hb) = match (self.handle(a), self.handle(b)) {
            (Ok(ha), Ok(hb)) => (ha, hb),
            (Err(e), _) | (_, Err(e)) => return LinkKind::Unknown(e),
        };
        let mut status = -1;
        // SAFETY: two handles from NVML and one out-pointer.
        let rc = unsafe { (self.calls.p2p_status)(ha, hb, NVML_CAPS_NVLINK, &mut status) };
        if rc == 0 && status == NVML_P2P_OK {
            return LinkKind::NvLink;
        }
        let mut level = -1;
        // SAFETY: as above.
        match unsafe { (self.calls.common_ancestor)(ha, hb, &mut level) } {
            0 => LinkKind::Pcie(topology_level(level)),
            rc => LinkKind::Unknown(format!(
                "not NVLink; nvmlDeviceGetTopologyCommonAncestor failed: {}",
                self.text(rc)
            )),
        }
    }
}

impl Drop for NvmlLib {
    fn drop(&mut self) {
        // SAFETY: paired with the successful nvmlInit in `open`.
        unsafe { (self.calls.shutdown)() };
    }
}

/// NVML's words for a result code.
fn nvml_text(calls: &Nvml, rc: c_int) -> String {
    // SAFETY: NVML returns a static string for any code.
    let s = unsafe { (calls.error_string)(rc) };
    if s.is_null() {
        format!("NVML error {rc}")
    } else {
        // SAFETY: non-null and NUL-terminated.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

/// `nvmlGpuTopologyLevel_t` in the words of `nvidia-smi topo -m`.
fn topology_level(level: c_int) -> String {
    match level {
        0 => "same board".into(),
        10 => "PIX (one PCIe switch)".into(),
        20 => "PXB (several PCIe switches)".into(),
        30 => "PHB (through the CPU's PCIe host bridge)".into(),
        40 => "NODE (between PCIe host bridges of one NUMA node)".into(),
        50 => "SYS (across CPU sockets)".into(),
        l => format!("topology level {l}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_says_why_it_is_missing() {
        let inv = inventory();
        if let Err(why) = &inv.driver {
            assert!(!why.is_empty());
            assert!(inv.links.is_empty());
            assert_eq!(inv.devices.as_ref().map(Vec::len), Ok(0));
        }
        if let Err(why) = &inv.nccl {
            assert!(why.contains("NCCL"), "{why}");
        }
        if let Err(why) = &inv.nvml {
            assert!(why.contains("libnvidia-ml.so.1"), "{why}");
        }
        if let Ok(devices) = &inv.devices {
            let n = devices.len();
            assert_eq!(inv.links.len(), n * n.saturating_sub(1) / 2);
        }
    }

    #[test]
    fn the_library_of_a_libc_function_is_libc() {
        let path = library_of(libc::getpid as *const c_void).expect("dladdr finds libc");
        assert!(path.contains("libc"), "{path}");
    }

    #[test]
    fn topology_levels_read_as_nvidia_smi_names_them() {
        assert!(topology_level(10).starts_with("PIX"));
        assert!(topology_level(50).starts_with("SYS"));
        assert_eq!(
            LinkKind::Pcie(topology_level(30)).to_string(),
            "PCIe, PHB (through the CPU's PCIe host bridge)"
        );
    }
}
