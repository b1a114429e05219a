//! Creating NCCL communicators with a deadline.
//!
//! Rank 0 creates the `ncclUniqueId` and broadcasts it over the host, so every way of starting
//! the host communicator works unchanged. Before that, all ranks exchange their NCCL versions:
//! different versions fail at once on every rank, naming ranks and versions.
//!
//! NCCL's blocking init cannot be interrupted, so communicators are initialised in NCCL's
//! nonblocking mode, waited for with the host's deadline (aborting on expiry, naming the ranks
//! that never started), and then traded for blocking twins with `ncclCommSplit`: operations on a
//! nonblocking communicator are launched from an NCCL helper thread and cost about 100 us each.
//! `ACCORD_NCCL_INIT=blocking` falls back to NCCL's plain blocking init (no deadline).

use super::engine::NcclEngine;
use super::loader::{self as nccl, Nccl, NcclComm, NcclUniqueId};
use crate::error::{Error, Result};
use crate::gpu::cuda::{self, CuContext, Driver};
use crate::gpu::engine::EngineResult;
use crate::gpu::group::not_in_group;
use crate::gpu::link::HostLink;
use crate::gpu::select::Joined;
use crate::rendezvous::StoreClient;
use std::time::{Duration, Instant};

/// Exchange NCCL versions (or load failures) over the host communicator; all ranks agree on the
/// outcome, so none is left waiting in NCCL initialisation for a rank that gave up.
fn agreed_nccl(host: &dyn HostLink, per_rank: usize) -> Result<&'static Nccl> {
    let local = cuda::driver().and_then(|_| nccl::nccl());
    let mine: i64 = match &local {
        Ok(n) => n.version as i64,
        Err(_) => -1,
    };
    let all = host.all_gather_i64(&[mine, per_rank as i64])?;
    let n = local?;
    let failed: Vec<usize> = (0..host.size()).filter(|r| all[2 * r] < 0).collect();
    if !failed.is_empty() {
        return Err(Error::Unsupported(format!(
            "rank(s) {failed:?} could not load CUDA or NCCL; see their logs"
        )));
    }
    if (0..host.size()).any(|r| all[2 * r] != mine) {
        let list: Vec<String> = (0..host.size())
            .map(|r| format!("rank {r}: {}", nccl::version_string(all[2 * r] as i32)))
            .collect();
        return Err(Error::Unsupported(format!(
            "NCCL versions differ between ranks ({}); every rank must load the same NCCL \
             (this rank loaded {} from {}; ACCORD_NCCL_LIBRARY selects one)",
            list.join(", "),
            n.version_string(),
            n.path
        )));
    }
    if (0..host.size()).any(|r| all[2 * r + 1] != per_rank as i64) {
        let list: Vec<String> = (0..host.size())
            .map(|r| format!("rank {r}: {}", all[2 * r + 1]))
            .collect();
        return Err(Error::invalid(format!(
            "every process must drive the same number of GPUs ({})",
            list.join(", ")
        )));
    }
    Ok(n)
}

/// NCCL communicators over `devices` for every rank of `host`: versions agreed, rank 0's unique
/// id broadcast, then joined. Collective over `host`.
pub(crate) fn create(host: &dyn HostLink, devices: &[usize]) -> Result<Vec<Joined>> {
    let n = agreed_nccl(host, devices.len())?;
    let mut uid = NcclUniqueId { internal: [0; 128] };
    if host.rank() == 0 {
        match super::unique_id() {
            Ok(u) => uid = u,
            // Still broadcast (zeros) so the others do not wait; they fail below.
            Err(e) => tracing::error!("{e}"),
        }
    }
    host.broadcast_bytes(&mut uid.internal, 0)?;
    if uid.internal.iter().all(|&b| b == 0) {
        return Err(Error::Aborted {
            reason: "rank 0 could not create an NCCL unique id (see its log)".into(),
        });
    }
    join(host, n, &uid, devices)
}

/// Join the NCCL communicator of an id this process got some other way: no collective call on
/// `host` first, so NCCL versions are not compared.
pub(crate) fn join_with_id(
    host: &dyn HostLink,
    uid: &NcclUniqueId,
    devices: &[usize],
) -> Result<Vec<Joined>> {
    cuda::driver()?;
    join(host, nccl::nccl()?, uid, devices)
}

/// `ncclCommInitRankConfig` in nonblocking mode, then wait for it under the host's timeout:
/// a rank that never joins costs a clear error, not a hang. Each rank marks in the store
/// that it started, so the error can say who is missing.
/// `ncclCommInitRankConfig` in nonblocking mode, then wait for it under the host's timeout:
/// a rank that never joins costs a clear error, not a hang. Each rank marks in the store that
/// it started, so the error can say who is missing.
fn join(
    host: &dyn HostLink,
    n: &'static Nccl,
    uid: &NcclUniqueId,
    devices: &[usize],
) -> Result<Vec<Joined>> {
    not_in_group("creating a GPU communicator")?;
    let cu = cuda::driver()?;
    let ctxs: Vec<CuContext> = devices
        .iter()
        .map(|&d| cu.primary_context(d))
        .collect::<Result<_>>()?;
    let id = id_of(uid);
    let store = host.store(&format!("gpu/{id}"));
    if let Some(s) = &store {
        // Best effort: only used to name the missing ranks on a timeout.
        let _ = s.set(&format!("joining/{}", host.rank()), "1");
    }
    let k = devices.len();
    let nranks = host.size() * k;
    // Escape hatch: NCCL's plain blocking init, without a deadline.
    let blocking = std::env::var("ACCORD_NCCL_INIT").is_ok_and(|v| v == "blocking");
    let mut comms: Vec<NcclComm> = vec![std::ptr::null_mut(); k];
    let mut outcome = issue_grouped(n, k, |i| {
        cu.make_current(ctxs[i])?;
        let mut cfg = nccl::NcclConfig::new(blocking);
        let out = &mut comms[i];
        // SAFETY: `out` is a valid out-pointer; the id is the one all ranks share; the
        // config outlives the call.
        let rc = unsafe {
            (n.comm_init_rank_config)(
                out,
                nranks as i32,
                *uid,
                (host.rank() * k + i) as i32,
                &mut cfg,
            )
        };
        if rc != 0 && rc != nccl::NCCL_IN_PROGRESS {
            let rank = Some(host.rank() * k + i);
            return Err(n.error("ncclCommInitRankConfig", rc, *out, rank).into());
        }
        Ok(())
    })
    .map_err(|f| *f.error);
    let deadline = Instant::now() + host.timeout();
    for (i, &c) in comms.iter().enumerate() {
        if outcome.is_err() || c.is_null() {
            break;
        }
        outcome = match settle(n, c, deadline) {
            Ok(()) => Ok(()),
            Err(Some(rc)) => Err(Error::Gpu {
                library: "nccl",
                call: "ncclCommInitRankConfig".into(),
                code: rc,
                text: format!("{} (initialising on GPU {})", n.text(rc, c), devices[i]),
                rank: Some(host.rank() * k + i),
            }),
            Err(None) => Err(join_timeout(host, store.as_ref(), &id, k)),
        };
    }
    if let Err(e) = outcome {
        abort_all(n, &comms);
        return Err(e);
    }
    // Every rank is in: trade the nonblocking communicators for blocking twins.
    let comms = if blocking {
        comms
    } else {
        let parents: Vec<_> = (0..k)
            .map(|i| (comms[i], ctxs[i], (host.rank() * k + i) as i32))
            .collect();
        let twins = blocking_twins(n, cu, &parents, host.timeout(), host.rank())?;
        retire(n, &comms, host.timeout());
        twins
    };
    let timeout = host.timeout();
    let host_of: Vec<usize> = (0..nranks).map(|r| r / k).collect();
    Ok(comms
        .iter()
        .enumerate()
        .map(|(i, &comm)| Joined {
            engine: Box::new(
                NcclEngine::new(n, cu, comm, ctxs[i], host.rank() * k + i, nranks, timeout)
                    .with_unique_id(uid),
            ),
            preferred: Vec::new(),
            ctx: ctxs[i] as usize,
            device: devices[i],
            rank: host.rank() * k + i,
            size: nranks,
            id: id.clone(),
            multi: k > 1,
            host_of: Some(host_of.clone()),
        })
        .collect())
}

/// Wait until a nonblocking call on `comm` has finished: `Ok` once `ncclCommGetAsyncError` leaves
/// `ncclInProgress`, `Err(Some(rc))` if it failed, `Err(None)` at the deadline. Yields first
/// (enqueueing finishes within microseconds), then sleeps (initialisation takes milliseconds).
pub(super) fn settle(
    n: &Nccl,
    comm: NcclComm,
    deadline: Instant,
) -> std::result::Result<(), Option<i32>> {
    let mut polls = 0u32;
    loop {
        let mut rc = 0;
        // SAFETY: a communicator NCCL handed out and nobody destroyed.
        let call = unsafe { (n.comm_get_async_error)(comm, &mut rc) };
        if call != 0 {
            return Err(Some(call));
        }
        match rc {
            0 => return Ok(()),
            nccl::NCCL_IN_PROGRESS => {}
            e => return Err(Some(e)),
        }
        if Instant::now() >= deadline {
            return Err(None);
        }
        polls += 1;
        if polls < 200 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

/// The error for an NCCL initialisation that did not finish in time, naming the ranks (NCCL
/// ranks: `k` per process) that never started it, from their processes' marks in the store.
fn join_timeout(host: &dyn HostLink, store: Option<&StoreClient>, id: &str, k: usize) -> Error {
    let missing: Vec<usize> = match store {
        Some(s) => (0..host.size())
            .filter(|r| !matches!(s.try_get(&format!("joining/{r}")), Ok(Some(_))))
            .flat_map(|r| r * k..(r + 1) * k)
            .collect(),
        None => Vec::new(),
    };
    let (waiting_for, hint) = if missing.is_empty() {
        let me = host.rank() * k..(host.rank() + 1) * k;
        let others = (0..host.size() * k).filter(|r| !me.contains(r)).collect();
        let hint = "; every rank started NCCL initialisation, so it is stuck inside NCCL \
                    (network, or a rank that died after starting; NCCL_DEBUG=INFO tells more)";
        (others, hint.to_string())
    } else {
        (
            missing,
            "; they never started NCCL initialisation".to_string(),
        )
    };
    Error::Timeout {
        op: "NCCL initialisation".into(),
        seq: 0,
        comm: format!("gpu/{id}"),
        waiting_for,
        after: host.timeout(),
        hint,
    }
}

/// Blocking twins of ready nonblocking communicators (`parents[i]`: the communicator, its
/// context, this rank's key), through one `ncclCommSplit` each (as one NCCL group when several),
/// waited on up to `timeout`. Operations on a nonblocking communicator cost ~100 us each, on a
/// blocking one a few: only initialisation needs the deadline.
///
/// On success the caller retires the parents. On failure the parents and any children are
/// aborted here, in that order: with a nonblocking parent NCCL writes the child handle from its
/// own thread when the split finishes, and aborting the parent waits for that thread, so only
/// then may the slots be read (and freed).
fn blocking_twins(
    n: &Nccl,
    cu: &Driver,
    parents: &[(NcclComm, CuContext, i32)],
    timeout: Duration,
    host_rank: usize,
) -> Result<Vec<NcclComm>> {
    let mut news: Vec<NcclComm> = vec![std::ptr::null_mut(); parents.len()];
    let outs = news.as_mut_ptr();
    let mut issued = issue_grouped(n, parents.len(), |i| {
        let (parent, ctx, key) = parents[i];
        cu.make_current(ctx)?;
        let mut cfg = nccl::NcclConfig::new(true);
        // SAFETY: a live communicator; the config outlives the call; slot `i` of `news` stays
        // valid until NCCL's thread is done with it (`news` lives to the end of this function,
        // and on failure the parents are aborted, which waits for that thread, before it is
        // dropped).
        let rc = unsafe { (n.comm_split)(parent, 0, key, outs.add(i), &mut cfg) };
        if rc != 0 && rc != nccl::NCCL_IN_PROGRESS {
            return Err(n
                .error("ncclCommSplit", rc, parent, Some(key as usize))
                .into());
        }
        Ok(())
    })
    .map_err(|f| *f.error);
    let deadline = Instant::now() + timeout;
    let slot = |i: usize| {
        // SAFETY: an element of `news`; NCCL's thread wrote it before the parent settled.
        unsafe { std::ptr::read_volatile(&news[i]) }
    };
    let why = |comm: NcclComm, rc: Option<i32>| match rc {
        Some(rc) => n.error("ncclCommSplit", rc, comm, None),
        None => Error::Aborted {
            reason: format!(
                "NCCL initialisation on rank {host_rank}: did not finish within {timeout:?} (a \
                 rank did not take part, or NCCL is stuck; NCCL_DEBUG=INFO tells more)"
            ),
        },
    };
    // The parents first: their settling is the split's completion.
    for &(parent, _, _) in parents {
        if issued.is_ok() {
            issued = settle(n, parent, deadline).map_err(|rc| why(parent, rc));
        }
    }
    for i in 0..parents.len() {
        let child = slot(i);
        if issued.is_ok() && child.is_null() {
            issued = Err(Error::Aborted {
                reason: format!(
                    "NCCL initialisation on rank {host_rank}: NCCL returned no communicator"
                ),
            });
        }
        if issued.is_ok() {
            issued = settle(n, child, deadline).map_err(|rc| why(child, rc));
        }
    }
    match issued {
        Ok(()) => Ok((0..parents.len()).map(slot).collect()),
        Err(why) => {
            let ps: Vec<NcclComm> = parents.iter().map(|p| p.0).collect();
            abort_all(n, &ps);
            let children: Vec<NcclComm> = (0..parents.len()).map(slot).collect();
            abort_all(n, &children);
            Err(why)
        }
    }
}

pub(super) fn abort_all(n: &Nccl, comms: &[NcclComm]) {
    for &c in comms.iter().filter(|c| !c.is_null()) {
        // SAFETY: communicators NCCL handed out and nobody else uses; abort stops their threads.
        unsafe { (n.comm_abort)(c) };
    }
}

/// Free communicators that are no longer needed: finalize them all (one may wait for the
/// others, e.g. the GPUs of one process), wait up to `timeout`, then destroy; abort whatever
/// does not finalize in time.
fn retire(n: &Nccl, comms: &[NcclComm], timeout: Duration) {
    let live: Vec<NcclComm> = comms.iter().copied().filter(|c| !c.is_null()).collect();
    // SAFETY: live communicators with no work left, each destroyed or aborted exactly once.
    let started: Vec<bool> = live
        .iter()
        .map(|&c| matches!(unsafe { (n.comm_finalize)(c) }, 0 | nccl::NCCL_IN_PROGRESS))
        .collect();
    let deadline = Instant::now() + timeout;
    for (&c, ok) in live.iter().zip(started) {
        // SAFETY: as above.
        unsafe {
            if ok && settle(n, c, deadline).is_ok() {
                (n.comm_destroy)(c);
            } else {
                (n.comm_abort)(c);
            }
        }
    }
}

/// Issue `issue(i)` for `i in 0..count`, as one NCCL group when there are several (one thread
/// drives several GPUs), every one even after another fails; the first failure, or the group
/// end's, is returned. Raw group calls: used outside `gpu::group`, with no events to arm.
pub(super) fn issue_grouped(
    n: &Nccl,
    count: usize,
    mut issue: impl FnMut(usize) -> EngineResult<()>,
) -> EngineResult<()> {
    let grouped = count > 1;
    if grouped {
        // SAFETY: no arguments; paired below.
        unsafe { (n.group_start)() };
    }
    let mut issued = Ok(());
    for i in 0..count {
        issued = issued.and(issue(i));
    }
    if grouped {
        // SAFETY: paired with the start above.
        let rc = unsafe { (n.group_end)() };
        if rc != 0 && rc != nccl::NCCL_IN_PROGRESS {
            let e = n.error("ncclGroupEnd", rc, std::ptr::null_mut(), None);
            issued = issued.and(Err(e.into()));
        }
    }
    issued
}

fn id_of(uid: &NcclUniqueId) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in uid.internal {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}
