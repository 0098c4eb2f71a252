"""``bench --ffn``: the gated FFN block of Gemma, Llama and Mistral,
``gelu_tanh(x @ Wg.T) * (x @ Wu.T)``, timed side by side: numpy float32; pyw8a8
``matmul_pair`` then the same numpy (unfused); ``matmul_pair(..., glu="gelu_tanh")``
(fused: the activation on each tile as it is finished); XNNPACK (one LiteRT graph) and
torch int8 (two dynamic int8 Linears, its fastest engine) where installed.  Each
contender (:mod:`~pyw8a8.tools.contenders`' ``ffn`` table) runs in a process of its own.
"""
from .. import _cpu, _threads
from ..lab.record import markdown_table
from ..lab.turns import isolated, measure
from .contenders import BUILD, XNNPACK, fastest_torch, ffn_names

# Tokens x (K = model width, N = FFN width): Gemma 3 270M's FFN and Gemma 3 1B's.
SHAPES = [(64, 640, 2048), (256, 640, 2048), (64, 1152, 6912), (256, 1152, 6912)]


def run(shapes, names, rounds, min_time):
    """Median seconds per FFN block of each contender at each shape, each in a process of
    its own, in interleaved rounds: [((M, K, N), {name: seconds})]."""
    with isolated(BUILD, names, _threads.get_num_threads()) as workers:
        return [((m, k, n), measure({name: worker.build("ffn", name, m, k, n)
                                     for name, worker in workers.items()}, rounds, min_time))
                for m, k, n in shapes]


def format_rows(rows):
    """Markdown table: milliseconds per block, each contender's speed against numpy and
    the fused block's against the unfused one; torch is its fastest engine, named."""
    torch_cols = any(name.startswith("torch ") for _, times in rows for name in times)
    xnnpack_cols = any(XNNPACK in times for _, times in rows)
    cols = ["M", "K", "N", "numpy f32 ms", "pyw8a8 unfused ms", "pyw8a8 fused ms"]
    cols += ["xnnpack int8 ms"] * xnnpack_cols + ["torch int8 ms"] * torch_cols
    cols += ["unfused vs numpy", "fused vs numpy"] + ["xnnpack vs numpy"] * xnnpack_cols
    cols += ["torch vs numpy"] * torch_cols + ["fused vs unfused"]
    table = []
    for (m, k, n), times in rows:
        base = times["numpy f32"]
        ms = [times[c] for c in ("numpy f32", "pyw8a8 unfused", "pyw8a8 fused")]
        cells = [m, k, n] + [f"{1e3 * t:.3f}" for t in ms]
        ratios = [base / times["pyw8a8 unfused"], base / times["pyw8a8 fused"]]
        if xnnpack_cols:
            cells.append(f"{1e3 * times[XNNPACK]:.3f}")
            ratios.append(base / times[XNNPACK])
        if torch_cols:
            best, seconds = fastest_torch(times, min)
            cells.append(f"{1e3 * seconds:.3f} ({best})")
            ratios.append(base / seconds)
        cells += [f"{r:.2f}x" for r in ratios]
        table.append(cells + [f"{times['pyw8a8 unfused'] / times['pyw8a8 fused']:.2f}x"])
    return markdown_table(cols, table)


def main(rounds, min_time, shapes=None, with_peers=True):
    """Print the FFN table (``bench --ffn``); returns the exit status."""
    rows = run(shapes or SHAPES, ffn_names(with_peers), rounds, min_time)
    print(f"\nGated FFN gelu_tanh(x @ Wg.T) * (x @ Wu.T), M tokens, K -> N; medians of "
          f"interleaved rounds, each contender in a process of its own; pyw8a8 ISA "
          f"{_cpu.isa()}, rotation off; {_threads.get_num_threads()} threads")
    print("\n".join(format_rows(rows)))
    return 0
