//! Algorithm selection from a latency/bandwidth cost model.
//!
//! Each algorithm's time is predicted in closed form from the classic alpha-beta-gamma model:
//! `alpha` per message (latency plus per-message overhead), `beta` per byte moved over a link and
//! `gamma` per byte reduced. Local copies are charged half of `gamma`. The formulas follow the
//! schedules in this module (rounds, message sizes, the extra rounds of folding a world that is
//! not a power of two), using the largest block where block sizes are uneven. The choice for a
//! call is the cheapest applicable algorithm, ties going to the one listed first by
//! [`algorithms::applicable`]; `ACCORD_ALGO_<OP>` (e.g. `ACCORD_ALGO_ALLREDUCE=ring`,
//! `ACCORD_ALGO_REDUCE_SCATTER=rabenseifner`) overrides it. The model's constants are built in
//! per kind of link ([`CostModel::for_link`]) unless `ACCORD_TUNER_PROFILE` names a profile
//! measured on the machine ([`super::calibrated`]).
//!
//! Every rank of a call must pick the same algorithm; the inputs here are the same on every rank
//! for all collectives except all-to-all-v, whose callers should pass an explicit algorithm.

use super::plan::{ceil_log2, Fold};
use super::{algorithms, Algorithm, Collective};
use crate::config::Config;
use crate::transport::LinkKind;
use std::fmt::Write as _;

/// Machine parameters of the cost model, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Cost of one message regardless of size (latency and per-message overhead).
    pub alpha_us: f64,
    /// Cost of moving one byte to a peer (inverse bandwidth).
    pub beta_us_per_byte: f64,
    /// Cost of reducing one byte into an accumulator.
    pub gamma_us_per_byte: f64,
    /// The share of `beta` a byte costs when a rank has a message to and from every peer in
    /// flight at once (direct all-to-all) on up to [`DIRECT_ALLTOALL_MAX_RANKS`] ranks: below 1
    /// where the transport moves several peers' messages in parallel.
    pub concurrent_share: f64,
}

impl CostModel {
    /// TCP over 10 Gb Ethernet: about 25 us per message and 1.25 GB/s.
    pub const fn tcp() -> Self {
        CostModel {
            alpha_us: 25.0,
            beta_us_per_byte: 1.0 / 1250.0,
            gamma_us_per_byte: 1.0 / 5000.0,
            // Each peer's connection has reader threads of its own, which read a posted
            // receive's frames straight into place (see DIRECT_ALLTOALL_MAX_RANKS).
            concurrent_share: 0.8,
        }
    }

    /// Shared memory between processes: a few microseconds per message, about 10 GB/s.
    pub const fn shm() -> Self {
        CostModel {
            alpha_us: 1.5,
            beta_us_per_byte: 1.0 / 10_000.0,
            gamma_us_per_byte: 1.0 / 5000.0,
            concurrent_share: 1.0,
        }
    }

    /// Threads in one process: a channel hand-off per message, memory bandwidth for bytes.
    pub const fn inproc() -> Self {
        CostModel {
            alpha_us: 0.5,
            beta_us_per_byte: 1.0 / 20_000.0,
            gamma_us_per_byte: 1.0 / 5000.0,
            concurrent_share: 1.0,
        }
    }

    /// `k` messages carrying `bytes` in total.
    fn msgs(&self, k: f64, bytes: f64) -> f64 {
        k * self.alpha_us + bytes * self.beta_us_per_byte
    }

    /// Reducing `bytes`.
    fn reduce(&self, bytes: f64) -> f64 {
        bytes * self.gamma_us_per_byte
    }

    /// Copying `bytes` locally.
    fn copy(&self, bytes: f64) -> f64 {
        bytes * self.gamma_us_per_byte / 2.0
    }
}

impl CostModel {
    /// The model for a world whose slowest link is `link` (see [`Transport::link`]).
    ///
    /// [`Transport::link`]: crate::transport::Transport::link
    pub const fn for_link(link: LinkKind) -> Self {
        match link {
            LinkKind::InProcess => Self::inproc(),
            LinkKind::SharedMemory => Self::shm(),
            LinkKind::Tcp => Self::tcp(),
        }
    }
}

impl Default for CostModel {
    fn default() -> Self {
        Self::tcp()
    }
}

/// Sizes of a call in bytes, as the formulas need them.
struct Shape {
    p: f64,
    /// `ceil(log2 p)`: rounds of a tree or of Bruck.
    lg: f64,
    /// `log2` of the folded power of two, and whether folding costs extra rounds.
    lg_pow: f64,
    pow: f64,
    folded: bool,
    /// The whole payload (see [`Collective::elements`]).
    n: f64,
    /// The largest per-rank block.
    blk: f64,
}

impl Shape {
    fn new(coll: &Collective, world: usize, elem_size: usize) -> Self {
        let fold = Fold::new(world.max(1));
        let es = elem_size as f64;
        let blk = match coll {
            Collective::AllGather { counts }
            | Collective::Gather { counts, .. }
            | Collective::Scatter { counts, .. }
            | Collective::ReduceScatter { counts } => counts.iter().copied().max().unwrap_or(0),
            Collective::AllToAll {
                send_counts,
                recv_counts,
            } => send_counts
                .iter()
                .chain(recv_counts)
                .copied()
                .max()
                .unwrap_or(0),
            other => other.elements().div_ceil(world.max(1)),
        };
        Shape {
            p: world as f64,
            lg: ceil_log2(world.max(1)) as f64,
            lg_pow: fold.pow.trailing_zeros() as f64,
            pow: fold.pow as f64,
            folded: fold.rem > 0,
            n: coll.elements() as f64 * es,
            blk: blk as f64 * es,
        }
    }

    /// The part of `n` a rank does not already own after a power-of-two reduce-scatter.
    fn pow_share(&self) -> f64 {
        (self.pow - 1.0) / self.pow * self.n
    }
}

/// A direct all-to-all has a message to and from every peer in flight at once, where pairwise
/// exchange has one of each per round: on up to this many ranks the model charges its bytes
/// [`CostModel::concurrent_share`] of pairwise's (TCP: 0.8, a calibrated profile's scaled to
/// keep the same crossover, `schedule::calibrated`; shared memory and threads, whose
/// messages this does not speed up: 1), and one message more for posting them all.
/// With every receive of a round posted before its sends (the executor), its messages land in
/// place however they interleave. Measured on 16 CPUs over TCP (4 and 8 ranks) and network
/// namespaces (2 x 2, 4 x 2): direct took 0.67-0.98x pairwise's time from 64 KiB blocks to 16
/// MiB, 0.91-1.01x at 16-32 KiB, 1.14x at 4 KiB (the model keeps pairwise or Bruck below about
/// 22 KiB at 8 ranks, 52 KiB at 4). Larger worlds, not measured, keep pairwise.
pub const DIRECT_ALLTOALL_MAX_RANKS: f64 = 8.0;

/// Predicted time in microseconds of `algo` for `coll` on `world` ranks with elements of
/// `elem_size` bytes; infinite where `algo` does not apply.
pub fn predict(
    coll: &Collective,
    world: usize,
    elem_size: usize,
    algo: Algorithm,
    model: &CostModel,
) -> f64 {
    if !algorithms::applicable(coll).contains(&algo) {
        return f64::INFINITY;
    }
    if world <= 1 {
        return 0.0;
    }
    let s = Shape::new(coll, world, elem_size);
    let m = model;
    let (p, n, blk) = (s.p, s.n, s.blk);
    // Folding a world onto a power of two costs `k` extra messages carrying `bytes` (and, for
    // reductions, reducing the folded rank's data on the way in).
    let fold = |k: f64, bytes: f64, reduce: bool| -> f64 {
        if !s.folded {
            return 0.0;
        }
        m.msgs(k, bytes) + if reduce { m.reduce(n) } else { 0.0 }
    };
    // Rooted schedules that make ranks agree with a barrier first (see `agreement`) pay for it.
    let agreement = match algorithms::needs_tokens(coll, algo)
        && super::agreement::starts_with_barrier(algo, world)
    {
        true => m.msgs(s.lg, 0.0),
        false => 0.0,
    };
    use Algorithm::*;
    let schedule = match (coll, algo) {
        (Collective::Barrier, Dissemination) => m.msgs(s.lg, 0.0),
        (Collective::Barrier, _) => m.msgs(p - 1.0, 0.0),

        (Collective::Broadcast { count, .. }, Ring) => {
            let segs = super::broadcast::ring_segments(*count) as f64;
            m.msgs(p - 2.0 + segs, (p - 2.0 + segs) * n / segs)
        }
        (Collective::Broadcast { .. }, BinomialTree) => m.msgs(s.lg, s.lg * n),
        (Collective::Broadcast { .. }, ScatterAllgather) => {
            m.msgs(s.lg + p - 1.0, 2.0 * (p - 1.0) * blk)
        }
        (Collective::Broadcast { .. }, _) => m.msgs(p - 1.0, (p - 1.0) * n),

        (Collective::Reduce { .. }, BinomialTree) => m.msgs(s.lg, s.lg * n) + m.reduce(s.lg * n),
        (Collective::Reduce { .. }, Rabenseifner) => {
            fold(1.0, n, true)
                + m.msgs(2.0 * s.lg_pow, 2.0 * s.pow_share())
                + m.reduce(s.pow_share())
        }
        (Collective::Reduce { .. }, _) => m.msgs(p - 1.0, (p - 1.0) * n) + m.reduce((p - 1.0) * n),

        (Collective::AllReduce { .. }, Ring) => {
            m.msgs(2.0 * (p - 1.0), 2.0 * (p - 1.0) * blk) + m.reduce((p - 1.0) * blk)
        }
        (Collective::AllReduce { .. }, RecursiveDoubling) => {
            fold(2.0, 2.0 * n, true) + m.msgs(s.lg_pow, s.lg_pow * n) + m.reduce(s.lg_pow * n)
        }
        (Collective::AllReduce { .. }, Rabenseifner) => {
            fold(2.0, 2.0 * n, true)
                + m.msgs(2.0 * s.lg_pow, 2.0 * s.pow_share())
                + m.reduce(s.pow_share())
        }
        (Collective::AllReduce { .. }, _) => {
            m.msgs(p - 1.0, (p - 1.0) * n) + m.reduce((p - 1.0) * n) + m.copy(p * n)
        }

        (Collective::AllGather { .. }, Ring) => m.msgs(p - 1.0, (p - 1.0) * blk),
        (Collective::AllGather { .. }, RecursiveDoubling) => {
            fold(2.0, blk + n, false) + m.msgs(s.lg_pow, s.pow_share())
        }
        (Collective::AllGather { .. }, Bruck) => m.msgs(s.lg, n - n / p) + m.copy(n),
        (Collective::AllGather { .. }, _) => m.msgs(p - 1.0, (p - 1.0) * blk),

        (Collective::Gather { .. } | Collective::Scatter { .. }, BinomialTree) => {
            m.msgs(s.lg, n - n / p) + m.copy(n)
        }
        (Collective::Gather { .. } | Collective::Scatter { .. }, _) => m.msgs(p - 1.0, n - n / p),

        (Collective::ReduceScatter { .. }, Rabenseifner) => {
            fold(2.0, n + blk, true)
                + m.msgs(s.lg_pow, s.pow_share())
                + m.reduce(s.pow_share())
                + m.copy(blk)
        }
        (Collective::ReduceScatter { .. }, _) => {
            m.msgs(p - 1.0, (p - 1.0) * blk) + m.reduce((p - 1.0) * blk)
        }

        (Collective::AllToAll { .. }, Bruck) => {
            m.msgs(s.lg, s.lg * (p / 2.0).floor() * blk) + m.copy(2.0 * n + s.lg * n)
        }
        (Collective::AllToAll { .. }, Direct) if p <= DIRECT_ALLTOALL_MAX_RANKS => {
            m.msgs(p, m.concurrent_share * (p - 1.0) * blk)
        }
        (Collective::AllToAll { .. }, Direct) => m.msgs(p, (p - 1.0) * blk),
        (Collective::AllToAll { .. }, _) => m.msgs(p - 1.0, (p - 1.0) * blk),

        (Collective::Scan { .. }, _) => {
            m.msgs(s.lg, s.lg * n) + m.reduce(2.0 * s.lg * n) + m.copy(2.0 * n)
        }
    };
    schedule + agreement
}

/// The environment variable that overrides the choice for `coll`, e.g. `ACCORD_ALGO_ALLREDUCE`.
pub fn override_var(coll: &Collective) -> String {
    crate::config::algo_var(coll.kind())
}

/// Pick the algorithm for `coll`: the override in `ACCORD_ALGO_<OP>` if it names an applicable
/// algorithm, otherwise the one with the smallest predicted time.
pub fn select(coll: &Collective, world: usize, elem_size: usize, model: &CostModel) -> Algorithm {
    select_in(crate::config::get(), coll, world, elem_size, model)
}

/// [`select`] with the overrides of `cfg` instead of the process's configuration.
pub fn select_in(
    cfg: &Config,
    coll: &Collective,
    world: usize,
    elem_size: usize,
    model: &CostModel,
) -> Algorithm {
    select_with(coll, world, elem_size, model, cfg.algo(coll.kind()))
}

/// [`select`] with the override given explicitly instead of read from the environment.
pub fn select_with(
    coll: &Collective,
    world: usize,
    elem_size: usize,
    model: &CostModel,
    over: Option<&str>,
) -> Algorithm {
    if let Some(name) = over.filter(|s| !s.trim().is_empty()) {
        match Algorithm::parse(name) {
            Ok(a) if algorithms::applicable(coll).contains(&a) => return a,
            Ok(a) => tracing::warn!(
                "{}={name}: {a} does not apply to {}; choosing by cost model instead",
                override_var(coll),
                coll.kind().name()
            ),
            Err(e) => tracing::warn!(
                "{}: {e}; choosing by cost model instead",
                override_var(coll)
            ),
        }
    }
    cheapest(coll, world, elem_size, model)
}

/// The applicable algorithm with the smallest predicted time (the earliest listed on ties).
fn cheapest(coll: &Collective, world: usize, elem_size: usize, model: &CostModel) -> Algorithm {
    let mut best = (Algorithm::Direct, f64::INFINITY);
    for &a in algorithms::applicable(coll) {
        let t = predict(coll, world, elem_size, a, model);
        if t < best.1 {
            best = (a, t);
        }
    }
    best.0
}

/// A table of every applicable algorithm with its predicted time, the chosen one marked `*`
/// (and the environment override, if one is set).
pub fn explain(coll: &Collective, world: usize, elem_size: usize, model: &CostModel) -> String {
    explain_in(crate::config::get(), coll, world, elem_size, model)
}

/// [`explain`] with the overrides of `cfg` instead of the process's configuration.
pub fn explain_in(
    cfg: &Config,
    coll: &Collective,
    world: usize,
    elem_size: usize,
    model: &CostModel,
) -> String {
    let chosen = select_in(cfg, coll, world, elem_size, model);
    let mut s = format!(
        "{} on {world} ranks, {} elements x {elem_size} B (alpha {} us, beta {} us/B, gamma {} us/B)\n",
        coll.kind().name(),
        coll.elements(),
        model.alpha_us,
        model.beta_us_per_byte,
        model.gamma_us_per_byte
    );
    if let Some(v) = cfg.algo(coll.kind()) {
        let _ = writeln!(s, "  override {}={v}", override_var(coll));
    }
    for &a in algorithms::applicable(coll) {
        let mark = if a == chosen { '*' } else { ' ' };
        let t = predict(coll, world, elem_size, a, model);
        let _ = writeln!(s, "{mark} {:<20} {t:>14.1} us", a.name());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allreduce(count: usize) -> Collective {
        Collective::AllReduce { count }
    }

    #[test]
    fn small_allreduce_picks_a_latency_algorithm() {
        for model in [CostModel::tcp(), CostModel::shm(), CostModel::inproc()] {
            for world in [4, 8, 13, 64] {
                let a = select_with(&allreduce(8), world, 4, &model, None);
                assert_eq!(a, Algorithm::RecursiveDoubling, "world {world}");
            }
        }
    }

    #[test]
    fn large_allreduce_picks_a_bandwidth_algorithm() {
        for model in [CostModel::tcp(), CostModel::shm(), CostModel::inproc()] {
            for world in [4, 8, 13, 64, 1024] {
                let a = select_with(&allreduce(64 << 20), world, 4, &model, None);
                assert!(
                    matches!(a, Algorithm::Ring | Algorithm::Rabenseifner),
                    "world {world}: {a}"
                );
            }
        }
    }

    #[test]
    fn other_collectives_switch_with_size() {
        let m = CostModel::tcp();
        let bcast = |count| Collective::Broadcast { count, root: 0 };
        assert_eq!(
            select_with(&bcast(4), 16, 4, &m, None),
            Algorithm::BinomialTree
        );
        assert_ne!(
            select_with(&bcast(16 << 20), 16, 4, &m, None),
            Algorithm::BinomialTree
        );
        let a2a = |c, p| Collective::AllToAll {
            send_counts: vec![c; p],
            recv_counts: vec![c; p],
        };
        assert_eq!(select_with(&a2a(1, 64), 64, 4, &m, None), Algorithm::Bruck);
        assert_eq!(
            select_with(&a2a(1 << 16, 64), 64, 4, &m, None),
            Algorithm::Pairwise
        );
        assert_eq!(
            select_with(&Collective::Barrier, 32, 0, &m, None),
            Algorithm::Dissemination
        );
    }

    #[test]
    fn large_all_to_all_over_tcp_posts_every_message_at_once_in_small_worlds_only() {
        let m = CostModel::tcp();
        let a2a = |bytes: usize, p| Collective::AllToAll {
            send_counts: vec![bytes / 4; p],
            recv_counts: vec![bytes / 4; p],
        };
        for p in [3, 4, 8] {
            let big = select_with(&a2a(256 << 10, p), p, 4, &m, None);
            assert_eq!(big, Algorithm::Direct, "{p} ranks, 256 KiB blocks");
            let small = select_with(&a2a(4 << 10, p), p, 4, &m, None);
            assert_ne!(small, Algorithm::Direct, "{p} ranks, 4 KiB blocks");
        }
        for p in [9, 16, 64] {
            let big = select_with(&a2a(1 << 20, p), p, 4, &m, None);
            assert_eq!(big, Algorithm::Pairwise, "{p} ranks");
        }
        // Shared memory moves a peer's messages no faster for having all of them in flight.
        for model in [CostModel::shm(), CostModel::inproc()] {
            let big = select_with(&a2a(256 << 10, 8), 8, 4, &model, None);
            assert_eq!(big, Algorithm::Pairwise, "{model:?}");
        }
    }

    #[test]
    fn every_prediction_is_finite_and_grows_with_size() {
        let p = 12;
        let colls = [
            Collective::Barrier,
            Collective::Broadcast {
                count: 1000,
                root: 3,
            },
            Collective::Reduce {
                count: 1000,
                root: 3,
            },
            allreduce(1000),
            Collective::AllGather {
                counts: vec![100; p],
            },
            Collective::Gather {
                counts: vec![100; p],
                root: 1,
            },
            Collective::Scatter {
                counts: vec![100; p],
                root: 1,
            },
            Collective::ReduceScatter {
                counts: vec![100; p],
            },
            Collective::AllToAll {
                send_counts: vec![100; p],
                recv_counts: vec![100; p],
            },
        ];
        for c in &colls {
            for &a in algorithms::applicable(c) {
                let t = predict(c, p, 4, a, &CostModel::tcp());
                let big = predict(c, p, 400, a, &CostModel::tcp());
                assert!(
                    t.is_finite() && t >= 0.0 && big >= t,
                    "{c:?} {a}: {t} {big}"
                );
            }
        }
        assert!(predict(
            &Collective::Barrier,
            4,
            0,
            Algorithm::Ring,
            &CostModel::tcp()
        )
        .is_infinite());
    }

    #[test]
    fn override_wins_when_applicable_and_falls_back_otherwise() {
        let m = CostModel::tcp();
        let c = allreduce(8);
        assert_eq!(select_with(&c, 8, 4, &m, Some("ring")), Algorithm::Ring);
        assert_eq!(
            select_with(&c, 8, 4, &m, Some("RD")),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(
            select_with(&c, 8, 4, &m, Some("bruck")),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(
            select_with(&c, 8, 4, &m, Some("nonsense")),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(
            override_var(&Collective::ReduceScatter { counts: vec![] }),
            "ACCORD_ALGO_REDUCE_SCATTER"
        );
    }

    #[test]
    fn override_is_read_from_the_configuration() {
        let c = Collective::Scatter {
            counts: vec![1; 8],
            root: 0,
        };
        let set = Config::from_lookup(&|k| (k == "ACCORD_ALGO_SCATTER").then(|| "direct".into()));
        assert_eq!(
            select_in(&set, &c, 8, 4, &CostModel::tcp()),
            Algorithm::Direct
        );
        let table = explain_in(&set, &c, 8, 4, &CostModel::tcp());
        assert!(
            table.contains("override ACCORD_ALGO_SCATTER=direct")
                && table.contains("* direct")
                && table.contains("binomial"),
            "{table}"
        );
        let unset = Config::default();
        assert_eq!(
            select_in(&unset, &c, 8, 4, &CostModel::tcp()),
            Algorithm::BinomialTree
        );
        assert!(!explain_in(&unset, &c, 8, 4, &CostModel::tcp()).contains("override"));
    }

    #[test]
    fn each_link_kind_has_its_model() {
        assert_eq!(
            CostModel::for_link(LinkKind::InProcess),
            CostModel::inproc()
        );
        assert_eq!(
            CostModel::for_link(LinkKind::SharedMemory),
            CostModel::shm()
        );
        assert_eq!(CostModel::for_link(LinkKind::Tcp), CostModel::tcp());
        assert!(CostModel::shm().alpha_us < CostModel::tcp().alpha_us);
    }
}
