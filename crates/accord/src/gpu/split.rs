//! Splitting device communicators: every rank first meets in the rendezvous store under the
//! deadline, then the engine splits.
//!
//! A library's split of a blocking communicator blocks until every member calls it, so a rank
//! that never calls split would leave the others stuck inside the library. Posting each rank's
//! `(color, key)` to the store first and waiting for all of them under the timeout turns that
//! into a [`Error::Timeout`] naming the ranks that never came. The posted choices also say which
//! process holds each rank of every child, which the child's watchdog needs.

use super::comm::DeviceComm;
use super::engine::{Child, EngineResult};
use super::group::not_in_group;
use super::select;
use super::select::Joined;
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Split this process's communicators together: `how[i]` is the `(color, key)` of `comms[i]`;
/// a `None` color takes no part and gets `None`. Collective over the communicators.
pub(crate) fn split_group(
    comms: &[Arc<DeviceComm>],
    how: &[(Option<u32>, i64)],
) -> Result<Vec<Option<Arc<DeviceComm>>>> {
    not_in_group("splitting a GPU communicator")?;
    if comms.is_empty() || comms.len() != how.len() {
        return Err(Error::invalid(format!(
            "split_group needs one (color, key) per communicator ({} communicators, {} pairs)",
            comms.len(),
            how.len()
        )));
    }
    let mut args = Vec::with_capacity(how.len());
    for &(color, key) in how {
        let c = match color {
            None => -1, // no color: takes no part
            Some(c) => i32::try_from(c)
                .map_err(|_| Error::invalid(format!("split color {c} is above {}", i32::MAX)))?,
        };
        let k = i32::try_from(key)
            .map_err(|_| Error::invalid(format!("split key {key} does not fit in 32 bits")))?;
        args.push((c, k));
    }
    for c in comms {
        if let Some(e) = c.poison() {
            return Err(e);
        }
    }
    let first = &comms[0];
    let timeout = comms.iter().map(|c| c.timeout()).max().unwrap_or_default();
    let k = first.splits.fetch_add(1, Ordering::Relaxed) + 1;
    for c in &comms[1..] {
        c.splits.fetch_add(1, Ordering::Relaxed);
    }
    // Every rank's (color, key), where the store has them: who ends up in which child.
    let mut choices: Option<Vec<(i32, i32)>> = None;
    if let Some(store) = &first.store {
        for (c, &(col, key)) in comms.iter().zip(&args) {
            store.set(&format!("split/{k}/{}", c.rank()), format!("{col} {key}"))?;
        }
        let keys: Vec<String> = (0..first.size).map(|r| format!("split/{k}/{r}")).collect();
        let missing = store.wait_missing(&keys, timeout)?;
        if !missing.is_empty() {
            let ranks: Vec<usize> = missing
                .iter()
                .filter_map(|m| m.rsplit('/').next()?.parse().ok())
                .collect();
            return Err(Error::Timeout {
                op: "split".into(),
                seq: k,
                comm: format!("gpu/{}", first.id),
                waiting_for: ranks,
                after: timeout,
                hint: "; they never called split".into(),
            });
        }
        choices = store
            .multi_get(&keys, timeout)
            .ok()
            .and_then(|values| values.iter().map(|v| parse_choice(v)).collect());
    }
    // Every rank is in: the split runs to completion.
    let children = match split_engines(comms, &args) {
        Ok(children) => children,
        Err(fault) => {
            let e = *fault.error;
            if fault.fatal {
                for c in comms {
                    c.fail(e.clone());
                }
            }
            return Err(e);
        }
    };
    let mut out = Vec::with_capacity(comms.len());
    let mut children = children.into_iter();
    for (parent, &(col, _)) in comms.iter().zip(&args) {
        let Some(Some(child)) = children.next() else {
            out.push(None);
            continue;
        };
        // Several GPUs of this process in the same child: drive them with `group`.
        let multi = args.iter().filter(|a| a.0 == col).count() > 1;
        let joined = Joined {
            engine: child.engine,
            preferred: Vec::new(),
            ctx: parent.context().1,
            device: parent.device(),
            rank: child.rank,
            size: child.size,
            id: format!("{}-s{k}c{col}", parent.id),
            multi,
            host_of: child_host_of(parent.host_of.as_deref(), choices.as_deref(), col),
        };
        // Children not wrapped yet are aborted when dropped.
        let g = DeviceComm::wrap(&parent.host, joined)?;
        g.set_timeout(parent.timeout());
        out.push(Some(g));
    }
    Ok(out)
}

/// Split every communicator's engine, in one launch group when this process drives several
/// (NCCL needs the splits of one process's GPUs issued together), then finish the children once
/// the group ended. Every split is issued even after one fails: the other ranks wait for it.
fn split_engines(
    comms: &[Arc<DeviceComm>],
    how: &[(i32, i32)],
) -> EngineResult<Vec<Option<Child>>> {
    let groups = match comms.len() {
        1 => Vec::new(),
        _ => select::launch_groups()?,
    };
    for g in &groups {
        g.start()?;
    }
    let mut issued = Ok(());
    let mut pending = Vec::with_capacity(comms.len());
    for (c, &(color, key)) in comms.iter().zip(how) {
        match c.fallback().split_begin(color, key) {
            Ok(p) => pending.push(p),
            Err(f) => issued = issued.and(Err(f)),
        }
    }
    for g in groups.iter().rev() {
        if let Err(e) = g.end() {
            issued = issued.and(Err(e.into()));
        }
    }
    issued?;
    // Unfinished children are released when dropped.
    pending.into_iter().map(|p| p.finish()).collect()
}

/// A rank's `"color key"` as posted for a split.
fn parse_choice(v: &[u8]) -> Option<(i32, i32)> {
    let text = std::str::from_utf8(v).ok()?;
    let (col, key) = text.split_once(' ')?;
    Some((col.parse().ok()?, key.parse().ok()?))
}

/// The host rank of each rank of the split's child of color `col`, in the child's rank order
/// (ordered by key, then by parent rank), from the parent's map and every parent rank's
/// (color, key).
fn child_host_of(
    parent: Option<&[usize]>,
    choices: Option<&[(i32, i32)]>,
    col: i32,
) -> Option<Vec<usize>> {
    let (parent, choices) = (parent?, choices?);
    let mut members: Vec<usize> = (0..choices.len())
        .filter(|&r| choices[r].0 == col)
        .collect();
    members.sort_by_key(|&r| (choices[r].1, r));
    members.iter().map(|&r| parent.get(r).copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_child_knows_which_processes_hold_its_ranks() {
        // Parent: 4 ranks on 2 processes (2 GPUs each). Colors 0,1,0,1; keys reverse rank 0/2.
        let parent = [0, 0, 1, 1];
        let choices = [(0, 5), (1, 0), (0, 1), (1, 0)];
        // Color 0: ranks 2 (key 1) then 0 (key 5): processes 1, 0.
        assert_eq!(
            child_host_of(Some(&parent), Some(&choices), 0),
            Some(vec![1, 0])
        );
        // Color 1: equal keys keep the parent order: ranks 1, 3.
        assert_eq!(
            child_host_of(Some(&parent), Some(&choices), 1),
            Some(vec![0, 1])
        );
        assert_eq!(child_host_of(None, Some(&choices), 0), None);
        assert_eq!(child_host_of(Some(&parent), None, 0), None);
        assert_eq!(parse_choice(b"-1 7"), Some((-1, 7)));
        assert_eq!(parse_choice(b"3"), None);
    }
}
