"""`Gemma3Config`: the hyper-parameters of a Gemma 3 text model, and the names of its tied
tensors."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

__all__ = ["EMBEDDING_NAME", "OUTPUT_NAME", "Gemma3Config"]

#: Name passed to the linear factory for the tied output (logits) layer.
OUTPUT_NAME = "output"
#: GGUF name of the token embedding (also the output weight: tied).
EMBEDDING_NAME = "token_embd.weight"


def _gguf(default, key):
    """A field read by `Gemma3Config.from_metadata` from the GGUF metadata `key`
    (``{arch}`` stands for the architecture name)."""
    return field(default=default, metadata={"gguf": key})


@dataclass(frozen=True)
class Gemma3Config:
    """Hyper-parameters of a Gemma 3 text model (defaults: 270M)."""

    vocab_size: int = 262144
    hidden_size: int = _gguf(640, "{arch}.embedding_length")
    n_layers: int = _gguf(18, "{arch}.block_count")
    ffn_size: int = _gguf(2048, "{arch}.feed_forward_length")
    n_heads: int = _gguf(4, "{arch}.attention.head_count")
    n_kv_heads: int = _gguf(1, "{arch}.attention.head_count_kv")
    head_dim: int = _gguf(256, "{arch}.attention.key_length")
    rms_eps: float = _gguf(1e-6, "{arch}.attention.layer_norm_rms_epsilon")
    rope_base_global: float = _gguf(1_000_000.0, "{arch}.rope.freq_base")
    rope_base_local: float = 10_000.0
    sliding_window: int = _gguf(512, "{arch}.attention.sliding_window")
    #: Layer i is global when ``i % sliding_window_pattern == pattern - 1``.
    sliding_window_pattern: int = 6
    #: Gemma's ``query_pre_attn_scalar``; attention scale is its -1/2 power.
    query_pre_attn_scalar: float = 256.0
    bos_id: int = _gguf(2, "tokenizer.ggml.bos_token_id")
    eos_id: int = _gguf(1, "tokenizer.ggml.eos_token_id")

    @classmethod
    def from_metadata(cls, meta: dict) -> "Gemma3Config":
        """Read what GGUF metadata provides; the rest keeps the Gemma 3 defaults."""
        arch = meta.get("general.architecture", "gemma3")
        if arch != "gemma3":
            raise ValueError(f"expected a gemma3 model, got architecture {arch!r}")
        kwargs = {}
        for f in fields(cls):
            key = f.metadata.get("gguf", "").format(arch=arch)
            if key and key in meta:
                kwargs[f.name] = float(meta[key]) if f.type in (float, "float") else int(meta[key])
        value_len = meta.get(f"{arch}.attention.value_length")
        if value_len is not None and int(value_len) != kwargs.get("head_dim", cls.head_dim):
            raise ValueError("key_length != value_length is not supported")
        return cls(**kwargs)

    @classmethod
    def from_weights(cls, weights: dict, **overrides) -> "Gemma3Config":
        """Infer the shape parameters from the tensors themselves."""
        emb = weights[EMBEDDING_NAME]
        n_layers = 0
        while f"blk.{n_layers}.attn_q.weight" in weights:
            n_layers += 1
        head_dim = int(weights["blk.0.attn_q_norm.weight"].shape[0])
        kw = dict(
            vocab_size=int(emb.shape[0]),
            hidden_size=int(emb.shape[1]),
            n_layers=n_layers,
            ffn_size=int(weights["blk.0.ffn_gate.weight"].shape[0]),
            n_heads=int(weights["blk.0.attn_q.weight"].shape[0]) // head_dim,
            n_kv_heads=int(weights["blk.0.attn_k.weight"].shape[0]) // head_dim,
            head_dim=head_dim,
        )
        kw.update(overrides)
        return cls(**kw)

    def is_global(self, layer: int) -> bool:
        p = self.sliding_window_pattern
        return layer % p == p - 1

    def to_dict(self) -> dict:
        return asdict(self)


