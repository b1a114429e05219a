//! Nonblocking collectives: a request runs the operation on a thread of a scope, in the place
//! its sequence number took when it was started.

use super::*;

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

macro_rules! nonblocking {
    ($($(#[$doc:meta])+ $iname:ident => $name:ident($($arg:ident : $ty:ty),*);)*) => {$(
        $(#[$doc])+
        ///
        /// The call takes its place in the communicator's order now, so ranks must start requests
        /// in the same order; it runs on a thread of `scope` and the buffers stay borrowed until the
        /// request completes.
        pub fn $iname<'scope, 'env, T: Element>(
            &self,
            scope: &'scope Scope<'scope, 'env>,
            $($arg: $ty),*
        ) -> Request<'scope> {
            let (comm, seq) = (self.clone(), self.next_seq());
            Request { handle: scope.spawn(move || comm.with_seq(seq, |c| c.$name($($arg),*))) }
        }
    )*};
}

impl Communicator {
    nonblocking! {
        /// Nonblocking [`Communicator::all_reduce`].
        iall_reduce => all_reduce(buf: &'scope mut [T], op: ReduceOp);
        /// Nonblocking [`Communicator::all_reduce_into`].
        iall_reduce_into => all_reduce_into(send: &'scope [T], recv: &'scope mut [T], op: ReduceOp);
        /// Nonblocking [`Communicator::broadcast`].
        ibroadcast => broadcast(buf: &'scope mut [T], root: usize);
        /// Nonblocking [`Communicator::reduce_into`].
        ireduce_into => reduce_into(send: &'scope [T], recv: &'scope mut [T], op: ReduceOp, root: usize);
        /// Nonblocking [`Communicator::all_gather`].
        iall_gather => all_gather(send: &'scope [T], recv: &'scope mut [T]);
        /// Nonblocking [`Communicator::gather`].
        igather => gather(send: &'scope [T], recv: &'scope mut [T], root: usize);
        /// Nonblocking [`Communicator::scatter`].
        iscatter => scatter(send: &'scope [T], recv: &'scope mut [T], root: usize);
        /// Nonblocking [`Communicator::reduce_scatter`].
        ireduce_scatter => reduce_scatter(send: &'scope [T], recv: &'scope mut [T], op: ReduceOp);
        /// Nonblocking [`Communicator::all_to_all`].
        iall_to_all => all_to_all(send: &'scope [T], recv: &'scope mut [T]);
        /// Nonblocking [`Communicator::reduce`].
        ireduce => reduce(buf: &'scope mut [T], op: ReduceOp, root: usize);
        /// Nonblocking [`Communicator::all_gather_v`].
        iall_gather_v => all_gather_v(send: &'scope [T], recv: &'scope mut [T], counts: &'scope [usize]);
        /// Nonblocking [`Communicator::gather_v`].
        igather_v => gather_v(send: &'scope [T], recv: &'scope mut [T], counts: &'scope [usize], root: usize);
        /// Nonblocking [`Communicator::scatter_v`].
        iscatter_v => scatter_v(send: &'scope [T], recv: &'scope mut [T], counts: &'scope [usize], root: usize);
        /// Nonblocking [`Communicator::reduce_scatter_v`].
        ireduce_scatter_v => reduce_scatter_v(send: &'scope [T], recv: &'scope mut [T], counts: &'scope [usize], op: ReduceOp);
        /// Nonblocking [`Communicator::all_to_all_v`].
        iall_to_all_v => all_to_all_v(send: &'scope [T], send_counts: &'scope [usize], recv: &'scope mut [T], recv_counts: &'scope [usize]);
    }

    /// Nonblocking [`Communicator::barrier`].
    pub fn ibarrier<'scope, 'env>(&self, scope: &'scope Scope<'scope, 'env>) -> Request<'scope> {
        let (comm, seq) = (self.clone(), self.next_seq());
        Request {
            handle: scope.spawn(move || comm.with_seq(seq, |c| c.barrier())),
        }
    }

    /// Run `f`, whose single operation on this communicator uses the already reserved sequence
    /// number `seq` instead of taking a fresh one.
    pub fn with_seq<R>(&self, seq: u64, f: impl FnOnce(&Communicator) -> R) -> R {
        RESERVED_SEQ.with(|c| c.set(Some((self.inner.id, seq))));
        let r = f(self);
        RESERVED_SEQ.with(|c| c.set(None));
        r
    }

    /// Reserve a sequence number on the calling thread's behalf, for a caller that runs the
    /// operation elsewhere later (with [`Communicator::with_seq`]).
    pub fn reserve_seq(&self) -> u64 {
        self.inner.seq.fetch_add(1, Ordering::Relaxed)
    }
}

thread_local! {
    /// (communicator id, sequence number) reserved for the next operation on this thread.
    pub(super) static RESERVED_SEQ: std::cell::Cell<Option<(u64, u64)>> = const { std::cell::Cell::new(None) };
}
