//! File descriptors between the ranks of one host: one Unix-domain socket per pair of local
//! ranks, authenticated with the job's token, carrying a fixed-size message and at most one
//! descriptor (`SCM_RIGHTS`) per step.
//!
//! Each rank listens on an abstract socket with a random name, published through the
//! rendezvous store; the lower rank of each pair connects to the higher one and both prove the
//! token ([`crate::auth`], role [`Role::Local`]) before anything else is read, so a stranger on
//! the host can neither hand a rank a descriptor nor receive one. Every wait is bounded by the
//! deadline given; a peer that never connects or never sends is named in an [`Error::Timeout`].

use crate::auth::{self, Role, Token};
use crate::error::{Error, Result};
use crate::rendezvous::StoreClient;
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::collections::BTreeMap;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

/// Bytes of every message: a magic word, the step it belongs to, and a payload.
pub(crate) const PAYLOAD: usize = 80;
const MAGIC: u32 = 0x4143_5359; // "ACSY"
const MESSAGE: usize = 4 + 8 + PAYLOAD;

/// One message from a peer: its payload and the descriptor that came with it, if any.
pub(crate) struct Received {
    pub payload: [u8; PAYLOAD],
    pub fd: Option<OwnedFd>,
}

/// Connected, authenticated sockets to every other rank of this host.
pub(crate) struct LocalMesh {
    /// Peer rank -> its socket.
    peers: BTreeMap<usize, UnixStream>,
    /// Names the communicator in errors.
    comm: String,
}

impl LocalMesh {
    /// Connect `me` to every rank in `local` (the ranks of this host, `me` among them) under
    /// `timeout`. Collective over `local`; `store` keys live under `key`.
    pub(crate) fn connect(
        me: usize,
        local: &[usize],
        store: &StoreClient,
        key: &str,
        token: &Token,
        timeout: Duration,
        comm: &str,
    ) -> Result<LocalMesh> {
        let deadline = Instant::now() + timeout;
        let name = format!("accord-local-{}", hex(&auth::random_bytes::<12>()));
        let addr = SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(os("naming the local socket"))?;
        let listener = UnixListener::bind_addr(&addr).map_err(os("binding the local socket"))?;
        listener
            .set_nonblocking(true)
            .map_err(os("the local socket"))?;
        store.set(&format!("{key}/{me}"), &name)?;
        let mut peers = BTreeMap::new();
        // Lower ranks connect to higher ones: each pair has exactly one connection.
        let higher: Vec<usize> = local.iter().copied().filter(|&r| r > me).collect();
        let lower = local.iter().filter(|&&r| r < me).count();
        if !higher.is_empty() {
            let keys: Vec<String> = higher.iter().map(|r| format!("{key}/{r}")).collect();
            let names = store
                .multi_get(&keys, remaining(deadline))
                .map_err(|e| missing(comm, &higher, &e, timeout))?;
            for (&r, n) in higher.iter().zip(names) {
                let a =
                    SocketAddr::from_abstract_name(&n).map_err(os("a local rank's socket name"))?;
                let mut s =
                    connect_until(&a, deadline).map_err(|e| missing(comm, &[r], &e, timeout))?;
                set_deadline(&s, deadline).map_err(os("a local socket"))?;
                auth::connect(&mut s, token, Role::Local, &format!("local rank {r}"))?;
                s.write_all(&(me as u32).to_le_bytes())
                    .map_err(os("greeting a local rank"))?;
                peers.insert(r, s);
            }
        }
        while peers.len() < higher.len() + lower {
            match listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).map_err(os("a local socket"))?;
                    set_deadline(&s, deadline).map_err(os("a local socket"))?;
                    // A stranger or a wrong token is refused and costs nothing more.
                    if auth::accept(&mut s, token, Role::Local, "a local rank").is_err() {
                        continue;
                    }
                    let mut r = [0u8; 4];
                    s.read_exact(&mut r)
                        .map_err(os("reading a local rank's greeting"))?;
                    let r = u32::from_le_bytes(r) as usize;
                    if r >= me || !local.contains(&r) || peers.contains_key(&r) {
                        return Err(Error::invalid(format!(
                            "{comm}: a local connection claims to be rank {r}, which does not \
                             connect to rank {me}"
                        )));
                    }
                    peers.insert(r, s);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let never: Vec<usize> = local
                            .iter()
                            .copied()
                            .filter(|&r| r < me && !peers.contains_key(&r))
                            .collect();
                        return Err(timeout_error(comm, never, timeout, "never connected"));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(Error::io("accepting a local rank", e)),
            }
        }
        Ok(LocalMesh {
            peers,
            comm: comm.to_string(),
        })
    }

    /// Send `payload` (and `fd`, if any) to every peer, then receive one message of step `step`
    /// from each, under `timeout`. Collective over the mesh.
    pub(crate) fn exchange(
        &self,
        step: u64,
        payload: &[u8; PAYLOAD],
        fd: Option<&OwnedFd>,
        timeout: Duration,
    ) -> Result<BTreeMap<usize, Received>> {
        let deadline = Instant::now() + timeout;
        let mut msg = [0u8; MESSAGE];
        msg[..4].copy_from_slice(&MAGIC.to_le_bytes());
        msg[4..12].copy_from_slice(&step.to_le_bytes());
        msg[12..].copy_from_slice(payload);
        for (&r, s) in &self.peers {
            set_deadline(s, deadline).map_err(os("a local socket"))?;
            send(s, &msg, fd).map_err(|e| self.io(r, "sending to", e, timeout))?;
        }
        let mut out = BTreeMap::new();
        for (&r, s) in &self.peers {
            let got = recv(s).map_err(|e| self.io(r, "receiving from", e, timeout))?;
            let (magic, their) = (
                u32::from_le_bytes(got.0[..4].try_into().expect("4 bytes")),
                u64::from_le_bytes(got.0[4..12].try_into().expect("8 bytes")),
            );
            if magic != MAGIC || their != step {
                return Err(Error::invalid(format!(
                    "{}: local rank {r} sent step {their} (magic {magic:#x}) where step {step} \
                     was due: the ranks of this host called symmetric-memory operations in \
                     different orders",
                    self.comm
                )));
            }
            let mut payload = [0u8; PAYLOAD];
            payload.copy_from_slice(&got.0[12..]);
            out.insert(r, Received { payload, fd: got.1 });
        }
        Ok(out)
    }

    fn io(&self, rank: usize, doing: &str, e: std::io::Error, timeout: Duration) -> Error {
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                timeout_error(&self.comm, vec![rank], timeout, "never answered")
            }
            std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::ConnectionReset => Error::PeerLost {
                rank,
                cause: format!("{doing} local rank {rank}: its socket closed ({e})"),
            },
            _ => Error::io(format!("{}: {doing} local rank {rank}", self.comm), e),
        }
    }
}

fn send(s: &UnixStream, msg: &[u8; MESSAGE], fd: Option<&OwnedFd>) -> std::io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(f) = fd {
        fds = [f.as_fd()];
        control.push(SendAncillaryMessage::ScmRights(&fds));
    }
    // The descriptor travels with the first byte; the rest follows on a plain stream.
    let n = sendmsg(s, &[IoSlice::new(msg)], &mut control, SendFlags::NOSIGNAL)?;
    (&*s).write_all(&msg[n..])
}

fn recv(s: &UnixStream) -> std::io::Result<([u8; MESSAGE], Option<OwnedFd>)> {
    let mut msg = [0u8; MESSAGE];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        s,
        &mut [IoSliceMut::new(&mut msg)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fd = None;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            for f in fds {
                fd.get_or_insert(f); // more than one: the extra ones are closed here
            }
        }
    }
    if got.bytes == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    (&*s).read_exact(&mut msg[got.bytes..])?;
    Ok((msg, fd))
}

fn connect_until(addr: &SocketAddr, deadline: Instant) -> Result<UnixStream> {
    loop {
        match UnixStream::connect_addr(addr) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < deadline => {
                tracing::trace!("local connect: {e}; retrying");
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(Error::io("connecting to a local rank", e)),
        }
    }
}

fn set_deadline(s: &UnixStream, deadline: Instant) -> std::io::Result<()> {
    let left = remaining(deadline).max(Duration::from_millis(1));
    s.set_read_timeout(Some(left))?;
    s.set_write_timeout(Some(left))
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

fn missing(comm: &str, ranks: &[usize], e: &Error, timeout: Duration) -> Error {
    match e {
        Error::Timeout { .. } => {
            timeout_error(comm, ranks.to_vec(), timeout, "never published its socket")
        }
        other => other.clone(),
    }
}

fn timeout_error(comm: &str, ranks: Vec<usize>, after: Duration, what: &str) -> Error {
    Error::Timeout {
        op: "symmetric memory".into(),
        seq: 0,
        comm: comm.to_string(),
        waiting_for: ranks,
        after,
        hint: format!("; they {what}"),
    }
}

/// Map an OS error, saying what was being done.
fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests;
