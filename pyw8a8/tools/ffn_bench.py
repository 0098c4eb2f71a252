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

Each contender runs in a process of its own, as in the bench's table.
"""
import math

import numpy as np

from .. import _cpu, _threads
from ..matmul import matmul_pair
from ..packing import pack_weight
from . import peers
from .measure import isolated, measure

# Tokens x (K = model width, N = FFN width): Gemma 3 270M's FFN and Gemma 3 1B's.
SHAPES = [(64, 640, 2048), (256, 640, 2048), (64, 1152, 6912), (256, 1152, 6912)]
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def ffn_data(m, k, n):
    """Float32 activations (M, K) and gate and up weights (N, K) of one shape."""
    rng = np.random.default_rng((m, k, n, 1))
    x = rng.standard_normal((m, k), dtype=np.float32)
    scale = np.float32(1 / np.sqrt(k))
    wg = rng.standard_normal((n, k), dtype=np.float32) * scale
    wu = rng.standard_normal((n, k), dtype=np.float32) * scale
    return x, wg, wu


def gelu_tanh_times(g, u):
    """``gelu_tanh(g) * u`` in float32 numpy, as a user writes it (in place, into `g`):
    ``0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) u``, eight passes over the arrays.

    Returns
    -------
    ndarray
        `g`, overwritten.
    """
    t = g * g
    t *= 0.044715
    t += 1
    t *= g
    t *= _SQRT_2_OVER_PI
    np.tanh(t, out=t)
    t += 1
    t *= 0.5
    g *= t
    g *= u
    return g


def _numpy_f32(x, wg, wu):
    wgt, wut = np.ascontiguousarray(wg.T), np.ascontiguousarray(wu.T)
    return lambda: gelu_tanh_times(x @ wgt, x @ wut)


def _pyw8a8(x, wg, wu, fused):
    pg, pu = pack_weight(wg, rotate=False), pack_weight(wu, rotate=False)
    if fused:
        return lambda: matmul_pair(x, pg, pu, glu="gelu_tanh")
    return lambda: gelu_tanh_times(*matmul_pair(x, pg, pu))


def _torch(x, wg, wu, engine):
    import torch
    gate, up = peers.torch_linears(engine, wg, wu)
    gelu = torch.nn.functional.gelu
    tx = torch.from_numpy(x)

    def run():
        with torch.no_grad():
            return gelu(gate(tx), approximate="tanh") * up(tx)
    return run


#: The XNNPACK contender (LiteRT's interpreter), where ai-edge-litert is installed.
XNNPACK = "xnnpack int8"


def _xnnpack(x, wg, wu):
    return peers.xnnpack_ffn(x, wg, wu, gelu_tanh_times(x @ wg.T, x @ wu.T))


def contender_names(with_peers=True):
    """numpy float32, pyw8a8 unfused and fused, then (`with_peers`) XNNPACK where LiteRT is
    installed and torch int8 on each of its engines where torch is."""
    names = ["numpy f32", "pyw8a8 unfused", "pyw8a8 fused"]
    if not with_peers:
        return names
    names += [XNNPACK] if peers.xnnpack_available() else []
    return names + [f"torch {e}" for e in (peers.torch_engines() or ())]


def build_contender(name, m, k, n):
    """The function of no arguments that runs FFN contender `name` (one of
    :func:`contender_names`) at M tokens of width K through an FFN of width N; it returns
    the block's output (M, N)."""
    x, wg, wu = ffn_data(m, k, n)
    kind, _, detail = name.partition(" ")
    if kind == "torch":
        return _torch(x, wg, wu, detail)
    if kind == "xnnpack":
        return _xnnpack(x, wg, wu)
    if kind == "pyw8a8":
        return _pyw8a8(x, wg, wu, fused=detail == "fused")
    return _numpy_f32(x, wg, wu)


def run(shapes, names, rounds, min_time):
    """Median seconds per FFN block of each contender at each shape, each one built and
    timed in a process of its own (as the bench's table: torch and pyw8a8 share an OpenMP
    runtime in one process), in interleaved rounds.

    Returns
    -------
    list of ((M, K, N), dict of str to float)
    """
    with isolated(build_contender, names, _threads.get_num_threads()) as workers:
        return [((m, k, n), measure({name: worker.build(name, m, k, n)
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
    names = contender_names(with_peers)
    rows = run(shapes or SHAPES, names, rounds, min_time)
    print(f"\nGated FFN gelu_tanh(x @ Wg.T) * (x @ Wu.T), M tokens, K -> N; medians of "
          f"interleaved rounds, each contender in a process of its own; pyw8a8 ISA "
          f"{_cpu.isa()}, rotation off; {_threads.get_num_threads()} threads")
    for line in format_rows(rows):
        print(line)
    return 0
