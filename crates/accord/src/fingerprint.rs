//! The fingerprint of a call: what every rank must agree on for a collective to be well formed.
//!
//! Every frame on the wire carries its operation's fingerprint. A receiver compares the frame's
//! fingerprint to its own call's, so two ranks that call different operations (or the same one
//! with a different dtype, count, root or reduce op) get a [`crate::Error::Desync`] naming both
//! calls instead of wrong data or a hang. A call that runs a message schedule also carries its
//! algorithm: ranks that chose different ones (`ACCORD_ALGO_<OP>` or
//! [`crate::Communicator::force_algorithm`] set differently) would exchange blocks of the same
//! size that mean different things.

use crate::dtype::{DataType, ReduceOp};
use crate::schedule::Algorithm;
use std::fmt;

/// Which operation a frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum OpKind {
    P2p = 1,
    Barrier = 2,
    Broadcast = 3,
    Reduce = 4,
    AllReduce = 5,
    AllGather = 6,
    AllGatherV = 7,
    Gather = 8,
    GatherV = 9,
    Scatter = 10,
    ScatterV = 11,
    ReduceScatter = 12,
    ReduceScatterV = 13,
    AllToAll = 14,
    AllToAllV = 15,
    SendRecv = 16,
    Scan = 17,
    ExScan = 18,
}

impl OpKind {
    /// Every kind, in wire order.
    pub const ALL: [OpKind; 18] = [
        OpKind::P2p,
        OpKind::Barrier,
        OpKind::Broadcast,
        OpKind::Reduce,
        OpKind::AllReduce,
        OpKind::AllGather,
        OpKind::AllGatherV,
        OpKind::Gather,
        OpKind::GatherV,
        OpKind::Scatter,
        OpKind::ScatterV,
        OpKind::ReduceScatter,
        OpKind::ReduceScatterV,
        OpKind::AllToAll,
        OpKind::AllToAllV,
        OpKind::SendRecv,
        OpKind::Scan,
        OpKind::ExScan,
    ];

    /// Lower-case name as users call it (`allreduce`, `reduce_scatter`...).
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::P2p => "send",
            OpKind::Barrier => "barrier",
            OpKind::Broadcast => "broadcast",
            OpKind::Reduce => "reduce",
            OpKind::AllReduce => "allreduce",
            OpKind::AllGather => "allgather",
            OpKind::AllGatherV => "allgatherv",
            OpKind::Gather => "gather",
            OpKind::GatherV => "gatherv",
            OpKind::Scatter => "scatter",
            OpKind::ScatterV => "scatterv",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::ReduceScatterV => "reduce_scatterv",
            OpKind::AllToAll => "alltoall",
            OpKind::AllToAllV => "alltoallv",
            OpKind::SendRecv => "sendrecv",
            OpKind::Scan => "scan",
            OpKind::ExScan => "exscan",
        }
    }

    /// Decode the wire byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| *k as u8 == v)
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What all ranks of one collective call must agree on.
///
/// Fields that are not meaningful for a kind (no root for allreduce, per-rank counts for
/// alltoallv) are left at their defaults, so they compare equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    /// The operation.
    pub kind: OpKind,
    /// Element type.
    pub dtype: DataType,
    /// Reduce operator, for reducing operations.
    pub op: Option<ReduceOp>,
    /// Root rank, for rooted operations.
    pub root: Option<u32>,
    /// The element count every rank must pass (per-rank block for allgather/scatter/alltoall).
    pub count: u64,
    /// Hash of a count vector all ranks must agree on (allgatherv, reduce_scatterv), else 0.
    pub counts_hash: u64,
    /// The algorithm of a call that runs a message schedule.
    pub algo: Option<Algorithm>,
}

/// Size of a fingerprint on the wire.
pub const FINGERPRINT_WIRE_LEN: usize = 24;

// The algorithm's place is encoded in four bits.
const _: () = assert!(Algorithm::ALL.len() < 16);

impl Fingerprint {
    /// A fingerprint with only kind, dtype and count set.
    pub fn new(kind: OpKind, dtype: DataType, count: usize) -> Self {
        Fingerprint {
            kind,
            dtype,
            op: None,
            root: None,
            count: count as u64,
            counts_hash: 0,
            algo: None,
        }
    }

    /// Set the algorithm.
    pub fn with_algorithm(mut self, algo: Algorithm) -> Self {
        self.algo = Some(algo);
        self
    }

    /// Set the reduce operator.
    pub fn with_op(mut self, op: ReduceOp) -> Self {
        self.op = Some(op);
        self
    }

    /// Set the root.
    pub fn with_root(mut self, root: usize) -> Self {
        self.root = Some(root as u32);
        self
    }

    /// Set the hash of a count vector all ranks must agree on.
    pub fn with_counts(mut self, counts: &[usize]) -> Self {
        self.counts_hash = hash_counts(counts);
        self
    }

    /// This call as an error names it beside `other`: with its algorithm where that is all
    /// the two differ in (elsewhere the algorithm would only hide the difference that matters).
    pub fn shown_beside(&self, other: &Fingerprint) -> String {
        let call = |f: &Fingerprint| Fingerprint { algo: None, ..*f };
        match self.algo {
            Some(a) if call(self) == call(other) => format!("{self} by {a}"),
            _ => self.to_string(),
        }
    }

    /// Encode to the fixed wire form.
    pub fn encode(&self) -> [u8; FINGERPRINT_WIRE_LEN] {
        let mut b = [0u8; FINGERPRINT_WIRE_LEN];
        b[0] = self.kind as u8;
        b[1] = self.dtype as u8;
        b[2] = self.op.map_or(0, |o| o as u8);
        // Bit 0: a root follows; bits 1-4: the algorithm's place in `Algorithm::ALL`, plus 1.
        let algo = self
            .algo
            .and_then(|a| Algorithm::ALL.iter().position(|&x| x == a))
            .map_or(0, |i| i as u8 + 1);
        b[3] = self.root.is_some() as u8 | algo << 1;
        b[4..8].copy_from_slice(&self.root.unwrap_or(0).to_le_bytes());
        b[8..16].copy_from_slice(&self.count.to_le_bytes());
        b[16..24].copy_from_slice(&self.counts_hash.to_le_bytes());
        b
    }

    /// Decode the wire form; `None` if any field is not a valid value.
    pub fn decode(b: &[u8; FINGERPRINT_WIRE_LEN]) -> Option<Self> {
        let kind = OpKind::from_u8(b[0])?;
        let dtype = DataType::from_u8(b[1])?;
        let op = match b[2] {
            0 => None,
            v => Some(ReduceOp::from_u8(v)?),
        };
        let root = match b[3] & 1 {
            0 => None,
            _ => Some(u32::from_le_bytes(b[4..8].try_into().ok()?)),
        };
        let algo = match (b[3] >> 1) as usize {
            0 => None,
            i => Some(*Algorithm::ALL.get(i - 1)?),
        };
        Some(Fingerprint {
            kind,
            dtype,
            op,
            root,
            count: u64::from_le_bytes(b[8..16].try_into().ok()?),
            counts_hash: u64::from_le_bytes(b[16..24].try_into().ok()?),
            algo,
        })
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({}", self.kind, self.dtype)?;
        match self.kind {
            OpKind::AllGatherV | OpKind::ReduceScatterV if self.counts_hash != 0 => {
                write!(f, " x counts#{:08x}", self.counts_hash as u32)?
            }
            OpKind::GatherV | OpKind::ScatterV | OpKind::AllToAllV | OpKind::Barrier => {}
            _ => write!(f, " x {}", self.count)?,
        }
        if let Some(op) = self.op {
            write!(f, ", {op}")?;
        }
        if let Some(root) = self.root {
            write!(f, ", root {root}")?;
        }
        f.write_str(")")
    }
}

/// FNV-1a over the counts: cheap, stable across processes and platforms.
pub fn hash_counts(counts: &[usize]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &c in counts {
        for b in (c as u64).to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h | 1 // never 0, which means "no counts"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_round_trip_and_display() {
        let fp = Fingerprint::new(OpKind::Broadcast, DataType::F32, 1024).with_root(0);
        assert_eq!(Fingerprint::decode(&fp.encode()), Some(fp));
        assert_eq!(fp.to_string(), "broadcast(f32 x 1024, root 0)");
        let fp = Fingerprint::new(OpKind::AllReduce, DataType::F32, 1024).with_op(ReduceOp::Sum);
        assert_eq!(fp.to_string(), "allreduce(f32 x 1024, sum)");
        assert_eq!(Fingerprint::decode(&fp.encode()), Some(fp));
        let mut bad = fp.encode();
        bad[0] = 200;
        assert_eq!(Fingerprint::decode(&bad), None);
        for algo in Algorithm::ALL {
            let by = fp.with_root(3).with_algorithm(algo);
            assert_eq!(Fingerprint::decode(&by.encode()), Some(by));
            assert_ne!(by, fp.with_root(3), "{algo}");
        }
        let by = fp.with_algorithm(Algorithm::Ring);
        assert_eq!(by.to_string(), "allreduce(f32 x 1024, sum)");
        let direct = fp.with_algorithm(Algorithm::Direct);
        assert_eq!(
            by.shown_beside(&direct),
            "allreduce(f32 x 1024, sum) by ring"
        );
        let other = Fingerprint::new(OpKind::Broadcast, DataType::F32, 1024).with_root(0);
        assert_eq!(by.shown_beside(&other), "allreduce(f32 x 1024, sum)");
        let mut bad = fp.encode();
        bad[3] = (Algorithm::ALL.len() as u8 + 1) << 1;
        assert_eq!(Fingerprint::decode(&bad), None);
    }
}
