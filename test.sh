#!/usr/bin/env bash
# The whole test suite: Rust unit, integration and multi-process tests, then the Python package's
# tests (python/tests/run.sh builds the wheel into python/.venv first).
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

# The MPI tests need OpenMPI (mpirun, and mpicc to build mpi4py); the C and C++ tests g++ and
# pkg-config. Install them where we can.
if { ! command -v mpicc || ! command -v g++ || ! command -v pkg-config; } >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing OpenMPI, g++ and pkg-config for the MPI and C/C++ tests"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev g++ pkg-config >/dev/null) \
        || echo "warning: could not install them; the MPI and C/C++ tests will say they skip"
fi
if ! command -v mpicc >/dev/null 2>&1; then
    echo "note: no mpicc on this machine: mpi4py is not installed and the MPI test is skipped"
    export ACCORD_PY_EXTRAS=${ACCORD_PY_EXTRAS-"ray dask[distributed] ml_dtypes torch nvmath-python mypy"}
fi

echo "== cargo test (release; builds the accord binary, examples and C library the multi-process tests run)"
cargo build --release -p accord-cli --bins --examples
cargo build --release -p accord-c
cargo test --workspace --release -- --test-threads=2
# The GPU tests pass without a GPU by skipping; say so, with their reasons.
cargo test -q --release -p accord --test gpu_collectives -- --nocapture 2>/dev/null | grep -E "skipping" || true

echo "== several hosts: network namespaces joined by veths, accord selftest on each layout"
if [ "$(id -u)" = 0 ] && ip netns list >/dev/null 2>&1 && command -v unshare >/dev/null 2>&1; then
    ACCORD=${CARGO_TARGET_DIR:-target}/release/accord bench/multihost.sh check
else
    echo "note: skipped: the multi-host check needs root, ip netns and unshare"
fi

echo "== python tests"
python/tests/run.sh
