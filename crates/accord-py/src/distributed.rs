//! Plans for distributed arrays: [`accord::distributed::Redistribute`] and
//! [`accord::distributed::DistributedFft`] as Python objects. `accord.distributed` (Python)
//! turns distributions into boxes, allocates results and handles memory order; these classes
//! plan over a communicator and execute on host or CUDA arrays through the same path as every
//! collective ([`Communicator::run`]).

use crate::buffers::{buf, pair, Call};
use crate::communicator::Communicator;
use crate::errors::to_py as err;
use crate::scalar::Arg;
use accord::distributed::{
    Direction, DistributedFft, FftKind, Layout, Norm, Precision, Redistribute, Region,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::Arc;

type Corners = (Vec<usize>, Vec<usize>);

fn region((lower, upper): Corners) -> PyResult<Region> {
    Region::new(lower, upper).map_err(err)
}

fn corners(b: &Region) -> Corners {
    (b.lower.clone(), b.upper.clone())
}

fn boxes(l: &Layout) -> Vec<Corners> {
    l.regions().iter().map(corners).collect()
}

/// A planned redistribution (see `accord.distributed.Redistribute`).
#[pyclass(module = "accord._native", frozen)]
pub(crate) struct RedistributePlan {
    plan: Arc<Redistribute>,
}

#[pymethods]
impl RedistributePlan {
    /// Plan moving this rank's `input` box (lower, upper) to its `output` box for arrays like
    /// `example` (its dtype; collective).
    #[new]
    fn new(
        py: Python<'_>,
        comm: &Communicator,
        input: Corners,
        output: Corners,
        example: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let b = buf(example, "operand", false)?;
        let dtype = b.dtype();
        let element = b.raw().map_or(dtype.size(), |r| r.itemsize);
        let (input, output) = (region(input)?, region(output)?);
        let core = comm.inner.clone();
        let plan = py
            .allow_threads(|| Redistribute::with_element(&core, &input, &output, dtype, element))
            .map_err(err)?;
        Ok(RedistributePlan {
            plan: Arc::new(plan),
        })
    }

    /// The global shape.
    #[getter]
    fn global_shape(&self) -> Vec<usize> {
        self.plan.input().shape().to_vec()
    }

    /// Every rank's input box, in rank order.
    #[getter]
    fn input_boxes(&self) -> Vec<Corners> {
        boxes(self.plan.input())
    }

    /// Every rank's output box, in rank order.
    #[getter]
    fn output_boxes(&self) -> Vec<Corners> {
        boxes(self.plan.output())
    }

    /// Bytes this rank sends to and receives from other ranks per execution.
    #[getter]
    fn bytes_moved(&self) -> (usize, usize) {
        self.plan.bytes_moved()
    }

    /// Move `arr` (this rank's input, C order) into `out` (its output, C order).
    #[pyo3(signature = (comm, arr, out, async_op=false))]
    fn execute(
        &self,
        py: Python<'_>,
        comm: &Communicator,
        arr: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let (arr, out) = (Arg::new(arr, "operand")?, Arg::new(out, "out")?);
        let bufs = pair(&arr, &out, "redistribute")?;
        let plan = self.plan.clone();
        comm.run(
            py,
            Call::two("redistribute", async_op, bufs, [&arr, &out]),
            Box::new(move |c, b| unsafe { plan.execute(c, b[0].send(), b[1].recv()) }.map(Some)),
        )
    }
}

/// A planned distributed FFT (see `accord.distributed.fft.FFT`).
#[pyclass(module = "accord._native", frozen)]
pub(crate) struct FftPlan {
    plan: Arc<DistributedFft>,
}

fn kind(name: &str, odd: bool) -> PyResult<FftKind> {
    Ok(match name {
        "C2C" => FftKind::C2C,
        "R2C" => FftKind::R2C,
        "C2R" => FftKind::C2R { odd },
        other => {
            return Err(PyValueError::new_err(format!(
                "fft_type {other:?}: expected 'C2C', 'R2C' or 'C2R'"
            )))
        }
    })
}

fn norm(name: &str) -> PyResult<Norm> {
    Ok(match name {
        "backward" => Norm::Backward,
        "ortho" => Norm::Ortho,
        "forward" => Norm::Forward,
        "none" => Norm::None,
        other => {
            return Err(PyValueError::new_err(format!(
                "norm {other:?}: expected 'backward', 'ortho', 'forward' or 'none'"
            )))
        }
    })
}

#[pymethods]
impl FftPlan {
    /// Plan a transform of `fft_type` ('C2C', 'R2C', 'C2R') in `precision` ('single' or
    /// 'double') from this rank's `input` box into its `output` box, or, with `None`, into the
    /// layout the last stage leaves (collective).
    #[new]
    #[pyo3(signature = (comm, input, output, fft_type, precision, odd=false))]
    fn new(
        py: Python<'_>,
        comm: &Communicator,
        input: Corners,
        output: Option<Corners>,
        fft_type: &str,
        precision: &str,
        odd: bool,
    ) -> PyResult<Self> {
        let kind = kind(fft_type, odd)?;
        let precision = match precision {
            "single" => Precision::F32,
            "double" => Precision::F64,
            other => {
                return Err(PyValueError::new_err(format!(
                    "precision {other:?}: expected 'single' or 'double'"
                )))
            }
        };
        let input = region(input)?;
        let output = output.map(region).transpose()?;
        let core = comm.inner.clone();
        let plan = py
            .allow_threads(|| DistributedFft::new(&core, &input, output.as_ref(), kind, precision))
            .map_err(err)?;
        Ok(FftPlan {
            plan: Arc::new(plan),
        })
    }

    /// The global shapes of the input and the output.
    #[getter]
    fn global_shapes(&self) -> (Vec<usize>, Vec<usize>) {
        (
            self.plan.input().shape().to_vec(),
            self.plan.output().shape().to_vec(),
        )
    }

    /// Every rank's input box, in rank order.
    #[getter]
    fn input_boxes(&self) -> Vec<Corners> {
        boxes(self.plan.input())
    }

    /// Every rank's output box, in rank order.
    #[getter]
    fn output_boxes(&self) -> Vec<Corners> {
        boxes(self.plan.output())
    }

    /// How many redistributions one execution runs.
    #[getter]
    fn redistributions(&self) -> usize {
        self.plan.moves().count()
    }

    /// Transform `arr` (this rank's input, C order) into `out` (its output) in `direction`
    /// ('forward' or 'inverse'), scaled as `norm` says.
    #[pyo3(signature = (comm, arr, out, direction, norm_name="backward", async_op=false))]
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        py: Python<'_>,
        comm: &Communicator,
        arr: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        direction: &str,
        norm_name: &str,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let direction = match direction {
            "forward" => Direction::Forward,
            "inverse" => Direction::Inverse,
            other => {
                return Err(PyValueError::new_err(format!(
                    "direction {other:?}: expected 'forward' or 'inverse'"
                )))
            }
        };
        let norm = norm(norm_name)?;
        let (arr, out) = (Arg::new(arr, "operand")?, Arg::new(out, "out")?);
        let bufs = (
            buf(&arr.obj, "operand", false)?,
            buf(&out.obj, "out", true)?,
        );
        let plan = self.plan.clone();
        comm.run(
            py,
            Call::two("fft", async_op, bufs, [&arr, &out]),
            Box::new(move |c, b| {
                unsafe { plan.execute(c, b[0].send(), b[1].recv(), direction, norm) }.map(Some)
            }),
        )
    }
}

/// The box (lower, upper) rank `rank` of `size` holds of an array of `shape` split over the
/// process grid `grid` (a slab is a grid with one axis above one): what
/// `accord.distributed.Slab` and `Block` compute.
#[pyfunction]
pub(crate) fn grid_box(
    grid: Vec<usize>,
    shape: Vec<usize>,
    rank: usize,
    size: usize,
) -> PyResult<Corners> {
    let b = accord::distributed::Distribution::Grid(grid)
        .region(&shape, rank, size)
        .map_err(err)?;
    Ok(corners(&b))
}
