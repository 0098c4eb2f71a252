"""``bench --torch``'s second table: torch and pyw8a8 in one process, each against itself
alone.  Three fresh processes time the encoder's ``encode`` in rounds: **torch alone**
(the float model, pyw8a8 never imported; torch's share is the time outside its
``nn.Linear`` layers), **both** (the pyw8a8 model, activations unfused: torch's share
outside the pyw8a8 layers, pyw8a8's inside), and **pyw8a8 alone** (the very products the
"both" model made, replayed with :func:`pyw8a8.matmul`, torch never imported, back to
back and with the caches swept before each product, as the model's other layers evict
a product's weight and input).  The three take turns PASSES times, each keeping the
memory it frees (KEEP_FREED_MEMORY)."""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from ..lab.processes import run_once
from ..lab.record import markdown_table
from ..lab.turns import take_turns
from . import encode_timing

#: At most this many encodes warm pyw8a8's model up before it is timed (settle_tuning):
#: the encoder's shapes settled after 8-11 on a Zen 3 (up to 19 candidates a shape).
SETTLE_ENCODES = 16


def settle_tuning(encode) -> int:
    """Call `encode()` until pyw8a8's tuner has settled every shape it met, at most
    SETTLE_ENCODES times; how many calls that took.  Timed before, rounds would time the
    candidates being tried (up to 1.13x the fastest's time, 672 x 384 x 1536 on a Zen 3)."""
    from .. import tuning
    calls = 0
    while calls < SETTLE_ENCODES and (calls == 0 or tuning.unsettled()):
        encode()
        calls += 1
    return calls


def both(texts, rounds):
    """The "both" process: the pyw8a8 encoder's time inside torch and inside pyw8a8."""
    import torch

    import pyw8a8.torch as pt
    model = pt.quantize(encode_timing.load_encoder(), fuse=False)
    with torch.inference_mode():
        settle_tuning(lambda: model.encode(texts, batch_size=32))
    total, linear, calls = encode_timing.timed_encodes(model, texts, pt.Linear, rounds)
    return {"torch": total - linear, "pyw8a8": linear, "calls": calls}


#: The least the swept replay reads: past the L3 of the 2-vCPU machines measured (32 MiB
#: on Zen 3 and 4, up to 105 MiB on the AMX Xeons).
SWEEP_BYTES = 128 << 20


def sweep_bytes(cache_dir="/sys/devices/system/cpu/cpu0/cache"):
    """Bytes read before each product of the swept replay: twice the last-level cache Linux
    reports under `cache_dir`, at least SWEEP_BYTES."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    caches = []
    for index in Path(cache_dir).glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
            caches.append((level, int(size[:-1]) * units[size[-1]] if size[-1] in units
                           else int(size)))
        except (OSError, ValueError):
            continue
    return max(SWEEP_BYTES, 2 * max(caches)[1]) if caches else SWEEP_BYTES


def pyw8a8_alone(calls, rounds):
    """The encode's products replayed (a weight and bias per layer, an input per call, as in
    the model), each round back to back, then with sweep_bytes() read before each product."""
    import numpy as np

    from .._probes import read_bytes
    from .._threads import get_num_threads
    from ..matmul import matmul
    from ..packing import pack_weight
    rng = np.random.default_rng(0)
    weights = {layer: pack_weight(rng.standard_normal((n, k), np.float32))
               for _, k, n, layer in calls}
    biases = {layer: rng.standard_normal(n).astype(np.float32) for _, _, n, layer in calls}
    inputs = [rng.standard_normal((m, k), np.float32) for m, k, _, _ in calls]
    sweep = np.ones(sweep_bytes(), np.uint8)

    def replay(swept=False):
        seconds = 0.0
        for x, (_, _, _, layer) in zip(inputs, calls):
            if swept:
                read_bytes(sweep, get_num_threads())
            t0 = time.perf_counter()
            matmul(x, weights[layer], bias=biases[layer])
            seconds += time.perf_counter() - t0
        return seconds
    settle_tuning(replay)
    hot, swept = [], []
    for i in range(rounds + 1):
        hot.append(replay())
        swept.append(replay(swept=True))
    assert "torch" not in sys.modules
    return {"pyw8a8": statistics.median(hot[1:]), "pyw8a8 swept": statistics.median(swept[1:])}


# glibc hands freed memory back, and a model's 18 MiB activations then come back as fresh
# pages, faulted and zeroed (40% of an encode on the Zen 5), which the replay would never
# pay: every process keeps what it frees.
KEEP_FREED_MEMORY = {"MALLOC_TRIM_THRESHOLD_": str(4 << 30), "MALLOC_MMAP_THRESHOLD_": str(1 << 30)}


def _in_process(name, *args):
    """What the function `name` returns in a fresh process that keeps its freed memory."""
    return run_once(name, *args, env=KEEP_FREED_MEMORY, timeout=1800, capture_stderr=True)


#: Turns of the three processes: with one, what pyw8a8 kept beside torch ranged from
#: 0.82x to 0.99x between runs of one tree (Zen 4).
PASSES = 3


def run(texts: list[str], rounds: int) -> dict[str, float]:
    """Each library's share of an encode beside the other and alone, in seconds: the median
    over PASSES turns of the three processes."""
    made = []  # each pass's "both" result: the products the replay repeats

    def both_pass(i):
        made.append(_in_process(f"{__name__}:both", texts, rounds))
        return made[-1]
    passes = take_turns({
        "both": both_pass,
        "torch alone": lambda i: _in_process(f"{encode_timing.__file__}:torch_alone",
                                             texts, rounds),
        "pyw8a8 alone": lambda i: _in_process(f"{__name__}:pyw8a8_alone", made[i]["calls"],
                                              rounds)}, PASSES, settle=0)
    shares = {"torch beside": [p["torch"] for p in passes["both"]],
              "pyw8a8 beside": [p["pyw8a8"] for p in passes["both"]],
              "torch alone": [p["torch"] for p in passes["torch alone"]],
              "pyw8a8 alone": [p["pyw8a8"] for p in passes["pyw8a8 alone"]],
              "pyw8a8 alone swept": [p["pyw8a8 swept"] for p in passes["pyw8a8 alone"]]}
    return {key: statistics.median(values) for key, values in shares.items()}


def format_table(shares: dict[str, float]) -> list[str]:
    rows = [("torch", "torch alone", "torch beside"), ("pyw8a8", "pyw8a8 alone", "pyw8a8 beside"),
            ("pyw8a8, caches swept alone", "pyw8a8 alone swept", "pyw8a8 beside")]
    lines = markdown_table(
        ["share of an encode", "alone ms", "beside the other ms", "kept of its speed"],
        [[label, f"{shares[a] * 1e3:.1f}", f"{shares[b] * 1e3:.1f}",
          f"{shares[a] / shares[b]:.2f}x"] for label, a, b in rows], "lrrr")
    lines.append("torch: attention, LayerNorm, GELU and the rest of the encode; pyw8a8: its "
                 "linear layers (replayed alone with pyw8a8.matmul, torch not imported); caches "
                 f"swept: {sweep_bytes() >> 20} MiB read before each product alone, as the "
                 "model's other layers move its activations through the caches between them")
    return lines
