"""The distributed FFT, shaped like ``nvmath.distributed.fft``::

    from accord.distributed import Slab
    from accord.distributed.fft import fft, ifft
    b = fft(a, distribution=Slab.X)        # a: this rank's X slab of the global array
    c = ifft(b, distribution=Slab.X)       # c equals a (numpy's normalisation by default)

2-D and 3-D (and higher) arrays distributed as slabs (:class:`Slab`), pencils
(:class:`Block`) or any boxes (``distribution=[input_box, output_box]``); complex-to-complex
(complex64, complex128), real-to-complex (:func:`rfft`: the last axis ``n`` becomes ``n//2+1``)
and complex-to-real (:func:`irfft`; ``last_axis_parity`` says whether the real length is
``2(m-1)`` or ``2(m-1)+1``). Local transforms run on Rust FFTs (rustfft,
realfft) on the host and on cuFFT for CuPy and torch CUDA operands; the transposes between
them are :func:`accord.distributed.redistribute`'s.

With ``FFTOptions(redistribute=False)`` a slab input's result stays in the complementary slab
(``Slab.X`` in, ``Slab.Y`` out, and the reverse), saving the last transpose; :attr:`FFT.output_box`
says which box this rank holds. ``norm`` follows numpy (``"backward"``: the inverse scaled by
``1/N``; ``"ortho"``, ``"forward"``) or ``"none"`` (unscaled both ways, as cuFFT and nvmath
compute). Results are new arrays; the operand is left as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, Sequence, Union

from .. import _arrays, _native
from . import Box, Distribution, Slab, _operands, bind, communicator, output_box

__all__ = ["FFT", "FFTOptions", "Slab", "fft", "ifft", "irfft", "rfft"]

_COMPLEX = {"complex64": "single", "complex128": "double"}
_REAL = {"float32": "single", "float64": "double"}
_NORMS = ("backward", "ortho", "forward", "none")


@dataclass
class FFTOptions:
    """Options of :class:`FFT` and the functions (nvmath's ``FFTOptions`` plus ``norm``).

    ``fft_type``: ``"C2C"``, ``"R2C"`` or ``"C2R"`` (default: C2C for complex operands, R2C
    for real ones); ``redistribute``: give a slab or block input's result in the same
    distribution (default) rather than where the last transform leaves it;
    ``last_axis_parity``: ``"even"`` or ``"odd"``, the real length of a C2R result's last
    axis; ``norm``: ``"backward"``, ``"ortho"``, ``"forward"`` or ``"none"``.
    """

    fft_type: Optional[Literal["C2C", "R2C", "C2R"]] = None
    redistribute: bool = True
    last_axis_parity: Literal["even", "odd"] = "even"
    norm: Literal["backward", "ortho", "forward", "none"] = "backward"

    def __post_init__(self) -> None:
        if self.fft_type not in (None, "C2C", "R2C", "C2R"):
            raise ValueError(f"fft_type must be 'C2C', 'R2C' or 'C2R', got {self.fft_type!r}")
        if self.last_axis_parity not in ("even", "odd"):
            raise ValueError(f"last_axis_parity must be 'even' or 'odd', got {self.last_axis_parity!r}")
        if self.norm not in _NORMS:
            raise ValueError(f"norm must be one of {_NORMS}, got {self.norm!r}")


def _options(options: Union[FFTOptions, dict, None]) -> FFTOptions:
    if options is None:
        return FFTOptions()
    if isinstance(options, dict):
        return FFTOptions(**options)
    if isinstance(options, FFTOptions):
        return options
    raise TypeError(f"options: expected FFTOptions or a dict, got {type(options).__name__}")


class FFT:
    """A planned distributed FFT (nvmath's ``FFT``)::

        with FFT(a, distribution=Slab.X) as f:
            f.plan()
            b = f.execute()                      # forward
            f.reset_operand(b)
            a2 = f.execute(direction="inverse")  # C2C plans run both ways

    ``distribution``: a :class:`Slab` or :class:`Block` (this rank's operand is its part), or
    ``[input_box, output_box]``. Collective: every rank constructs, plans and executes together.
    """

    def __init__(
        self,
        operand: Any,
        /,
        *,
        distribution: Union[Distribution, Sequence[Box]],
        options: Union[FFTOptions, dict, None] = None,
        comm: Any = None,
    ):
        self.comm = communicator(comm)
        self.options = _options(options)
        self.operand = operand
        name = _operands.dtype_name(operand)
        kind = self.options.fft_type or ("R2C" if name in _REAL else "C2C")
        want = _REAL if kind == "R2C" else _COMPLEX
        if name not in want:
            raise TypeError(
                f"FFT: a {kind} transform takes {' or '.join(want)} operands, not {name}"
            )
        if len(operand.shape) < 2:
            raise ValueError(f"FFT: the distributed FFT needs 2 or more axes, not shape {tuple(operand.shape)}")
        self.fft_type = kind
        self.precision = want[name]
        self.distribution = distribution
        if isinstance(distribution, Distribution) and not isinstance(distribution, Box):
            self.input_box, global_shape, self._order = bind(self.comm, operand, distribution, "FFT (input)")
            shape = list(global_shape)
            if kind == "R2C":
                shape[-1] = shape[-1] // 2 + 1
            elif kind == "C2R":
                shape[-1] = 2 * (shape[-1] - 1) + (self.options.last_axis_parity == "odd")
            self._wanted = (
                output_box(self.comm, distribution, shape, "FFT (output)") if self.options.redistribute else None
            )
        else:
            pair = list(distribution)  # type: ignore[arg-type]
            if len(pair) != 2 or not all(isinstance(b, Box) for b in pair):
                raise TypeError("FFT: distribution must be a Slab, a Block or [input_box, output_box]")
            self.input_box, _, self._order = bind(self.comm, operand, pair[0], "FFT (input)")
            self._wanted = pair[1]
        if kind != "C2C" and self._order == "F":
            raise ValueError(
                f"FFT: {kind} transforms run along the last axis of C-ordered operands; pass a "
                "C-ordered array"
            )
        self._plan: Any = None

    def plan(self) -> None:
        """Plan the stages (collective; checks that the boxes tile the global arrays)."""
        inp, out = self.input_box, self._wanted
        if self._order == "F":
            inp, out = inp.reversed(), None if out is None else out.reversed()
        self._plan = _native.FftPlan(
            self.comm,
            tuple(inp),
            None if out is None else tuple(out),
            self.fft_type,
            self.precision,
            odd=self.options.last_axis_parity == "odd",
        )

    def _check_planned(self) -> None:
        if self._plan is None:
            raise RuntimeError("FFT: call plan() first (or it was freed)")

    @property
    def output_box(self) -> Box:
        """This rank's box of the result."""
        self._check_planned()
        lower, upper = self._plan.output_boxes[self.comm.rank]
        b = Box(lower, upper)
        return b.reversed() if self._order == "F" else b

    @property
    def global_shape(self) -> tuple:
        """The global shapes of the operand and the result."""
        self._check_planned()
        shapes = [tuple(s) for s in self._plan.global_shapes]
        if self._order == "F":
            shapes = [s[::-1] for s in shapes]
        return tuple(shapes)

    def reset_operand(self, operand: Any, *, distribution: Union[Distribution, Sequence[Box], None] = None) -> None:
        """Execute on `operand` from now on. With the same distribution, it must have the same
        local shape, dtype, order, framework and device; a result of this plan (or anything
        else) in another distribution needs a new plan, which passing `distribution` makes."""
        if distribution is not None and distribution != self.distribution:
            self.__init__(operand, distribution=distribution, options=self.options, comm=self.comm)  # type: ignore[misc]
            self.plan()
            return
        _operands.check_like(operand, self.operand, self._order, "pass distribution= to plan anew")
        self.operand = operand

    def execute(self, *, direction: Optional[Literal["forward", "inverse"]] = None) -> Any:
        """Transform the operand; this rank's part of the result (a new array)."""
        self._check_planned()
        if direction is None:
            direction = "inverse" if self.fft_type == "C2R" else "forward"
        if direction not in ("forward", "inverse"):
            raise ValueError(f"direction must be 'forward' or 'inverse', got {direction!r}")
        c, transposed = _operands.c_view(self.operand, self._order)
        lower, upper = self._plan.output_boxes[self.comm.rank]
        shape = tuple(u - l for l, u in zip(lower, upper))
        out_name = {
            "C2C": _operands.dtype_name(self.operand),
            "R2C": {"single": "complex64", "double": "complex128"}[self.precision],
            "C2R": {"single": "float32", "double": "float64"}[self.precision],
        }[self.fft_type]
        out = _arrays.empty(c, shape, _operands.dtype_like(c, out_name))
        self._plan.execute(self.comm, c, out, direction, self.options.norm)
        return _operands.transpose(out) if transposed else out

    def free(self) -> None:
        """Release the plan."""
        self._plan = None

    def __enter__(self) -> "FFT":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()


def _run(
    operand: Any,
    distribution: Any,
    options: Any,
    comm: Any,
    fft_type: Literal["C2C", "R2C", "C2R"],
    direction: str,
) -> Any:
    opts = _options(options)
    if opts.fft_type not in (None, fft_type):
        raise ValueError(f"options.fft_type is {opts.fft_type!r} but this function computes {fft_type}")
    opts = FFTOptions(fft_type, opts.redistribute, opts.last_axis_parity, opts.norm)
    with FFT(operand, distribution=distribution, options=opts, comm=comm) as f:
        f.plan()
        return f.execute(direction=direction)  # type: ignore[arg-type]


def fft(operand: Any, /, distribution: Any, *, options: Any = None, comm: Any = None) -> Any:
    """Forward complex-to-complex N-d FFT of the distributed `operand` (see :class:`FFT`)."""
    return _run(operand, distribution, options, comm, "C2C", "forward")


def ifft(operand: Any, /, distribution: Any, *, options: Any = None, comm: Any = None) -> Any:
    """Inverse complex-to-complex N-d FFT (scaled by ``1/N`` unless ``norm`` says otherwise)."""
    return _run(operand, distribution, options, comm, "C2C", "inverse")


def rfft(operand: Any, /, distribution: Any, *, options: Any = None, comm: Any = None) -> Any:
    """Real-to-complex N-d FFT: the last axis ``n`` gives ``n//2+1`` complex numbers."""
    return _run(operand, distribution, options, comm, "R2C", "forward")


def irfft(operand: Any, /, distribution: Any, *, options: Any = None, comm: Any = None) -> Any:
    """Complex-to-real N-d FFT, the inverse of :func:`rfft` (``last_axis_parity`` in
    `options` gives the real length of the last axis)."""
    return _run(operand, distribution, options, comm, "C2R", "inverse")
