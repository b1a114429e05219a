//! The distributed FFT against the DFT's definition, computed axis by axis on the whole array:
//! 2-D and 3-D shapes (primes, sizes the rank count does not divide), slabs on every axis,
//! pencils and box lists, 1-6 ranks, every kind, both precisions, every normalisation.

use accord::distributed::{
    Direction, DistributedFft, Distribution, FftKind, Norm, Precision, Region,
};
use accord::testing::run_world;
use num_complex::Complex;

type C = Complex<f64>;

/// The DFT along `axis` of a C-order array, by its definition (`sign` -1 forward, +1 inverse).
fn dft_axis(shape: &[usize], axis: usize, x: &[C], sign: f64) -> Vec<C> {
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut y = vec![C::default(); x.len()];
    for (i, out) in y.iter_mut().enumerate() {
        let (o, k, c) = (i / (n * inner), (i / inner) % n, i % inner);
        for j in 0..n {
            let w = sign * 2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
            *out += x[(o * n + j) * inner + c] * C::new(w.cos(), w.sin());
        }
    }
    y
}

fn dft(shape: &[usize], x: &[C], sign: f64) -> Vec<C> {
    (0..shape.len()).fold(x.to_vec(), |y, a| dft_axis(shape, a, &y, sign))
}

/// A value per global index, not symmetric in any way.
fn value(i: usize) -> C {
    C::new(
        ((i * 7919) % 23) as f64 / 7.0 - 1.5,
        ((i * 104_729) % 19) as f64 / 5.0 - 1.8,
    )
}

/// The elements of `b` out of a global C-order array of `shape`.
fn part<T: Copy>(global: &[T], shape: &[usize], b: &Region) -> Vec<T> {
    let local = b.shape();
    (0..b.volume())
        .map(|mut k| {
            let mut index = 0;
            let mut at = vec![0; local.len()];
            for a in (0..local.len()).rev() {
                at[a] = b.lower[a] + k % local[a];
                k /= local[a];
            }
            for (a, i) in at.iter().enumerate() {
                index = index * shape[a] + i;
            }
            global[index]
        })
        .collect()
}

/// Put each rank's part back into a global array.
fn assemble<T: Copy + Default>(parts: &[(Region, Vec<T>)], shape: &[usize]) -> Vec<T> {
    let mut global = vec![T::default(); shape.iter().product()];
    let index: Vec<usize> = (0..global.len()).collect();
    for (b, local) in parts {
        for (i, v) in part(&index, shape, b).into_iter().zip(local) {
            global[i] = *v;
        }
    }
    global
}

fn assert_close(got: &[C], want: &[C], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().map(|v| v.norm()).fold(1e-300, f64::max);
    let err = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).norm())
        .fold(0.0, f64::max);
    assert!(
        err <= tol * scale,
        "{what}: max error {err:e} against max value {scale:e}"
    );
}

/// Input layouts worth covering for `shape` over `size` ranks.
fn layouts(shape: &[usize], size: usize) -> Vec<(String, Vec<Region>)> {
    let mut out = Vec::new();
    for axis in 0..shape.len() {
        out.push((
            format!("slab {axis}"),
            Distribution::Slab(axis).regions(shape, size).unwrap(),
        ));
    }
    if shape.len() == 3 && size.is_multiple_of(2) {
        let grid = vec![2, size / 2, 1];
        out.push((
            format!("pencils {grid:?}"),
            Distribution::Grid(grid).regions(shape, size).unwrap(),
        ));
    }
    // Boxes of uneven sizes, the last rank holding nothing.
    if size >= 2 {
        let mut boxes = Vec::new();
        let n0 = shape[0];
        for r in 0..size - 1 {
            let (lo, hi) = (n0 * r / (size - 1), n0 * (r + 1) / (size - 1));
            let mut b = Region::whole(shape);
            (b.lower[0], b.upper[0]) = (lo, hi);
            if r % 2 == 1 && shape[1] > 1 {
                // Split this one further along axis 1 and give the halves away unevenly.
                b.upper[1] = 1;
                let mut rest = Region::whole(shape);
                (rest.lower[0], rest.upper[0], rest.lower[1]) = (lo, hi, 1);
                boxes.push(b);
                boxes.push(rest);
                continue;
            }
            boxes.push(b);
        }
        while boxes.len() < size {
            boxes.push(Region::new(vec![0; shape.len()], vec![0; shape.len()]).unwrap());
        }
        boxes.truncate(size);
        if boxes.iter().map(Region::volume).sum::<usize>() == shape.iter().product::<usize>() {
            out.push(("boxes".into(), boxes));
        }
    }
    out
}

fn to_f32(x: &[C]) -> Vec<Complex<f32>> {
    x.iter()
        .map(|v| Complex::new(v.re as f32, v.im as f32))
        .collect()
}

fn from_f32(x: &[Complex<f32>]) -> Vec<C> {
    x.iter().map(|v| C::new(v.re as f64, v.im as f64)).collect()
}

/// Run one complex transform on every rank; the assembled output and its global shape.
fn run_c2c(
    shape: &[usize],
    boxes: &[Region],
    keep_layout: bool,
    precision: Precision,
    direction: Direction,
    norm: Norm,
    global: &[C],
) -> Vec<C> {
    let parts = run_world(boxes.len(), |comm| {
        let mine = &boxes[comm.rank()];
        let out = keep_layout.then_some(mine);
        let fft = DistributedFft::new(&comm, mine, out, FftKind::C2C, precision).unwrap();
        let input = part(global, shape, mine);
        let region = fft.output().region(comm.rank()).clone();
        let got = match precision {
            Precision::F64 => {
                let mut y = vec![C::default(); region.volume()];
                fft.execute(&comm, &input, &mut y, direction, norm).unwrap();
                y
            }
            Precision::F32 => {
                let x = to_f32(&input);
                let mut y = vec![Complex::<f32>::default(); region.volume()];
                fft.execute(&comm, &x, &mut y, direction, norm).unwrap();
                from_f32(&y)
            }
        };
        if keep_layout {
            assert_eq!(&region, mine);
        }
        (region, got)
    });
    assemble(&parts, shape)
}

#[test]
fn complex_transforms_match_the_definition() {
    let shapes: [&[usize]; 4] = [&[6, 5, 4], &[7, 3, 5], &[5, 9], &[2, 3, 8]];
    let mut runs = 0;
    for size in 1..=6 {
        for shape in shapes {
            let global: Vec<C> = (0..shape.iter().product()).map(value).collect();
            let forward = dft(shape, &global, -1.0);
            for (name, boxes) in layouts(shape, size) {
                for keep in [true, false] {
                    let what = format!("{shape:?} at {size} ranks, {name}, keep layout {keep}");
                    let got = run_c2c(
                        shape,
                        &boxes,
                        keep,
                        Precision::F64,
                        Direction::Forward,
                        Norm::Backward,
                        &global,
                    );
                    assert_close(&got, &forward, 1e-12, &what);
                    runs += 1;
                }
            }
        }
    }
    assert!(runs > 100, "{runs}");
}

#[test]
fn inverse_single_precision_and_every_norm() {
    let shape = [6usize, 7, 4];
    let n = shape.iter().product::<usize>() as f64;
    let global: Vec<C> = (0..n as usize).map(value).collect();
    let inverse = dft(&shape, &global, 1.0);
    let forward = dft(&shape, &global, -1.0);
    for size in [1, 3, 4] {
        let boxes = Distribution::Slab(0).regions(&shape, size).unwrap();
        for (norm, f, i) in [
            (Norm::Backward, 1.0, 1.0 / n),
            (Norm::Forward, 1.0 / n, 1.0),
            (Norm::Ortho, 1.0 / n.sqrt(), 1.0 / n.sqrt()),
            (Norm::None, 1.0, 1.0),
        ] {
            let scaled = |x: &[C], s: f64| x.iter().map(|v| v * s).collect::<Vec<_>>();
            let got = run_c2c(
                &shape,
                &boxes,
                true,
                Precision::F64,
                Direction::Inverse,
                norm,
                &global,
            );
            assert_close(
                &got,
                &scaled(&inverse, i),
                1e-12,
                &format!("inverse {norm:?}"),
            );
            let got = run_c2c(
                &shape,
                &boxes,
                false,
                Precision::F32,
                Direction::Forward,
                norm,
                &global,
            );
            assert_close(
                &got,
                &scaled(&forward, f),
                1e-5,
                &format!("f32 forward {norm:?}"),
            );
        }
    }
}

#[test]
fn real_transforms_match_the_definition_and_round_trip() {
    for (shape, odd) in [
        (vec![6usize, 5, 8], false),
        (vec![5, 4, 7], true),
        (vec![9, 6], false),
        (vec![4, 5], true),
    ] {
        let real: Vec<f64> = (0..shape.iter().product()).map(|i| value(i).re).collect();
        let full = dft(
            &shape,
            &real.iter().map(|&r| C::new(r, 0.0)).collect::<Vec<_>>(),
            -1.0,
        );
        let last = shape.len() - 1;
        let m = shape[last] / 2 + 1;
        let mut half_shape = shape.clone();
        half_shape[last] = m;
        let half: Vec<C> = full
            .chunks(shape[last])
            .flat_map(|l| l[..m].to_vec())
            .collect();
        for size in 1..=5 {
            for (name, boxes) in layouts(&shape, size) {
                let what = format!("{shape:?} at {size} ranks, {name}");
                let parts = run_world(size, |comm| {
                    let r = comm.rank();
                    let mine = &boxes[r];
                    // Forward into the same kind of slab/box over the half-length array when
                    // the layout allows, else wherever the stages end.
                    let r2c = DistributedFft::new(&comm, mine, None, FftKind::R2C, Precision::F64)
                        .unwrap();
                    let x = part(&real, &shape, mine);
                    let region = r2c.output().region(r).clone();
                    let mut spec = vec![C::default(); region.volume()];
                    r2c.execute(&comm, &x, &mut spec, Direction::Forward, Norm::Backward)
                        .unwrap();
                    // And back into the input's layout.
                    let c2r = DistributedFft::new(
                        &comm,
                        &region,
                        Some(mine),
                        FftKind::C2R { odd },
                        Precision::F64,
                    )
                    .unwrap();
                    let mut back = vec![0f64; mine.volume()];
                    c2r.execute(&comm, &spec, &mut back, Direction::Inverse, Norm::Backward)
                        .unwrap();
                    for (a, b) in back.iter().zip(&x) {
                        assert!(
                            (a - b).abs() < 1e-12 * 10.0,
                            "{what}: round trip {a} vs {b}"
                        );
                    }
                    // The inverse of an R2C plan and the forward of a C2R plan are refused.
                    let e = r2c.execute(&comm, &x, &mut spec, Direction::Inverse, Norm::Backward);
                    assert!(e.unwrap_err().to_string().contains("forward only"));
                    (region, spec)
                });
                assert_close(&assemble(&parts, &half_shape), &half, 1e-12, &what);
            }
        }
    }
}

#[test]
fn bad_calls_are_named() {
    let errors = run_world(2, |comm| {
        let shape = [4usize, 4];
        let mine = Distribution::Slab(0)
            .region(&shape, comm.rank(), 2)
            .unwrap();
        let fft =
            DistributedFft::new(&comm, &mine, Some(&mine), FftKind::C2C, Precision::F32).unwrap();
        let x = vec![0f32; 16];
        let mut y = vec![Complex::<f32>::default(); 8];
        let wrong_type = fft
            .execute(&comm, &x, &mut y, Direction::Forward, Norm::Backward)
            .unwrap_err();
        let short = vec![Complex::<f32>::default(); 7];
        let wrong_size = fft
            .execute(&comm, &short, &mut y, Direction::Forward, Norm::Backward)
            .unwrap_err();
        let line = Region::new(vec![4 * comm.rank()], vec![4 * comm.rank() + 4]).unwrap();
        let one_d =
            DistributedFft::new(&comm, &line, None, FftKind::C2C, Precision::F64).unwrap_err();
        [
            wrong_type.to_string(),
            wrong_size.to_string(),
            one_d.to_string(),
        ]
    });
    for e in &errors {
        assert!(
            e[0].contains("the input holds f32 but this transform's input is c64"),
            "{e:?}"
        );
        assert!(e[1].contains("has 56 bytes"), "{e:?}");
        assert!(e[2].contains("2 or more axes"), "{e:?}");
    }
}

#[test]
fn unaligned_outputs_get_the_same_result() {
    // The last stages may run in the caller's output when it is aligned; an unaligned one takes
    // the work buffers instead, with the same numbers.
    for size in [1, 2, 3] {
        run_world(size, |comm| {
            let shape = [6usize, 4, 5];
            let mine = Distribution::Slab(0)
                .region(&shape, comm.rank(), comm.size())
                .unwrap();
            for (kind, out) in [
                (FftKind::C2C, Some(&mine)),
                (FftKind::C2C, None),
                (FftKind::R2C, None),
            ] {
                let fft = DistributedFft::new(&comm, &mine, out, kind, Precision::F64).unwrap();
                let (it, ot) = fft.types();
                let input: Vec<u8> = (0..mine.volume() * it.size())
                    .map(|i| {
                        if i % 8 == 7 {
                            0x3f
                        } else {
                            (i * 13 % 256) as u8
                        }
                    })
                    .collect();
                let bytes = fft.output_shape().iter().product::<usize>() * ot.size();
                let mut aligned = vec![0u64; bytes / 8];
                let mut shifted = vec![0u8; bytes + 4];
                let (d, norm) = (Direction::Forward, Norm::Ortho);
                let send = || accord::SendBuf::bytes(&input, it);
                fft.execute(
                    &comm,
                    send(),
                    accord::RecvBuf::bytes(bytemuck::cast_slice_mut(&mut aligned), ot),
                    d,
                    norm,
                )
                .unwrap();
                fft.execute(
                    &comm,
                    send(),
                    accord::RecvBuf::bytes(&mut shifted[4..], ot),
                    d,
                    norm,
                )
                .unwrap();
                assert_eq!(
                    bytemuck::cast_slice::<u64, u8>(&aligned),
                    &shifted[4..],
                    "{kind:?} {out:?}"
                );
            }
        });
    }
}
