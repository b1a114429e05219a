//! NCCL: the device engine every GPU communicator is created with, and the fallback that runs
//! everything the others do not.
//!
//! - `loader`: finding and loading the library at run time (the search order is documented
//!   there and on [`nccl`]);
//! - `init`: creating communicators under a deadline (nonblocking init, then blocking twins);
//! - `engine`: the device-engine trait for an NCCL communicator: every operation kind,
//!   the asynchronous error, abort, split, and NCCL's launch group.

mod engine;
mod init;
mod loader;
pub(crate) use loader::loaded;
mod scan;

pub use loader::*;

pub(crate) use engine::launch_group;
pub(crate) use init::{create, join_with_id};

use crate::error::Result;

/// A fresh `ncclUniqueId`, for [`crate::Communicator::attach_devices_with_id`] (which this
/// process must then share with the others itself). [`crate::Communicator::attach_device`] does
/// all of this over the communicator.
pub fn unique_id() -> Result<NcclUniqueId> {
    super::cuda::driver()?;
    let n = nccl()?;
    let mut uid = NcclUniqueId { internal: [0; 128] };
    // SAFETY: writes 128 bytes.
    let rc = unsafe { (n.get_unique_id)(&mut uid) };
    if rc != 0 {
        return Err(n.error("ncclGetUniqueId", rc, std::ptr::null_mut(), None));
    }
    Ok(uid)
}
