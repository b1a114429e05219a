"""One rank of the distributed-array checks: `accord run -n N python worker_distributed.py [cuda]`.

Every rank builds the same global arrays from one seed, takes its part, and checks what
accord.distributed gives back against numpy on the whole array:
- redistribute between random layouts (slabs on every axis, process grids, box lists with empty
  boxes) of random shapes (primes, sizes the rank count does not divide), every dtype (one moved
  as bytes), C and F order; round trips exact; a plan reused with reset_operand;
- fft/ifft/rfft/irfft against numpy.fft on 2-D and 3-D arrays as slabs, pencils and box pairs,
  complex64 and complex128, with and without the last redistribution, every norm;
- bad layouts and shapes raise on every rank, naming the ranks.
With `cuda`, the same on CuPy arrays (or torch CUDA tensors when CuPy is missing), one GPU per
rank. Prints `DIST-OK <rank>` at the end.
"""

import sys

import numpy as np

import accord
from accord.distributed import Block, Box, Redistribute, Slab, redistribute
from accord.distributed import _operands
from accord.distributed import fft as dfft

comm = accord.init(timeout=60)
n, me = comm.size, comm.rank
CUDA = len(sys.argv) > 1 and sys.argv[1] == "cuda"

if CUDA:
    try:
        import cupy as xp

        xp.cuda.Device(me % xp.cuda.runtime.getDeviceCount()).use()

        def to_dev(a):
            return xp.asarray(a)

        def to_host(a):
            return xp.asnumpy(a)

    except ImportError:
        import torch

        dev = torch.device("cuda", me % torch.cuda.device_count())

        def to_dev(a):
            return torch.from_numpy(np.ascontiguousarray(a) if a.flags.c_contiguous else a).to(dev)

        def to_host(a):
            return a.cpu().numpy()

else:

    def to_dev(a):
        return a

    def to_host(a):
        return a


def fail(what):
    print(f"FAIL rank {me}: {what}", flush=True)
    sys.exit(1)


def part(global_array, box):
    return global_array[tuple(slice(l, u) for l, u in zip(box.lower, box.upper))]


def random_boxes(rng, shape, parts):
    """`parts` boxes tiling `shape`, some possibly empty, in random order."""
    boxes = [(list([0] * len(shape)), list(shape))]
    while len(boxes) < parts:
        i = int(rng.integers(len(boxes)))
        lo, hi = boxes[i]
        a = int(rng.integers(len(shape)))
        cut = lo[a] + int(rng.integers(hi[a] - lo[a] + 1))
        left, right = (lo[:], hi[:]), (lo[:], hi[:])
        left[1][a] = cut
        right[0][a] = cut
        boxes[i] = left
        boxes.append(right)
    order = rng.permutation(len(boxes))
    return [Box(*boxes[k]) for k in order]


def grid_for(rng, ndim):
    grid = [1] * ndim
    m, f = n, 2
    while m > 1:
        while m % f == 0:
            grid[int(rng.integers(ndim))] *= f
            m //= f
        f += 1
    return grid


def random_layout(rng, shape):
    kind = int(rng.integers(3))
    if kind == 0:
        return Slab(int(rng.integers(len(shape))))
    if kind == 1:
        return Block(grid_for(rng, len(shape)))
    return random_boxes(rng, shape, n)[me]


def box_of(dist, shape):
    return dist if isinstance(dist, Box) else dist.box(me, n, shape)


DTYPES = ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "bool", "complex64", "complex128"]
if not CUDA:
    DTYPES.append("datetime64[ns]")


def check_redistribute():
    rng = np.random.default_rng(1234)
    for case in range(24):
        ndim = 1 + case % 3
        shape = tuple(int(rng.choice([1, 2, 3, 5, 7, 8, 11])) for _ in range(ndim))
        dtype = np.dtype(DTYPES[case % len(DTYPES)])
        src, dst = random_layout(rng, shape), random_layout(rng, shape)
        order = "F" if case % 4 == 3 else "C"
        g = (np.arange(np.prod(shape)) * 7 % 251).reshape(shape).astype(dtype)
        mine = np.array(part(g, box_of(src, shape)), order=order)
        a = to_dev(mine)
        try:
            b = redistribute(a, src, dst, comm=comm)
        except ValueError as e:
            strides = getattr(a, "strides", None) or (a.stride() if hasattr(a, "stride") else None)
            fail(f"redistribute case {case} {shape} {dtype} {order}: local shape {a.shape}, "
                 f"strides {strides}: {e}")
        want = part(g, box_of(dst, shape))
        got = to_host(b)
        if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
            fail(f"redistribute case {case} {shape} {dtype} {src} -> {dst}: got {got} want {want}")
        if order == "F" and ndim > 1 and "F" not in _operands.orders(b):
            fail(f"case {case}: an F-order operand gave a result that is not F-ordered")
        # Round trip with a reusable plan, run twice on two operands.
        with Redistribute(b, dst, src, comm=comm) as back:
            back.plan()
            if tuple(back.global_shape) != shape:
                fail(f"case {case}: global shape {back.global_shape} != {shape}")
            for _ in range(2):
                again = to_host(back.execute())
                if not np.array_equal(again, mine):
                    fail(f"round trip case {case}")
                back.reset_operand(to_dev(np.array(want, order=order)))


def rel_err(got, want):
    if got.shape != want.shape:
        fail(f"result shape {got.shape}, expected {want.shape}")
    if want.size == 0:
        return 0.0
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))


def check_fft():
    rng = np.random.default_rng(99)
    shapes = [(6, 5, 4), (7, 3, 9), (5, 9), (8, 8, 8)]
    for shape in shapes:
        for dtype, tol in (("complex64", 1e-5), ("complex128", 1e-12)):
            g = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
            want = np.fft.fftn(g)
            layouts = [Slab.X, Slab.Y] + ([Slab.Z] if len(shape) == 3 else [])
            if len(shape) == 3 and n % 2 == 0:
                layouts.append(Block((2, n // 2, 1)))
            for dist in layouts:
                mine = np.ascontiguousarray(part(g, dist.box(me, n, shape)))
                for redist in (True, False):
                    opts = {"redistribute": redist}
                    with dfft.FFT(to_dev(mine), distribution=dist, options=opts, comm=comm) as f:
                        f.plan()
                        b = f.execute()
                        ob = f.output_box
                        if redist and ob != dist.box(me, n, shape):
                            fail(f"{shape} {dist}: output box {ob} is not the input's")
                        err = rel_err(to_host(b), part(want, ob))
                        if err > tol:
                            fail(f"fft {shape} {dtype} {dist} redistribute={redist}: error {err:e}")
                        if redist:
                            # The inverse through the same plan gives the input back.
                            f.reset_operand(b)
                            back = to_host(f.execute(direction="inverse"))
                            if rel_err(back, mine) > tol * 10:
                                fail(f"ifft round trip {shape} {dtype} {dist}")
            # ifft and every norm through the functions, on X slabs.
            mine = np.ascontiguousarray(part(g, Slab.X.box(me, n, shape)))
            for norm in ("backward", "ortho", "forward", "none"):
                got = to_host(dfft.ifft(to_dev(mine), Slab.X, options={"norm": norm}, comm=comm))
                ref = np.fft.ifftn(g, norm=None if norm == "none" else norm)
                if norm == "none":
                    ref = ref * np.prod(shape)
                if rel_err(got, part(ref, Slab.X.box(me, n, shape))) > tol:
                    fail(f"ifft norm {norm} {shape} {dtype}")
    # Box pairs: uneven row blocks in, column slabs out.
    shape = (9, 6, 4)
    g = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    cuts = [0] + sorted(int(c) for c in np.random.default_rng(5).integers(0, 10, n - 1)) + [9]
    ibox = Box((cuts[me], 0, 0), (cuts[me + 1], 6, 4))
    obox = Slab.Y.box(me, n, shape)
    got = to_host(dfft.fft(to_dev(np.ascontiguousarray(part(g, ibox))), [ibox, obox], comm=comm))
    if rel_err(got, part(np.fft.fftn(g), obox)) > 1e-12:
        fail("fft with a box pair")


def check_real():
    rng = np.random.default_rng(7)
    for shape in [(6, 5, 8), (5, 4, 7), (9, 6), (4, 5)]:
        for dtype, tol in (("float32", 1e-5), ("float64", 1e-12)):
            g = rng.standard_normal(shape).astype(dtype)
            want = np.fft.rfftn(g)
            parity = "odd" if shape[-1] % 2 else "even"
            for dist in (Slab.X, Slab.Y):
                mine = np.ascontiguousarray(part(g, dist.box(me, n, shape)))
                spec = dfft.rfft(to_dev(mine), dist, comm=comm)
                half = list(shape)
                half[-1] = shape[-1] // 2 + 1
                if rel_err(to_host(spec), part(want, dist.box(me, n, half))) > tol:
                    fail(f"rfft {shape} {dtype} {dist}")
                back = dfft.irfft(spec, dist, options={"last_axis_parity": parity}, comm=comm)
                if rel_err(to_host(back), mine) > tol * 10:
                    fail(f"irfft {shape} {dtype} {dist}")


def expect(what, fn, exc, *needles):
    try:
        fn()
    except exc as e:
        text = str(e)
        if not all(s in text for s in needles):
            fail(f"{what}: message {text!r} lacks {needles}")
        return
    fail(f"{what}: no {exc.__name__}")


def check_errors():
    shape = (4 * n, 3)
    g = np.zeros(shape, np.float32)
    mine = to_dev(np.ascontiguousarray(part(g, Slab.X.box(me, n, shape))))
    if n >= 2:
        # Ranks 0 and 1 both claim rows 0..3: their boxes overlap, and every rank hears it.
        claim = Box((0, 0), (4, 3)) if me < 2 else Slab.X.box(me, n, shape)
        own = Slab.X.box(me, n, shape)
        expect("overlap", lambda: redistribute(mine, claim, own, comm=comm),
               accord.InvalidArgumentError, "ranks 0", "and 1", "overlap")
        # Rank 0's operand is a row short of its slab.
        short = to_dev(np.zeros((3 if me == 0 else 4, 3), np.float32))
        expect("slab shape", lambda: redistribute(short, Slab.X, Slab.Y, comm=comm), ValueError,
               "rank 0's operand has shape (3, 3)")
    expect("box shape", lambda: redistribute(mine, Box((0, 0), (1, 1)), Slab.Y, comm=comm), ValueError,
           f"rank {me}'s operand has shape")
    with Redistribute(mine, Slab.X, Slab.Y, comm=comm) as r:
        r.plan()
        expect("reset_operand", lambda: r.reset_operand(to_dev(np.zeros((5, 5), np.float32))), ValueError,
               "reset_operand: the new operand", "make a new plan")
    expect("fft dtype", lambda: dfft.fft(mine, Slab.X, comm=comm), TypeError, "complex64 or complex128")
    expect("1-d fft", lambda: dfft.fft(to_dev(np.zeros(4, np.complex64)), Slab.X, comm=comm), ValueError, "2 or more axes")


def check_torch_cpu():
    """torch CPU tensors through the same calls (results are torch tensors)."""
    try:
        import torch
    except ImportError:
        print(f"rank {me}: torch CPU tensors skipped: torch is not installed", flush=True)
        return
    shape = (5, 7, 3)
    g = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    t = torch.from_numpy(np.ascontiguousarray(part(g, Slab.X.box(me, n, shape))))
    b = redistribute(t, Slab.X, Slab.Z, comm=comm)
    if not isinstance(b, torch.Tensor) or not np.array_equal(b.numpy(), part(g, Slab.Z.box(me, n, shape))):
        fail("torch redistribute")
    c = torch.from_numpy(np.ascontiguousarray(part(g, Slab.Y.box(me, n, shape)))).to(torch.complex128)
    f = dfft.fft(c, Slab.Y, comm=comm)
    if rel_err(f.numpy(), part(np.fft.fftn(g), Slab.Y.box(me, n, shape))) > 1e-12:
        fail("torch fft")


check_redistribute()
if not CUDA:
    check_torch_cpu()
check_fft()
check_real()
check_errors()
comm.barrier()
print(f"DIST-OK {me}", flush=True)
