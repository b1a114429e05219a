//! Tunables and limits, read from the environment once per process.
//!
//! [`get`] reads every variable below the first time anything asks and keeps the result for the
//! life of the process; setting one of them later has no effect. [`Config::from_lookup`] parses
//! the same variables through any lookup, so tests need not touch the process environment.
//! A value that does not parse counts as unset: the default applies (so does one that is not
//! UTF-8, with a warning; but an `ACCORD_TUNER_PROFILE` that is not fails the start). Sizes are
//! in bytes, times as noted; "trimmed" means surrounding whitespace is ignored.
//!
//! | Variable | Type | Default | Meaning |
//! |---|---|---|---|
//! | `ACCORD_TIMEOUT` | seconds (fractional, > 0; trimmed) | 300 | deadline of every blocking call of a communicator |
//! | `ACCORD_EXPLAIN` | `1` (trimmed) | off | rank 0 prints which algorithm each collective uses and why |
//! | `ACCORD_ALGO_<OP>` | algorithm name | cost model | force the algorithm of one collective, e.g. `ACCORD_ALGO_ALLREDUCE=ring`, `ACCORD_ALGO_REDUCE_SCATTER=rabenseifner`; a name that does not apply is warned about and ignored; the same on every rank |
//! | `ACCORD_TUNER_PROFILE` | path of a profile | built-in costs | the tuner prices algorithms with the TCP and shared-memory costs `accord bench --calibrate` measured (`schedule::calibrated`); an unreadable profile fails the start; the same costs on every rank |
//! | `ACCORD_CHUNK_BYTES` | bytes | 524288 | largest frame payload; rounded down to a multiple of 8 within 8 B..64 MiB |
//! | `ACCORD_MAX_UNMATCHED_BYTES` | bytes (> 0; trimmed) | 1 GiB | frames one peer may leave in a mailbox that no receive has taken |
//! | `ACCORD_HOST` | host or IP (blank: unset) | the advertised address | where TCP listens ([`crate::transport::tcp`]) |
//! | `ACCORD_ADVERTISE_HOST` | host or IP (blank: unset) | `ACCORD_HOST` if specific, else this host name's address | where peers are told to connect |
//! | `ACCORD_TRANSPORT` | `tcp` (trimmed) | shared memory allowed | `tcp` on any rank turns shared memory off for all |
//! | `ACCORD_HOST_ID` | string | host name + boot id | ranks with equal ids share memory |
//! | `ACCORD_SHM_P2P` | `0`/`off`/`no` (trimmed) | on | point-to-point traffic between local ranks through shared-memory rings |
//! | `ACCORD_SHM_CMA` | `0`/`off`/`no` (trimmed) | on | single-copy transfers with `process_vm_readv`; the same on every rank |
//! | `ACCORD_SHM_CHUNK_BYTES` | bytes (trimmed) | 1 MiB | one staging half; rounded down to a multiple of 64 within 4 KiB..256 MiB; the same on every rank |
//! | `ACCORD_SHM_RING_BYTES` | bytes (trimmed) | 512 KiB | one point-to-point ring; rounded down to a multiple of 4096 within 16 KiB..256 MiB; the same on every rank |
//! | `ACCORD_HIERARCHY` | `0`/`off`/`no` (trimmed) | on | collectives of ranks on several hosts compose shared memory inside hosts with the host leaders' (or stripes') steps over the network (`comm::hierarchy`); off: one schedule over the point-to-point transport (shared-memory rings between local ranks, TCP between hosts); the same on every rank |
//! | `ACCORD_HIER_STRIPE_BYTES` | bytes (trimmed) | 64 KiB | allreduces across hosts from this size are striped, one slice per local rank; smaller ones on hosts of two ranks whose copies together stay below it run whole on every local rank's stripe (`comm::hierarchy`); the same on every rank |
//! | `ACCORD_HIER_PIPELINE_BYTES` | bytes (trimmed) | 32 MiB | striped allreduces from this size run in 4 pieces, each piece's step between hosts overlapping the host steps of the others (`comm::hierarchy`); the same on every rank |
//! | `ACCORD_HIER_BLOCKS_BYTES` | bytes (trimmed) | 1 MiB | reduce-scatters and allgathers across hosts (equal blocks, hosts of equal rank counts) whose whole buffer is below this size go over the stripes; larger ones take one schedule over the transport; the same on every rank |
//! | `ACCORD_HIER_ALLTOALL_BLOCK_BYTES` | bytes (trimmed) | 32 KiB | regular all-to-alls across hosts (hosts of equal rank counts) whose blocks (the bytes a rank sends each rank) are below this size go over the stripes; larger ones, and all-to-all-v, take one schedule over every rank; the same on every rank |
//! | `ACCORD_TCP_POLL_US` | microseconds (trimmed) | 50 | how long a wait for a small TCP message reads its peer's socket itself (renewed while bytes come) before sleeping; 0: sleep at once |
//! | `ACCORD_TCP_PUMP_BYTES` | bytes (trimmed) | 1 MiB | waits for TCP messages below this size read the peer's socket themselves; from 64 KiB only where every rank of the host and its reader thread can have a CPU of their own |
//! | `ACCORD_TCP_LANES` | count 1-8 (trimmed) | this process's usable CPUs / the ranks drawing on them (of any host name: network namespaces of one machine), 1 to 4 | TCP connections a rank opens to each lower rank; messages from `ACCORD_TCP_STRIPE_BYTES` are dealt over them ([`crate::transport::tcp`]) |
//! | `ACCORD_TCP_STRIPE_BYTES` | bytes (trimmed) | 256 KiB | TCP messages from this size are dealt over a pair's connections, in at least one frame per connection |
//! | `ACCORD_TCP_BUSY_POLL_US` | microseconds (trimmed) | off (the kernel's `net.core.busy_read`) | `SO_BUSY_POLL` on every TCP connection: a read finding nothing polls the network device's queue itself (NICs with NAPI) instead of waiting for its interrupt; some kernels let only processes with `CAP_NET_ADMIN` raise it above `net.core.busy_read`; a rank that cannot set it fails to start, naming this variable ([`crate::transport::tcp`]) |
//! | `ACCORD_SHM_SPIN_US` | microseconds (trimmed) | 50 (crowded: 0, rings 2) | how long a shared-memory wait spins before yielding |
//! | `ACCORD_SHM_YIELD_US` | microseconds (trimmed) | 500 (crowded: 5000) | how long it then yields before sleeping |
//! | `ACCORD_PIECE_BYTES` | bytes (trimmed) | 8 MiB | allreduces that run as a schedule over the transport (TCP, or shared-memory rings with the hierarchy off) and are larger than twice this size run as consecutive allreduces on pieces of at most this size (at most 256 pieces), whose bytes stay in the caches while they are reduced (`schedule::pieces`); 0: never; the same on every rank |
//! | `ACCORD_SHM_SMALL_BYTES` | bytes (trimmed) | 16 KiB | shared-memory allreduces up to this size take the one-barrier path (the shared-memory collectives); the same on every rank |
//! | `ACCORD_SHM_CMA_BYTES` | bytes (trimmed) | off | from this size, broadcast and allgather readers copy straight out of the owner's buffer; the same on every rank |
//! | `ACCORD_SHM_STREAM_BYTES` | bytes (trimmed) | 2 MiB | copies into user buffers from this size use non-temporal stores |
//! | `ACCORD_SHM_SLOT_BYTES` | bytes (trimmed) | 64 KiB | slot size of pipelined shared-memory broadcasts; the same on every rank |
//! | `ACCORD_GPU_WATCHDOG` | `0` | on | the watchdog that aborts NCCL on timeouts and errors |
//! | `ACCORD_GPU_ENGINE` | `auto`, `accord` or `nccl` (trimmed, any case) | `auto` | who runs collectives on GPU memory: `auto` picks Accord's own kernels or NCCL per call by size (see [`crate::gpu`]), `accord` runs Accord's kernels wherever they apply, `nccl` never uses them |
//! | `ACCORD_GPU_CHUNK_BYTES` | bytes (trimmed) | 1 MiB | bytes one round of Accord's GPU kernels moves per pair of ranks; rounded down to a multiple of 4 KiB within 64 KiB..64 MiB; equal on the ranks of a GPU communicator, which compares them |
//! | `ACCORD_GPU_LL_BYTES` | bytes (trimmed) | 256 KiB | the largest call Accord's GPU kernels send as LL packets (a one-shot allreduce's message; an allgather's, reduce-scatter's or alltoall's block per rank); at most 256 KiB; equal on the ranks of a GPU communicator, which compares them |
//! | `ACCORD_GPU_ALLTOALL_SELF` | `copy` (any case) | inside the NCCL group | how alltoall moves a rank's own block |
//! | `ACCORD_NCCL_INIT` | `blocking` | with a deadline | NCCL's plain blocking communicator init |
//! | `ACCORD_NCCL_LIBRARY` | path | search | the NCCL library to load |
//! | `ACCORD_CUDA_LIBRARY` | path | `libcuda.so.1` | the CUDA driver library to load |
//! | `ACCORD_NVRTC_LIBRARY` | path | search (see [`crate::gpu::cuda::nvrtc`]) | the NVRTC library that compiles kernels at run time |
//! | `ACCORD_CUFFT_LIBRARY` | path | search (see [`crate::gpu::cuda::cufft`]) | the cuFFT library the distributed FFT's device transforms load |
//! | `ACCORD_KERNEL_CACHE` | `0` (trimmed) | on | keep kernels compiled with NVRTC in `$XDG_CACHE_HOME/accord` (else `~/.cache/accord`) |
//! | `ACCORD_SYMMETRIC` | `ipc` (trimmed) | VMM where supported | share symmetric-heap memory through CUDA IPC handles instead of VMM file descriptors |
//! | `ACCORD_SOAK` | count (≥ 1; trimmed) | 1 | repetition multiplier of randomized and fault tests |
//! | `ACCORD_FLIGHT_RECORDER` | count (trimmed) | 2048 | calls each communicator's flight recorder keeps; 0: none ([`crate::observe`]) |
//! | `ACCORD_FLIGHT_DIR` | path | `$TMPDIR/accord-flight` | where flight records are written |
//! | `ACCORD_FLIGHT_SIGNAL` | `0` (trimmed) | on | `SIGUSR1` writes the flight records |
//! | `ACCORD_JOB_ID` | string | the store's address | names the job in flight-record files (`accord run` sets it) |
//! | `ACCORD_TRACE` | path | off | a Chrome-trace timeline per rank ([`crate::observe::trace`]) |
//!
//! The settings marked "the same on every rank" ([`Config::shared`]) are compared when a world
//! forms, with the frames' format version: a rank that sets one otherwise (or runs another
//! release) makes every rank's init fail naming the setting and two ranks that differ.
//!
//! Joining a job reads its own variables at every init, because the process environment may
//! change between inits (and [`crate::rendezvous::init_with_vars`] takes them from the caller):
//! `ACCORD_RANK`, `ACCORD_WORLD_SIZE`, `ACCORD_LOCAL_RANK`, `ACCORD_LOCAL_WORLD_SIZE`,
//! `ACCORD_STORE`, `ACCORD_STORE_EXTERNAL`, `ACCORD_STORE_HOST`, `ACCORD_STORE_PREFIX`,
//! `ACCORD_TOKEN`, `ACCORD_TOKEN_FILE`, `ACCORD_JOIN_TIMEOUT` and `ACCORD_TIMEOUT` (there a value
//! that does not parse is an error rather than the default). The [`crate::rendezvous`] module
//! documents them, and [`crate::rendezvous::EnvConfig`] parses them.

use crate::fingerprint::OpKind;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

/// Default of [`Config::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Default of [`Config::chunk_bytes`].
pub const DEFAULT_CHUNK_BYTES: usize = 512 * 1024;
/// Largest [`Config::chunk_bytes`]; a receiver refuses bigger frames.
pub const MAX_CHUNK_BYTES: usize = 64 * 1024 * 1024;
/// Default of [`Config::max_unmatched_bytes`].
pub const DEFAULT_MAX_UNMATCHED_BYTES: usize = 1 << 30;
/// Default of [`Config::shm_half_bytes`].
pub const DEFAULT_SHM_HALF_BYTES: usize = 1 << 20;

/// Default of `ACCORD_TCP_POLL_US`.
pub const DEFAULT_TCP_POLL: Duration = Duration::from_micros(50);
/// Default of `ACCORD_TCP_PUMP_BYTES`: on 16 CPUs, 2 and 4 ranks over loopback and 2 x 2
/// network namespaces, reading the socket in the waiting thread made 64-256 KiB calls 1.2-1.9x
/// faster in 7 rows of 9 (allreduce, allgather, broadcast), 1 MiB ones 0.8-1.25x, 4 MiB ones
/// 0.85-1.09x.
pub const DEFAULT_TCP_PUMP_BYTES: usize = 1 << 20;
/// Default of [`Config::shm_ring_bytes`].
pub const DEFAULT_SHM_RING_BYTES: usize = 512 << 10;
/// Default of [`Config::shm_cma_bytes`]: never (single copy off). On the 2-core VM the
/// shared-memory numbers come from, `process_vm_readv` moved about 6 GB/s against 20 GB/s for
/// memcpy, so the pipelined two-copy path wins at every size; set the variable where single
/// copy is faster.
pub const DEFAULT_SHM_CMA_BYTES: usize = usize::MAX;

/// Every tunable and limit of the core, parsed. See the [module documentation](self) for the
/// variables, their defaults and meaning.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `ACCORD_TIMEOUT`.
    pub timeout: Duration,
    /// `ACCORD_EXPLAIN=1`.
    pub explain: bool,
    /// `ACCORD_ALGO_<OP>` as set (unparsed: whether a name applies depends on the call).
    pub algo: BTreeMap<OpKind, String>,
    /// `ACCORD_CHUNK_BYTES`, rounded and clamped.
    pub chunk_bytes: usize,
    /// `ACCORD_MAX_UNMATCHED_BYTES`.
    pub max_unmatched_bytes: usize,
    /// `ACCORD_HOST` (empty: all interfaces).
    pub host: String,
    /// `ACCORD_ADVERTISE_HOST`.
    pub advertise_host: Option<String>,
    /// False when `ACCORD_TRANSPORT=tcp`.
    pub shm: bool,
    /// `ACCORD_HOST_ID`, when set and not empty.
    pub host_id: Option<String>,
    /// False when `ACCORD_SHM_P2P` is `0`, `off` or `no`.
    pub shm_p2p: bool,
    /// False when `ACCORD_SHM_CMA` is `0`, `off` or `no`.
    pub shm_cma: bool,
    /// `ACCORD_SHM_CHUNK_BYTES`, rounded and clamped: one staging half.
    pub shm_half_bytes: usize,
    /// `ACCORD_SHM_RING_BYTES`, rounded and clamped.
    pub shm_ring_bytes: usize,
    /// `ACCORD_TCP_POLL_US`: how long a wait for a TCP frame checks for it before sleeping.
    pub tcp_poll: Duration,
    /// `ACCORD_TCP_PUMP_BYTES`: waits for messages below this size read the socket themselves.
    pub tcp_pump_bytes: usize,
    /// `ACCORD_TCP_STRIPE_BYTES`: messages from this size are dealt over a pair's lanes.
    pub tcp_stripe_bytes: usize,
    /// `ACCORD_TCP_LANES`: connections per pair of ranks (1 to 8), where set.
    pub tcp_lanes: Option<usize>,
    /// `ACCORD_TCP_BUSY_POLL_US`: `SO_BUSY_POLL` for every TCP connection, where set and not 0.
    pub tcp_busy_poll: Option<Duration>,
    /// `ACCORD_TUNER_PROFILE`: the tuner's costs measured by `accord bench --calibrate`, or
    /// why the profile could not be read (reported when the world forms).
    pub tuner_profile: Option<Result<crate::schedule::calibrated::Calibrated, String>>,
    /// `ACCORD_HIERARCHY`: collectives across hosts take the hierarchical engine.
    pub hierarchy: bool,
    /// `ACCORD_HIER_STRIPE_BYTES`: allreduces across hosts from this size are striped.
    pub hier_stripe_bytes: usize,
    /// `ACCORD_HIER_BLOCKS_BYTES`: reduce-scatters and allgathers across hosts below this size
    /// (the whole buffer) go over the stripes.
    pub hier_blocks_bytes: usize,
    /// `ACCORD_HIER_ALLTOALL_BLOCK_BYTES`: regular all-to-alls across hosts whose blocks (the
    /// bytes a rank sends each rank) are below this size go over the stripes.
    pub hier_alltoall_block_bytes: usize,
    /// `ACCORD_HIER_PIPELINE_BYTES`: striped allreduces from this size are pipelined.
    pub hier_pipeline_bytes: usize,
    /// `ACCORD_PIECE_BYTES`: allreduces run as schedules of more than twice this size run in
    /// pieces of it (`schedule::pieces`); 0: never.
    pub piece_bytes: usize,
    /// `ACCORD_SHM_SPIN_US` (the default depends on whether the host is crowded).
    pub shm_spin: Option<Duration>,
    /// `ACCORD_SHM_YIELD_US` (the default depends on whether the host is crowded).
    pub shm_yield: Option<Duration>,
    /// `ACCORD_SHM_SMALL_BYTES`.
    pub shm_small_bytes: usize,
    /// `ACCORD_SHM_CMA_BYTES`.
    pub shm_cma_bytes: usize,
    /// `ACCORD_SHM_STREAM_BYTES`.
    pub shm_stream_bytes: usize,
    /// `ACCORD_SHM_SLOT_BYTES`.
    pub shm_slot_bytes: usize,
    /// False when `ACCORD_GPU_WATCHDOG=0`.
    pub gpu_watchdog: bool,
    /// `ACCORD_GPU_ENGINE`.
    pub gpu_engine: GpuEngine,
    /// `ACCORD_GPU_CHUNK_BYTES`, rounded and clamped.
    pub gpu_chunk_bytes: usize,
    /// `ACCORD_GPU_LL_BYTES`, clamped.
    pub gpu_ll_bytes: usize,
    /// `ACCORD_GPU_ALLTOALL_SELF=copy`.
    pub gpu_alltoall_self_copy: bool,
    /// `ACCORD_NCCL_INIT=blocking`.
    pub nccl_init_blocking: bool,
    /// `ACCORD_NCCL_LIBRARY`, when set and not empty.
    pub nccl_library: Option<String>,
    /// `ACCORD_CUDA_LIBRARY`.
    pub cuda_library: String,
    /// `ACCORD_SYMMETRIC=ipc`.
    pub symmetric_ipc: bool,
    /// `ACCORD_SOAK`.
    pub soak: usize,
}

/// Who runs collectives on GPU memory (`ACCORD_GPU_ENGINE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuEngine {
    /// Accord's own kernels or NCCL, per call, by size.
    Auto,
    /// Accord's own kernels wherever they apply (NCCL for the rest).
    Accord,
    /// NCCL only.
    Nccl,
}

impl GpuEngine {
    /// `auto`, `accord` or `nccl`, any case, surrounding blanks ignored.
    pub fn parse(v: &str) -> Option<GpuEngine> {
        match v.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(GpuEngine::Auto),
            "accord" | "own" => Some(GpuEngine::Accord),
            "nccl" => Some(GpuEngine::Nccl),
            _ => None,
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            GpuEngine::Auto => "auto",
            GpuEngine::Accord => "accord",
            GpuEngine::Nccl => "nccl",
        }
    }
}

/// Whether a switch that is on by default is turned off (`0`, `off`, `no`).
fn switched_off(v: Option<&str>) -> bool {
    matches!(v.map(str::trim), Some("0" | "off" | "no"))
}

impl Config {
    /// The settings every rank of a job must share, as (variable, value): they choose the
    /// paths across hosts and the layout and algorithms of the shared-memory collectives, so
    /// ranks that set them differently would take paths that never meet or read each other's
    /// staging at the wrong places. Compared when a world forms. (The GPU kernels' sizes are
    /// compared by the communicators that use them.)
    pub fn shared(&self) -> Vec<(&'static str, String)> {
        let on = |b: bool| if b { "on" } else { "off" }.to_string();
        let bytes = |n: usize| match n {
            usize::MAX => "off".to_string(),
            n => n.to_string(),
        };
        vec![
            ("ACCORD_HIERARCHY", on(self.hierarchy)),
            ("ACCORD_HIER_STRIPE_BYTES", bytes(self.hier_stripe_bytes)),
            ("ACCORD_HIER_BLOCKS_BYTES", bytes(self.hier_blocks_bytes)),
            (
                "ACCORD_HIER_ALLTOALL_BLOCK_BYTES",
                bytes(self.hier_alltoall_block_bytes),
            ),
            (
                "ACCORD_HIER_PIPELINE_BYTES",
                bytes(self.hier_pipeline_bytes),
            ),
            ("ACCORD_PIECE_BYTES", self.piece_bytes.to_string()),
            ("ACCORD_SHM_CMA", on(self.shm_cma)),
            ("ACCORD_SHM_CHUNK_BYTES", bytes(self.shm_half_bytes)),
            ("ACCORD_SHM_RING_BYTES", bytes(self.shm_ring_bytes)),
            ("ACCORD_SHM_SMALL_BYTES", bytes(self.shm_small_bytes)),
            ("ACCORD_SHM_CMA_BYTES", bytes(self.shm_cma_bytes)),
            ("ACCORD_SHM_SLOT_BYTES", bytes(self.shm_slot_bytes)),
            ("ACCORD_ALGO_<OP>", self.algo_overrides()),
            (
                "ACCORD_TUNER_PROFILE",
                match &self.tuner_profile {
                    None => "none".to_string(),
                    Some(Ok(c)) => c.describe(),
                    Some(Err(e)) => format!("unreadable ({})", e.replace('\n', " ")),
                },
            ),
        ]
    }

    /// The tuner's cost model for a world whose slowest link is `link`: the calibrated one
    /// where `ACCORD_TUNER_PROFILE` names a readable profile, else the built-in one.
    pub fn cost_model(
        &self,
        link: crate::transport::LinkKind,
    ) -> crate::schedule::tuner::CostModel {
        match &self.tuner_profile {
            Some(Ok(c)) => c.for_link(link),
            _ => crate::schedule::tuner::CostModel::for_link(link),
        }
    }

    /// The `ACCORD_ALGO_<OP>` overrides that take effect, in one line (`allreduce=ring,...`, or
    /// `none`): the schedules between hosts run on every local rank's stripe at once, so ranks
    /// that chose differently would each agree with their stripe and still end with other
    /// results. Names as parsed (spelling, case and aliases aside); a blank or unknown value is
    /// ignored where it is set, so it counts as unset here too.
    fn algo_overrides(&self) -> String {
        let set: Vec<String> = self
            .algo
            .iter()
            .filter_map(|(k, v)| {
                let a = crate::schedule::Algorithm::parse(v).ok()?;
                Some(format!("{}={}", k.name(), a.name()))
            })
            .collect();
        match set.is_empty() {
            true => "none".to_string(),
            false => set.join(","),
        }
    }

    /// Parse the variables as `lookup` returns them (`None`: unset).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Config {
        let raw = |k: &str| lookup(k);
        let trimmed = |k: &str| -> Option<usize> { raw(k).and_then(|v| v.trim().parse().ok()) };
        let micros = |k: &str| trimmed(k).map(|v| Duration::from_micros(v as u64));
        let not_blank = |k: &str| raw(k).filter(|v| !v.trim().is_empty());
        Config {
            timeout: raw("ACCORD_TIMEOUT")
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s > 0.0)
                .map(Duration::from_secs_f64)
                .unwrap_or(DEFAULT_TIMEOUT),
            explain: raw("ACCORD_EXPLAIN").is_some_and(|v| v.trim() == "1"),
            algo: OpKind::ALL
                .iter()
                .filter_map(|&k| raw(&algo_var(k)).map(|v| (k, v)))
                .collect(),
            chunk_bytes: raw("ACCORD_CHUNK_BYTES")
                .and_then(|v| v.parse::<usize>().ok())
                .map(|v| (v.clamp(8, MAX_CHUNK_BYTES) / 8) * 8)
                .unwrap_or(DEFAULT_CHUNK_BYTES),
            max_unmatched_bytes: trimmed("ACCORD_MAX_UNMATCHED_BYTES")
                .filter(|&v| v > 0)
                .unwrap_or(DEFAULT_MAX_UNMATCHED_BYTES),
            host: not_blank("ACCORD_HOST").unwrap_or_default(),
            advertise_host: not_blank("ACCORD_ADVERTISE_HOST"),
            shm: !matches!(
                raw("ACCORD_TRANSPORT").as_deref().map(str::trim),
                Some("tcp" | "TCP")
            ),
            host_id: raw("ACCORD_HOST_ID").filter(|h| !h.is_empty()),
            shm_p2p: !switched_off(raw("ACCORD_SHM_P2P").as_deref()),
            shm_cma: !switched_off(raw("ACCORD_SHM_CMA").as_deref()),
            shm_half_bytes: trimmed("ACCORD_SHM_CHUNK_BYTES")
                .map(|v| (v.clamp(4096, 256 << 20) / 64) * 64)
                .unwrap_or(DEFAULT_SHM_HALF_BYTES),
            shm_ring_bytes: trimmed("ACCORD_SHM_RING_BYTES")
                .map(|v| (v.clamp(16 << 10, 256 << 20) / 4096) * 4096)
                .unwrap_or(DEFAULT_SHM_RING_BYTES),
            tcp_poll: micros("ACCORD_TCP_POLL_US").unwrap_or(DEFAULT_TCP_POLL),
            tcp_pump_bytes: trimmed("ACCORD_TCP_PUMP_BYTES").unwrap_or(DEFAULT_TCP_PUMP_BYTES),
            tcp_stripe_bytes: trimmed("ACCORD_TCP_STRIPE_BYTES")
                .unwrap_or(crate::transport::tcp::STRIPE_MIN_BYTES),
            tcp_lanes: trimmed("ACCORD_TCP_LANES").map(|n: usize| n.clamp(1, 8)),
            tcp_busy_poll: micros("ACCORD_TCP_BUSY_POLL_US").filter(|d| !d.is_zero()),
            tuner_profile: not_blank("ACCORD_TUNER_PROFILE")
                .map(|p| crate::schedule::calibrated::Calibrated::load(p.trim())),
            hierarchy: !switched_off(raw("ACCORD_HIERARCHY").as_deref()),
            hier_stripe_bytes: trimmed("ACCORD_HIER_STRIPE_BYTES")
                .unwrap_or(crate::comm::STRIPE_MIN_BYTES),
            hier_blocks_bytes: trimmed("ACCORD_HIER_BLOCKS_BYTES")
                .unwrap_or(crate::comm::BLOCKS_MAX_BYTES),
            hier_alltoall_block_bytes: trimmed("ACCORD_HIER_ALLTOALL_BLOCK_BYTES")
                .unwrap_or(crate::comm::ALLTOALL_MAX_BLOCK_BYTES),
            hier_pipeline_bytes: trimmed("ACCORD_HIER_PIPELINE_BYTES")
                .unwrap_or(crate::comm::PIPELINE_MIN_BYTES),
            piece_bytes: trimmed("ACCORD_PIECE_BYTES")
                .unwrap_or(crate::schedule::pieces::PIECE_BYTES),
            shm_spin: micros("ACCORD_SHM_SPIN_US"),
            shm_yield: micros("ACCORD_SHM_YIELD_US"),
            shm_small_bytes: trimmed("ACCORD_SHM_SMALL_BYTES").unwrap_or(16 << 10),
            shm_cma_bytes: trimmed("ACCORD_SHM_CMA_BYTES").unwrap_or(DEFAULT_SHM_CMA_BYTES),
            shm_stream_bytes: trimmed("ACCORD_SHM_STREAM_BYTES").unwrap_or(2 << 20),
            shm_slot_bytes: trimmed("ACCORD_SHM_SLOT_BYTES").unwrap_or(64 << 10),
            symmetric_ipc: raw("ACCORD_SYMMETRIC").is_some_and(|v| v.trim() == "ipc"),
            gpu_watchdog: raw("ACCORD_GPU_WATCHDOG").is_none_or(|v| v != "0"),
            gpu_engine: raw("ACCORD_GPU_ENGINE")
                .and_then(|v| GpuEngine::parse(&v))
                .unwrap_or(GpuEngine::Auto),
            gpu_chunk_bytes: trimmed("ACCORD_GPU_CHUNK_BYTES")
                .map(|v| (v.clamp(64 << 10, 64 << 20) / 4096) * 4096)
                .unwrap_or(1 << 20),
            gpu_ll_bytes: trimmed("ACCORD_GPU_LL_BYTES")
                .unwrap_or(256 << 10)
                .min(256 << 10),
            gpu_alltoall_self_copy: raw("ACCORD_GPU_ALLTOALL_SELF")
                .is_some_and(|v| v.eq_ignore_ascii_case("copy")),
            nccl_init_blocking: raw("ACCORD_NCCL_INIT").is_some_and(|v| v == "blocking"),
            nccl_library: raw("ACCORD_NCCL_LIBRARY").filter(|p| !p.is_empty()),
            cuda_library: raw("ACCORD_CUDA_LIBRARY").unwrap_or_else(|| "libcuda.so.1".into()),
            soak: trimmed("ACCORD_SOAK").unwrap_or(1).max(1),
        }
    }

    /// The `ACCORD_ALGO_<OP>` override for `kind`, as set.
    pub fn algo(&self, kind: OpKind) -> Option<&str> {
        self.algo.get(&kind).map(String::as_str)
    }
}

impl Default for Config {
    /// Every default, as if no variable were set.
    fn default() -> Self {
        Config::from_lookup(&|_| None)
    }
}

/// The variable that overrides the algorithm of `kind`, e.g. `ACCORD_ALGO_ALLREDUCE`.
pub fn algo_var(kind: OpKind) -> String {
    format!("ACCORD_ALGO_{}", kind.name().to_ascii_uppercase())
}

/// The process's configuration, read from its environment on first use.
pub fn get() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let mut c = Config::from_lookup(&|k| match std::env::var(k) {
            Ok(v) => Some(v),
            Err(std::env::VarError::NotUnicode(raw)) => {
                tracing::warn!("{k} is not valid UTF-8 ({raw:?}): ignored");
                None
            }
            Err(std::env::VarError::NotPresent) => None,
        });
        // A limit renamed when its meaning changed: say so rather than ignore it in silence.
        if std::env::var_os("ACCORD_HIER_ALLTOALL_BYTES").is_some() {
            tracing::warn!(
                "ACCORD_HIER_ALLTOALL_BYTES (a rank's whole buffer) is ignored: all-to-alls across \
                 hosts take the stripes by block size, ACCORD_HIER_ALLTOALL_BLOCK_BYTES"
            );
        }
        // A profile asked for and not read fails the start, as an unreadable file does.
        if let Some(raw) = std::env::var_os("ACCORD_TUNER_PROFILE").filter(|v| v.to_str().is_none())
        {
            c.tuner_profile = Some(Err(format!("{} is not valid UTF-8", raw.to_string_lossy())));
        }
        c
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Config {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(&move |k| {
            pairs
                .iter()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn defaults_when_nothing_is_set() {
        let c = Config::default();
        assert_eq!(c.timeout, Duration::from_secs(300));
        assert!(!c.explain && c.algo.is_empty());
        assert_eq!(c.chunk_bytes, 512 << 10);
        assert_eq!(c.max_unmatched_bytes, 1 << 30);
        assert_eq!((c.host.as_str(), c.advertise_host.as_deref()), ("", None));
        assert!(c.shm && c.shm_p2p && c.shm_cma && c.host_id.is_none());
        assert_eq!((c.shm_half_bytes, c.shm_ring_bytes), (1 << 20, 512 << 10));
        assert_eq!((c.shm_spin, c.shm_yield), (None, None));
        assert_eq!(c.tcp_poll, DEFAULT_TCP_POLL);
        assert_eq!(c.tcp_pump_bytes, DEFAULT_TCP_PUMP_BYTES);
        assert_eq!(c.tcp_lanes, None);
        assert_eq!(c.tcp_stripe_bytes, 256 << 10);
        assert_eq!(c.hier_stripe_bytes, 64 << 10);
        assert_eq!(c.hier_blocks_bytes, 1 << 20);
        assert_eq!(c.hier_alltoall_block_bytes, 32 << 10);
        assert_eq!(c.hier_pipeline_bytes, 32 << 20);
        assert_eq!(c.piece_bytes, 8 << 20);
        assert!(c.hierarchy);
        assert_eq!(
            (
                c.shm_small_bytes,
                c.shm_cma_bytes,
                c.shm_stream_bytes,
                c.shm_slot_bytes
            ),
            (16 << 10, usize::MAX, 2 << 20, 64 << 10)
        );
        assert!(c.gpu_watchdog && !c.gpu_alltoall_self_copy && !c.nccl_init_blocking);
        assert_eq!(
            (c.gpu_engine, c.gpu_chunk_bytes),
            (GpuEngine::Auto, 1 << 20)
        );
        assert_eq!(c.gpu_ll_bytes, 256 << 10);
        assert_eq!(c.nccl_library, None);
        assert_eq!(c.cuda_library, "libcuda.so.1");
        assert_eq!(c.soak, 1);
    }

    #[test]
    fn gpu_engine_and_chunk_parse_and_fall_back() {
        let c = with(&[
            ("ACCORD_GPU_ENGINE", " NCCL "),
            ("ACCORD_GPU_CHUNK_BYTES", "100000"),
        ]);
        assert_eq!((c.gpu_engine, c.gpu_chunk_bytes), (GpuEngine::Nccl, 98304));
        let c = with(&[
            ("ACCORD_GPU_ENGINE", "Accord"),
            ("ACCORD_GPU_CHUNK_BYTES", "1"),
        ]);
        assert_eq!(
            (c.gpu_engine, c.gpu_chunk_bytes),
            (GpuEngine::Accord, 64 << 10)
        );
        assert_eq!(
            with(&[("ACCORD_GPU_ENGINE", "fast")]).gpu_engine,
            GpuEngine::Auto
        );
        for e in [GpuEngine::Auto, GpuEngine::Accord, GpuEngine::Nccl] {
            assert_eq!(GpuEngine::parse(e.name()), Some(e));
        }
    }

    #[test]
    fn timeout_is_fractional_seconds_and_falls_back_when_invalid() {
        assert_eq!(
            with(&[("ACCORD_TIMEOUT", " 2.5 ")]).timeout,
            Duration::from_millis(2500)
        );
        for bad in ["0", "-1", "inf", "NaN", "soon", ""] {
            assert_eq!(
                with(&[("ACCORD_TIMEOUT", bad)]).timeout,
                DEFAULT_TIMEOUT,
                "{bad}"
            );
        }
    }

    #[test]
    fn sizes_are_rounded_and_clamped() {
        assert_eq!(with(&[("ACCORD_CHUNK_BYTES", "1001")]).chunk_bytes, 1000);
        assert_eq!(with(&[("ACCORD_CHUNK_BYTES", "1")]).chunk_bytes, 8);
        assert_eq!(
            with(&[("ACCORD_CHUNK_BYTES", "999999999999")]).chunk_bytes,
            MAX_CHUNK_BYTES
        );
        // This one has never been trimmed.
        assert_eq!(
            with(&[("ACCORD_CHUNK_BYTES", " 1024")]).chunk_bytes,
            DEFAULT_CHUNK_BYTES
        );
        let c = with(&[
            ("ACCORD_SHM_CHUNK_BYTES", " 10000 "),
            ("ACCORD_SHM_RING_BYTES", "1"),
        ]);
        assert_eq!((c.shm_half_bytes, c.shm_ring_bytes), (9984, 16 << 10));
        assert_eq!(
            with(&[("ACCORD_SHM_RING_BYTES", "70000")]).shm_ring_bytes,
            17 * 4096
        );
    }

    #[test]
    fn limits_reject_zero_and_garbage() {
        let cap = |v| with(&[("ACCORD_MAX_UNMATCHED_BYTES", v)]).max_unmatched_bytes;
        assert_eq!(cap(" 4096\n"), 4096);
        assert_eq!(cap("0"), DEFAULT_MAX_UNMATCHED_BYTES);
        assert_eq!(cap("lots"), DEFAULT_MAX_UNMATCHED_BYTES);
        assert_eq!(with(&[("ACCORD_SOAK", "0")]).soak, 1);
        assert_eq!(with(&[("ACCORD_SOAK", " 7")]).soak, 7);
        assert_eq!(
            with(&[("ACCORD_SHM_SMALL_BYTES", "x")]).shm_small_bytes,
            16 << 10
        );
        assert_eq!(with(&[("ACCORD_SHM_CMA_BYTES", " 0 ")]).shm_cma_bytes, 0);
    }

    #[test]
    fn switches() {
        for off in ["0", " off", "no "] {
            let c = with(&[("ACCORD_SHM_P2P", off), ("ACCORD_SHM_CMA", off)]);
            assert!(!c.shm_p2p && !c.shm_cma, "{off:?}");
        }
        let c = with(&[("ACCORD_SHM_P2P", "1"), ("ACCORD_SHM_CMA", "OFF")]);
        assert!(c.shm_p2p && c.shm_cma);
        assert!(!with(&[("ACCORD_TRANSPORT", " tcp ")]).shm);
        assert!(!with(&[("ACCORD_TRANSPORT", "TCP")]).shm);
        assert!(with(&[("ACCORD_TRANSPORT", "Tcp")]).shm);
        assert!(with(&[("ACCORD_EXPLAIN", " 1 ")]).explain);
        assert!(!with(&[("ACCORD_EXPLAIN", "yes")]).explain);
        assert!(!with(&[("ACCORD_GPU_WATCHDOG", "0")]).gpu_watchdog);
        assert!(with(&[("ACCORD_GPU_WATCHDOG", "off")]).gpu_watchdog);
        assert!(with(&[("ACCORD_GPU_ALLTOALL_SELF", "COPY")]).gpu_alltoall_self_copy);
        assert!(with(&[("ACCORD_NCCL_INIT", "blocking")]).nccl_init_blocking);
        assert!(!with(&[("ACCORD_NCCL_INIT", " blocking")]).nccl_init_blocking);
    }

    #[test]
    fn hosts_libraries_and_spin_times() {
        let c = with(&[
            ("ACCORD_HOST", " "),
            ("ACCORD_ADVERTISE_HOST", "10.0.0.5"),
            ("ACCORD_HOST_ID", ""),
            ("ACCORD_NCCL_LIBRARY", ""),
            ("ACCORD_CUDA_LIBRARY", "/opt/libcuda.so"),
            ("ACCORD_SHM_SPIN_US", " 0"),
            ("ACCORD_SHM_YIELD_US", "250"),
            ("ACCORD_TCP_POLL_US", " 0 "),
            ("ACCORD_TCP_PUMP_BYTES", " 1048576"),
            ("ACCORD_TCP_LANES", "12"),
            ("ACCORD_TCP_BUSY_POLL_US", " 50"),
            ("ACCORD_HIERARCHY", "off"),
        ]);
        assert_eq!(c.host, "");
        assert_eq!(c.advertise_host.as_deref(), Some("10.0.0.5"));
        assert_eq!(
            (c.host_id.as_deref(), c.nccl_library.as_deref()),
            (None, None)
        );
        assert_eq!(c.cuda_library, "/opt/libcuda.so");
        assert_eq!(c.shm_spin, Some(Duration::ZERO));
        assert_eq!(c.shm_yield, Some(Duration::from_micros(250)));
        assert_eq!(c.tcp_poll, Duration::ZERO);
        assert_eq!(c.tcp_pump_bytes, 1 << 20);
        assert_eq!(c.tcp_lanes, Some(8), "at most 8");
        assert_eq!(c.tcp_busy_poll, Some(Duration::from_micros(50)));
        assert!(!c.hierarchy);
        assert_eq!(
            with(&[("ACCORD_TCP_BUSY_POLL_US", "0")]).tcp_busy_poll,
            None
        );
        let c = with(&[("ACCORD_HOST_ID", "node7"), ("ACCORD_HOST", "eth0")]);
        assert_eq!(
            (c.host_id.as_deref(), c.host.as_str()),
            (Some("node7"), "eth0")
        );
    }

    #[test]
    fn algorithm_overrides_by_operation() {
        let c = with(&[
            ("ACCORD_ALGO_ALLREDUCE", "ring"),
            ("ACCORD_ALGO_REDUCE_SCATTER", "rabenseifner"),
        ]);
        assert_eq!(c.algo(OpKind::AllReduce), Some("ring"));
        assert_eq!(c.algo(OpKind::ReduceScatter), Some("rabenseifner"));
        assert_eq!(c.algo(OpKind::Broadcast), None);
        assert_eq!(
            algo_var(OpKind::ReduceScatter),
            "ACCORD_ALGO_REDUCE_SCATTER"
        );
        // Every rank must set them alike: compared when a world forms.
        let shared = |c: &Config| {
            let s = c.shared();
            s.into_iter()
                .find(|(k, _)| *k == "ACCORD_ALGO_<OP>")
                .unwrap()
                .1
        };
        assert_eq!(shared(&c), "allreduce=ring,reduce_scatter=rabenseifner");
        // So is the size of the pieces large calls run in (the schedule's shape).
        let pieces = with(&[("ACCORD_PIECE_BYTES", " 0\n")]);
        assert_eq!(pieces.piece_bytes, 0);
        assert!(pieces
            .shared()
            .contains(&("ACCORD_PIECE_BYTES", "0".into())));
        assert_eq!(shared(&with(&[])), "none");
        // As parsed: spelling, aliases, blanks and unknown names (ignored where set) aside.
        let spelled = with(&[
            ("ACCORD_ALGO_ALLREDUCE", " RD\n"),
            ("ACCORD_ALGO_REDUCE_SCATTER", "halving-doubling"),
            ("ACCORD_ALGO_BROADCAST", " "),
            ("ACCORD_ALGO_ALLGATHER", "ring,reduce_scatter=ring"),
        ]);
        assert_eq!(
            shared(&spelled),
            "allreduce=recursive_doubling,reduce_scatter=rabenseifner"
        );
    }

    /// A calibrated profile replaces the built-in TCP and shared-memory costs; ranks compare
    /// the costs themselves, and an unreadable profile is carried to the start as an error.
    #[test]
    fn a_tuner_profile_replaces_the_built_in_costs() {
        use crate::schedule::tuner::CostModel;
        use crate::transport::LinkKind;
        let shared = |c: &Config| {
            let s = c.shared();
            s.into_iter()
                .find(|(k, _)| *k == "ACCORD_TUNER_PROFILE")
                .unwrap()
                .1
        };
        assert_eq!(with(&[]).cost_model(LinkKind::Tcp), CostModel::tcp());
        assert_eq!(shared(&with(&[("ACCORD_TUNER_PROFILE", " ")])), "none");
        let path = std::env::temp_dir().join(format!("tuner-profile-{}.json", std::process::id()));
        let pp = "[[8, 9.0], [262144, 40.0], [1048576, 130.0]]";
        let text = format!(
            r#"{{"accord_profile": 1, "gamma_us_per_byte": 0.0001,
                "tcp": {{"pingpong": {pp}}}, "shm": {{"pingpong": [[8, 1.5]]}}}}"#
        );
        std::fs::write(&path, text).unwrap();
        let c = with(&[("ACCORD_TUNER_PROFILE", path.to_str().unwrap())]);
        std::fs::remove_file(&path).unwrap();
        let tcp = c.cost_model(LinkKind::Tcp);
        assert_eq!(tcp.alpha_us, 9.0);
        assert!((tcp.beta_us_per_byte - 90.0 / 786_432.0).abs() < 1e-12);
        assert_eq!(c.cost_model(LinkKind::SharedMemory).alpha_us, 1.5);
        assert_eq!(c.cost_model(LinkKind::InProcess), CostModel::inproc());
        assert!(shared(&c).starts_with("tcp 9.0 us + "), "{}", shared(&c));
        let missing = with(&[("ACCORD_TUNER_PROFILE", "/nonexistent/p.json")]);
        assert_eq!(missing.cost_model(LinkKind::Tcp), CostModel::tcp());
        assert!(shared(&missing).starts_with("unreadable (/nonexistent/p.json: "));
    }
}
