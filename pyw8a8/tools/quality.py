"""``python -m pyw8a8 quality``: the SQNR (dB against float64; higher is better) of plain,
rotated, scaled and rotated + scaled W8A8 on synthetic FFN data with the outliers that
make LLM activations hard to quantize per token (rows of widely different magnitude, a
few input channels 10-50x the rest, hidden channels with large up rows and small down
columns), at ``gate/up`` (the input projections), ``down`` (the down projection of the
exact hidden activation) and ``FFN`` (the whole W8A8 chain)."""
import argparse
import math

import numpy as np

from ..matmul import matmul, matmul_pair
from ..packing import pack_weight
from ..rotation import MAX_BLOCK, MAX_SEED, MIN_BLOCK
from ..scaling import equalize_ffn


def gelu_tanh(z):
    """GELU with the tanh approximation (Gemma's), in the input's dtype."""
    return 0.5 * z * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (z + 0.044715 * z**3)))


def sqnr_db(reference, approx):
    """10 log10(sum(reference^2) / sum((approx - reference)^2)), computed in float64."""
    ref = np.asarray(reference, dtype=np.float64)
    err = np.asarray(approx, dtype=np.float64) - ref
    return float(10.0 * np.log10(np.sum(ref**2) / max(np.sum(err**2), 1e-300)))


def synthetic_ffn(m=64, d=1024, f=2048, n_outliers=4, seed=0):
    """Activations and gated-FFN weights of `m` tokens, width `d`, hidden width `f`, with
    `n_outliers` input channels scaled 10-50x (and twice as many hidden ones made larger).

    Returns
    -------
    x : ndarray of float64, shape (m, d)
    w_gate, w_up : ndarray of float64, shape (f, d)
    w_down : ndarray of float64, shape (d, f)"""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, d)) * np.exp(rng.normal(0.0, 1.0, (m, 1)))
    x[:, rng.choice(d, n_outliers, replace=False)] *= rng.uniform(10, 50, n_outliers)
    w_gate = rng.standard_normal((f, d)) / np.sqrt(d)
    w_up = rng.standard_normal((f, d)) / np.sqrt(d)
    w_down = rng.standard_normal((d, f)) / np.sqrt(f)
    # Hidden channels with large up rows and small down columns (one is not the inverse of
    # the other, so equalization has something to balance without being trivial).
    hidden = rng.choice(f, 2 * n_outliers, replace=False)
    w_up[hidden] *= rng.uniform(4, 16, (hidden.size, 1))
    w_down[:, hidden] /= rng.uniform(2, 8, hidden.size)
    return x, w_gate, w_up, w_down


def ffn_float(x, w_gate, w_up, w_down):
    """The float64 reference FFN output, shape (m, d)."""
    return (gelu_tanh(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def evaluate(x, w_gate, w_up, w_down, blocks=(64, 128), seed=0):
    """SQNR (dB) of each configuration on `x` (m, d), `w_gate`, `w_up` (f, d) and `w_down`
    (d, f), float64, rotated with `blocks` and `seed`.

    Returns
    -------
    list of (str, float, float, float)
        (configuration, gate/up, down, FFN SQNR): plain, rotated per block, scaled, scaled +
        rotated per block."""
    ref_gate = x @ w_gate.T
    ref_ffn = ffn_float(x, w_gate, w_up, w_down)
    eq_gate, eq_up, eq_down, _ = equalize_ffn(w_gate, w_up, w_down)
    configs = [("plain", False, 0)] + [(f"rotated b{b}", False, b) for b in blocks]
    configs += [("scaled", True, 0)] + [(f"scaled+rotated b{b}", True, b) for b in blocks]
    rows = []
    for name, scaled, block in configs:
        wg, wu, wd = (eq_gate, eq_up, eq_down) if scaled else (w_gate, w_up, w_down)
        opts = dict(rotate=True, block=block, seed=seed) if block else dict(rotate=False)
        pg, pu, pd = (pack_weight(w, **opts) for w in (wg, wu, wd))
        gate, up = matmul_pair(x, pg, pu)
        # The scaled up projection's output is t * (x @ w_up.T); compare like with like.
        up_sqnr = sqnr_db(np.concatenate([ref_gate, x @ wu.T], axis=1),
                          np.concatenate([gate, up], axis=1))
        hidden = gelu_tanh(ref_gate) * (x @ wu.T)
        down_sqnr = sqnr_db(hidden @ wd.T, matmul(hidden, pd))
        chain = matmul(gelu_tanh(gate.astype(np.float64)) * up, pd)
        rows.append((name, up_sqnr, down_sqnr, sqnr_db(ref_ffn, chain)))
    return rows


def format_table(rows):
    """The rows of :func:`evaluate` as a fixed-width text table."""
    lines = [f"{'configuration':<22}{'gate/up dB':>12}{'down dB':>10}{'FFN dB':>10}"]
    lines += [f"{name:<22}{up:>12.2f}{down:>10.2f}{out:>10.2f}"
              for name, up, down, out in rows]
    return "\n".join(lines)


def check_options(tokens, width, hidden, outliers, blocks, seed):
    """A ValueError naming the first bad option of ``quality``: a size below 1, more outliers
    than `width` input channels or `hidden` / 2 hidden ones, a block of `blocks` that is not
    a power of two from 16 to 4096 dividing `width` and `hidden`, or a seed outside
    [0, 2**32 - 1]."""
    for option, value in (("--tokens", tokens), ("--width", width), ("--hidden", hidden)):
        if value < 1:
            raise ValueError(f"{option} must be >= 1, got {value}")
    most = min(width, hidden // 2)
    if not 0 <= outliers <= most:
        raise ValueError(f"--outliers must be from 0 to {most} (at most --width input "
                         f"channels and half of --hidden), got {outliers}")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"--seed must be from 0 to 2**32 - 1, got {seed}")
    fits = [b for b in (2**i for i in range(MIN_BLOCK.bit_length() - 1,
                                             MAX_BLOCK.bit_length()))
            if math.gcd(width, hidden) % b == 0]
    for block in blocks:
        if block not in fits:
            raise ValueError(f"--blocks {block}: a block must be a power of two from "
                             f"{MIN_BLOCK} to {MAX_BLOCK} dividing --width {width} and "
                             f"--hidden {hidden}; fitting blocks: "
                             f"{' '.join(map(str, fits)) or 'none'}")


def main(argv=None):
    """``python -m pyw8a8 quality``: the SQNR table; exit status 0, or 2 for a bad option."""
    parser = argparse.ArgumentParser(
        prog="python -m pyw8a8 quality",
        description="SQNR of W8A8 (plain, rotated, scaled, both) on synthetic FFN data "
                    "with outlier channels, against float64.")
    parser.add_argument("--tokens", type=int, default=64, help="rows of x (default 64)")
    parser.add_argument("--width", type=int, default=1024, help="model width D (1024)")
    parser.add_argument("--hidden", type=int, default=2048, help="hidden width F (2048)")
    parser.add_argument("--outliers", type=int, default=4,
                        help="outlier input channels (default 4)")
    parser.add_argument("--blocks", type=int, nargs="+", default=[64, 128],
                        help="rotation block sizes (default 64 128)")
    parser.add_argument("--seed", type=int, default=0, help="data and rotation seed")
    args = parser.parse_args(argv)
    try:
        check_options(args.tokens, args.width, args.hidden, args.outliers, args.blocks,
                      args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    data = synthetic_ffn(args.tokens, args.width, args.hidden, args.outliers, args.seed)
    print(f"synthetic gated FFN: {args.tokens} tokens, D={args.width}, F={args.hidden}, "
          f"{args.outliers} outlier input channels; SQNR vs float64 (higher is better)")
    print(format_table(evaluate(*data, blocks=args.blocks, seed=args.seed)))
    return 0
