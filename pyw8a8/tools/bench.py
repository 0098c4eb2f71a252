"""Side-by-side speed of pyw8a8 against numpy float32 and the int8 peers: every contender
on the same activations and pre-packed weights, each in a process of its own, in
interleaved rounds (A, B, C, A, B, C, ...); medians of GOPS = 2 * M * N * K / time."""
import os
import platform
import sys

from .. import _cpu, _threads
from .._thread_policy import thread_policy
from ..lab import chart, record
from ..lab.record import markdown_table
from ..lab.turns import isolated, measure
from . import (
    amx_model,
    dask_bench,
    ffn_bench,
    peers,
    proxies,
    roofline,
    torch_bench,
    torch_layer_bench,
    toy_transformer,
)
from .bench_options import parse_args
from .bench_table import (
    GOPS_NOTE,
    column_value,
    format_isolation,
    format_table,
    rotated_and_peers,
    summary_lines,
    table_header,
)
from .contenders import BUILD, build_contender, contender_names
from .probes import fp32_peak_gops, int8_peak_gops, print_rotation

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


def _time_shape(shape, workers, beside, rounds, min_time, kernels):
    """GOPS at `shape` of each contender of `workers` ({name: Isolated}) and (`beside`) of each
    built in this process too, as "<name> beside", in the same rounds; the kernel each
    names goes to kernels[name]."""
    m, k, n = shape
    contenders = {name: worker.build("product", name, m, k, n)
                  for name, worker in workers.items()}
    for name, worker in contenders.items():
        if worker.kernel:
            kernels.setdefault(name, {})[shape] = worker.kernel
    if beside:
        contenders.update({f"{name} beside": build_contender("product", name, m, k, n)
                           for name in workers})
    times = measure(contenders, rounds, min_time)
    return {name: 2 * m * n * k / t / 1e9 for name, t in times.items()}


def run_table(shapes, names, rounds, min_time, beside=False, kernels=None):
    """GOPS of each contender at each shape, each in a process of its own, taking turns:
    [((M, K, N), {name: GOPS})].

    In one process they disturb each other: torch's dynamic Linear, on the OpenMP runtime
    pyw8a8 loaded, ran at about half its speed alone (1 x 1152 x 6912, 2 Xeon vCPUs).  With
    `beside`, each is also timed in this process (``bench --check-isolation``); `kernels`
    receives {name: {shape: kernel}} of the contenders that name their kernel."""
    kernels = {} if kernels is None else kernels
    rows = []
    with isolated(BUILD, names, _threads.get_num_threads()) as workers:
        for i, shape in enumerate(shapes):
            print(f"bench: shape {i + 1} of {len(shapes)}, {'x'.join(map(str, shape))} "
                  f"({len(workers)} contenders)", file=sys.stderr, flush=True)
            rows.append((shape, _time_shape(shape, workers, beside, rounds, min_time,
                                            kernels)))
    return rows


def main(argv=None, quick=False):
    """``python -m pyw8a8 bench`` (`quick`: ``info``, the short table); the exit status.  A bad
    option exits with status 2 before any measurement."""
    args, isas = parse_args(argv, quick)
    if quick:
        return _table_main(args, isas, QUICK_SHAPES, with_peers=False, rotated=False)
    if args.record is None:
        return _run(args, isas)
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
        return torch_bench.main(args.torch_settings, _machine_info())
    if args.torch_layer:
        _print_machine(True)
        print("\n".join(torch_layer_bench.run(args.shapes or SHAPES, args.rounds,
                                              args.min_time, _threads.get_num_threads())))
        return 0
    if args.amx_model:
        print("\n".join(amx_model.format_table(args.shapes or SHAPES,
                                                _threads.get_num_threads())))
        return 0
    if args.mca or args.overhead or args.crossover:
        return proxies.main(args.mca, args.overhead, args.rounds, args.min_time,
                            args.shapes, args.crossover)
    with_peers = not args.no_peers
    if args.ffn:
        _print_machine(with_peers)
        return ffn_bench.main(args.rounds, args.min_time, args.shapes, with_peers)
    if args.check_isolation:
        return _isolation_main(args.shapes or SHAPES, isas, args)
    return _table_main(args, isas, args.shapes or SHAPES, with_peers)


def _default_isas():
    """Every SIMD ISA this CPU runs (a small-M fallback in the column of the ISA it serves)."""
    return [i for i in _cpu.available_isas()
            if not i.startswith("scalar")] or ["scalar"]


def _print_machine(with_peers=False):
    """The machine's lines, and (`with_peers`) a line for each peer that is missing."""
    print("\n".join(_machine_info() + (peers.missing() if with_peers else [])))


def _table_main(args, isas, shapes, with_peers, rotated=True):
    """The machine, the peaks, the table of every contender at every shape, the rotation."""
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
    bounds = roofline.measure(peaks, nthreads)
    bw = bounds.bandwidth
    print(f"read bandwidth: {bw['DRAM']:.1f} GB/s from memory (1 GiB buffer), "
          f"{bw['L3']:.1f} GB/s from L3 (8 MiB), {bw['L2']:.1f} GB/s from L2 (half of "
          f"each core's) ({nthreads} threads)")
    kernels = {}
    rows = run_table(shapes, names, args.rounds, args.min_time, kernels=kernels)
    print(f"\n{GOPS_NOTE}; {nthreads} threads")
    print("\n".join(format_table(table_header(names), rows, isas, peaks, bounds,
                                 fp32_peak)))
    for name, by_shape in kernels.items():
        ran = sorted(set(by_shape.values()))
        print(f"{name}: Inductor's int8 GEMM was {' or '.join(ran)}"
              + ("" if len(ran) == 1 else " (" + ", ".join(
                  f"{'x'.join(map(str, shape))}: {kernel}"
                  for shape, kernel in by_shape.items()) + ")"))
    for line in summary_lines(table_header(names), rows, isas):
        print(line)
    if getattr(args, "record", None) is not None:
        _write_chart(args.record, rows, names, isas, bounds, nthreads, shapes == SHAPES)
    with _cpu.use_isa(isas[0]):
        print_rotation(isas[0], args.rounds, args.min_time)
    return 0


def _write_chart(directory, rows, names, isas, bounds, nthreads, grid):
    """The record's chart of the table: pyw8a8 (rotated, its default, and not) and each
    peer as shares of each shape's roofline on the CPU's best ISA.  The day's chart is its
    latest run of the standard grid (`grid`), which the docs show; a run of other shapes
    draws it only where the day has none."""
    kept = record.chart_path(directory)
    if not grid and kept.exists():
        print(f"chart: {kept.name} kept, a run of the standard shapes")
        return
    header = table_header(names)
    rotated, peers_ = rotated_and_peers(header)
    ours = "pyw8a8, rotation off"
    contenders = (["pyw8a8, rotated (default)"] if rotated else []) + [ours] + peers_
    chart_rows = []
    for shape, gops in rows:
        values = {ours: max(gops[f"pyw8a8 {i}"] for i in isas)}
        if rotated:
            values[contenders[0]] = gops[rotated]
        values.update({p: column_value(gops, p)[0] for p in peers_})
        chart_rows.append((shape, {c: v for c, v in values.items() if v}))
    kind = record.this_cpu_kind()
    svg = chart.roofline_chart(
        f"pyw8a8 bench on {kind}: GOPS over each shape's roofline ({isas[0]}, "
        f"{nthreads} threads)", chart_rows, contenders,
        lambda m, k, n: bounds.attainable(isas[0], m, k, n)[0])
    print(f"chart: {record.write_chart(directory, svg).name}")


def _isolation_main(shapes, isas, args):
    _print_machine(not args.no_peers)
    isas = isas or _default_isas()
    names = contender_names(isas, not args.no_peers)
    rows = run_table(shapes, names, args.rounds, args.min_time, beside=True)
    print(f"\n{GOPS_NOTE}; {_threads.get_num_threads()} threads")
    print("\n".join(format_table(table_header(names), rows, isas)))
    print("\nThe same contenders beside each other in one process, timed in the same "
          "interleaved rounds (GOPS)")
    print("\n".join(format_isolation(rows, names)))
    return 0


def _dask_main(args):
    m, k, n = args.dask_shape
    if args.dask_large:
        m = 2**20
    _print_machine()
    rows = dask_bench.run(m, k, n, args.dask_chunk, rounds=1 if args.dask_large else 3)
    print("\nGOPS = 2*M*N*K / median time (activation draw, rotation, quantization and "
          "row sums included); efficiency = T(1 worker) / (workers * T)")
    print("\n".join(dask_bench.format_rows(rows)))
    return 0


def _mixed_main(rounds):
    _print_machine()
    print(f"thread policy: {thread_policy()}")
    best = toy_transformer.best_times(rounds=rounds)
    t = toy_transformer
    print(f"\nSmall numpy transformer ({t.LAYERS} layers, D={t.D}, F={t.F}, {t.TOKENS} "
          f"tokens; numpy attention), best of {rounds} forwards each, taking turns:")
    print("\n".join(markdown_table(["linear layers", "forward ms", "speedup"], [
        [label, f"{best[name] * 1e3:.1f}", f"{best['float'] / best[name]:.2f}x"]
        for name, label in (("float", "numpy float32"), ("w8a8", "pyw8a8.matmul"))])))
    return 0
