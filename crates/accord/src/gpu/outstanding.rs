//! The record of a device communicator's operations in flight: each one's place, fingerprint,
//! peers and event, retired in issue order once its event passes; the oldest unfinished one is
//! what the watchdog times and names in a timeout.

use super::device::Event;
use super::engine::P2p;
use crate::fingerprint::Fingerprint;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// An operation in flight, as the watchdog sees it.
pub(crate) struct Outstanding {
    pub seq: u64,
    /// For collectives: how many collectives this rank has entered, this one included.
    pub cseq: Option<u64>,
    pub fp: Fingerprint,
    /// For point-to-point operations: the ranks they send to and receive from.
    pub peers: Peers,
    pub event: Arc<Event>,
    pub since: Instant,
}

/// The peers of a point-to-point operation (its first send and first receive), so that a
/// timeout can name the rank whose matching operation never came.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Peers {
    pub send_to: Option<usize>,
    pub recv_from: Option<usize>,
}

impl Peers {
    pub(crate) fn of(ops: &[P2p]) -> Peers {
        let mut p = Peers::default();
        for o in ops {
            match *o {
                P2p::Send { peer, .. } => p.send_to = p.send_to.or(Some(peer)),
                P2p::Recv { peer, .. } => p.recv_from = p.recv_from.or(Some(peer)),
            }
        }
        p
    }

    /// The ranks, without repeats.
    pub fn ranks(&self) -> Vec<usize> {
        let mut r: Vec<usize> = self.send_to.into_iter().chain(self.recv_from).collect();
        r.dedup();
        r
    }
}

/// The oldest unfinished operation.
#[derive(Clone, Copy)]
pub(crate) struct Head {
    pub seq: u64,
    /// Its collective count (None for point-to-point).
    pub cseq: Option<u64>,
    pub fp: Fingerprint,
    pub peers: Peers,
    pub since: Instant,
}

impl Head {
    /// The operation in words: a point-to-point one says whether it sends or receives (their
    /// fingerprint is the same) and with which rank.
    pub fn what(&self) -> String {
        let call = self.fp.to_string();
        let args = call.find('(').map_or("", |i| &call[i..]);
        match (self.peers.send_to, self.peers.recv_from) {
            (Some(to), Some(from)) => format!("sendrecv{args} to rank {to}, from rank {from}"),
            (Some(to), None) => format!("send{args} to rank {to}"),
            (None, Some(from)) => format!("recv{args} from rank {from}"),
            (None, None) => call,
        }
    }
}

/// Bookkeeping updated on every operation (under one uncontended lock).
#[derive(Default)]
pub(crate) struct OpState {
    /// Operations issued (collective and point-to-point).
    pub seq: u64,
    /// Collectives issued: the number ranks compare.
    pub cseq: u64,
    pub hash: u64,
    pub last: Option<Fingerprint>,
    /// Which engine ran the last collective (its place in the list; ranks must agree, so it
    /// enters `hash`) and whether on symmetric-heap arrays (for messages).
    pub route: (usize, bool),
    pub outstanding: VecDeque<Outstanding>,
}

impl OpState {
    /// Retire finished operations in issue order, marking them finished (callers hold the abort
    /// lock, so no abort runs meanwhile); the oldest unfinished one. `faulted` says whether an
    /// engine's kernels recorded a failure: asked after an event passed (a kernel records its
    /// failure before it returns), so an operation that gave up is never marked finished.
    pub(crate) fn retire(&mut self, faulted: &dyn Fn() -> bool) -> Option<Head> {
        while let Some(front) = self.outstanding.front() {
            if !front.event.done().unwrap_or(false) || faulted() {
                return Some(Head {
                    seq: front.seq,
                    cseq: front.cseq,
                    fp: front.fp,
                    peers: front.peers,
                    since: front.since,
                });
            }
            front.event.finished.store(true, Ordering::Release);
            self.outstanding.pop_front();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DataType;
    use crate::fingerprint::OpKind;
    use crate::gpu::device::DeviceSlice;

    fn slice(count: usize, dtype: DataType) -> DeviceSlice {
        // SAFETY: never dereferenced; only its length and type are read.
        unsafe { DeviceSlice::from_raw(0x1000, count, dtype) }
    }

    #[test]
    fn a_stuck_message_names_its_direction_and_peer() {
        let head = |ops: &[P2p]| Head {
            seq: 6,
            cseq: None,
            fp: Fingerprint::new(OpKind::P2p, DataType::F32, 4),
            peers: Peers::of(ops),
            since: Instant::now(),
        };
        let (buf, other) = (slice(4, DataType::F32), slice(4, DataType::F32));
        let recv = head(&[P2p::Recv { buf, peer: 0 }]);
        assert_eq!(recv.what(), "recv(f32 x 4) from rank 0");
        assert_eq!(recv.peers.ranks(), vec![0]);
        let send = head(&[P2p::Send { buf, peer: 1 }]);
        assert_eq!(send.what(), "send(f32 x 4) to rank 1");
        let both = head(&[
            P2p::Send { buf, peer: 1 },
            P2p::Recv {
                buf: other,
                peer: 1,
            },
        ]);
        assert_eq!(both.what(), "sendrecv(f32 x 4) to rank 1, from rank 1");
        assert_eq!(both.peers.ranks(), vec![1], "one peer named once");
        let ring = head(&[
            P2p::Send { buf, peer: 2 },
            P2p::Recv {
                buf: other,
                peer: 0,
            },
        ]);
        assert_eq!(ring.peers.ranks(), vec![2, 0]);
        let mut coll = head(&[]);
        coll.fp = Fingerprint::new(OpKind::AllReduce, DataType::F32, 4);
        assert_eq!(coll.what(), coll.fp.to_string());
    }
}
