//! The store's wire protocol: one request, one response, over an authenticated TCP stream.
//!
//! ```text
//! request  := op (u8) fields...
//! response := tag (u8) fields...
//! key      := len (u32) UTF-8 bytes          len <= MAX_KEY_BYTES
//! value    := len (u32) bytes                len <= MAX_VALUE_BYTES
//! keys     := count (u32) key*               count <= MAX_KEYS, sum of key lengths <= MAX_KEYS_BYTES
//! timeout  := milliseconds (u64)             u64::MAX = no deadline
//!
//! SET        1  key value                 -> OK
//! GET        2  key timeout               -> VALUE | TIMEOUT
//! WAIT       3  keys timeout              -> OK | TIMEOUT
//! ADD        4  key delta (i64)           -> INT
//! CAS        5  key has_expected (u8) [value] value -> MAYBE
//! DELETE     6  key                       -> BOOL
//! NUM_KEYS   7                            -> COUNT
//! CHECK      8  keys                      -> BOOL
//! MULTI_GET  9  keys timeout              -> VALUES | TIMEOUT
//!
//! OK 0 | VALUE 1 value | MAYBE 2 present (u8) [value] | INT 3 i64 | BOOL 4 u8 | COUNT 5 u64
//! | VALUES 6 count (u32) value* | TIMEOUT 7 keys (those still missing) | ERROR 8 message (value)
//! ```
//!
//! All integers are little-endian. Every length is checked against its bound *before* anything is
//! allocated, and buffers grow only as bytes actually arrive, so a hostile peer cannot make either
//! side allocate more than the bounds below. Malformed input is an [`Error::Protocol`]; the server
//! answers it with an `ERROR` response and closes the connection.

use crate::error::{Error, Result};
use std::io::{self, Read, Write};
use std::time::Duration;

/// Longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 4 * 1024;
/// Largest value accepted, in bytes.
pub const MAX_VALUE_BYTES: usize = 64 * 1024 * 1024;
/// Most keys in one `wait`, `check` or `multi_get`.
pub const MAX_KEYS: usize = 1 << 16;
/// Largest total of key bytes in one multi-key request.
pub const MAX_KEYS_BYTES: usize = 16 * 1024 * 1024;
/// Largest total of value bytes in one `multi_get` response.
pub const MAX_MULTI_VALUE_BYTES: usize = MAX_VALUE_BYTES;
/// Longest error message accepted in a response.
const MAX_MESSAGE_BYTES: usize = 64 * 1024;

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_WAIT: u8 = 3;
const OP_ADD: u8 = 4;
const OP_CAS: u8 = 5;
const OP_DELETE: u8 = 6;
const OP_NUM_KEYS: u8 = 7;
const OP_CHECK: u8 = 8;
const OP_MULTI_GET: u8 = 9;

const R_OK: u8 = 0;
const R_VALUE: u8 = 1;
const R_MAYBE: u8 = 2;
const R_INT: u8 = 3;
const R_BOOL: u8 = 4;
const R_COUNT: u8 = 5;
const R_VALUES: u8 = 6;
const R_TIMEOUT: u8 = 7;
const R_ERROR: u8 = 8;

/// A request from a client. `timeout` of `None` means "no deadline".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    Set {
        key: String,
        value: Vec<u8>,
    },
    Get {
        key: String,
        timeout: Option<Duration>,
    },
    Wait {
        keys: Vec<String>,
        timeout: Option<Duration>,
    },
    Add {
        key: String,
        delta: i64,
    },
    CompareSet {
        key: String,
        expected: Option<Vec<u8>>,
        new: Vec<u8>,
    },
    Delete {
        key: String,
    },
    NumKeys,
    Check {
        keys: Vec<String>,
    },
    MultiGet {
        keys: Vec<String>,
        timeout: Option<Duration>,
    },
}

/// The server's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Response {
    Ok,
    Value(Vec<u8>),
    Maybe(Option<Vec<u8>>),
    Int(i64),
    Bool(bool),
    Count(u64),
    Values(Vec<Vec<u8>>),
    /// The request's deadline passed; these keys were still missing.
    Timeout(Vec<String>),
    /// The server refused the request (message for the user).
    Error(String),
}

// ---------------------------------------------------------------- encoding

fn put_u32(b: &mut Vec<u8>, v: usize) {
    b.extend_from_slice(&(v as u32).to_le_bytes());
}

fn put_bytes(b: &mut Vec<u8>, v: &[u8]) {
    put_u32(b, v.len());
    b.extend_from_slice(v);
}

fn put_keys(b: &mut Vec<u8>, keys: &[String]) {
    put_u32(b, keys.len());
    for k in keys {
        put_bytes(b, k.as_bytes());
    }
}

fn put_timeout(b: &mut Vec<u8>, t: Option<Duration>) {
    let ms = t.map_or(u64::MAX, |d| {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX - 1)
    });
    b.extend_from_slice(&ms.to_le_bytes());
}

/// Check what the local side is about to send against the bounds the other side enforces, so an
/// oversized request fails here with a clear message instead of as a dropped connection.
pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::invalid(format!(
            "store key of {} bytes is longer than the limit of {MAX_KEY_BYTES} bytes",
            key.len()
        )));
    }
    Ok(())
}

pub(crate) fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(Error::invalid(format!(
            "store value of {} bytes is larger than the limit of {MAX_VALUE_BYTES} bytes",
            value.len()
        )));
    }
    Ok(())
}

pub(crate) fn check_keys(keys: &[String]) -> Result<()> {
    if keys.len() > MAX_KEYS {
        return Err(Error::invalid(format!(
            "{} keys in one store request; the limit is {MAX_KEYS}",
            keys.len()
        )));
    }
    let mut total = 0;
    for k in keys {
        check_key(k)?;
        total += k.len();
    }
    if total > MAX_KEYS_BYTES {
        return Err(Error::invalid(format!(
            "{total} bytes of keys in one store request; the limit is {MAX_KEYS_BYTES}"
        )));
    }
    Ok(())
}

impl Request {
    /// Check the request against the protocol bounds (before sending it).
    pub(crate) fn validate(&self) -> Result<()> {
        match self {
            Request::Set { key, value } => {
                check_key(key)?;
                check_value(value)
            }
            Request::Get { key, .. } | Request::Add { key, .. } | Request::Delete { key } => {
                check_key(key)
            }
            Request::Wait { keys, .. }
            | Request::Check { keys }
            | Request::MultiGet { keys, .. } => check_keys(keys),
            Request::CompareSet { key, expected, new } => {
                check_key(key)?;
                if let Some(e) = expected {
                    check_value(e)?;
                }
                check_value(new)
            }
            Request::NumKeys => Ok(()),
        }
    }

    /// The request as bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64);
        match self {
            Request::Set { key, value } => {
                b.push(OP_SET);
                put_bytes(&mut b, key.as_bytes());
                put_bytes(&mut b, value);
            }
            Request::Get { key, timeout } => {
                b.push(OP_GET);
                put_bytes(&mut b, key.as_bytes());
                put_timeout(&mut b, *timeout);
            }
            Request::Wait { keys, timeout } => {
                b.push(OP_WAIT);
                put_keys(&mut b, keys);
                put_timeout(&mut b, *timeout);
            }
            Request::Add { key, delta } => {
                b.push(OP_ADD);
                put_bytes(&mut b, key.as_bytes());
                b.extend_from_slice(&delta.to_le_bytes());
            }
            Request::CompareSet { key, expected, new } => {
                b.push(OP_CAS);
                put_bytes(&mut b, key.as_bytes());
                match expected {
                    Some(e) => {
                        b.push(1);
                        put_bytes(&mut b, e);
                    }
                    None => b.push(0),
                }
                put_bytes(&mut b, new);
            }
            Request::Delete { key } => {
                b.push(OP_DELETE);
                put_bytes(&mut b, key.as_bytes());
            }
            Request::NumKeys => b.push(OP_NUM_KEYS),
            Request::Check { keys } => {
                b.push(OP_CHECK);
                put_keys(&mut b, keys);
            }
            Request::MultiGet { keys, timeout } => {
                b.push(OP_MULTI_GET);
                put_keys(&mut b, keys);
                put_timeout(&mut b, *timeout);
            }
        }
        b
    }

    /// Read one request. `Ok(None)` when the peer closed the connection cleanly between requests.
    pub(crate) fn read<R: Read>(r: &mut R) -> Result<Option<Request>> {
        let Some(op) = read_first_byte(r)? else {
            return Ok(None);
        };
        let req = match op {
            OP_SET => Request::Set {
                key: read_key(r)?,
                value: read_bytes(r, MAX_VALUE_BYTES, "value")?,
            },
            OP_GET => Request::Get {
                key: read_key(r)?,
                timeout: read_timeout(r)?,
            },
            OP_WAIT => Request::Wait {
                keys: read_keys(r)?,
                timeout: read_timeout(r)?,
            },
            OP_ADD => Request::Add {
                key: read_key(r)?,
                delta: i64::from_le_bytes(read_array(r)?),
            },
            OP_CAS => {
                let key = read_key(r)?;
                let expected = match read_array::<1, _>(r)?[0] {
                    0 => None,
                    1 => Some(read_bytes(r, MAX_VALUE_BYTES, "expected value")?),
                    x => return Err(proto(format!("compare_set flag must be 0 or 1, got {x}"))),
                };
                Request::CompareSet {
                    key,
                    expected,
                    new: read_bytes(r, MAX_VALUE_BYTES, "value")?,
                }
            }
            OP_DELETE => Request::Delete { key: read_key(r)? },
            OP_NUM_KEYS => Request::NumKeys,
            OP_CHECK => Request::Check {
                keys: read_keys(r)?,
            },
            OP_MULTI_GET => Request::MultiGet {
                keys: read_keys(r)?,
                timeout: read_timeout(r)?,
            },
            x => return Err(proto(format!("unknown store request code {x}"))),
        };
        Ok(Some(req))
    }
}

impl Response {
    /// The response as bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(16);
        match self {
            Response::Ok => b.push(R_OK),
            Response::Value(v) => {
                b.push(R_VALUE);
                put_bytes(&mut b, v);
            }
            Response::Maybe(v) => {
                b.push(R_MAYBE);
                match v {
                    Some(v) => {
                        b.push(1);
                        put_bytes(&mut b, v);
                    }
                    None => b.push(0),
                }
            }
            Response::Int(i) => {
                b.push(R_INT);
                b.extend_from_slice(&i.to_le_bytes());
            }
            Response::Bool(x) => {
                b.push(R_BOOL);
                b.push(u8::from(*x));
            }
            Response::Count(n) => {
                b.push(R_COUNT);
                b.extend_from_slice(&n.to_le_bytes());
            }
            Response::Values(vs) => {
                b.push(R_VALUES);
                put_u32(&mut b, vs.len());
                for v in vs {
                    put_bytes(&mut b, v);
                }
            }
            Response::Timeout(keys) => {
                b.push(R_TIMEOUT);
                put_keys(&mut b, keys);
            }
            Response::Error(msg) => {
                b.push(R_ERROR);
                let mut m = msg.as_bytes();
                if m.len() > MAX_MESSAGE_BYTES {
                    m = &m[..MAX_MESSAGE_BYTES];
                }
                put_bytes(&mut b, m);
            }
        }
        b
    }

    /// Read one response.
    pub(crate) fn read<R: Read>(r: &mut R) -> Result<Response> {
        let Some(tag) = read_first_byte(r)? else {
            return Err(Error::Store(
                "the store closed the connection without answering".into(),
            ));
        };
        Ok(match tag {
            R_OK => Response::Ok,
            R_VALUE => Response::Value(read_bytes(r, MAX_VALUE_BYTES, "value")?),
            R_MAYBE => match read_array::<1, _>(r)?[0] {
                0 => Response::Maybe(None),
                1 => Response::Maybe(Some(read_bytes(r, MAX_VALUE_BYTES, "value")?)),
                x => return Err(proto(format!("presence flag must be 0 or 1, got {x}"))),
            },
            R_INT => Response::Int(i64::from_le_bytes(read_array(r)?)),
            R_BOOL => match read_array::<1, _>(r)?[0] {
                0 => Response::Bool(false),
                1 => Response::Bool(true),
                x => return Err(proto(format!("boolean must be 0 or 1, got {x}"))),
            },
            R_COUNT => Response::Count(u64::from_le_bytes(read_array(r)?)),
            R_VALUES => {
                let n = read_len(r, MAX_KEYS, "value count")?;
                let mut vs = Vec::with_capacity(n.min(1024));
                let mut total = 0usize;
                for _ in 0..n {
                    let v = read_bytes(r, MAX_MULTI_VALUE_BYTES - total, "value")?;
                    total += v.len();
                    vs.push(v);
                }
                Response::Values(vs)
            }
            R_TIMEOUT => Response::Timeout(read_keys(r)?),
            R_ERROR => {
                let m = read_bytes(r, MAX_MESSAGE_BYTES, "error message")?;
                Response::Error(String::from_utf8_lossy(&m).into_owned())
            }
            x => return Err(proto(format!("unknown store response code {x}"))),
        })
    }
}

/// Write a whole encoded message.
pub(crate) fn write_msg<W: Write>(w: &mut W, bytes: &[u8]) -> io::Result<()> {
    w.write_all(bytes)?;
    w.flush()
}

// ---------------------------------------------------------------- decoding

fn proto(msg: String) -> Error {
    Error::Protocol(format!("store: {msg}"))
}

fn read_err(e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        proto("connection closed in the middle of a message".into())
    } else {
        Error::io("store connection", e)
    }
}

/// The first byte of a message, or `None` on a clean end of stream.
fn read_first_byte<R: Read>(r: &mut R) -> Result<Option<u8>> {
    let mut b = [0u8; 1];
    loop {
        match r.read(&mut b) {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(Some(b[0])),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("store connection", e)),
        }
    }
}

fn read_array<const N: usize, R: Read>(r: &mut R) -> Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b).map_err(read_err)?;
    Ok(b)
}

fn read_len<R: Read>(r: &mut R, max: usize, what: &str) -> Result<usize> {
    let n = u32::from_le_bytes(read_array(r)?) as usize;
    if n > max {
        return Err(proto(format!(
            "{what} length {n} exceeds the limit of {max}"
        )));
    }
    Ok(n)
}

/// A length-prefixed byte string of at most `max` bytes. The buffer grows only as bytes arrive.
fn read_bytes<R: Read>(r: &mut R, max: usize, what: &str) -> Result<Vec<u8>> {
    let n = read_len(r, max, what)?;
    let mut v = Vec::with_capacity(n.min(64 * 1024));
    r.take(n as u64).read_to_end(&mut v).map_err(read_err)?;
    if v.len() != n {
        return Err(proto(format!(
            "connection closed after {} of {n} {what} bytes",
            v.len()
        )));
    }
    Ok(v)
}

fn read_key<R: Read>(r: &mut R) -> Result<String> {
    let b = read_bytes(r, MAX_KEY_BYTES, "key")?;
    String::from_utf8(b).map_err(|_| proto("key is not valid UTF-8".into()))
}

fn read_keys<R: Read>(r: &mut R) -> Result<Vec<String>> {
    let n = read_len(r, MAX_KEYS, "key count")?;
    let mut keys = Vec::with_capacity(n.min(1024));
    let mut total = 0usize;
    for _ in 0..n {
        let k = read_key(r)?;
        total += k.len();
        if total > MAX_KEYS_BYTES {
            return Err(proto(format!(
                "keys add up to more than {MAX_KEYS_BYTES} bytes"
            )));
        }
        keys.push(k);
    }
    Ok(keys)
}

fn read_timeout<R: Read>(r: &mut R) -> Result<Option<Duration>> {
    let ms = u64::from_le_bytes(read_array(r)?);
    Ok((ms != u64::MAX).then(|| Duration::from_millis(ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_requests() -> Vec<Request> {
        vec![
            Request::Set {
                key: "a".into(),
                value: b"xyz".to_vec(),
            },
            Request::Get {
                key: "a".into(),
                timeout: Some(Duration::from_millis(1500)),
            },
            Request::Wait {
                keys: vec!["a".into(), "b/c".into()],
                timeout: None,
            },
            Request::Add {
                key: "n".into(),
                delta: -7,
            },
            Request::CompareSet {
                key: "c".into(),
                expected: Some(b"old".to_vec()),
                new: b"new".to_vec(),
            },
            Request::CompareSet {
                key: "c".into(),
                expected: None,
                new: vec![],
            },
            Request::Delete { key: "d".into() },
            Request::NumKeys,
            Request::Check {
                keys: vec!["x".into()],
            },
            Request::MultiGet {
                keys: vec!["x".into(), "y".into()],
                timeout: Some(Duration::ZERO),
            },
        ]
    }

    fn all_responses() -> Vec<Response> {
        vec![
            Response::Ok,
            Response::Value(b"v".to_vec()),
            Response::Maybe(None),
            Response::Maybe(Some(vec![1, 2])),
            Response::Int(i64::MIN),
            Response::Bool(true),
            Response::Count(42),
            Response::Values(vec![vec![], b"q".to_vec()]),
            Response::Timeout(vec!["addr/3".into()]),
            Response::Error("nope".into()),
        ]
    }

    #[test]
    fn requests_round_trip() {
        for req in all_requests() {
            let bytes = req.encode();
            let back = Request::read(&mut bytes.as_slice()).unwrap().unwrap();
            assert_eq!(back, req);
        }
        assert_eq!(Request::read(&mut [].as_slice()).unwrap(), None);
    }

    #[test]
    fn responses_round_trip() {
        for resp in all_responses() {
            let bytes = resp.encode();
            assert_eq!(Response::read(&mut bytes.as_slice()).unwrap(), resp);
        }
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        for req in all_requests() {
            let bytes = req.encode();
            for cut in 1..bytes.len() {
                let r = Request::read(&mut &bytes[..cut]);
                assert!(
                    matches!(r, Err(Error::Protocol(_))),
                    "{req:?} cut {cut}: {r:?}"
                );
            }
        }
        for resp in all_responses() {
            let bytes = resp.encode();
            for cut in 0..bytes.len() {
                assert!(Response::read(&mut &bytes[..cut]).is_err());
            }
        }
    }

    #[test]
    fn oversized_lengths_rejected_before_allocating() {
        // SET with a 4 GiB key length.
        let mut b = vec![OP_SET];
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        let e = Request::read(&mut b.as_slice()).unwrap_err();
        assert!(e.to_string().contains("key length"), "{e}");
        // WAIT with too many keys.
        let mut b = vec![OP_WAIT];
        b.extend_from_slice(&(MAX_KEYS as u32 + 1).to_le_bytes());
        assert!(matches!(
            Request::read(&mut b.as_slice()),
            Err(Error::Protocol(_))
        ));
        // VALUE response claiming 4 GiB.
        let mut b = vec![R_VALUE];
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Response::read(&mut b.as_slice()),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn garbage_is_a_protocol_error() {
        assert!(matches!(
            Request::read(&mut [0xEEu8, 1, 2].as_slice()),
            Err(Error::Protocol(_))
        ));
        let mut b = vec![OP_SET];
        put_bytes(&mut b, &[0xff, 0xfe]);
        assert!(Request::read(&mut b.as_slice())
            .unwrap_err()
            .to_string()
            .contains("UTF-8"));
        // Deterministic pseudo-random streams never panic.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..2000 {
            let mut buf = vec![0u8; 40];
            for byte in buf.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *byte = x as u8;
            }
            let _ = Request::read(&mut buf.as_slice());
            let _ = Response::read(&mut buf.as_slice());
        }
    }

    #[test]
    fn validate_enforces_limits() {
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        assert!(Request::Delete { key: long }.validate().is_err());
        assert!(Request::NumKeys.validate().is_ok());
    }
}
