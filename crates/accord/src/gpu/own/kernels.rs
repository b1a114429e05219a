//! The kernels' source, its modules, and their parameters.
//!
//! `collectives.cu` is compiled with NVRTC on first use: one module for data movement, and one
//! per (element type, operator) for the reducing kernels, each cached for the process.

use super::plan::{Algo, MAX_RANKS};
use crate::dtype::{DataType, ReduceOp};
use crate::error::Result;
use crate::gpu::cuda::{nvrtc, Kernel};
use std::collections::HashMap;
use std::sync::Mutex;

/// The kernels, in CUDA C++.
pub(crate) const SOURCE: &str = include_str!("collectives.cu");

/// `struct Ctx` of `collectives.cu`: what every kernel is told about the communicator.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ctx {
    pub sig: u64,
    pub peer_sig: [u64; MAX_RANKS],
    pub peer_scratch: [u64; MAX_RANKS],
    pub epochs: u64,
    pub control: u64,
    pub timeout_ns: u64,
    pub ll_off: u64,
    pub ll_slot: u64,
    pub bulk_off: u64,
    pub chunk: u64,
    pub sym_table: u64,
    pub din: u64,
    pub dout: u64,
    pub rank: u32,
    pub size: u32,
    pub hash: u32,
    pub pad: u32,
}

/// `struct Parts` of `collectives.cu`: alltoallv's blocks, in bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Parts {
    pub send_off: [u64; MAX_RANKS],
    pub send_len: [u64; MAX_RANKS],
    pub recv_off: [u64; MAX_RANKS],
    pub recv_len: [u64; MAX_RANKS],
}

/// The bytes of a plain `repr(C)` value made of integers only (no padding: the fields above
/// are 8-byte words followed by 4-byte ones in pairs).
pub(crate) fn bytes_of<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: T is one of the padding-free integer structs above; the slice borrows `v`.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

const _: () = assert!(std::mem::size_of::<Ctx>() == 8 * (1 + 2 * MAX_RANKS + 10) + 16);
const _: () = assert!(std::mem::size_of::<Parts>() == 4 * 8 * MAX_RANKS);

/// The NVRTC options of the module holding `algo` for `dtype` and `op`.
pub(crate) fn options(algo: Algo, dtype: DataType, op: ReduceOp) -> Vec<String> {
    if !algo.reduces() {
        return Vec::new();
    }
    let (kind, t, u) = match dtype {
        DataType::F16 => (2, "unsigned short", "unsigned short"),
        DataType::BF16 => (3, "unsigned short", "unsigned short"),
        DataType::F32 => (1, "float", "float"),
        DataType::F64 => (1, "double", "double"),
        DataType::I8 => (0, "signed char", "unsigned char"),
        DataType::U8 => (0, "unsigned char", "unsigned char"),
        DataType::I32 => (0, "int", "unsigned int"),
        DataType::U32 => (0, "unsigned int", "unsigned int"),
        DataType::I64 => (0, "long long", "unsigned long long"),
        DataType::U64 => (0, "unsigned long long", "unsigned long long"),
        DataType::Bool | DataType::I16 | DataType::U16 | DataType::C64 | DataType::C128 => {
            unreachable!("{dtype} reaches the kernels only as bytes or components (gpu::lower)")
        }
    };
    vec![
        format!("-DACCORD_OP={}", op as u8),
        format!("-DACCORD_KIND={kind}"),
        format!("-DACCORD_T={t}"),
        format!("-DACCORD_U={u}"),
    ]
}

/// The kernels one engine has loaded, by (kernel, type, operator); data movement is keyed with
/// `u8` and `Sum`.
pub(crate) struct Loaded {
    device: usize,
    map: Mutex<HashMap<(Algo, DataType, ReduceOp), Kernel>>,
}

impl Loaded {
    pub fn new(device: usize) -> Self {
        Loaded {
            device,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// `algo`'s kernel for `dtype` and `op`, compiled on first use.
    pub fn get(&self, algo: Algo, dtype: DataType, op: ReduceOp) -> Result<Kernel> {
        let key = match algo.reduces() {
            true => (algo, dtype, op),
            false => (algo, DataType::U8, ReduceOp::Sum),
        };
        if let Some(k) = self.map.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(k.clone());
        }
        let k = nvrtc::load_kernel(
            SOURCE,
            algo.kernel(),
            &options(algo, dtype, op),
            self.device,
        )?;
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, k.clone());
        Ok(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The field names of `struct NAME` in the kernels' source, in order.
    fn fields(name: &str) -> Vec<String> {
        let start = SOURCE
            .find(&format!("struct {name} {{"))
            .expect("struct in source");
        let body = &SOURCE[start..SOURCE[start..].find("};").unwrap() + start];
        body.lines()
            .skip(1)
            .filter_map(|l| l.split("//").next())
            .flat_map(|l| {
                let l = l.trim().trim_end_matches(';');
                let names = l.split_once(' ').map(|(_, n)| n).unwrap_or("");
                names
                    .split(',')
                    .map(|n| n.trim().split('[').next().unwrap().to_string())
                    .filter(|n| !n.is_empty())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn parameter_structs_match_the_source() {
        let ctx = [
            "sig",
            "peer_sig",
            "peer_scratch",
            "epochs",
            "control",
            "timeout_ns",
            "ll_off",
            "ll_slot",
            "bulk_off",
            "chunk",
            "sym_table",
            "din",
            "dout",
            "rank",
            "size",
            "hash",
            "pad",
        ];
        assert_eq!(fields("Ctx"), ctx);
        let parts = ["send_off", "send_len", "recv_off", "recv_len"];
        assert_eq!(fields("Parts"), parts);
        assert!(SOURCE.contains(&format!("#define MAXR {MAX_RANKS}")));
        assert!(SOURCE.contains(&format!("#define MAXB {}", super::super::plan::MAX_BLOCKS)));
        let slots = crate::gpu::symm::registry::SLOTS;
        assert!(SOURCE.contains(&format!("#define SLOTS {slots}")));
        assert_eq!(crate::gpu::symm::registry::RANKS, MAX_RANKS);
    }

    #[test]
    fn every_kernel_is_in_the_source_and_reducing_ones_get_their_type() {
        use Algo::*;
        for a in [
            Barrier,
            AllReduceOneShot,
            AllGatherLl,
            AllToAllLl,
            ReduceScatterLl,
            AllReduceTwoShot,
            ReduceScatter,
            AllGather,
            Broadcast,
            AllToAll,
        ] {
            assert!(SOURCE.contains(&format!(" {}(Ctx c", a.kernel())), "{a:?}");
            let o = options(a, DataType::BF16, ReduceOp::Max);
            match a.reduces() {
                true => assert!(
                    o.contains(&"-DACCORD_KIND=3".to_string())
                        && o.contains(&"-DACCORD_OP=4".to_string())
                ),
                false => assert!(o.is_empty()),
            }
        }
        for t in DataType::ALL
            .into_iter()
            .filter(|&t| crate::gpu::lower::native(t))
        {
            assert_eq!(options(AllReduceTwoShot, t, ReduceOp::Sum).len(), 4);
        }
    }
}
