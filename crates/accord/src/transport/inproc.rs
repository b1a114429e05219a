//! Ranks as threads of one process: frames go straight into the peer's [`Mailbox`].
//!
//! The test suite runs every algorithm over this transport; it exercises the same chunking,
//! matching, timeout and abort paths as the network transports.

use super::waits::Answer;
use super::{chunk_bytes, for_each_chunk, Envelope, Frame, LinkKind, Mailbox, Transport};
use crate::error::{Error, Result};
use std::sync::Arc;

/// One rank's end of an in-process world.
pub struct InProcess {
    rank: usize,
    boxes: Arc<Vec<Mailbox>>,
}

impl InProcess {
    /// Create a world of `n` connected ranks; element `i` is rank `i`'s transport.
    pub fn world(n: usize) -> Vec<Arc<InProcess>> {
        Self::world_with_cap(n, super::mailbox::max_unmatched_bytes())
    }

    /// Like [`InProcess::world`], where one rank may leave at most `cap` bytes untaken in
    /// another's mailbox (see [`super::mailbox`]).
    pub fn world_with_cap(n: usize, cap: usize) -> Vec<Arc<InProcess>> {
        let boxes: Arc<Vec<Mailbox>> = Arc::new((0..n).map(|_| Mailbox::with_cap(cap)).collect());
        (0..n)
            .map(|rank| {
                Arc::new(InProcess {
                    rank,
                    boxes: boxes.clone(),
                })
            })
            .collect()
    }

    /// Simulate this rank's death: every peer sees it as lost.
    pub fn kill(&self) {
        for (peer, b) in self.boxes.iter().enumerate() {
            if peer != self.rank {
                b.peer_lost(self.rank, "in-process rank killed");
            }
        }
    }
}

impl Transport for InProcess {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.boxes.len()
    }

    fn name(&self) -> &'static str {
        "inproc"
    }

    fn link(&self) -> LinkKind {
        LinkKind::InProcess
    }

    fn send(&self, peer: usize, env: &Envelope, data: &[u8]) -> Result<()> {
        let dst = self.boxes.get(peer).ok_or_else(|| {
            Error::invalid(format!("peer {peer} outside a world of {}", self.size()))
        })?;
        if let Some(cause) = self.boxes[self.rank].lost(peer) {
            return Err(Error::PeerLost { rank: peer, cause });
        }
        for_each_chunk(data, chunk_bytes(), |off, bytes| {
            dst.deliver(
                self.rank,
                Frame::new(*env, data.len() as u64, off as u64, bytes.to_vec()),
            );
            Ok(())
        })
    }

    fn mailbox(&self) -> &Mailbox {
        &self.boxes[self.rank]
    }

    fn abort(&self, by: usize, reason: &str) {
        for b in self.boxes.iter() {
            b.abort(by, reason);
        }
    }

    /// Peers are threads of this process: read what they wait for directly.
    fn probe(&self, peers: &[usize], _within: std::time::Duration) -> Vec<Answer> {
        peers
            .iter()
            .map(|&p| {
                if p == self.rank || p >= self.boxes.len() {
                    return Answer::Unknown;
                }
                match self.boxes[self.rank].lost(p) {
                    Some(cause) => Answer::Lost(cause),
                    None => Answer::Waiting(self.boxes[p].waits().now()),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_of_one_process_are_in_process_links() {
        let w = InProcess::world(2);
        assert_eq!((w[1].rank(), w[1].size(), w[1].name()), (1, 2, "inproc"));
        assert_eq!(w[0].link(), LinkKind::InProcess);
    }
}
