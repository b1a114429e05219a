//! The schedules a communicator has built, by call: looked up on every call that runs one, so
//! the lookup borrows the caller's collective (an allgather's counts are not copied to ask) and
//! hashes with FxHash (a keyed SipHash cost more than the rest of a small call's bookkeeping).

use super::Plan;
use crate::fingerprint::OpKind;
use crate::schedule::Collective;
use rustc_hash::FxHashMap;

/// Most plans kept for one (operation, element size): workloads with ever-changing sizes must
/// not grow the cache forever.
const MAX_PLANS: usize = 4096;

/// Plans by (operation, element size), then collective: the algorithm choice depends on all
/// three (an all-to-all-v takes pairwise whatever its counts, which a regular all-to-all of
/// the same counts need not).
#[derive(Default)]
pub(super) struct Plans {
    by_call: FxHashMap<(OpKind, usize), FxHashMap<Collective, Plan>>,
}

impl Plans {
    /// The plan for this call, if built.
    pub fn get(&self, kind: OpKind, coll: &Collective, elem_size: usize) -> Option<&Plan> {
        self.by_call.get(&(kind, elem_size))?.get(coll)
    }

    /// Keep `plan` for this call.
    pub fn insert(&mut self, kind: OpKind, coll: &Collective, elem_size: usize, plan: Plan) {
        let plans = self.by_call.entry((kind, elem_size)).or_default();
        if plans.len() >= MAX_PLANS {
            plans.clear();
        }
        plans.insert(coll.clone(), plan);
    }

    /// Forget every plan (the algorithm choices changed).
    pub fn clear(&mut self) {
        self.by_call.clear();
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
            p.insert(OpKind::AllGather, &ag(n + 10), 4, plan(Algorithm::Direct));
        }
        assert!(p.by_call[&(OpKind::AllGather, 4)].len() <= MAX_PLANS);
        p.clear();
        assert!(p.get(OpKind::AllGather, &ag(20), 4).is_none());
    }
}
