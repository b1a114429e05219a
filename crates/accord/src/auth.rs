//! Proof of a shared token, without sending the token.
//!
//! Every connection — client to store, rank to rank — starts with a mutual challenge-response:
//!
//! ```text
//! acceptor  -> connector : "ACCORDv1" | role (1 byte) | nonce_a (32)
//! connector -> acceptor  : nonce_c (32) | HMAC-SHA256(token, "connector" | nonce_a | nonce_c)
//! acceptor  -> connector : 1 | HMAC-SHA256(token, "acceptor" | nonce_c | nonce_a)   (accepted)
//!                          0 | reason length (u16) | reason                          (refused)
//! ```
//!
//! Both sides prove knowledge of the token; a stranger learns nothing it can replay, and the
//! acceptor acts on nothing a connector sends before the proof checks out. The role byte stops a
//! store client from talking to a peer socket by mistake (and vice versa) with a clear error.
//!
//! Listeners run the accepting side through `auth::gate`, which bounds how many connections may
//! be in the handshake at once and for how long ([`HandshakeLimits`]).

use crate::error::{Error, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{Read, Write};

pub(crate) mod gate;
pub use gate::HandshakeLimits;

const GREETING: &[u8; 8] = b"ACCORDv1";
const NONCE: usize = 32;
const MAC: usize = 32;

/// What kind of endpoint is accepting the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    /// The rendezvous store.
    Store = 1,
    /// A rank's peer listener.
    Peer = 2,
    /// A rank's socket for passing file descriptors to ranks of its host (the symmetric heap).
    Local = 3,
}

/// The shared secret of one job. Empty means "no authentication configured": both sides must
/// then also have an empty token, and the handshake still runs (it still catches wrong services).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// A token from its text form.
    pub fn new(s: impl AsRef<[u8]>) -> Self {
        Token(s.as_ref().to_vec())
    }

    /// A fresh random token (64 hex characters).
    pub fn random() -> Self {
        Token(hex(&random_bytes::<32>()).into_bytes())
    }

    /// The text form, to pass to child processes.
    pub fn as_str(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }

    fn mac(&self, label: &[u8], a: &[u8], b: &[u8]) -> Hmac<Sha256> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(label);
        m.update(a);
        m.update(b);
        m
    }
}

/// Random bytes from the OS.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).expect("the OS random source failed");
    b
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            Error::Unauthorized(format!(
                "{what}: no answer to the authentication handshake in time"
            ))
        } else {
            Error::io(format!("{what}: authentication handshake"), e)
        }
    }
}

/// Whether `hello` is the greeting an acceptor of `role` sends first (its first 9 bytes).
pub(crate) fn greets_as(hello: &[u8], role: Role) -> bool {
    hello.len() >= 9 && &hello[..8] == GREETING && hello[8] == role as u8
}

/// Accepting side. `what` names the connection in errors. Call with a read timeout set.
pub fn accept<S: Read + Write>(s: &mut S, token: &Token, role: Role, what: &str) -> Result<()> {
    let challenge = Challenge::new(role);
    s.write_all(challenge.hello()).map_err(io(what))?;
    let mut reply = [0u8; REPLY_LEN];
    s.read_exact(&mut reply).map_err(io(what))?;
    let (answer, verdict) = challenge.answer(token, &reply, what);
    match verdict {
        Ok(()) => s.write_all(&answer).map_err(io(what))?,
        Err(_) => {
            let _ = s.write_all(&answer);
        }
    }
    verdict
}

/// Length of the connector's reply to the greeting.
pub(crate) const REPLY_LEN: usize = NONCE + MAC;

/// The accepting side's half of the handshake as messages, for callers that drive the socket
/// themselves (`auth::gate` runs many handshakes on one thread).
pub(crate) struct Challenge {
    hello: [u8; 9 + NONCE],
}

impl Challenge {
    /// A fresh nonce for one connection.
    pub(crate) fn new(role: Role) -> Self {
        let mut hello = [0u8; 9 + NONCE];
        hello[..8].copy_from_slice(GREETING);
        hello[8] = role as u8;
        hello[9..].copy_from_slice(&random_bytes::<NONCE>());
        Challenge { hello }
    }

    /// The greeting to send first.
    pub(crate) fn hello(&self) -> &[u8] {
        &self.hello
    }

    /// Check the connector's reply: the bytes to send back (acceptance with this side's proof,
    /// or the refusal) and whether the connector proved knowledge of `token`.
    pub(crate) fn answer(
        &self,
        token: &Token,
        reply: &[u8; REPLY_LEN],
        what: &str,
    ) -> (Vec<u8>, Result<()>) {
        let nonce_a = &self.hello[9..];
        let (nonce_c, proof) = reply.split_at(NONCE);
        if token
            .mac(b"connector", nonce_a, nonce_c)
            .verify_slice(proof)
            .is_err()
        {
            let reason = b"wrong token";
            let mut msg = vec![0u8];
            msg.extend_from_slice(&(reason.len() as u16).to_le_bytes());
            msg.extend_from_slice(reason);
            return (
                msg,
                Err(Error::Unauthorized(format!(
                    "{what}: the connecting process does not know this job's token; refused"
                ))),
            );
        }
        let mut ok = vec![1u8];
        ok.extend_from_slice(
            &token
                .mac(b"acceptor", nonce_c, nonce_a)
                .finalize()
                .into_bytes(),
        );
        (ok, Ok(()))
    }
}

/// Connecting side. Call with a read timeout set.
pub fn connect<S: Read + Write>(s: &mut S, token: &Token, role: Role, what: &str) -> Result<()> {
    let mut hello = [0u8; 9 + NONCE];
    s.read_exact(&mut hello).map_err(io(what))?;
    if &hello[..8] != GREETING {
        return Err(Error::Protocol(format!(
            "{what}: the other end is not an Accord endpoint"
        )));
    }
    if hello[8] != role as u8 {
        return Err(Error::Protocol(format!(
            "{what}: expected a {role:?} endpoint but reached a different kind of Accord endpoint"
        )));
    }
    let nonce_a = &hello[9..];
    let nonce_c = random_bytes::<NONCE>();
    let mut reply = Vec::with_capacity(NONCE + MAC);
    reply.extend_from_slice(&nonce_c);
    reply.extend_from_slice(
        &token
            .mac(b"connector", nonce_a, &nonce_c)
            .finalize()
            .into_bytes(),
    );
    s.write_all(&reply).map_err(io(what))?;
    let mut status = [0u8; 1];
    s.read_exact(&mut status).map_err(io(what))?;
    if status[0] != 1 {
        return Err(Error::Unauthorized(format!(
            "{what}: refused — this process's token (ACCORD_TOKEN or ACCORD_TOKEN_FILE) does not \
             match the job's"
        )));
    }
    let mut proof = [0u8; MAC];
    s.read_exact(&mut proof).map_err(io(what))?;
    if token
        .mac(b"acceptor", &nonce_c, nonce_a)
        .verify_slice(&proof)
        .is_err()
    {
        return Err(Error::Unauthorized(format!(
            "{what}: the other end does not know this job's token; refusing to talk to it"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    fn pair(server_tok: &str, client_tok: &str) -> (Result<()>, Result<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let st = Token::new(server_tok);
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            accept(&mut s, &st, Role::Peer, "test")
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let cr = connect(&mut c, &Token::new(client_tok), Role::Peer, "test");
        (h.join().unwrap(), cr)
    }

    #[test]
    fn same_token_accepted() {
        let (a, c) = pair("secret", "secret");
        a.unwrap();
        c.unwrap();
    }

    #[test]
    fn wrong_token_refused_on_both_sides() {
        let (a, c) = pair("secret", "guess");
        assert!(matches!(a, Err(Error::Unauthorized(_))), "{a:?}");
        assert!(matches!(c, Err(Error::Unauthorized(_))), "{c:?}");
    }

    #[test]
    fn token_is_not_printed() {
        assert_eq!(format!("{:?}", Token::new("hunter2")), "Token(<redacted>)");
        assert_eq!(Token::random().as_str().len(), 64);
    }
}
