//! Algorithms as data.
//!
//! An algorithm is a pure function `(collective, world, rank) -> Schedule`: no I/O, no clocks. A
//! [`Schedule`] is a list of rounds; each round is a list of [`Step`]s over element ranges
//! ([`Span`]) of three buffers: the caller's input ([`Buf::In`]), the caller's output
//! ([`Buf::Out`]) and a scratch buffer ([`Buf::Tmp`], `tmp_len` elements) the executor allocates.
//!
//! ## Execution semantics (shared by the executor and the symbolic checker)
//! For each round in order:
//! 1. every [`Step::Send`] of the round is performed, in order, reading the buffers as they are at
//!    the start of the round;
//! 2. then every other step, in order ([`Step::Recv`] and [`Step::RecvReduce`] wait for the
//!    matching message).
//!
//! Messages between a pair of ranks within one call are matched in FIFO order, so sender and
//! receiver must list them in the same order. Sends never wait for the receiver, so a schedule
//! deadlocks only if some receive has no matching send — which the checker rules out.
//!
//! When `In` and `Out` are the same memory (an in-place call), a [`Step::Copy`] between identical
//! ranges is a no-op; algorithms must not otherwise rely on `In` and `Out` being distinct or equal.

use crate::error::{Error, Result};
use std::fmt;

pub mod algorithms;
pub mod calibrated;
pub mod check;
pub mod pieces;
pub mod sim;
pub mod tuner;

mod agreement;
mod allgather;
mod allreduce;
mod alltoall;
mod barrier;
mod broadcast;
mod gather_scatter;
mod plan;
mod recursive;
mod reduce;
mod reduce_scatter;
mod scan;

/// Which buffer a span refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The caller's input (read only).
    In,
    /// The caller's output.
    Out,
    /// Scratch space owned by the executor.
    Tmp,
}

/// A range of elements in one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    /// The buffer.
    pub buf: Buf,
    /// First element.
    pub off: usize,
    /// Number of elements.
    pub len: usize,
}

impl Span {
    /// Shorthand constructor.
    pub const fn new(buf: Buf, off: usize, len: usize) -> Self {
        Span { buf, off, len }
    }
}

/// One thing a rank does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Send `src` to `peer`.
    Send {
        /// Destination rank.
        peer: usize,
        /// What to send.
        src: Span,
    },
    /// Receive a message from `peer` into `dst` (its length must equal `dst.len`).
    Recv {
        /// Source rank.
        peer: usize,
        /// Where it goes.
        dst: Span,
    },
    /// Receive a message from `peer` and reduce it with `src` into `dst` (`dst = src op msg`):
    /// `src` is `dst` where `dst` accumulates, another range of equal length (the input) where
    /// the first reduction of a range would otherwise follow a copy of it.
    RecvReduce {
        /// Source rank.
        peer: usize,
        /// The local operand.
        src: Span,
        /// Where the result goes.
        dst: Span,
    },
    /// Local copy, `src` and `dst` of equal length.
    Copy {
        /// Source.
        src: Span,
        /// Destination.
        dst: Span,
    },
    /// Local reduction `dst = dst op src`.
    Reduce {
        /// Operand.
        src: Span,
        /// Accumulator.
        dst: Span,
    },
    /// Apply the reduce operator's final step to a fully reduced range (avg: divide by world).
    Finalize {
        /// The range.
        dst: Span,
    },
}

impl Step {
    /// The same step with every span passed through `f`.
    pub fn with_spans(self, mut f: impl FnMut(Span) -> Span) -> Step {
        match self {
            Step::Send { peer, src } => Step::Send { peer, src: f(src) },
            Step::Recv { peer, dst } => Step::Recv { peer, dst: f(dst) },
            Step::RecvReduce { peer, src, dst } => Step::RecvReduce {
                peer,
                src: f(src),
                dst: f(dst),
            },
            Step::Copy { src, dst } => Step::Copy {
                src: f(src),
                dst: f(dst),
            },
            Step::Reduce { src, dst } => Step::Reduce {
                src: f(src),
                dst: f(dst),
            },
            Step::Finalize { dst } => Step::Finalize { dst: f(dst) },
        }
    }
}

/// A complete plan for one rank's part of one call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    /// Rounds, executed in order (see the module docs for the semantics).
    pub rounds: Vec<Vec<Step>>,
    /// Elements of scratch space the plan needs.
    pub tmp_len: usize,
}

impl Schedule {
    /// Every step, in order.
    pub fn steps(&self) -> impl Iterator<Item = &Step> {
        self.rounds.iter().flatten()
    }
}

pub use crate::op::Collective;

/// The algorithms Accord knows. Not every algorithm applies to every collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// Every rank talks to the peers it needs directly (linear); best for tiny worlds.
    Direct,
    /// Ring: bandwidth-optimal for large messages.
    Ring,
    /// Recursive doubling: log2(p) rounds, full-size messages; latency-optimal.
    RecursiveDoubling,
    /// Recursive halving then doubling (Rabenseifner): log rounds and bandwidth-optimal.
    Rabenseifner,
    /// Binomial tree.
    BinomialTree,
    /// Broadcast as scatter + ring allgather (van de Geijn), for large broadcasts.
    ScatterAllgather,
    /// Bruck: log rounds for small all-to-all / allgather.
    Bruck,
    /// Pairwise exchange: p-1 rounds, one peer each, for large all-to-all.
    Pairwise,
    /// Dissemination barrier.
    Dissemination,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 9] = [
        Algorithm::Direct,
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::Rabenseifner,
        Algorithm::BinomialTree,
        Algorithm::ScatterAllgather,
        Algorithm::Bruck,
        Algorithm::Pairwise,
        Algorithm::Dissemination,
    ];

    /// Name as used in `ACCORD_ALGO_<OP>` and tables.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Direct => "direct",
            Algorithm::Ring => "ring",
            Algorithm::RecursiveDoubling => "recursive_doubling",
            Algorithm::Rabenseifner => "rabenseifner",
            Algorithm::BinomialTree => "binomial",
            Algorithm::ScatterAllgather => "scatter_allgather",
            Algorithm::Bruck => "bruck",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Dissemination => "dissemination",
        }
    }

    /// Parse a name (also accepts `rd`, `tree`, `halving_doubling`).
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase().replace('-', "_");
        let alias = match s.as_str() {
            "rd" => "recursive_doubling",
            "tree" | "binomial_tree" => "binomial",
            "halving_doubling" | "recursive_halving" => "rabenseifner",
            other => other,
        };
        Self::ALL
            .iter()
            .copied()
            .find(|a| a.name() == alias)
            .ok_or_else(|| Error::invalid(format!("unknown algorithm {s:?}")))
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
