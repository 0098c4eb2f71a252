#!/usr/bin/env bash
# The C kernel tests (tests/c/test_kernels.c) natively, then for Arm: cross-compiled for the
# baseline armv8-a and run under qemu user-mode emulation on a CPU model with dotprod
# ("max": the dispatcher must pick neondot) and one without ("cortex-a53": neon).
# Installs the cross compiler and qemu with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

SIMD=pyw8a8/_simd
SRC=tests/c/test_kernels.c
# setup.py's flags, so the tests exercise the code generation that ships.
CFLAGS="-O3 -std=c11 -fno-strict-aliasing -Wno-unused-function"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

echo "== native $(uname -m): scalar and the paths this CPU supports"
${CC:-cc} $CFLAGS -I"$SIMD" "$SRC" -lm -o "$OUT/test_native"
"$OUT/test_native"

# On an Arm host the native compiler already targets AArch64.
if [ "$(uname -m)" = aarch64 ]; then CROSS=${CC:-cc}; else CROSS=aarch64-linux-gnu-gcc; fi
missing=()
command -v "$CROSS" >/dev/null || missing+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
if [ ${#missing[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null; then
        echo "SKIPPED the Arm tests: ${missing[*]} missing and no apt-get to install them"
        exit 0
    fi
    echo "== installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

echo "== aarch64 build (baseline armv8-a, static)"
"$CROSS" $CFLAGS -static -I"$SIMD" "$SRC" -lm -o "$OUT/test_arm"
echo "== qemu-aarch64 -cpu max (dotprod)"
qemu-aarch64 -cpu max "$OUT/test_arm" --expect neondot
echo "== qemu-aarch64 -cpu cortex-a53 (no dotprod)"
qemu-aarch64 -cpu cortex-a53 "$OUT/test_arm" --expect neon

# The extension modules themselves must compile for AArch64 with setup.py's flags: nothing
# x86-only may leak into the common code.  Compile only (no Arm Python to link against); the
# host's Python and numpy headers serve, both being LP64 Linux.
if python3 -c "import Cython, numpy" 2>/dev/null; then
    echo "== aarch64 compile of the extension modules"
    py_inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
    np_inc=$(python3 -c "import numpy; print(numpy.get_include())")
    for pyx in pyw8a8/*.pyx; do
        mod=$(basename "$pyx" .pyx)
        python3 -m cython -3 -I pyw8a8 "$pyx" -o "$OUT/$mod.c"
        "$CROSS" $CFLAGS -fopenmp -fPIC -I"$py_inc" -I"$np_inc" -Ipyw8a8 \
            -DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION -c "$OUT/$mod.c" -o "$OUT/$mod.o"
        echo "$mod: ok"
    done
else
    echo "SKIPPED the aarch64 compile of the extension modules: no Cython or numpy here"
fi
