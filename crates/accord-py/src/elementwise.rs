//! allreduce, scan and exscan: one array per rank in, one out, in place or into `out`.

use crate::args::reduce_op;
use crate::buffers::{buf, pair, Call};
use crate::communicator::Communicator;
use crate::scalar::Arg;
use accord::{Communicator as CoreComm, ReduceOp};
use pyo3::prelude::*;

/// The reductions of one array per rank into one array per rank, in place or not.
#[derive(Clone, Copy)]
pub(crate) enum Elementwise {
    AllReduce,
    Scan,
    ExScan,
}

impl Elementwise {
    fn name(self) -> &'static str {
        match self {
            Elementwise::AllReduce => "allreduce",
            Elementwise::Scan => "scan",
            Elementwise::ExScan => "exscan",
        }
    }

    fn call<'a>(
        self,
        c: &CoreComm,
        io: (Option<accord::SendBuf<'a>>, accord::RecvBuf<'a>),
        op: ReduceOp,
    ) -> accord::Result<accord::Completion> {
        match (self, io) {
            (Elementwise::AllReduce, (None, r)) => c.all_reduce(r, op),
            (Elementwise::AllReduce, (Some(s), r)) => c.all_reduce((s, r), op),
            (Elementwise::Scan, (None, r)) => c.scan(r, op),
            (Elementwise::Scan, (Some(s), r)) => c.scan((s, r), op),
            (Elementwise::ExScan, (None, r)) => c.exscan(r, op),
            (Elementwise::ExScan, (Some(s), r)) => c.exscan((s, r), op),
        }
    }
}

impl Communicator {
    /// `allreduce`, `scan` or `exscan` of `arr` into `out` (into `arr` when `out` is None).
    pub(crate) fn elementwise(
        &self,
        py: Python<'_>,
        what: Elementwise,
        arr: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let op = reduce_op(op)?;
        let Some(out) = out.filter(|o| !o.is(arr)) else {
            let arr = Arg::new(arr, "arr")?;
            let a = buf(&arr.obj, "arr", true)?;
            return self.run(
                py,
                Call::one(what.name(), async_op, a, &arr),
                Box::new(move |c, b| unsafe { what.call(c, (None, b[0].recv()), op) }.map(Some)),
            );
        };
        let (arr, out) = (Arg::new(arr, "arr")?, Arg::new(out, "out")?);
        let bufs = pair(&arr, &out, what.name())?;
        self.run(
            py,
            Call::two(what.name(), async_op, bufs, [&arr, &out]),
            Box::new(move |c, b| {
                unsafe { what.call(c, (Some(b[0].send()), b[1].recv()), op) }.map(Some)
            }),
        )
    }
}
