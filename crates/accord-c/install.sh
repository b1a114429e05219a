#!/usr/bin/env bash
# Build libaccord (the C ABI) and install it under PREFIX with <accord.h>, <accord/comms.hpp>
# and a pkg-config file, so that C and C++ programs build with
#     g++ -std=c++17 prog.cpp $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs accord)
# Usage: crates/accord-c/install.sh PREFIX   (CARGO_TARGET_DIR is honoured; ACCORD_INSTALL_NO_BUILD=1
# installs what the last `cargo build --release -p accord-c` left there)
set -euo pipefail
prefix=${1:?usage: install.sh PREFIX}
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)

if [ -z "${ACCORD_INSTALL_NO_BUILD:-}" ]; then
    cargo build --release --quiet -p accord-c --manifest-path "$root/Cargo.toml"
fi

mkdir -p "$prefix/lib/pkgconfig" "$prefix/include/accord"
install -m 755 "$target/release/libaccord_c.so" "$prefix/lib/libaccord.so.0"
ln -sf libaccord.so.0 "$prefix/lib/libaccord.so"
install -m 644 "$target/release/libaccord_c.a" "$prefix/lib/libaccord.a"
install -m 644 "$here/include/accord.h" "$prefix/include/accord.h"
install -m 644 "$here/include/accord/comms.hpp" "$prefix/include/accord/comms.hpp"
cat > "$prefix/lib/pkgconfig/accord.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: accord
Description: Collective communication for distributed CPUs and GPUs (C ABI and C++ comms wrapper)
Version: $version
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -laccord
Libs.private: -lpthread -ldl -lm -lgcc_s
Cflags: -I\${includedir}
PC
echo "installed libaccord $version under $prefix (pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig)"
