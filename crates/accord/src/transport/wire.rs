//! The fixed frame header used by byte-stream transports (TCP, and anything else that carries
//! frames as bytes).
//!
//! ```text
//! 0   magic "ACD1"        8  src rank  u32     16 comm      u64    32 total_len u64
//! 4   kind  u8            12 chunk_len u32     24 seq       u64    40 offset    u64
//! 5   order u24
//! 48  fingerprint (24 bytes)                                        72 end
//! ```
//!
//! All integers little-endian. [`Header::decode`] rejects anything inconsistent *before* a payload
//! buffer is allocated, so a hostile or corrupted header can never make the receiver allocate or
//! write more than [`super::MAX_CHUNK_BYTES`] (or the message size it expects).

use super::Envelope;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FINGERPRINT_WIRE_LEN};

/// The version of the frames' format, which ranks compare when a world forms: raise it with
/// any change to a header's or a fingerprint's encoding (2: fingerprints carry the algorithm).
pub const PROTOCOL: u32 = 2;

/// Header size on the wire.
pub const HEADER_LEN: usize = 72;
const MAGIC: [u8; 4] = *b"ACD1";
/// Largest abort reason accepted.
pub const MAX_REASON_BYTES: usize = 64 * 1024;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A chunk of a message.
    Data = 1,
    /// The sender gives up on the world; the payload is the reason (UTF-8).
    Abort = 2,
    /// The sender is shutting down cleanly; no more frames follow.
    Bye = 3,
    /// The sender asks what this rank's blocked calls wait for; the payload is a nonce (u64)
    /// that the answer repeats.
    Query = 4,
    /// The answer to a [`FrameKind::Query`]; the payload is described in
    /// [`super::waits`].
    Status = 5,
}

/// Payload bytes of a [`FrameKind::Query`].
pub const QUERY_LEN: usize = 8;

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Frame kind.
    pub kind: FrameKind,
    /// Sender's rank, checked against the connection's peer.
    pub src: u32,
    /// Payload bytes following the header.
    pub chunk_len: u32,
    /// The message's label.
    pub env: Envelope,
    /// Whole message length.
    pub total_len: u64,
    /// Offset of this chunk.
    pub offset: u64,
    /// The data frame's place among every data frame the sender sent this receiver, modulo
    /// [`ORDER_MODULUS`]: frames of one peer that travel over several connections are put back
    /// in this order (see `tcp::lanes`). 0 in control frames and where nothing reorders.
    pub order: u32,
}

/// [`Header::order`] counts modulo this (it takes the header's three spare bytes).
pub const ORDER_MODULUS: u32 = 1 << 24;

impl Header {
    /// Encode.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = self.kind as u8;
        b[5..8].copy_from_slice(&(self.order % ORDER_MODULUS).to_le_bytes()[..3]);
        b[8..12].copy_from_slice(&self.src.to_le_bytes());
        b[12..16].copy_from_slice(&self.chunk_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.env.comm.to_le_bytes());
        b[24..32].copy_from_slice(&self.env.seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.total_len.to_le_bytes());
        b[40..48].copy_from_slice(&self.offset.to_le_bytes());
        b[48..72].copy_from_slice(&self.env.fp.encode());
        b
    }

    /// Decode and validate. `expected_src` is the rank the connection belongs to.
    pub fn decode(b: &[u8; HEADER_LEN], expected_src: u32) -> Result<Self> {
        let bad = |what: String| {
            Err(Error::Protocol(format!(
                "malformed frame from rank {expected_src}: {what}"
            )))
        };
        if b[0..4] != MAGIC {
            return bad(format!("bad magic {:02x?}", &b[0..4]));
        }
        let kind = match b[4] {
            1 => FrameKind::Data,
            2 => FrameKind::Abort,
            3 => FrameKind::Bye,
            4 => FrameKind::Query,
            5 => FrameKind::Status,
            k => return bad(format!("unknown frame kind {k}")),
        };
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let src = u32_at(8);
        if src != expected_src {
            return bad(format!("claims to come from rank {src}"));
        }
        let chunk_len = u32_at(12);
        let total_len = u64_at(32);
        let offset = u64_at(40);
        let limit = match kind {
            FrameKind::Data => super::MAX_CHUNK_BYTES,
            FrameKind::Abort => MAX_REASON_BYTES,
            FrameKind::Bye => 0,
            FrameKind::Query => QUERY_LEN,
            FrameKind::Status => super::waits::MAX_STATUS_BYTES,
        };
        if chunk_len as usize > limit {
            return bad(format!(
                "chunk of {chunk_len} bytes exceeds the limit of {limit}"
            ));
        }
        if offset
            .checked_add(chunk_len as u64)
            .is_none_or(|end| end > total_len)
            && kind == FrameKind::Data
        {
            return bad(format!(
                "chunk {offset}+{chunk_len} lies outside a message of {total_len} bytes"
            ));
        }
        let fp_bytes: &[u8; FINGERPRINT_WIRE_LEN] = b[48..72].try_into().unwrap();
        let fp = match (kind, Fingerprint::decode(fp_bytes)) {
            (_, Some(fp)) => fp,
            (FrameKind::Data, None) => return bad("invalid fingerprint".into()),
            (_, None) => Fingerprint::new(
                crate::fingerprint::OpKind::P2p,
                crate::dtype::DataType::U8,
                0,
            ),
        };
        Ok(Header {
            kind,
            src,
            chunk_len,
            env: Envelope {
                comm: u64_at(16),
                seq: u64_at(24),
                fp,
            },
            total_len,
            offset,
            order: u32::from_le_bytes([b[5], b[6], b[7], 0]),
        })
    }
}

/// For a header that [`Header::decode`] refuses only because its kind is one this version does
/// not know (a control frame of a later version), the payload length to skip; `None` for
/// anything else, or a payload longer than [`MAX_REASON_BYTES`].
pub fn unknown_kind_len(b: &[u8; HEADER_LEN], expected_src: u32) -> Option<usize> {
    let len = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
    (b[0..4] == MAGIC
        && !(1..=5).contains(&b[4])
        && u32::from_le_bytes(b[8..12].try_into().unwrap()) == expected_src
        && len <= MAX_REASON_BYTES)
        .then_some(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DataType;
    use crate::fingerprint::OpKind;

    fn sample() -> Header {
        Header {
            kind: FrameKind::Data,
            src: 3,
            chunk_len: 100,
            env: Envelope {
                comm: 7,
                seq: 9,
                fp: Fingerprint::new(OpKind::AllReduce, DataType::F32, 25),
            },
            total_len: 100,
            offset: 0,
            order: 0x12_3456,
        }
    }

    #[test]
    fn round_trip() {
        let h = sample();
        assert_eq!(Header::decode(&h.encode(), 3).unwrap(), h);
    }

    #[test]
    fn rejects_lies() {
        let h = sample();
        assert!(Header::decode(&h.encode(), 2).is_err(), "wrong source");
        let mut b = h.encode();
        b[0] = b'X';
        assert!(Header::decode(&b, 3).is_err(), "magic");
        let mut big = h;
        big.chunk_len = u32::MAX;
        big.total_len = u64::MAX;
        assert!(Header::decode(&big.encode(), 3).is_err(), "huge chunk");
        let mut outside = h;
        outside.offset = u64::MAX - 10;
        assert!(
            Header::decode(&outside.encode(), 3).is_err(),
            "offset overflow"
        );
    }

    #[test]
    fn unknown_kinds_are_skippable_not_fatal() {
        let mut b = sample().encode();
        assert_eq!(unknown_kind_len(&b, 3), None, "a known kind");
        b[4] = 9;
        assert!(Header::decode(&b, 3).is_err());
        assert_eq!(unknown_kind_len(&b, 3), Some(100));
        assert_eq!(unknown_kind_len(&b, 2), None, "wrong source");
        b[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(unknown_kind_len(&b, 3), None, "too long to skip");
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_garbage(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), HEADER_LEN)) {
            let b: [u8; HEADER_LEN] = bytes.try_into().unwrap();
            if let Ok(h) = Header::decode(&b, u32::from_le_bytes(b[8..12].try_into().unwrap())) {
                proptest::prop_assert!(h.chunk_len as usize <= super::super::MAX_CHUNK_BYTES);
            }
        }
    }
}
