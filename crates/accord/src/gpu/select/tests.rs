use super::*;
use crate::dtype::{DataType, ReduceOp};
use crate::fingerprint::OpKind;
use crate::gpu::cuda::CuStream;
use crate::gpu::device::DeviceSlice;
use crate::gpu::engine::{EngineResult, P2p, PendingChild};
use crate::op::{Extent, Request};

/// An engine that runs only what `takes` accepts, and says so by name.
struct Fake {
    name: &'static str,
    takes: fn(&Op) -> bool,
}

impl DeviceEngine for Fake {
    fn name(&self) -> &'static str {
        self.name
    }
    fn supports(&self, op: &Op, _heap: bool) -> std::result::Result<(), String> {
        match (self.takes)(op) {
            true => Ok(()),
            false => Err(format!("{} does not run {}", self.name, op.kind())),
        }
    }
    fn enqueue(
        &self,
        _: &Op,
        _: Option<DeviceSlice>,
        _: DeviceSlice,
        _: CuStream,
    ) -> EngineResult<()> {
        Ok(())
    }
    fn enqueue_p2p(&self, _: &[P2p], _: CuStream) -> EngineResult<()> {
        Ok(())
    }
    fn finish_enqueue(&self, _: &str) -> EngineResult<()> {
        Ok(())
    }
    fn async_error(&self) -> Option<Error> {
        (self.name == "broken").then(|| Error::invalid("broken"))
    }
    fn abort(&self) {}
    fn close(&self) {}
    fn split_begin(&self, _: i32, _: i32) -> EngineResult<Box<dyn PendingChild>> {
        Err(Error::invalid("fakes do not split").into())
    }
    fn set_timeout(&self, _: std::time::Duration) {}
    fn version(&self) -> (String, String) {
        (String::new(), String::new())
    }
    fn raw_handle(&self) -> usize {
        0
    }
}

fn fake(name: &'static str, takes: fn(&Op) -> bool) -> Box<dyn DeviceEngine> {
    Box::new(Fake { name, takes })
}

fn all_reduce(op: ReduceOp) -> Op {
    let req = Request {
        kind: OpKind::AllReduce,
        dtype: DataType::I32,
        reduce: Some(op),
        root: None,
        send: None,
        recv: Extent::len(8),
    };
    Op::new(req, 0, 2).unwrap()
}

#[test]
fn the_first_engine_that_supports_the_op_runs_it() {
    let engines = Engines::new(
        vec![fake("sum-only", |op| op.reduce == Some(ReduceOp::Sum))],
        fake("fallback", |_| true),
    );
    let sum = all_reduce(ReduceOp::Sum);
    assert_eq!(engines.pick(&sum, false, 1).unwrap().1.name(), "sum-only");
    let max = all_reduce(ReduceOp::Max);
    assert_eq!(engines.pick(&max, false, 1).unwrap().1.name(), "fallback");
    assert_eq!(engines.fallback().name(), "fallback");
    let order: Vec<_> = engines.iter().map(|e| e.name()).collect();
    assert_eq!(order, ["sum-only", "fallback"]);
}

#[test]
fn when_no_engine_runs_the_op_the_fallbacks_reason_is_the_error() {
    let engines = Engines::new(vec![fake("first", |_| false)], fake("fallback", |_| false));
    let op = all_reduce(ReduceOp::BXor);
    match engines.pick(&op, false, 1) {
        Err(Error::Unsupported(why)) => assert_eq!(why, "fallback does not run allreduce"),
        Err(e) => panic!("wrong error {e}"),
        Ok((_, e)) => panic!("picked {}", e.name()),
    }
}

#[test]
fn any_engines_async_error_is_reported() {
    let quiet = Engines::new(Vec::new(), fake("fallback", |_| true));
    assert_eq!(quiet.async_error(), None);
    let broken = Engines::new(vec![fake("broken", |_| true)], fake("fallback", |_| true));
    assert_eq!(broken.async_error(), Some(Error::invalid("broken")));
}
