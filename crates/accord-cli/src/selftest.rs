//! `accord selftest`: Accord's conformance suite ([`accord::testing::conformance`]) run by the
//! ranks of a real job, to check a deployment end to end: every operation, element type and
//! reduce operator, counts 0, 1, 7 and 1031 (blocks that never divide evenly), one large count,
//! and 1 MiB allreduces, each result compared with a sequential reference computed on every
//! rank.
//!
//! Each rank is one `accord selftest` process bootstrapped from the environment (`accord run -n 4
//! accord selftest` on one host; on several hosts, one process per rank with `ACCORD_RANK`,
//! `ACCORD_WORLD_SIZE`, `ACCORD_STORE` and `ACCORD_TOKEN`, as `bench/multihost.sh` starts them).

use accord::fingerprint::OpKind;
use accord::testing::conformance::{self, HostMemory, Options};
use accord::DataType;

/// Run the suite on this rank; 0 when every rank's results were right on this rank.
pub fn rank_main() -> i32 {
    let comm = match accord::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("accord selftest: {e}");
            return 2;
        }
    };
    let what = format!("{} ranks over {}", comm.size(), comm.transport_name());
    let large = Options {
        engine: format!("{what}, large"),
        counts: vec![40_009],
        dtypes: vec![DataType::BF16, DataType::F64, DataType::U8],
        ..Options::new(&what)
    };
    // From 1 MiB, allreduces over hosts of equal rank counts are striped.
    let striped = Options {
        engine: format!("{what}, 1 MiB + 12 B allreduce"),
        counts: vec![262_147],
        dtypes: vec![DataType::F32, DataType::F64, DataType::I64],
        kinds: vec![OpKind::AllReduce],
        ..Options::new(&what)
    };
    let mut calls = 0;
    for opts in [Options::new(&what), large, striped] {
        match conformance::check(&comm, &HostMemory, &opts) {
            Ok(s) => calls += s.cases,
            Err(f) => {
                eprintln!("accord selftest: rank {}: {f}", comm.rank());
                return 1;
            }
        }
    }
    println!(
        "accord selftest: rank {} of {what}: {calls} calls, every result right",
        comm.rank()
    );
    0
}
