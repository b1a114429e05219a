//! The algorithm library: which algorithms apply to a collective, and building their schedules.

use super::{Algorithm, Buf, Collective, Schedule, Span, Step};
use crate::error::{Error, Result};

/// Algorithms that can compute `coll`, most general first.
pub fn applicable(coll: &Collective) -> &'static [Algorithm] {
    match coll {
        Collective::AllReduce { .. } => &[Algorithm::Direct],
        _ => &[],
    }
}

/// Build `rank`'s schedule for `coll` in a world of `world` ranks with `algo`.
pub fn build(coll: &Collective, world: usize, rank: usize, algo: Algorithm) -> Result<Schedule> {
    match (coll, algo) {
        (Collective::AllReduce { count }, Algorithm::Direct) => {
            Ok(direct_allreduce(*count, world, rank))
        }
        _ => Err(Error::Unsupported(format!(
            "{} has no {algo} algorithm",
            coll.kind()
        ))),
    }
}

/// Placeholder: everyone sends everything to everyone and reduces in rank order.
fn direct_allreduce(count: usize, world: usize, rank: usize) -> Schedule {
    let all = |b| Span::new(b, 0, count);
    let mut sends = vec![Step::Copy {
        src: all(Buf::In),
        dst: all(Buf::Out),
    }];
    for p in (0..world).filter(|&p| p != rank) {
        sends.push(Step::Send {
            peer: p,
            src: all(Buf::In),
        });
    }
    let mut recvs = Vec::new();
    for p in (0..world).filter(|&p| p != rank) {
        recvs.push(Step::RecvReduce {
            peer: p,
            dst: all(Buf::Out),
        });
    }
    recvs.push(Step::Finalize { dst: all(Buf::Out) });
    Schedule {
        rounds: vec![sends, recvs],
        tmp_len: 0,
    }
}
