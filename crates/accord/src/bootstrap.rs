//! From "I am one of N processes" to a working [`Communicator`]: rendezvous through the store,
//! then connect the transport.

use crate::comm::{timeout_from_env, Communicator};
use crate::error::Result;
use crate::rendezvous::{self, InitMethod, Rendezvous};
use crate::transport::tcp::{TcpOptions, TcpTransport};
use crate::transport::Transport;
use std::sync::Arc;
use std::time::Duration;

/// Join the job described by the environment (`env://`): `accord run`, torchrun, mpirun or Slurm
/// variables. See [`crate::rendezvous`] for the variables read.
pub fn init() -> Result<Communicator> {
    init_with("env://", None, None)
}

/// Join a job through `url` (`env://`, `tcp://host:port`, `file:///shared/path`). `rank` and
/// `world_size` override the environment.
pub fn init_with(
    url: &str,
    rank: Option<usize>,
    world_size: Option<usize>,
) -> Result<Communicator> {
    init_with_timeout(url, rank, world_size, timeout_from_env())
}

/// Like [`init_with`] with an explicit deadline for the rendezvous and for every later call.
pub fn init_with_timeout(
    url: &str,
    rank: Option<usize>,
    world_size: Option<usize>,
    timeout: Duration,
) -> Result<Communicator> {
    let method = InitMethod::parse(url)?;
    let rdv = rendezvous::init(&method, rank, world_size, Some(timeout))?;
    from_rendezvous(rdv, timeout)
}

/// Connect the transport for a finished rendezvous and wrap it in a communicator that keeps the
/// store (and, on the hosting rank, the store server) alive.
pub fn from_rendezvous(rdv: Rendezvous, timeout: Duration) -> Result<Communicator> {
    let book = rdv.store.with_prefix("accord/tcp");
    let opts = TcpOptions {
        timeout,
        ..TcpOptions::default()
    };
    let transport: Arc<dyn Transport> =
        TcpTransport::connect(rdv.rank, rdv.world_size, &rdv.token, &book, opts)?;
    let comm = Communicator::with_resources(transport, vec![Arc::new(rdv)]);
    comm.set_timeout(timeout);
    Ok(comm)
}
