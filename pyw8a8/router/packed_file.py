"""Save and load packed weights as one ``.npz`` file (no pickling): the packed-weight file format."""

from __future__ import annotations

import zipfile

import numpy as np

from ..packing import PackedWeight

__all__ = ["PACKED_FORMAT_VERSION", "load_packed", "save_packed"]

#: Version of the container layout written by `save_packed` (the name list and the
#: ``"<index>/<key>"`` entries).  It is not the packed weight's own layout version: each
#: weight's `PackedWeight.to_dict` arrays carry that one (set in `pyw8a8.packing`), and
#: `PackedWeight.from_dict` checks it, so either layout can change without the other.
PACKED_FORMAT_VERSION = 1

_FORMAT_KEY = "__pyw8a8_packed_format__"
_NAMES_KEY = "__names__"


def save_packed(path, mapping: dict) -> None:
    """Save packed weights to an ``.npz`` file (no pickling).

    Parameters
    ----------
    path : str or path-like
        Destination file (numpy appends ``.npz`` if missing).
    mapping : dict[str, PackedWeight]
        Tensor name -> packed weight; each must provide ``to_dict()``
        returning ``{str: numpy.ndarray}``.
    """
    arrays = {
        _FORMAT_KEY: np.array(PACKED_FORMAT_VERSION, dtype=np.int64),
        _NAMES_KEY: np.array(list(mapping.keys()), dtype=np.str_),
    }
    for i, (name, packed) in enumerate(mapping.items()):
        if not isinstance(name, str):
            raise ValueError(f"tensor names must be strings, got {name!r}")
        d = packed.to_dict()
        if not isinstance(d, dict):
            raise ValueError(f"{name}: to_dict() must return a dict")
        for key, value in d.items():
            if "/" in key:
                raise ValueError(f"{name}: to_dict() key {key!r} must not contain '/'")
            arr = np.asarray(value)
            if arr.dtype == object:
                raise ValueError(f"{name}: to_dict()[{key!r}] is an object array")
            arrays[f"{i}/{key}"] = arr
    np.savez(path, **arrays)


def load_packed(path, cls=PackedWeight) -> dict:
    """Load packed weights written by `save_packed`.

    Parameters
    ----------
    path : str or path-like
    cls : type, default=PackedWeight
        Class with ``from_dict`` that rebuilds each packed weight.

    Returns
    -------
    dict[str, PackedWeight]

    Raises
    ------
    ValueError
        If the file is corrupted, truncated, not a packed-weight file or of
        an unsupported format version.
    """
    try:
        with np.load(path, allow_pickle=False) as npz:
            files = set(npz.files)
            if _FORMAT_KEY not in files or _NAMES_KEY not in files:
                raise ValueError(f"{path}: not a pyw8a8 packed-weight file")
            version = int(npz[_FORMAT_KEY])
            if version != PACKED_FORMAT_VERSION:
                raise ValueError(
                    f"{path}: unsupported packed format version {version} "
                    f"(this pyw8a8 reads {PACKED_FORMAT_VERSION})"
                )
            names = [str(n) for n in npz[_NAMES_KEY].tolist()]
            parts = [dict() for _ in names]
            for f in files:
                if f in (_FORMAT_KEY, _NAMES_KEY):
                    continue
                idx, sep, key = f.partition("/")
                if not sep or not idx.isdigit() or int(idx) >= len(names):
                    raise ValueError(f"{path}: unexpected entry {f!r}")
                parts[int(idx)][key] = npz[f]  # reading checks the CRC
    except ValueError as exc:
        msg = str(exc)
        if str(path) in msg:
            raise
        raise ValueError(f"{path}: corrupted or truncated packed-weight file ({msg})") from exc
    except (zipfile.BadZipFile, EOFError, OSError, KeyError) as exc:
        raise ValueError(f"{path}: corrupted or truncated packed-weight file ({exc})") from exc
    out = {}
    for name, d in zip(names, parts):
        if not d:
            raise ValueError(f"{path}: no arrays stored for {name!r}")
        try:
            out[name] = cls.from_dict(d)
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}: invalid packed weight {name!r}: {exc}") from exc
    return out
