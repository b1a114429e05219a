//! The device engine: what runs collectives on device memory for one communicator (NCCL, or
//! Accord's own kernels).
//!
//! An engine only launches work and answers for its own library: it takes an [`Op`] that
//! [`Op::new`] already checked and slices the neutral layer already matched against it, and
//! enqueues the work on a stream. Everything around that is engine-neutral and lives in
//! [`super::comm`]: ordering and sequence numbers, fingerprints, events, poisoning, the watchdog,
//! the timeout and the split meeting. An engine reports failures as a [`Fault`], saying whether
//! the communicator survives it (a usage error) or must be aborted; the neutral layer does the
//! aborting, through [`DeviceEngine::abort`].

use super::cuda::CuStream;
use super::device::DeviceSlice;
use crate::error::{Error, Result};
use crate::op::Op;

/// A failure of an engine call.
#[derive(Debug)]
pub(crate) struct Fault {
    /// Boxed: faults are rare, and the `Ok` path should stay small.
    pub error: Box<Error>,
    /// Whether the communicator must fail (abort and poison): the library is in an unknown
    /// state. Usage errors leave it usable.
    pub fatal: bool,
}

impl Fault {
    /// A failure that leaves the engine in an unknown state.
    pub fn fatal(error: Error) -> Self {
        Fault {
            error: Box::new(error),
            fatal: true,
        }
    }
}

/// Errors from checks and plain CUDA calls leave the communicator usable.
impl From<Error> for Fault {
    fn from(error: Error) -> Self {
        Fault {
            error: Box::new(error),
            fatal: false,
        }
    }
}

pub(crate) type EngineResult<T> = std::result::Result<T, Fault>;

/// One side of a point-to-point batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum P2p {
    /// Send the slice to a rank.
    Send { buf: DeviceSlice, peer: usize },
    /// Receive the slice from a rank.
    Recv { buf: DeviceSlice, peer: usize },
}

/// One child of a split, as the engine made it.
pub(crate) struct Child {
    pub engine: Box<dyn DeviceEngine>,
    /// This process's rank in the child, and the child's size.
    pub rank: usize,
    pub size: usize,
}

/// What runs operations on device memory for one communicator.
///
/// Operations arrive in the communicator's order, one at a time (the neutral layer holds no
/// lock around them: callers serialise their calls, as documented for the communicator); the
/// query and abort methods may run on the watchdog's thread meanwhile.
pub(crate) trait DeviceEngine: Send + Sync {
    /// For messages and `ACCORD_EXPLAIN`, e.g. `NCCL`.
    fn name(&self) -> &'static str;

    /// Whether this engine runs `op` (`heap`: on arrays of the communicator's symmetric heap,
    /// [`DeviceEngine::heap_arrays`]); the reason when it does not. Checked before the operation
    /// takes its place in the communicator's order.
    fn supports(&self, op: &Op, heap: bool) -> std::result::Result<(), String>;

    /// [`DeviceEngine::supports`] without the reason: asked on every call, so engines that
    /// decline often answer without building a message.
    fn accepts(&self, op: &Op, heap: bool) -> bool {
        self.supports(op, heap).is_ok()
    }

    /// Whether every array `op` touches on this rank lies in the communicator's symmetric heap,
    /// which this engine takes zero-copy (and may therefore prefer at more sizes).
    fn heap_arrays(&self, _op: &Op, _send: Option<DeviceSlice>, _recv: DeviceSlice) -> bool {
        false
    }

    /// How it runs `op`, for `ACCORD_EXPLAIN`.
    fn explain(&self, _op: &Op) -> String {
        self.name().to_string()
    }

    /// A failure the engine's kernels recorded on the device, if any: checked (cheaply) once an
    /// operation's event has passed and before its result is believed, since a kernel that gave
    /// up returns like one that finished.
    fn device_fault(&self) -> Option<Error> {
        None
    }

    /// Enqueue the collective `op` on `stream`. `send` is `None` in place (`recv` is the input
    /// too); for the barrier, `recv` is one scratch word of the communicator. The slices hold
    /// what `op` needs on this rank, of `op.dtype`.
    fn enqueue(
        &self,
        op: &Op,
        send: Option<DeviceSlice>,
        recv: DeviceSlice,
        stream: CuStream,
    ) -> EngineResult<()>;

    /// Enqueue point-to-point sends and receives on `stream`, as one group when there are
    /// several (so that a ring of send-receive pairs cannot deadlock). Peers are ranks.
    fn enqueue_p2p(&self, ops: &[P2p], stream: CuStream) -> EngineResult<()>;

    /// After a launch group ended with work still being enqueued (a nonblocking library), wait
    /// for it to finish; `what` names the group's end for messages.
    fn finish_enqueue(&self, what: &str) -> EngineResult<()>;

    /// The library's asynchronous error, if it has one (a peer's lost connection where the
    /// library notices it). Never called after [`DeviceEngine::abort`].
    fn async_error(&self) -> Option<Error>;

    /// Stop the library's work on the device and free it: kernels return, nothing later
    /// runs. Idempotent; allowed from any thread, also while an operation blocks.
    fn abort(&self);

    /// Release the engine once its work is done (the neutral layer waited for its stream).
    /// Nothing after [`DeviceEngine::abort`].
    fn close(&self);

    /// Begin splitting this communicator: ranks with the same `color` form a child, ordered by
    /// `(key, rank)`; a negative color takes no part. Every rank has already met under the
    /// deadline, so the split runs to completion. Issued inside the library's [`LaunchGroup`]
    /// when several GPUs of this process split together; the child is finished once the group
    /// ended.
    fn split_begin(&self, color: i32, key: i32) -> EngineResult<Box<dyn PendingChild>>;

    /// The communicator's deadline changed (an engine that waits inside a call bounds the wait
    /// by it).
    fn set_timeout(&self, timeout: std::time::Duration);

    /// The library's version and where it was loaded from.
    fn version(&self) -> (String, String);

    /// The library's communicator handle, for interoperation.
    fn raw_handle(&self) -> usize;

    /// The unique id the library's communicator was created from (NCCL's 128 bytes), where it
    /// was created from one (a split child was not).
    fn unique_id(&self) -> Option<Vec<u8>> {
        None
    }
}

/// A child of [`DeviceEngine::split_begin`], complete once the launch group it was issued in
/// ended. Dropped unfinished, it releases what the library made.
pub(crate) trait PendingChild: Send {
    /// The child, or `None` if this rank took no part.
    fn finish(self: Box<Self>) -> EngineResult<Option<Child>>;
}

/// A launch group of an engine's library, over every communicator of the process
/// (`ncclGroupStart` / `ncclGroupEnd`): operations issued between start and end launch together,
/// so that one thread can drive several GPUs.
pub(crate) trait LaunchGroup: Sync {
    fn start(&self) -> Result<()>;

    /// End the group: `Ok(true)` if it launched but some communicator's enqueue is still in
    /// progress (see [`DeviceEngine::finish_enqueue`]).
    fn end(&self) -> Result<bool>;

    /// The call that ends it, for messages.
    fn end_name(&self) -> &'static str;
}
