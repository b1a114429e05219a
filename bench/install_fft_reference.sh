#!/usr/bin/env bash
# Installs the references of the distributed FFT benchmark (bench/fft.sh) on a bare Debian
# machine: FFTW's development files and OpenMPI from apt, then a venv with numpy, mpi4py and
# mpi4py-fft built against the system FFTW. Safe to run again: each step is skipped when its
# result is already there.
#
#   bench/install_fft_reference.sh            # venv in $FFT_VENV (~/.cache/accord-baselines/fftvenv)
#   FFT_VENV=/some/where bench/install_fft_reference.sh
#
# mpi4py-fft ships only a source distribution: its setup.py looks for libfftw3{,f,l} (and the
# _threads variants) under $FFTW_ROOT / $FFTW_DIR, sys.prefix, /usr and /usr/local, including
# lib/<multiarch triplet>, so Debian's libfftw3-dev is found without setting anything. It is
# built with --no-build-isolation against the numpy and Cython of the venv (its build needs
# setuptools, wheel, numpy and Cython there).
set -euo pipefail
VENV=${FFT_VENV:-$HOME/.cache/accord-baselines/fftvenv}
MPI4PY_FFT=${MPI4PY_FFT:-mpi4py-fft==2.0.6}

need=()
[ -e /usr/include/fftw3.h ] || need+=(libfftw3-dev)
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin libopenmpi-dev)
python3 -m venv --help >/dev/null 2>&1 && python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY=$VENV/bin/python
"$PY" -c 'import numpy, Cython, setuptools, wheel, mpi4py' 2>/dev/null \
  || "$PY" -m pip install -q numpy cython setuptools wheel mpi4py
"$PY" -c 'import mpi4py_fft.fftw.fftw_xfftn' 2>/dev/null \
  || "$PY" -m pip install -q --no-build-isolation "$MPI4PY_FFT"

# The FFTW backend must have built (otherwise bench/fft_mpi4py.py falls back to numpy's FFT).
"$PY" - <<'EOF'
import mpi4py, mpi4py_fft, numpy
from mpi4py import MPI
from mpi4py_fft.fftw import fftw_xfftn, fftwf_xfftn  # noqa: F401
print(f"mpi4py-fft {mpi4py_fft.__version__} (FFTW backend), mpi4py {mpi4py.__version__}, "
      f"numpy {numpy.__version__}, {MPI.Get_library_version().splitlines()[0].strip(chr(0) + ' ')}")
EOF
echo "python: $PY"
