//! The host's copy of `accord::MemoryChannel` (`<accord/channel.cuh>`).

/// One channel to a peer, as kernels receive it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryChannelHandle {
    /// This rank's buffer.
    pub local: u64,
    /// The peer's buffer as mapped here.
    pub remote: u64,
    /// The peer's counter of this rank's signals (mapped).
    pub remote_inbound: u64,
    /// This rank's counter of the peer's signals.
    pub inbound: u64,
    /// This rank's count of waits done on the peer.
    pub expected: u64,
    /// This rank's error word.
    pub error: u64,
    /// Bound of every wait, in nanoseconds.
    pub timeout_ns: u64,
    /// The peer's rank.
    pub peer: u32,
    /// This rank.
    pub rank: u32,
}

// The layout `<accord/channel.cuh>` asserts too.
const _: () = {
    assert!(std::mem::size_of::<MemoryChannelHandle>() == 64);
    assert!(std::mem::offset_of!(MemoryChannelHandle, remote_inbound) == 16);
    assert!(std::mem::offset_of!(MemoryChannelHandle, timeout_ns) == 48);
    assert!(std::mem::offset_of!(MemoryChannelHandle, peer) == 56);
    assert!(std::mem::offset_of!(MemoryChannelHandle, rank) == 60);
};
