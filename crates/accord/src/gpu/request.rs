//! [`GpuRequest`]: an operation enqueued on a stream, to wait for or poll.

use super::comm::DeviceComm;
use super::cuda::CuEvent;
use super::device::{Event, Stream};
use crate::error::Result;
use std::sync::Arc;
use std::time::Duration;

/// Work enqueued on a stream; wait for it or poll it. Dropping it does not cancel anything.
pub struct GpuRequest {
    event: Arc<Event>,
    comm: Arc<DeviceComm>,
    seq: u64,
}

impl std::fmt::Debug for GpuRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuRequest")
            .field("seq", &self.seq)
            .finish()
    }
}

impl GpuRequest {
    pub(crate) fn new(event: Arc<Event>, comm: Arc<DeviceComm>, seq: u64) -> Self {
        GpuRequest { event, comm, seq }
    }

    /// Block the host until the operation has finished on the GPU, or the communicator fails
    /// before it did (the watchdog enforces the timeout and watches the peers).
    pub fn wait(&self) -> Result<()> {
        let mut spins = 0u32;
        loop {
            if self.comm.settled(&self.event)? {
                return Ok(());
            }
            spins += 1;
            if spins < 2000 {
                std::hint::spin_loop();
            } else if spins < 4000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// `Ok(true)` if the operation has finished; an error if the communicator failed first.
    pub fn test(&self) -> Result<bool> {
        self.comm.settled(&self.event)
    }

    /// Make `stream` wait (on the GPU, not the host) until the operation has finished.
    pub fn stream_wait(&self, stream: Stream) -> Result<()> {
        let s = self.comm.stream_of(stream);
        let cu = self.comm.cu;
        // SAFETY: a live event and stream.
        let rc = unsafe { (cu.stream_wait_event)(s, self.event.handle as CuEvent, 0) };
        cu.check(rc, "cuStreamWaitEvent")
    }

    /// The operation's sequence number on its communicator.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}
