#!/usr/bin/env bash
# The whole test suite: Rust unit, integration and multi-process tests, then the Python package's
# tests (which build the wheel into a local virtual environment first).
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

echo "== cargo build (release binary used by multi-process tests)"
cargo build --release -p accord-cli
echo "== cargo test"
cargo test --workspace --release -- --test-threads=2
