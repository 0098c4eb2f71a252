#!/usr/bin/env bash
# Builds and runs the C kernel tests (tests/c/test_kernels.c) in one of three modes:
#
#   native    with setup.py's flags: scalar and the ISAs this CPU supports; then the float
#             attention (tests/c/test_float_attention.c) in each vector width
#   emulated  x86 only: every ISA of the registry, with the AVX-512 VNNI, AVX-VNNI and AMX
#             intrinsics emulated in plain C (SIMDe from the simde-py package, and the tile
#             model of tests/c/w8_emulate.h); the binary must hold none of those
#             instructions (checked with objdump where present)
#   arm       cross-compiled for the baseline armv8-a and run under qemu user-mode emulation
#             on a CPU with dotprod ("max": the dispatcher must pick neondot) and one
#             without ("cortex-a53": neon); then the extension modules are compiled for
#             AArch64.  Needs gcc-aarch64-linux-gnu and qemu-user (`make arm-tools`
#             installs them); exits 77 ("skipped") without them.
#
# Usage: tests/c/run.sh native|emulated|arm
set -euo pipefail
cd "$(dirname "$0")/../.."

SIMD=pyw8a8/_simd
SRC=tests/c/test_kernels.c
PYTHON=${PYTHON:-python3}
# setup.py's flags (from the one file that sets them), so the tests exercise the code
# generation that ships.
CFLAGS="$("$PYTHON" -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))["cflags"]))' \
    "$SIMD/build_flags.json") -Wall -Werror"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

case "${1:-}" in
native)
    echo "== native $(uname -m): scalar and the ISAs this CPU supports"
    ${CC:-cc} $CFLAGS -I"$SIMD" "$SRC" -lm -o "$OUT/test_native"
    "$OUT/test_native"
    # The float attention's row code is plain C cloned per vector width (W8_ROW_CLONES):
    # one build per width, each compared with the plain one (the unused row functions of
    # attention.h are not this test's).
    echo "== float attention: each vector width this CPU runs, the same bits"
    widths=(default) fa_x86=()
    if [ "$(uname -m)" = x86_64 ]; then widths+=(avx2 avx512f) fa_x86=(-DFA_X86); fi
    for width in "${widths[@]}"; do
        clones=""
        [ "$width" = default ] || clones="__attribute__((target(\"$width\")))"
        ${CC:-cc} $CFLAGS -Wno-unused-function -I"$SIMD" "-DW8_ROW_CLONES=$clones" \
            -DFA_ENTRY="fa_$width" -c tests/c/float_attention_entry.c -o "$OUT/fa_$width.o"
    done
    ${CC:-cc} $CFLAGS -Wno-unused-function "${fa_x86[@]}" -I"$SIMD" \
        tests/c/test_float_attention.c "$OUT"/fa_*.o -lm -o "$OUT/test_float_attention"
    "$OUT/test_float_attention"
    ;;
emulated)
    if ! simde=$("$PYTHON" -c "import simde_py; print(simde_py.get_include())" 2>/dev/null); then
        echo "SKIPPED: the simde-py package (SIMDe headers) is not installed"
        exit 77
    fi
    echo "== emulated: every x86 ISA, intrinsics in plain C"
    # -O1: the emulation is plain C either way, and it compiles twice as fast.
    ${CC:-cc} ${CFLAGS/-O3/-O1} -Wno-psabi -DW8_EMULATE -mavx2 -mfma -I"$SIMD" -Itests/c \
        -I"$simde" "$SRC" -lm -o "$OUT/test_emulated"
    if command -v objdump >/dev/null; then
        if objdump -d "$OUT/test_emulated" | grep -E -q '%zmm|vpdpbusd|tdpb|tileloadd|ldtilecfg'; then
            echo "FAIL: the emulated binary holds AVX-512, VNNI or AMX instructions"
            exit 1
        fi
        echo "objdump: no AVX-512, VNNI or AMX instruction in the emulated binary"
    fi
    "$OUT/test_emulated" --all
    ;;
arm)
    # On an Arm host the native compiler already targets AArch64.
    if [ "$(uname -m)" = aarch64 ]; then CROSS=${CC:-cc}; else CROSS=aarch64-linux-gnu-gcc; fi
    for tool in "$CROSS" qemu-aarch64; do
        if ! command -v "$tool" >/dev/null; then
            echo "SKIPPED: $tool not found (make arm-tools installs the cross tools)"
            exit 77
        fi
    done
    echo "== aarch64 build (baseline armv8-a, static)"
    "$CROSS" $CFLAGS -static -I"$SIMD" "$SRC" -lm -o "$OUT/test_arm"
    echo "== qemu-aarch64 -cpu max (dotprod)"
    qemu-aarch64 -cpu max "$OUT/test_arm" --expect neondot
    echo "== qemu-aarch64 -cpu cortex-a53 (no dotprod)"
    qemu-aarch64 -cpu cortex-a53 "$OUT/test_arm" --expect neon
    # The extension modules must compile for AArch64 with setup.py's flags: nothing
    # x86-only may leak into the common code.  Compile only (no Arm Python to link
    # against); the host's Python and numpy headers serve, both being LP64 Linux.
    echo "== aarch64 compile of the extension modules"
    py_inc=$("$PYTHON" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
    np_inc=$("$PYTHON" -c "import numpy; print(numpy.get_include())")
    for pyx in pyw8a8/*.pyx; do
        mod=$(basename "$pyx" .pyx)
        "$PYTHON" -m cython -3 -I pyw8a8 -X boundscheck=False,wraparound=False,cdivision=True \
            -X initializedcheck=False "$pyx" -o "$OUT/$mod.c"
        # Cython's generated code is not -Wall clean: the kernels' warnings are checked above.
        "$CROSS" ${CFLAGS/-Wall -Werror/} -fopenmp -fPIC -I"$py_inc" -I"$np_inc" -Ipyw8a8 \
            -DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION -c "$OUT/$mod.c" -o "$OUT/$mod.o"
        echo "$mod: ok"
    done
    ;;
*)
    echo "usage: $0 native|emulated|arm" >&2
    exit 2
    ;;
esac
