//! Completions and background operations.
//!
//! Every operation returns a [`Completion`]: host operations have finished when they return;
//! device operations are enqueued on their stream and complete there, as NCCL's do.
//! [`Communicator::spawn`] runs any operation on a thread of a scope, in the place in the
//! communicator's order that it took when spawned; [`Communicator::isend`] and
//! [`Communicator::irecv`] do the same for messages.

use super::*;
use crate::gpu::{GpuRequest, Stream};

/// How an operation completes: already (host buffers), or on a GPU stream (device buffers).
#[derive(Debug)]
pub struct Completion {
    device: Option<GpuRequest>,
}

impl Completion {
    pub(crate) fn done() -> Self {
        Completion { device: None }
    }

    pub(super) fn device(req: GpuRequest) -> Self {
        Completion { device: Some(req) }
    }

    /// Block until the operation has finished (at once for host operations); the error of a
    /// device operation that failed on the GPU.
    pub fn wait(&self) -> Result<()> {
        match &self.device {
            Some(r) => r.wait(),
            None => Ok(()),
        }
    }

    /// Whether the operation has finished.
    pub fn test(&self) -> Result<bool> {
        match &self.device {
            Some(r) => r.test(),
            None => Ok(true),
        }
    }

    /// Make `stream` wait (on the GPU, not the host) until the operation has finished: what
    /// torch's `Work.wait()` does for CUDA. Nothing to do for host operations.
    pub fn stream_wait(&self, stream: Stream) -> Result<()> {
        match &self.device {
            Some(r) => r.stream_wait(stream),
            None => Ok(()),
        }
    }

    /// Whether the operation runs on a GPU stream.
    pub fn on_device(&self) -> bool {
        self.device.is_some()
    }

    /// The device operation's request, if it is one.
    pub fn device_request(&self) -> Option<&GpuRequest> {
        self.device.as_ref()
    }
}

/// An operation running in the background. Dropping it without [`Request::wait`] still waits
/// for completion when the enclosing [`std::thread::scope`] ends; the buffers stay borrowed until
/// then.
#[must_use = "a request must be waited on to see its result"]
pub struct Request<'scope> {
    pub(super) handle: ScopedJoinHandle<'scope, Result<()>>,
}

impl Request<'_> {
    /// Block until the operation finishes and return its result.
    pub fn wait(self) -> Result<()> {
        self.handle.join().unwrap_or_else(|_| {
            Err(Error::Aborted {
                reason: "operation panicked".into(),
            })
        })
    }

    /// Whether the operation has finished (then [`Request::wait`] returns at once).
    pub fn test(&self) -> bool {
        self.handle.is_finished()
    }
}

impl Communicator {
    /// Run one operation in the background: `f` gets a handle whose operation takes its place
    /// in the communicator's order now (so ranks must spawn in the same order), and runs on a
    /// thread of `scope`; the buffers stay borrowed until the request completes. Every rank must
    /// spawn the same calls: a spawned call takes the message path ([`Communicator::reserve`]),
    /// the same call blocking may take the shared-memory or hierarchical engine, and the two
    /// never meet (both wait until the deadline).
    ///
    /// ```
    /// use accord::{testing::run_world, ReduceOp};
    /// run_world(2, |comm| {
    ///     let (mut a, mut b) = (vec![1i32; 4], vec![comm.rank() as i32; 4]);
    ///     std::thread::scope(|s| {
    ///         let ra = comm.spawn(s, |c| c.all_reduce(&mut a, ReduceOp::Sum));
    ///         let rb = comm.spawn(s, |c| c.broadcast(&mut b, 1));
    ///         ra.wait().unwrap();
    ///         rb.wait().unwrap();
    ///     });
    ///     assert_eq!((a[0], b[0]), (2, 1));
    /// });
    /// ```
    pub fn spawn<'scope, 'env, T>(
        &self,
        scope: &'scope Scope<'scope, 'env>,
        f: impl FnOnce(&Communicator) -> Result<T> + Send + 'scope,
    ) -> Request<'scope> {
        let comm = self.reserve();
        Request {
            handle: scope.spawn(move || f(&comm).map(|_| ())),
        }
    }

    /// A handle whose next operation takes its place in this communicator's order now, to run
    /// later, possibly on another thread ([`Communicator::spawn`] uses it). The handle runs one
    /// operation; further ones fail. Such operations run on the message path, which matches
    /// by sequence number, so several may be in flight in any order.
    pub fn reserve(&self) -> Communicator {
        Communicator {
            inner: self.inner.clone(),
            reserved: Some(Arc::new(ReservedSeq {
                seq: self.reserve_seq(),
                taken: Default::default(),
            })),
        }
    }

    /// Take the next sequence number (which [`Communicator::reserve`] hands to a handle).
    pub(super) fn reserve_seq(&self) -> u64 {
        self.inner.seq.fetch_add(1, Ordering::Relaxed)
    }
}
