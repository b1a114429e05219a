//! The optional strided-copy table: `cuMemcpy3DAsync_v2`, a stream-ordered copy of a 3-D block
//! of bytes between pitched arrays (the distributed FFT packs and unpacks sub-blocks of an
//! array with it). Every driver since CUDA 3.2 has it; it is a table of its own so that a
//! driver (or a test's fake one) without it loses only strided copies, which
//! [`super::Driver::strided`] then names.

use super::{CuDevicePtr, CuResult, CuStream};
use std::ffi::{c_uint, c_void};

/// `CU_MEMORYTYPE_DEVICE`.
pub const CU_MEMORYTYPE_DEVICE: c_uint = 2;

/// `CUDA_MEMCPY3D` (the `_v2` layout, which `cuMemcpy3DAsync_v2` takes): field for field as
/// in `cuda.h`. Unused fields stay zero; `Default` gives an all-zero struct.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
#[allow(missing_docs)]
pub struct CudaMemcpy3d {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_z: usize,
    pub src_lod: usize,
    pub src_memory_type: c_uint,
    pub src_host: usize,
    pub src_device: CuDevicePtr,
    pub src_array: usize,
    pub reserved0: usize,
    pub src_pitch: usize,
    pub src_height: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_z: usize,
    pub dst_lod: usize,
    pub dst_memory_type: c_uint,
    pub dst_host: usize,
    pub dst_device: CuDevicePtr,
    pub dst_array: usize,
    pub reserved1: usize,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub width_in_bytes: usize,
    pub height: usize,
    pub depth: usize,
}

super::symbol_table! {
    /// Function pointers for strided (pitched, 3-D) copies.
    Strided {
        memcpy_3d_async: "cuMemcpy3DAsync_v2" => fn(*const c_void, CuStream) -> CuResult;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_struct_has_cuda_h_layout() {
        // 11 fields a side (the memory type padded to 8 bytes) plus 3: 25 eight-byte words.
        assert_eq!(std::mem::size_of::<CudaMemcpy3d>(), 25 * 8);
        assert_eq!(std::mem::offset_of!(CudaMemcpy3d, src_memory_type), 32);
        assert_eq!(std::mem::offset_of!(CudaMemcpy3d, src_device), 48);
        assert_eq!(std::mem::offset_of!(CudaMemcpy3d, dst_x_in_bytes), 88);
        assert_eq!(std::mem::offset_of!(CudaMemcpy3d, dst_device), 136);
        assert_eq!(std::mem::offset_of!(CudaMemcpy3d, width_in_bytes), 176);
        assert_eq!(std::mem::offset_of!(CudaMemcpy3d, depth), 192);
    }
}
