"""``bench --torch --torch-models checkpoint``: Gemma 3 270M kept as a transformers user
keeps a quantized model.  The float model is saved once as a transformers checkpoint;
then, each in a fresh process: ``from_pretrained`` with :class:`~pyw8a8.torch.W8A8Config`
(which then saves the int8 checkpoint with ``save_pretrained``), ``from_pretrained`` of
that int8 checkpoint, and :func:`pyw8a8.torch.quantize` of the float model loaded alone.

For each: the load's seconds, the process's resident memory after it and its peak during
it, above a baseline with the libraries warmed (a tiny Gemma 3 built and run first), over
the float checkpoint's bytes; and whether its greedy tokens and logits are the
W8A8Config load's, bit for bit.  The targets: the int8 checkpoint at most 0.30x the float
one's bytes, a loaded model's resident memory at most 0.35x, loading with W8A8Config
peaking at most 1.3x, the reloaded model the saved one's bits."""
from __future__ import annotations

import gc
import os
import resource
import tempfile
import time
from pathlib import Path

from ..lab.processes import run_once

ROUTES = ("W8A8Config", "saved int8", "quantize")
#: A fixed prompt of Gemma 3 token ids ("The capital of France is Paris. The capital of
#: Germany is"), and the greedy tokens generated after it.
PROMPT = [2, 651, 6037, 576, 6081, 603, 7127, 235265, 714, 6037, 576, 9066, 603]
NEW_TOKENS = 16


def save_float(directory: str) -> None:
    """Gemma 3 270M (float32, from the package index's GGUF) saved by save_pretrained."""
    from .torch_lm import load_lm
    model, _ = load_lm()
    model.save_pretrained(Path(directory) / "float")


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _warm() -> None:
    """A tiny Gemma 3 built, run and dropped: the code a load runs is then in the
    baseline, not in the model's figures."""
    import torch
    from transformers import AutoModelForCausalLM, Gemma3TextConfig
    tiny = AutoModelForCausalLM.from_config(Gemma3TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, vocab_size=128))
    with torch.inference_mode():
        tiny(torch.tensor([[1, 2]]))
    del tiny
    gc.collect()


def load_route(route: str, directory: str) -> dict:
    """In its own process: the model loaded by `route`, its memory and its outputs (saved
    beside the checkpoints for the parent to compare)."""
    import torch
    import transformers
    import transformers.quantizers.auto  # noqa: F401  (as from_pretrained imports it)

    import pyw8a8.torch as pt
    directory = Path(directory)
    _warm()
    base = _resident()
    start = time.perf_counter()
    load = transformers.AutoModelForCausalLM.from_pretrained
    if route == "W8A8Config":
        model = load(directory / "float", dtype=torch.float32,
                     quantization_config=pt.W8A8Config())
    elif route == "saved int8":
        model = load(directory / "int8")
    else:
        model = pt.quantize(load(directory / "float", dtype=torch.float32), inplace=True)
    seconds = time.perf_counter() - start
    gc.collect()
    resident, peak = _resident() - base, _peak() - base
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        logits = model(ids).logits
        tokens = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    if route == "W8A8Config":
        model.save_pretrained(directory / "int8")
    torch.save({"logits": logits, "tokens": tokens}, directory / f"{route}.pt")
    return {"seconds": seconds, "resident": resident, "peak": peak}


def _bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.iterdir() if f.suffix == ".safetensors")


def run(progress=print, save: str = f"{__name__}:save_float") -> tuple[list[dict], dict]:
    """Each route's row, and the two checkpoints' bytes; `save` names the function that
    writes the float model into ``<directory>/float`` (its own process; the tests' writes a
    tiny one)."""
    import torch
    with tempfile.TemporaryDirectory() as directory:
        progress("bench checkpoint: the float model saved as a transformers checkpoint")
        run_once(save, directory, capture_stderr=True)
        rows = []
        for route in ROUTES:
            progress(f"bench checkpoint: {route}")
            rows.append({"route": route, **run_once(f"{__name__}:load_route", route,
                                                     directory, capture_stderr=True)})
        outputs = {r: torch.load(Path(directory) / f"{r}.pt") for r in ROUTES}
        sizes = {"float": _bytes(Path(directory) / "float"),
                 "int8": _bytes(Path(directory) / "int8")}
    for row in rows:
        ours, first = outputs[row["route"]], outputs[ROUTES[0]]
        row["same tokens"] = torch.equal(ours["tokens"], first["tokens"])
        row["same logits"] = torch.equal(ours["logits"], first["logits"])
    return rows, sizes


def format_table(rows: list[dict], sizes: dict) -> list[str]:
    from ..lab.record import markdown_table
    whole = sizes["float"]
    lines = ["", f"Gemma 3 270M kept in int8: the float checkpoint {whole / 1e6:.0f} MB, the "
             f"int8 one save_pretrained wrote {sizes['int8'] / 1e6:.0f} MB "
             f"({sizes['int8'] / whole:.2f}x); each load in a fresh process, memory above "
             f"a warmed baseline, over the float checkpoint's bytes"]
    header = ["route", "load s", "resident MB", "resident / float", "peak MB",
              "peak / float", f"greedy {NEW_TOKENS} tokens as W8A8Config's",
              "logits as W8A8Config's"]
    body = [[r["route"], f"{r['seconds']:.1f}", f"{r['resident'] / 1e6:.0f}",
             f"{r['resident'] / whole:.2f}x", f"{r['peak'] / 1e6:.0f}",
             f"{r['peak'] / whole:.2f}x", "yes" if r["same tokens"] else "no",
             "bit for bit" if r["same logits"] else "no"] for r in rows]
    return lines + markdown_table(header, body, "lrrrrrll")


def main(progress=print) -> int:
    """The table; status 1 (with the reason printed) where a package is missing."""
    try:
        from .torch_lm import _imports
        _imports()
        rows, sizes = run(progress)
    except ImportError as exc:
        print(f"bench --torch checkpoint: {exc}")
        return 1
    print("\n".join(format_table(rows, sizes)))
    return 0
