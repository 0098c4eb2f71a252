"""``bench --ffn``: the gated FFN block of Gemma, Llama and Mistral,
``gelu_tanh(x @ Wg.T) * (x @ Wu.T)``, timed side by side:

* numpy float32: two products, then the tanh-GELU and the product in numpy;
* pyw8a8 unfused: ``matmul_pair`` (one quantized activation for both products), then the
  same numpy;
* pyw8a8 fused: ``matmul_pair(..., glu="gelu_tanh")``, the activation and the product done
  on each tile as it is finished, one output array;
* xnnpack int8 (where LiteRT is installed): one LiteRT graph, two FULLY_CONNECTED layers
  as the bench table's XNNPACK contender, GELU (tanh form) and MUL, through XNNPACK;
* torch int8 (where torch is installed): two dynamic int8 Linears and
  ``F.gelu(approximate="tanh")``, on the fastest of torch's engines.

Each contender (:mod:`~pyw8a8.tools.contenders`' ``ffn`` table) runs in a process of its
own, as in the bench's table.
"""
from .. import _cpu, _threads
from ..lab.turns import isolated, measure
from .contenders import BUILD, XNNPACK, ffn_names

# Tokens x (K = model width, N = FFN width): Gemma 3 270M's FFN and Gemma 3 1B's.
SHAPES = [(64, 640, 2048), (256, 640, 2048), (64, 1152, 6912), (256, 1152, 6912)]


def run(shapes, names, rounds, min_time):
    """Median seconds per FFN block of each contender at each shape, each one built and
    timed in a process of its own (as the bench's table: torch and pyw8a8 share an OpenMP
    runtime in one process), in interleaved rounds.

    Returns
    -------
    list of ((M, K, N), dict of str to float)
    """
    with isolated(BUILD, names, _threads.get_num_threads()) as workers:
        return [((m, k, n), measure({name: worker.build("ffn", name, m, k, n)
                                     for name, worker in workers.items()}, rounds, min_time))
                for m, k, n in shapes]


def format_rows(rows):
    """Markdown table: milliseconds per block, each contender's speed against numpy
    float32 (its time over theirs) and the fused block's against the unfused one; torch
    is its fastest engine, named."""
    torch_cols = any(name.startswith("torch ") for _, times in rows for name in times)
    xnnpack_cols = any(XNNPACK in times for _, times in rows)
    cols = ["M", "K", "N", "numpy f32 ms", "pyw8a8 unfused ms", "pyw8a8 fused ms"]
    cols += ["xnnpack int8 ms"] * xnnpack_cols + ["torch int8 ms"] * torch_cols
    cols += ["unfused vs numpy", "fused vs numpy"] + ["xnnpack vs numpy"] * xnnpack_cols
    cols += ["torch vs numpy"] * torch_cols + ["fused vs unfused"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for (m, k, n), times in rows:
        base = times["numpy f32"]
        ms = [times[c] for c in ("numpy f32", "pyw8a8 unfused", "pyw8a8 fused")]
        cells = [str(m), str(k), str(n)] + [f"{1e3 * t:.3f}" for t in ms]
        ratios = [base / times["pyw8a8 unfused"], base / times["pyw8a8 fused"]]
        if xnnpack_cols:
            cells.append(f"{1e3 * times[XNNPACK]:.3f}")
            ratios.append(base / times[XNNPACK])
        if torch_cols:
            engines = {h[len("torch "):]: t for h, t in times.items()
                       if h.startswith("torch ")}
            best = min(engines, key=engines.get)
            cells.append(f"{1e3 * engines[best]:.3f} ({best})")
            ratios.append(base / engines[best])
        cells += [f"{r:.2f}x" for r in ratios]
        cells.append(f"{times['pyw8a8 unfused'] / times['pyw8a8 fused']:.2f}x")
        out.append("| " + " | ".join(cells) + " |")
    return out


def main(rounds, min_time, shapes=None, with_peers=True):
    """Print the FFN table (``bench --ffn``); returns the exit status."""
    names = ffn_names(with_peers)
    rows = run(shapes or SHAPES, names, rounds, min_time)
    print(f"\nGated FFN gelu_tanh(x @ Wg.T) * (x @ Wu.T), M tokens, K -> N; medians of "
          f"interleaved rounds, each contender in a process of its own; pyw8a8 ISA "
          f"{_cpu.isa()}, rotation off; {_threads.get_num_threads()} threads")
    for line in format_rows(rows):
        print(line)
    return 0
