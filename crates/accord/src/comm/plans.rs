//! The schedules a communicator has built, by call: looked up on every call that runs one, so
//! the lookup borrows the caller's collective (an allgather's counts are not copied to ask) and
//! hashes with foldhash (std's SipHash cost more than the rest of a small call's bookkeeping).

use super::Plan;
use crate::fingerprint::OpKind;
use crate::schedule::Collective;
use foldhash::HashMap;

/// Most plans kept: workloads with ever-changing sizes must not grow the cache forever.
const MAX_PLANS: usize = 4096;

/// Plans by (operation, element size), then collective: the algorithm choice depends on all
/// three (an all-to-all-v takes pairwise whatever its counts, which a regular all-to-all of
/// the same counts need not).
#[derive(Default)]
pub(super) struct Plans {
    by_call: HashMap<(OpKind, usize), HashMap<Collective, Plan>>,
    /// Plans kept, over every (operation, element size).
    kept: usize,
}

impl Plans {
    /// The plan for this call, if built.
    pub fn get(&self, kind: OpKind, coll: &Collective, elem_size: usize) -> Option<&Plan> {
        self.by_call.get(&(kind, elem_size))?.get(coll)
    }

    /// Keep `plan` for this call.
    pub fn insert(&mut self, kind: OpKind, coll: &Collective, elem_size: usize, plan: Plan) {
        if self.kept >= MAX_PLANS && self.get(kind, coll, elem_size).is_none() {
            self.clear();
        }
        let plans = self.by_call.entry((kind, elem_size)).or_default();
        if plans.insert(coll.clone(), plan).is_none() {
            self.kept += 1;
        }
    }

    /// Forget every plan (the algorithm choices changed).
    pub fn clear(&mut self) {
        self.by_call.clear();
        self.kept = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Algorithm, Schedule};
    use std::sync::Arc;

    #[test]
    fn plans_are_found_by_operation_size_and_collective_and_stay_bounded() {
        let plan = |a| (Arc::new(Schedule::default()), a);
        let ag = |n| Collective::AllGather { counts: vec![n; 3] };
        let mut p = Plans::default();
        p.insert(OpKind::AllGather, &ag(4), 4, plan(Algorithm::Ring));
        assert_eq!(
            p.get(OpKind::AllGather, &ag(4), 4).unwrap().1,
            Algorithm::Ring
        );
        assert!(p.get(OpKind::AllGather, &ag(4), 8).is_none());
        assert!(p.get(OpKind::AllGather, &ag(5), 4).is_none());
        assert!(p.get(OpKind::Gather, &ag(4), 4).is_none());
        for n in 0..MAX_PLANS {
            let kind = [OpKind::AllGather, OpKind::Gather][n % 2];
            p.insert(kind, &ag(n + 10), 4 + n % 3, plan(Algorithm::Direct));
        }
        // The 4,097th plan found the cache full: it starts afresh.
        let kept: usize = p.by_call.values().map(|m| m.len()).sum();
        assert_eq!((kept, p.kept), (1, 1));
        // Keeping a plan again counts once, and does not empty a full cache.
        p.insert(OpKind::AllGather, &ag(1), 4, plan(Algorithm::Ring));
        p.insert(OpKind::AllGather, &ag(1), 4, plan(Algorithm::Ring));
        assert_eq!(p.kept, 2);
        p.clear();
        assert!(p.get(OpKind::AllGather, &ag(20), 4).is_none());
    }
}
