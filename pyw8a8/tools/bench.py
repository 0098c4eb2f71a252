"""Side-by-side speed of pyw8a8 against numpy float32 and the int8 peers.

Every contender runs on the same float32 activations and pre-packed weights, each in a
process of its own, in interleaved rounds (A, B, C, A, B, C, ...) so a noisy shared
machine slows them alike; the table reports medians. Effective GOPS = 2 * M * N * K /
time.
"""
import argparse
import math
import os
import platform
import sys

from .. import _cpu, _threads
from .._thread_policy import thread_policy
from . import (
    dask_bench,
    ffn_bench,
    peers,
    proxies,
    record,
    torch_bench,
    torch_layer_bench,
    toy_transformer,
)
from .contenders import ROTATED, build_contender, contender_names
from .measure import isolated, measure
from .probes import (
    CACHE_RESIDENT_BYTES,
    fp32_peak_gops,
    int8_peak_gops,
    print_rotation,
    read_bandwidth_gbs,
)

SHAPES = [(1, 1152, 6912), (8, 1152, 6912), (64, 1152, 6912), (256, 1152, 6912),
          (1024, 2048, 640), (1, 4096, 4096), (64, 4096, 4096), (1, 640, 2048),
          (64, 2048, 640), (1, 640, 262144)]  # the last: a 168 MB LM head, DRAM-bound
QUICK_SHAPES = [(1, 1152, 6912), (64, 1152, 6912), (256, 1152, 6912)]


def _machine_info():
    lines = [f"CPU: {platform.processor() or platform.machine()}; "
             f"{os.cpu_count()} logical CPUs; threads used: {_threads.get_num_threads()}"]
    features = [k for k, v in _cpu.cpu_features().items() if v]
    lines.append(f"CPU features: {', '.join(features) or 'none detected'}")
    lines.append(f"pyw8a8 ISAs available: {', '.join(_cpu.available_isas())}; "
                 f"in use: {_cpu.isa()}")
    try:
        from threadpoolctl import threadpool_info
        pools = [f"{p['internal_api']}({p.get('architecture') or ''}) "
                 f"x{p['num_threads']}" for p in threadpool_info()]
        lines.append(f"thread pools: {', '.join(pools)}")
    except ImportError:
        pass
    return lines


#: The table's one torch column: the fastest of torch's engines in each row.
TORCH_COLUMN = "torch int8"


def _time_shape(shape, workers, beside, rounds, min_time, kernels):
    """GOPS at one shape of each contender in `workers` ({name: Isolated}), built and timed
    in its own process, and (`beside`) of each also built in this one, as "<name> beside",
    all in the same interleaved rounds; the kernel each names goes to kernels[name]."""
    m, k, n = shape
    contenders = {name: worker.build(name, m, k, n) for name, worker in workers.items()}
    for name, worker in contenders.items():
        if worker.kernel:
            kernels.setdefault(name, {})[shape] = worker.kernel
    if beside:
        contenders.update({f"{name} beside": build_contender(name, m, k, n)
                           for name in workers})
    times = measure(contenders, rounds, min_time)
    return {name: 2 * m * n * k / t / 1e9 for name, t in times.items()}


def run_table(shapes, names, rounds, min_time, beside=False, kernels=None):
    """GOPS of each contender (:func:`contender_names`) at each shape, each one built and
    timed in a process of its own, in interleaved rounds (:func:`measure`).

    In one process the contenders disturb each other: torch (2.13's CPU build) takes the
    OpenMP runtime pyw8a8 loaded, its spin policy included, and its dynamic Linear ran at
    about half its speed alone beside pyw8a8 (1 x 1152 x 6912, 2 Xeon vCPUs).  A user who
    runs one of them gets what it measures alone.
    With `beside`, each contender is also timed in this process beside the others, in the
    same rounds, under the name "<name> beside" (``bench --check-isolation``).  `kernels`,
    where given, receives {name: {shape: kernel}} of the contenders that name the kernel
    they run (torchao's: the GEMM Inductor chose).

    Returns
    -------
    list of ((M, K, N), dict of str to float)
    """
    kernels = {} if kernels is None else kernels
    with isolated(build_contender, names, _threads.get_num_threads()) as workers:
        return [(shape, _time_shape(shape, workers, beside, rounds, min_time, kernels))
                for shape in shapes]


def table_header(names):
    """The columns of :func:`format_table` for contenders `names`: torch's engines folded
    into TORCH_COLUMN."""
    header = ["M", "K", "N"] + [h for h in names if not h.startswith("torch ")]
    return header + [TORCH_COLUMN] * any(h.startswith("torch ") for h in names)


def _cell(gops, column):
    """(GOPS, label) of `column` in one row's figures; TORCH_COLUMN is the fastest engine,
    labelled with its name. (None, "") where the row lacks the column."""
    if column == TORCH_COLUMN:
        engines = {h[len("torch "):]: v for h, v in gops.items()
                   if h.startswith("torch ") and not h.endswith(" beside")}
        if not engines:
            return None, ""
        best = max(engines, key=engines.get)
        return engines[best], f" ({best})"
    return gops.get(column), ""


def format_table(header, rows, isas, peaks=None, bandwidth=None, fp32_peak=None):
    """Markdown table: GOPS per contender, ratios of the fastest pyw8a8 ISA to numpy and
    to the best peer (and of the rotated contender, where the table has one, to the best
    peer), each ISA's fraction of its own int8 instruction peak (and numpy's of the
    float32 FMA peak) and, at M = 1, the weight-read GB/s against the bandwidth of the
    level the weight is read from (`bandwidth`: {"L3": GB/s, "DRAM": GB/s}). The torch
    column (TORCH_COLUMN, see :func:`table_header`) names its fastest engine."""
    ours_names = [f"pyw8a8 {i}" for i in isas]
    rotated = [h for h in header[4:] if h.startswith("pyw8a8 ") and h.endswith(ROTATED)]
    peer_names = [h for h in header[4:] if not h.startswith("pyw8a8 ")]
    cols = header + ["vs numpy"] + (["vs best peer"] if peer_names else [])
    cols += [f"{rotated[0][len('pyw8a8 '):]} vs best peer"] if rotated and peer_names else []
    cols += [f"% peak {i}" for i in isas] if peaks else []
    cols += ["numpy % fp32 peak"] if fp32_peak else []
    cols += ["M=1 weight GB/s (% of L3 or DRAM read)"] if bandwidth else []
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for (m, k, n), gops in rows:
        ours = max(gops[name] for name in ours_names)
        cells = [str(m), str(k), str(n)]
        for h in header[3:]:
            value, label = _cell(gops, h)
            cells.append("-" if value is None else f"{value:.0f}{label}")
        cells.append(f"{ours / gops['numpy f32']:.1f}x")
        if peer_names:
            best_peer = max((v for v, _ in (_cell(gops, p) for p in peer_names)
                             if v is not None), default=None)
            cells.append(f"{ours / best_peer:.2f}x" if best_peer else "-")
            if rotated:
                cells.append(f"{gops[rotated[0]] / best_peer:.2f}x" if best_peer else "-")
        if peaks:
            cells += [f"{100 * gops[f'pyw8a8 {i}'] / peaks[i]:.0f}%" for i in isas]
        if fp32_peak:
            cells.append(f"{100 * gops['numpy f32'] / fp32_peak:.0f}%")
        if bandwidth:
            if m == 1:
                gbs = ours / 2  # at M = 1: 2 ops per weight byte, so GB/s = GOPS / 2
                level = "L3" if k * n <= CACHE_RESIDENT_BYTES else "DRAM"
                cells.append(f"{gbs:.1f} ({100 * gbs / bandwidth[level]:.0f}% of {level})")
            else:
                cells.append("")
        out.append("| " + " | ".join(cells) + " |")
    return out


def summary_lines(header, rows, isas):
    """The table's verdict in plain words: for the fastest pyw8a8 ISA (rotation off) and
    the rotated contender, the range of their ratios to the best int8 peer and every shape
    where a peer is faster, named with that peer and its lead; [] without peers."""
    rotated = [h for h in header[4:] if h.startswith("pyw8a8 ") and h.endswith(ROTATED)]
    peer_names = [h for h in header[4:] if not h.startswith("pyw8a8 ")]
    if not peer_names:
        return []
    contenders = [("pyw8a8 (rotation off)", lambda g: max(g[f"pyw8a8 {i}"] for i in isas))]
    if rotated:
        contenders.append((rotated[0], lambda g: g[rotated[0]]))
    lines = []
    for what, pick in contenders:
        ratios, behind = [], []
        for (m, k, n), gops in rows:
            peers_here = [(v, p + label) for v, label, p in
                          ((*_cell(gops, p), p) for p in peer_names) if v is not None]
            if not peers_here:
                continue
            best, name = max(peers_here)
            ratio = pick(gops) / best
            ratios.append(ratio)
            if ratio < 1:
                behind.append(f"{m}x{k}x{n} ({name} {1 / ratio:.2f}x faster)")
        if not ratios:
            continue
        span = f"{min(ratios):.2f}-{max(ratios):.2f}x the best int8 peer"
        lines.append(f"{what}: {span}; " + (
            f"slower than a peer at {len(behind)} of {len(ratios)} shapes: "
            + ", ".join(behind) if behind else "ahead of every peer at every shape"))
    return lines


#: How far a contender timed beside the others may be from it timed alone.
ISOLATION_TOLERANCE = 0.10


def format_isolation(rows, names):
    """Markdown table of ``bench --check-isolation``: each contender's GOPS beside the
    others (in one process) and alone (a process of its own), timed in the same rounds,
    and their ratio; then a line that counts the ratios outside ISOLATION_TOLERANCE."""
    out = ["| M | K | N | contender | beside the others | alone | beside / alone |",
           "|---|---|---|---|---|---|---|"]
    off = []
    for (m, k, n), gops in rows:
        for name in names:
            beside, alone = gops[f"{name} beside"], gops[name]
            ratio = beside / alone
            if abs(ratio - 1) > ISOLATION_TOLERANCE:
                off.append(f"{m}x{k}x{n} {name}")
            out.append(f"| {m} | {k} | {n} | {name} | {beside:.0f} | {alone:.0f} | "
                       f"{ratio:.2f} |")
    verdict = (f"all {sum(len(names) for _ in rows)} within {ISOLATION_TOLERANCE:.0%}"
               if not off else f"{len(off)} outside {ISOLATION_TOLERANCE:.0%}: "
               + ", ".join(off))
    return out + ["", f"beside / alone: {verdict}"]


def parse_shape(text):
    """One ``M,K,N`` of the command line.

    Parameters
    ----------
    text : str
        Three comma-separated integers.

    Returns
    -------
    tuple of int
        (M, K, N), each >= 1.

    Raises
    ------
    ValueError
        If `text` is not three comma-separated integers >= 1 (the message quotes it).
    """
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:  # not integers: the message below says what is expected
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"expected M,K,N (three integers >= 1), got {text!r}")
    return shape


def parse_shapes(text):
    """The ``M,K,N;M,K,N;...`` of ``--shapes``.

    Parameters
    ----------
    text : str
        One or more :func:`parse_shape` items separated by ``;``.

    Returns
    -------
    list of tuple of int

    Raises
    ------
    ValueError
        If an item is not three integers >= 1 (an empty item included).
    """
    return [parse_shape(item) for item in text.split(";")]


def parse_count(text):
    """A count of the command line (``--rounds``, ``--dask-chunk``): an integer >= 1.

    Raises
    ------
    ValueError
        If `text` is not an integer >= 1.
    """
    try:
        value = int(text)
    except ValueError:  # reported below with what is expected
        value = 0
    if value < 1:
        raise ValueError(f"expected an integer >= 1, got {text!r}")
    return value


def parse_seconds(text):
    """A duration of the command line (``--min-time``): a finite number of seconds > 0.

    Raises
    ------
    ValueError
        If `text` is not a finite number > 0 (nan, inf and 0 included).
    """
    try:
        value = float(text)
    except ValueError:  # reported below with what is expected
        value = math.nan
    if not 0 < value < math.inf:
        raise ValueError(f"expected a finite number of seconds > 0, got {text!r}")
    return value


def _option_type(parse):
    """`parse` as an argparse type: its ValueError message becomes the option's error
    (argparse would report a ValueError as just "invalid <name> value")."""
    def convert(text):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def _checked_isas(parser, names, option):
    """The ISAs `names` given to `option`, or a usage error for one that is unknown or
    that this CPU lacks (it would die on an illegal instruction)."""
    try:
        return [_cpu.checked_ops(name, option).name for name in names]
    except (ValueError, RuntimeError) as exc:
        parser.error(str(exc))


#: `main`'s switches that run another measurement instead of the table, and their help.
_MODE_FLAGS = (
    ("--mixed", "only a small numpy transformer (attention in numpy) with its linear layers in "
                "float32 numpy and in pyw8a8, default thread settings, taking turns"),
    ("--mca", "only llvm-mca's cycles per iteration of each x86 microkernel against its dot "
              "instruction's bound (any x86 machine)"),
    ("--overhead", "only the time around the kernels: matmul with a microkernel that does no "
                   "arithmetic, against the product's time at VNNI and AMX speeds"),
    ("--dask", "instead: a large M on local dask clusters of 1 and 2 worker processes against "
               "the in-process call (needs the dask extra)"),
    ("--check-isolation", "only the table's contenders, each timed alone in a process of "
                          "its own (as the table is) and beside the others in one process, "
                          "in the same rounds, with their ratio"),
    ("--torch", "only real PyTorch models (the sentence encoder all-MiniLM-L6-v2, the causal "
                "LM Gemma 3 270M): float32, torch's dynamic int8, torchao + Inductor and "
                "pyw8a8.torch eager and compiled, fidelity, speed and compile time (options "
                "below)"),
    ("--ffn", "only the gated FFN block gelu_tanh(x @ Wg.T) * (x @ Wu.T): numpy float32, "
              "pyw8a8 matmul_pair then numpy, pyw8a8 fused (glu=), torch int8"),
    ("--torch-layer", "only one nn.Linear as a PyTorch user runs it, microseconds a call: "
                      "pyw8a8.matmul, pyw8a8.torch eager, compiled and on the Python "
                      "operator, and torchao compiled by Inductor (freezing, max-autotune)"),
)


def main(argv=None, quick=False):
    """``python -m pyw8a8 bench`` (`quick`: ``info``, the short table); returns the exit
    status. Every option is checked before any measurement: a bad one exits with status 2
    (argparse's usage and one error line)."""
    parser = argparse.ArgumentParser(
        prog="python -m pyw8a8 " + ("info" if quick else "bench"),
        description=("A quick table: GOPS (2*M*N*K/s) of pyw8a8's ISAs and numpy float32 "
                     "at a few shapes, medians of interleaved rounds." if quick else
                     "Side-by-side GOPS (2*M*N*K/s) of pyw8a8 and its peers, medians of "
                     "interleaved rounds."))
    parser.add_argument("--rounds", type=_option_type(parse_count),
                        default=5 if quick else 9)
    parser.add_argument("--min-time", type=_option_type(parse_seconds),
                        default=0.02 if quick else 0.05,
                        help="seconds of calls per contender per round")
    parser.add_argument("--isa", action="append",
                        help="pyw8a8 ISA(s) to time (default: every available SIMD ISA)")
    if quick:  # info: the short table alone, pyw8a8's ISAs against numpy float32
        args = parser.parse_args(argv)
        isas = _checked_isas(parser, args.isa or [], "--isa")
        return _table_main(args, isas, QUICK_SHAPES, with_peers=False, rotated=False)
    parser.add_argument("--no-peers", action="store_true",
                        help="only numpy float32 and pyw8a8")
    parser.add_argument("--shapes", type=_option_type(parse_shapes),
                        help="M,K,N;M,K,N;... (default: the standard grid)")
    for flag, text in _MODE_FLAGS:
        parser.add_argument(flag, action="store_true", help=text)
    parser.add_argument("--dask-shape", type=_option_type(parse_shape),
                        default="32768,1152,6912",
                        help="M,K,N of --dask (default: 32768,1152,6912)")
    parser.add_argument("--dask-large", action="store_true",
                        help="--dask with M = 2**20 (1048576 x 1152 x 6912)")
    parser.add_argument("--dask-chunk", type=_option_type(parse_count), default=4096,
                        help="rows per chunk of --dask (default 4096)")
    parser.add_argument("--crossover", nargs=2, metavar=("WIDE", "NARROW"),
                        help="only the M from which ISA WIDE beats ISA NARROW (amx "
                             "avx512vnni: the small-M fallback's threshold)")
    parser.add_argument("--record", metavar="DIR",
                        help="also keep the run (any mode) in DIR/YYYY-MM-DD-<cpu kind>.md "
                             "(e.g. docs/benchmarks/): what it printed, its tables as "
                             "markdown, with the CPU model and features, the thread count, "
                             "the versions of Python, numpy, pyw8a8 and the peers found, the "
                             "commit of the source tree and the command line; a later run "
                             "on the same day and CPU kind is appended to that file")
    torch_bench.add_options(parser, _option_type)
    args = parser.parse_args(argv)
    isas = _checked_isas(parser, args.isa or [], "--isa")
    _checked_isas(parser, args.crossover or [], "--crossover")
    # Checked before any measurement, as every option is.
    args.torch_settings = torch_bench.settings(parser, args) if args.torch else None
    if args.record is None:
        return _run(args, isas)
    try:
        record.checked_directory(args.record)
    except ValueError as exc:
        parser.error(f"--record: {exc}")
    with record.captured_stdout() as output:
        status = _run(args, isas)
    if status == 0:  # a failed run is not a record
        command = record.command_line("bench", sys.argv[1:] if argv is None else argv)
        print(f"recorded in {record.write(args.record, output.getvalue(), command)}")
    return status


def _run(args, isas):
    """The measurement `args` ask for (`isas`: the checked --isa); its exit status."""
    if args.dask or args.dask_large:
        return _dask_main(args)
    if args.mixed:
        return _mixed_main(args.rounds)
    if args.torch:
        return torch_bench.main(args.rounds, _machine_info(), settings=args.torch_settings)
    if args.torch_layer:
        _print_machine(True)
        for line in torch_layer_bench.run(args.shapes or SHAPES, args.rounds, args.min_time,
                                          _threads.get_num_threads()):
            print(line)
        return 0
    if args.mca or args.overhead or args.crossover:
        return proxies.main(["--mca"] * args.mca + ["--overhead"] * args.overhead,
                            args.rounds, args.min_time, args.shapes, args.crossover)
    with_peers = not args.no_peers
    if args.ffn:
        _print_machine(with_peers)
        return ffn_bench.main(args.rounds, args.min_time, args.shapes, with_peers)
    if args.check_isolation:
        return _isolation_main(args.shapes or SHAPES, isas, args)
    return _table_main(args, isas, args.shapes or SHAPES, with_peers)


def _default_isas():
    """The table's ISAs unless --isa names some: every SIMD ISA this CPU runs (a small-M
    fallback in the column of the ISA it serves)."""
    return [i for i in _cpu.available_isas()
            if not i.startswith("scalar")] or ["scalar"]


def _print_machine(with_peers):
    """The machine's lines, and (`with_peers`) a line for each peer that is missing."""
    for line in _machine_info() + (peers.missing() if with_peers else []):
        print(line)


def _table_main(args, isas, shapes, with_peers, rotated=True):
    """The table (``bench``, and ``info`` without peers or rotation): the machine, the
    peaks, then GOPS of every contender at every shape, then the rotation's cost."""
    _print_machine(with_peers)
    isas = isas or _default_isas()
    names = contender_names(isas, with_peers, rotated)
    nthreads = _threads.get_num_threads()
    peaks = {isa: int8_peak_gops(isa, nthreads) for isa in isas}
    for isa, gops in peaks.items():
        print(f"int8 instruction peak of ISA {isa}: {gops:.0f} GOPS ({nthreads} threads)")
    fp32_peak, fp32_width = fp32_peak_gops(nthreads)
    if fp32_peak:
        print(f"float32 FMA peak ({fp32_width}, numpy's instruction): {fp32_peak:.0f} GOPS "
              f"({nthreads} threads)")
    bandwidth = {"DRAM": read_bandwidth_gbs(nthreads),
                 "L3": read_bandwidth_gbs(nthreads, nbytes=8 << 20, rounds=25)}
    print(f"read bandwidth: {bandwidth['DRAM']:.1f} GB/s from memory (1 GiB buffer), "
          f"{bandwidth['L3']:.1f} GB/s from L3 (8 MiB) ({nthreads} threads)")
    kernels = {}
    rows = run_table(shapes, names, args.rounds, args.min_time, kernels=kernels)
    print(f"\n{GOPS_NOTE}; {nthreads} threads")
    for line in format_table(table_header(names), rows, isas, peaks, bandwidth, fp32_peak):
        print(line)
    for name, by_shape in kernels.items():
        ran = sorted(set(by_shape.values()))
        print(f"{name}: Inductor's int8 GEMM was {' or '.join(ran)}"
              + ("" if len(ran) == 1 else " (" + ", ".join(
                  f"{'x'.join(map(str, shape))}: {kernel}"
                  for shape, kernel in by_shape.items()) + ")"))
    for line in summary_lines(table_header(names), rows, isas):
        print(line)
    with _cpu.use_isa(isas[0]):
        print_rotation(isas[0], args.rounds, args.min_time)
    return 0


GOPS_NOTE = ("GOPS = 2*M*N*K / median time, activation quantization included, each "
             "contender in a process of its own. pyw8a8 runs with rotation off, the "
             "'rotated' column with it on (block 128); torch int8: the fastest of torch's "
             "dynamic int8 engines, named; xnnpack int8: XNNPACK through LiteRT; torchao "
             "inductor: torchao's int8 Linear compiled by Inductor (freezing, max-autotune); "
             "vs best "
             "peer: the fastest pyw8a8 ISA over the fastest int8 peer (below 1.00x: the "
             "peer is faster); % peak: of the ISA's instruction loop above, which a "
             "kernel can pass when it issues faster than that loop")


def _isolation_main(shapes, isas, args):
    _print_machine(not args.no_peers)
    isas = isas or _default_isas()
    names = contender_names(isas, not args.no_peers)
    nthreads = _threads.get_num_threads()
    rows = run_table(shapes, names, args.rounds, args.min_time, beside=True)
    print(f"\n{GOPS_NOTE}; {nthreads} threads")
    for line in format_table(table_header(names), rows, isas):
        print(line)
    print("\nThe same contenders beside each other in one process, timed in the same "
          "interleaved rounds (GOPS)")
    for line in format_isolation(rows, names):
        print(line)
    return 0


def _dask_main(args):
    m, k, n = args.dask_shape
    if args.dask_large:
        m = 2**20
    for line in _machine_info():
        print(line)
    rows = dask_bench.run(m, k, n, args.dask_chunk, rounds=1 if args.dask_large else 3)
    print("\nGOPS = 2*M*N*K / median time (activation draw, rotation, quantization and "
          "row sums included); efficiency = T(1 worker) / (workers * T)")
    for line in dask_bench.format_rows(rows):
        print(line)
    return 0


def _mixed_main(rounds):
    for line in _machine_info():
        print(line)
    print(f"thread policy: {thread_policy()}")
    best = toy_transformer.best_times(rounds=rounds)
    t = toy_transformer
    print(f"\nSmall numpy transformer ({t.LAYERS} layers, D={t.D}, F={t.F}, {t.TOKENS} "
          f"tokens; numpy attention), best of {rounds} forwards each, taking turns:")
    print("| linear layers | forward ms | speedup |")
    print("|---|---|---|")
    for name in ("float", "w8a8"):
        print(f"| {'numpy float32' if name == 'float' else 'pyw8a8.matmul'} | "
              f"{best[name] * 1e3:.1f} | {best['float'] / best[name]:.2f}x |")
    return 0
