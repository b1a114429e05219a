//! GPUs: the CUDA driver, NCCL, NVML and NVRTC as Accord finds them, each device, and how
//! the devices are linked ([`accord::gpu::inventory`]).

use super::report::{bytes, Check, Section, Status};
use accord::gpu::inventory::{self, Inventory, LinkKind};
use serde_json::json;

/// The section, and the number of usable devices (0 when the driver is missing).
pub fn section(required: bool) -> (Section, usize) {
    let inv = inventory::inventory();
    let missing = if required { Status::Fail } else { Status::Info };
    let mut checks = vec![driver(&inv, missing)];
    let devices = inv.devices.as_ref().map(Vec::as_slice).unwrap_or_default();
    if inv.driver.is_ok() {
        checks.push(match &inv.devices {
            Err(e) => Check::new("devices", "devices", missing, format!("no GPU: {e}")),
            Ok(d) if d.is_empty() => Check::new(
                "devices",
                "devices",
                missing,
                format!(
                    "no GPU: the driver sees no device (CUDA_VISIBLE_DEVICES={})",
                    std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
                ),
            ),
            Ok(d) => listed(d),
        });
    }
    if devices.len() >= 2 {
        checks.push(links(&inv));
    }
    if !devices.is_empty() {
        checks.push(sharing(&inv));
    }
    checks.push(nccl(&inv, !devices.is_empty()));
    checks.push(match &inv.nvml {
        Ok(path) => Check::new("nvml", "NVML", Status::Info, format!("loaded from {path}"))
            .fact("library", path.as_str()),
        Err(e) => Check::new(
            "nvml",
            "NVML",
            Status::Info,
            format!("not loaded ({e}): NVLink and PCIe cannot be told apart"),
        )
        .fact("library", None::<String>),
    });
    if !devices.is_empty() {
        checks.push(nvrtc());
    }
    let n = devices.len();
    (
        Section {
            id: "gpu",
            title: "GPU",
            checks,
        },
        n,
    )
}

fn driver(inv: &Inventory, missing: Status) -> Check {
    match &inv.driver {
        Err(e) => {
            let mut c = Check::new(
                "cuda_driver",
                "CUDA driver",
                missing,
                format!("no GPU: {e}"),
            )
            .fact("found", false)
            .fact("error", e.as_str());
            if e.starts_with("CUDA driver library not found") {
                c = c.note("if the NVIDIA driver is installed elsewhere, set ACCORD_CUDA_LIBRARY");
            }
            c
        }
        Ok(d) => {
            let version = match &d.driver_version {
                Some(v) => format!("driver {v}, "),
                None => String::new(),
            };
            let mut c = Check::new(
                "cuda_driver",
                "CUDA driver",
                Status::Ok,
                format!(
                    "{version}CUDA {}.{}, from {}",
                    d.cuda_version.0, d.cuda_version.1, d.library
                ),
            )
            .fact("found", true)
            .fact("library", d.library.as_str())
            .fact(
                "cuda_version",
                format!("{}.{}", d.cuda_version.0, d.cuda_version.1),
            )
            .fact("driver_version", d.driver_version.clone());
            if let Err(e) = &d.sharing_calls {
                c.status = Status::Warn;
                c = c.note(e.as_str());
            }
            c
        }
    }
}

fn listed(devices: &[inventory::Device]) -> Check {
    let mut c = Check::new(
        "devices",
        "devices",
        Status::Ok,
        format!("{} visible", devices.len()),
    );
    let mut facts = Vec::new();
    for d in devices {
        c = c.note(format!(
            "{}: {} (sm_{}{}, {}, {} SMs, PCI {})",
            d.ordinal,
            d.name,
            d.compute_capability.0,
            d.compute_capability.1,
            bytes(d.memory_bytes),
            d.multiprocessors,
            d.pci_bus_id
        ));
        facts.push(json!({
            "ordinal": d.ordinal,
            "name": d.name,
            "compute_capability": format!("{}.{}", d.compute_capability.0, d.compute_capability.1),
            "memory_bytes": d.memory_bytes,
            "multiprocessors": d.multiprocessors,
            "pci_bus_id": d.pci_bus_id,
            "vmm": d.vmm,
            "posix_fd_handles": d.posix_fd_handles,
        }));
    }
    c.fact("count", devices.len()).fact("list", facts)
}

fn links(inv: &Inventory) -> Check {
    let pairs = inv.links.len();
    let peer = inv.links.iter().filter(|l| l.peer_access).count();
    let nvlink = inv
        .links
        .iter()
        .filter(|l| l.kind == LinkKind::NvLink)
        .count();
    let unknown = inv
        .links
        .iter()
        .filter(|l| matches!(l.kind, LinkKind::Unknown(_)))
        .count();
    let kinds = if unknown == pairs {
        "link kind unknown".to_string()
    } else {
        format!("{nvlink} over NVLink")
    };
    let mut c = Check::new(
        "links",
        "links",
        if peer == pairs {
            Status::Ok
        } else {
            Status::Warn
        },
        format!("{pairs} pair(s): {peer} with peer access, {kinds}"),
    );
    if peer < pairs {
        c = c.note(
            "pairs without peer access cannot map each other's memory: their traffic goes \
             through host memory, and Accord's own kernels do not run across them",
        );
    }
    let mut facts = Vec::new();
    for l in &inv.links {
        c = c.note(format!(
            "{}-{}: {}, {}",
            l.a,
            l.b,
            l.kind,
            if l.peer_access {
                "peer access"
            } else {
                "no peer access"
            }
        ));
        let (kind, detail) = match &l.kind {
            LinkKind::NvLink => ("nvlink", None),
            LinkKind::Pcie(p) => ("pcie", Some(p.clone())),
            LinkKind::Unknown(w) => ("unknown", Some(w.clone())),
        };
        facts.push(json!({"a": l.a, "b": l.b, "peer_access": l.peer_access, "kind": kind, "detail": detail}));
    }
    c.fact("pairs", facts)
}

fn sharing(inv: &Inventory) -> Check {
    let devices = inv.devices.as_ref().map(Vec::as_slice).unwrap_or_default();
    let lacking: Vec<String> = devices
        .iter()
        .filter(|d| !(d.vmm && d.posix_fd_handles))
        .map(|d| d.ordinal.to_string())
        .collect();
    let c = if lacking.is_empty() {
        Check::new(
            "memory_sharing",
            "memory sharing",
            Status::Ok,
            "every device supports VMM and POSIX file-descriptor handles (the symmetric heap)"
                .into(),
        )
    } else {
        Check::new(
            "memory_sharing",
            "memory sharing",
            Status::Warn,
            format!(
                "device(s) {} lack VMM or POSIX file-descriptor handles: the symmetric heap \
                 needs ACCORD_SYMMETRIC=ipc there",
                lacking.join(", ")
            ),
        )
    };
    c.fact(
        "ipc_calls",
        inv.driver
            .as_ref()
            .map(|d| d.sharing_calls.is_ok())
            .unwrap_or(false),
    )
}

fn nccl(inv: &Inventory, have_devices: bool) -> Check {
    match &inv.nccl {
        Ok(n) => Check::new(
            "nccl",
            "NCCL",
            Status::Ok,
            format!("{} from {}", n.version, n.library),
        )
        .fact("found", true)
        .fact("library", n.library.as_str())
        .fact("version", n.version.as_str()),
        Err(e) => {
            let first = e.lines().next().unwrap_or_default();
            let mut c = Check::new(
                "nccl",
                "NCCL",
                if have_devices {
                    Status::Warn
                } else {
                    Status::Info
                },
                if have_devices {
                    format!(
                        "{}: Accord's own kernels run the collectives of one host; set \
                         ACCORD_NCCL_LIBRARY to libnccl.so.2 or install nvidia-nccl-cu12",
                        first.split(';').next().unwrap_or(first)
                    )
                } else {
                    format!(
                        "{} (only GPU runs use it)",
                        first.split(';').next().unwrap_or(first)
                    )
                },
            )
            .fact("found", false)
            .fact("error", e.as_str());
            if have_devices {
                for line in e.lines().skip(1) {
                    c = c.note(line.trim());
                }
            }
            c
        }
    }
}

/// NVRTC compiles Accord's kernels at run time; compile an empty kernel for device 0.
fn nvrtc() -> Check {
    const PROBE: &str = "extern \"C\" __global__ void accord_doctor_probe() {}\n";
    match accord::gpu::cuda::nvrtc::compile(PROBE, "accord_doctor_probe.cu", &[], 0) {
        Ok(c) => Check::new(
            "nvrtc",
            "NVRTC",
            Status::Ok,
            format!(
                "compiles Accord's kernels for device 0 ({})",
                c.arch.trim_start_matches("--gpu-architecture=")
            ),
        )
        .fact("usable", true),
        Err(e) => Check::new(
            "nvrtc",
            "NVRTC",
            Status::Warn,
            format!("{e}: Accord's own kernels cannot run, so NCCL runs every collective"),
        )
        .fact("usable", false),
    }
}
