"""Speed proxies any machine can measure, for the ISAs it may not have (``bench --mca``,
``--overhead``, ``--crossover``; speed is never asserted):

* ``mca_report``: llvm-mca's cycles per iteration of each x86 microkernel's inner loop,
  compiled with setup.py's flags, against the bound of as many of its dot instructions
  alone: near 1, the loop issues at the port bound (no spills, loads hidden);
* ``crossover``: the smallest M from which a wide ISA (amx) beats a narrower one, for
  ``_cpu``'s small-M fallback;
* ``overhead_report``: ``matmul``'s time with a microkernel that does no arithmetic
  (everything around the kernels) against the product's time at given kernel speeds."""
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import numpy as np

from .. import _cpu, _dispatch, _threads
from ..lab.record import markdown_table
from ..lab.turns import measure
from ..matmul import matmul
from ..packing import pack_weight

# One dot step of each ISA in registers, as the microkernel issues it: accumulator i,
# operands from two fixed registers (the AVX2 step through a temporary of its own).
_DOT_STEPS = {
    "avx512vnni": lambda i: [f"vpdpbusd %zmm30, %zmm31, %zmm{i}"],
    "avxvnni": lambda i: [f"{{vex}} vpdpbusd %ymm14, %ymm15, %ymm{i}"],
    "avx2": lambda i: [f"vpxor %ymm15, %ymm14, %ymm{8 + i % 4}",
                       f"vpmaddubsw %ymm{8 + i % 4}, %ymm13, %ymm{8 + i % 4}",
                       f"vpmaddwd %ymm12, %ymm{8 + i % 4}, %ymm{8 + i % 4}",
                       f"vpaddd %ymm{8 + i % 4}, %ymm{i % 8}, %ymm{i % 8}"],
}

# (ISA, C prefix, dot mnemonic, llvm-mca CPU): icelake-server models zmm vpdpbusd as
# measured on Sapphire Rapids (2 a cycle), alderlake the VEX form; AVX2 runs on CPUs
# without VNNI (Zen 3, Skylake).  llvm-mca does not model AMX.
MCA_ISAS = [("avx512vnni", "w8_avx512", "vpdpbusd", "icelake-server"),
             ("avxvnni", "w8_avxvnni", "vpdpbusd", "alderlake"),
             ("avx2", "w8_avx2", "vpmaddubsw", "znver3"),
             ("avx2", "w8_avx2", "vpmaddubsw", "skylake")]


def _simd_dir():
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_simd")


def build_cflags():
    """The C core's compile flags (``_simd/build_flags.json``, which setup.py reads too)."""
    with open(os.path.join(_simd_dir(), "build_flags.json")) as f:
        return json.load(f)["cflags"]


def kernels_assembly(cc="cc"):
    """The assembly of the C core, compiled with setup.py's flags (no -march)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "core.c")
        with open(src, "w") as f:
            # The registry references every kernel, so every kernel is emitted.
            f.write('#include "dispatch.h"\n'
                    "const w8_isa_ops *w8_registry(void) { return w8_isas; }\n")
        out = os.path.join(tmp, "core.s")
        subprocess.run([cc, *build_cflags(), "-fno-asynchronous-unwind-tables", "-I",
                        _simd_dir(), "-S", src, "-o", out], check=True, capture_output=True,
                       text=True)
        with open(out) as f:
            return f.read()


def function_lines(asm, name):
    """The instruction and label lines of function `name` in GCC's assembly output."""
    match = re.search(rf"^{re.escape(name)}:\n(.*?)^\s*\.size\s+{re.escape(name)},", asm,
                      flags=re.M | re.S)
    if match is None:
        raise ValueError(f"no function {name} in the assembly")
    return [line for line in match.group(1).splitlines()
            if line.strip() and not line.lstrip().startswith((".p2align", ".cfi", "#"))]


def innermost_loops(lines):
    """The instruction lines of each straight-line loop: a label, then instructions up to a
    jump back to it, no other label between."""
    loops, label, body = [], None, []
    for line in lines:
        m = re.match(r"^(\.L\w+):", line)
        if m:
            label, body = m.group(1), []
            continue
        if label is None:
            continue
        body.append(line)
        jump = re.match(r"^\s*j\w+\s+(\.L\w+)", line)
        if jump:
            if jump.group(1) == label:
                loops.append(body)
            label = None
    return loops


def count_mnemonic(body, mnemonic):
    return sum(1 for line in body if re.match(rf"^\s*(\{{vex\}}\s*)?{mnemonic}\b", line))


def dot_loop(asm, function, mnemonic):
    """The innermost loop of `function` with the most dot instructions (the full tile's)."""
    loops = innermost_loops(function_lines(asm, function))
    if not loops:
        raise ValueError(f"no loop in {function}")
    return max(loops, key=lambda body: count_mnemonic(body, mnemonic))


def mca_cycles(body, mcpu, llvm_mca="llvm-mca"):
    """llvm-mca's block reciprocal throughput (cycles per iteration) of a loop body."""
    run = subprocess.run([llvm_mca, "-mtriple=x86_64-linux-gnu", f"-mcpu={mcpu}",
                          "-iterations=200"], input="\n".join(body) + "\n",
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"llvm-mca -mcpu={mcpu} failed: {run.stderr.strip()[:300]}")
    match = re.search(r"Block RThroughput:\s*([\d.]+)", run.stdout)
    if match is None:
        raise RuntimeError("llvm-mca printed no block throughput")
    return float(match.group(1))


def find_llvm_mca():
    for name in ["llvm-mca"] + [f"llvm-mca-{v}" for v in range(20, 13, -1)]:
        if shutil.which(name):
            return name
    return None


def mca_report(cc="cc"):
    """Per x86 microkernel: (ISA, mcpu, dots per iteration, cycles per iteration, the dot bound
    in cycles, ratio)."""
    llvm_mca = find_llvm_mca()
    if llvm_mca is None:
        raise RuntimeError("llvm-mca not found (Debian: apt-get install llvm)")
    asm = kernels_assembly(cc)
    rows = []
    for isa, prefix, mnemonic, mcpu in MCA_ISAS:
        loop = dot_loop(asm, f"{prefix}_ukernel_biased", mnemonic)
        dots = count_mnemonic(loop, mnemonic)
        cycles = mca_cycles(loop, mcpu, llvm_mca)
        bound = mca_cycles([line for i in range(dots) for line in _DOT_STEPS[isa](i)],
                           mcpu, llvm_mca)
        rows.append((isa, mcpu, dots, cycles, bound, cycles / bound))
    return rows


def print_mca(cc="cc"):
    print("llvm-mca: predicted cycles per iteration of each microkernel's inner loop "
          "(the full register tile), against its dot instruction's bound")
    print("\n".join(markdown_table(
        ["ISA", "-mcpu", "dots / iteration", "cycles / iteration", "dot bound", "ratio"],
        [[isa, mcpu, dots, f"{cycles:.2f}", f"{bound:.2f}", f"{ratio:.2f}"]
         for isa, mcpu, dots, cycles, bound, ratio in mca_report(cc)])))


# Per-core kernel speeds the overhead is weighed against: the AVX-512 VNNI instruction peak
# and a round AMX figure on Sapphire Rapids (docs: performance notes).
BUDGETS = (("VNNI", 650e9, 0.10), ("AMX", 4000e9, 0.25))
OVERHEAD_SHAPES = [(64, 1152, 6912), (256, 1152, 6912), (1024, 2048, 640),
                   (64, 4096, 4096), (64, 2048, 640)]


def overhead_report(shapes, rounds, min_time, rotate=False, tile_of=None):
    """Per shape: (shape, real seconds, no-op-kernel seconds) on the active ISA, the no-op
    kernel with ISA `tile_of`'s register tile (default: the active ISA's)."""
    rng = np.random.default_rng(0)
    noop = _dispatch.IsaOps(_cpu.isa(), noop_kernel=True, tile_of=tile_of)
    rows = []
    for m, k, n in shapes:
        x = rng.standard_normal((m, k)).astype(np.float32)
        packed = pack_weight(rng.standard_normal((n, k)).astype(np.float32), rotate=rotate)

        def without_kernel():
            with _cpu.use_ops(noop):
                return matmul(x, packed)
        times = measure({"real": lambda: matmul(x, packed), "noop": without_kernel},
                        rounds, min_time)
        rows.append(((m, k, n), times["real"], times["noop"]))
    return rows


def print_overhead(shapes, rounds, min_time):
    nthreads = _threads.get_num_threads()
    isa = _cpu.isa()
    # the VNNI and AMX tiles too: their loop nest runs as often as it would there
    tiles = [isa] + [t for t in ("avx512vnni", "amx")
                      if t in _cpu.compiled_isas() and t != isa]
    print(f"\nOverhead around the kernels (ISA {isa}, {nthreads} threads): matmul with a "
          "microkernel that does no arithmetic, against the product's time at the kernel "
          "speeds below (budgets: <= 10% at 650 GOPS/core, <= 25% at 4 TOPS/core); "
          "'tile' is the register tile the loop nest runs with")
    cols = ["M", "K", "N", "rotation", "tile", "overhead us", "% of this run's matmul"]
    cols += [f"% of {name} time" for name, _, _ in BUDGETS]
    print("\n".join(markdown_table(cols, [])))
    for tile in tiles:
        for rotate in (False, True):
            for (m, k, n), real, noop in overhead_report(shapes, rounds, min_time, rotate,
                                                         tile):
                cells = [str(m), str(k), str(n), "on" if rotate else "off", tile,
                         f"{noop * 1e6:.0f}", f"{100 * noop / real:.0f}%"]
                for _, rate, budget in BUDGETS:
                    share = noop / (2 * m * n * k / (rate * nthreads))
                    cells.append(f"{100 * share:.0f}%{'' if share <= budget else ' (over)'}")
                print("| " + " | ".join(cells) + " |")


CROSSOVER_ROWS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def crossover(wide, narrow, k, n, rounds, min_time, rows=CROSSOVER_ROWS):
    """Per M: (M, seconds on ISA `wide`, on `narrow`), both forced, taking turns; and the
    smallest M from which `wide` is faster at every larger M (None if never)."""
    ops = {name: _cpu.checked_ops(name, "--crossover") for name in (wide, narrow)}
    rng = np.random.default_rng(0)
    packed = pack_weight(rng.standard_normal((n, k)).astype(np.float32), rotate=False)
    out = []
    for m in rows:
        x = rng.standard_normal((m, k)).astype(np.float32)

        def on(name):
            def run():
                with _cpu.use_ops(ops[name]):
                    return matmul(x, packed)
            return run
        times = measure({name: on(name) for name in ops}, rounds, min_time)
        out.append((m, times[wide], times[narrow]))
    start = None
    for m, t_wide, t_narrow in reversed(out):
        if t_wide >= t_narrow:
            break
        start = m
    return out, start


def print_crossover(wide, narrow, rounds, min_time, k=2048, n=2048):
    rows, start = crossover(wide, narrow, k, n, rounds, min_time)
    print(f"{wide} against {narrow} at K = {k}, N = {n} ({_threads.get_num_threads()} "
          "threads), medians of interleaved rounds:")
    print("\n".join(markdown_table(
        ["M", f"{wide} us", f"{narrow} us", f"{wide} / {narrow}"],
        [[m, f"{t_wide * 1e6:.1f}", f"{t_narrow * 1e6:.1f}", f"{t_narrow / t_wide:.2f}x"]
         for m, t_wide, t_narrow in rows])))
    print(f"{wide} is faster from M = {start} on" if start is not None else
          f"{wide} is never faster at every larger M")
    variables = {(w, n): v for w, n, v, _ in _cpu.SMALL_M_FALLBACKS}
    if (wide, narrow) in variables and start is not None:
        print(f"(set {variables[wide, narrow]}={start}, or _cpu's default, to this)")
    return start


def main(mca, overhead, rounds, min_time, shapes=None, crossover_isas=None):
    """``bench --mca`` / ``--overhead`` / ``--crossover`` (`crossover_isas`: WIDE, NARROW) on
    options the bench's parser has checked; the exit status, 1 where llvm-mca or the
    compiler failed."""
    if mca:
        cc = os.environ.get("CC") or sysconfig.get_config_var("CC").split()[0] or "cc"
        try:
            print_mca(cc)
        except (RuntimeError, subprocess.CalledProcessError, ValueError) as exc:
            print(f"pyw8a8 bench --mca: {exc}", file=sys.stderr)
            return 1
    if overhead:
        print_overhead(shapes or OVERHEAD_SHAPES, rounds, min_time)
    if crossover_isas:
        print_crossover(*crossover_isas, rounds, min_time)
    return 0
