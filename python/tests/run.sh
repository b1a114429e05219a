#!/usr/bin/env bash
# Build the accord wheel into a local virtual environment and run the Python tests.
#   python/tests/run.sh [pytest args...]
# Needs: python3 (>= 3.11) with venv, a Rust toolchain. Optional system package for the MPI test:
#   apt-get install -y openmpi-bin libopenmpi-dev
# ACCORD_PY_EXTRAS="ray dask[distributed] mpi4py ml_dtypes torch nvmath-python mypy" (default) selects the optional test
# deps (torch: about 5 GB with its CUDA libraries, which it needs to import even without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."            # python/
PYDIR=$(pwd)
VENV=${ACCORD_VENV:-$PYDIR/.venv}
EXTRAS=${ACCORD_PY_EXTRAS-"ray dask[distributed] mpi4py ml_dtypes torch nvmath-python mypy"}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# shellcheck disable=SC2086
"$VENV/bin/pip" install -q --upgrade pip maturin numpy pytest $EXTRAS
"$VENV/bin/pip" install -q --force-reinstall --no-deps .
# Run from outside the source tree so that the installed package (with its extension) is imported.
cd /tmp
exec "$VENV/bin/python" -m pytest -v "$PYDIR/tests" "$@"
