//! One error type for everything Accord does.
//!
//! Every variant carries the structured facts a user needs to find the culprit: which operation,
//! which sequence number, which rank. The `Display` text is written to be read in a log line by
//! someone who did not write the program.

use std::fmt;
use std::time::Duration;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a communicator, a transport or the rendezvous store.
///
/// Errors are `Clone` because a failed communicator is *poisoned*: the first error is stored and
/// returned again by every later call on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A blocking call passed its deadline.
    #[error(
        "timed out after {:.1?} in {op} (communicator {comm}, op #{seq}) waiting for rank(s) {}{hint}",
        after,
        RankList(waiting_for)
    )]
    Timeout {
        /// Human description of the call, e.g. `allreduce(f32 x 1024, sum)`.
        op: String,
        /// The call's sequence number on its communicator.
        seq: u64,
        /// Name of the communicator (`world`, or the group's name).
        comm: String,
        /// Ranks (in the communicator) to blame: those the call was still waiting for or, when
        /// those were themselves waiting, the ranks at the end of the chain (a stopped or hung
        /// rank, or one in no call; see the crate docs on timeouts).
        waiting_for: Vec<usize>,
        /// How long the call waited.
        after: Duration,
        /// Extra diagnosis, e.g. what the missing rank is doing instead, or the chain of waits
        /// that leads to the culprit (may be empty).
        hint: String,
    },
    /// Ranks called different operations, or the same one with incompatible arguments.
    #[error(
        "desync: rank {peer} called {theirs} but rank {me} called {mine} (communicator {comm}, op #{seq})"
    )]
    Desync {
        /// This rank.
        me: usize,
        /// The call this rank made.
        mine: String,
        /// The rank whose call disagrees.
        peer: usize,
        /// The call that rank made.
        theirs: String,
        /// Communicator name.
        comm: String,
        /// Sequence number of the call.
        seq: u64,
    },
    /// A peer's connection broke or its process died.
    #[error("rank {rank} is lost: {cause}")]
    PeerLost {
        /// The lost rank (in the world).
        rank: usize,
        /// What was observed (end of stream, reset, ...).
        cause: String,
    },
    /// The communicator was aborted, locally or by a peer that failed.
    #[error("communicator aborted: {reason}")]
    Aborted {
        /// Why, including the original failure where known.
        reason: String,
    },
    /// The caller passed something that cannot work (sizes, dtype/op pairs, ranks...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A peer or store client failed the shared-token challenge.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The operation exists but not for these arguments or this build.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Malformed bytes arrived on a connection.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// An operating-system I/O error, with what we were doing.
    #[error("{context}: {message}")]
    Io {
        /// What Accord was doing.
        context: String,
        /// The OS error text.
        message: String,
        /// The OS error kind.
        kind: std::io::ErrorKind,
    },
    /// The rendezvous store refused or failed a request.
    #[error("store: {0}")]
    Store(String),
    /// A GPU library call failed: the library, the call, its result code and the library's own
    /// description of it.
    #[error("{call} failed{}: {text} ({library} error {code})", OnRank(*rank))]
    Gpu {
        /// `nccl` or `cuda`.
        library: &'static str,
        /// The call, e.g. `ncclAllReduce` or `cuMemAlloc`.
        call: String,
        /// The library's result code (`ncclResult_t`, `CUresult`).
        code: i32,
        /// The library's description of the code, with its last detailed message where it has
        /// one.
        text: String,
        /// The rank (of the GPU communicator) the call failed on, where known.
        rank: Option<usize>,
    },
}

impl Error {
    /// Wrap an I/O error with a description of what was being attempted.
    pub fn io(context: impl Into<String>, err: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            message: err.to_string(),
            kind: err.kind(),
        }
    }

    /// What every rank reports after rank `by`'s abort notice, which carries `reason`.
    pub(crate) fn aborted_by(by: usize, reason: &str) -> Self {
        Error::Aborted {
            reason: format!("rank {by} gave up: {reason}"),
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}

/// ` on rank 3`, or nothing.
struct OnRank(Option<usize>);

impl fmt::Display for OnRank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(r) => write!(f, " on rank {r}"),
            None => Ok(()),
        }
    }
}

/// Formats `[1, 3]` as `1, 3`.
struct RankList<'a>(&'a [usize]);

impl fmt::Display for RankList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_failure_names_the_call_the_code_and_the_librarys_words() {
        let e = Error::Gpu {
            library: "nccl",
            call: "ncclAllReduce".into(),
            code: 2,
            text: "unhandled system error: socket closed".into(),
            rank: Some(3),
        };
        assert_eq!(
            e.to_string(),
            "ncclAllReduce failed on rank 3: unhandled system error: socket closed (nccl error 2)"
        );
        let e = Error::Gpu {
            library: "cuda",
            call: "cuMemAlloc".into(),
            code: 2,
            text: "out of memory".into(),
            rank: None,
        };
        assert_eq!(
            e.to_string(),
            "cuMemAlloc failed: out of memory (cuda error 2)"
        );
    }
}
