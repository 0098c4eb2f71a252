"""Save and load packed weights as one ``.npz`` file (no pickling): the packed-weight file
format."""

from __future__ import annotations

import lzma
import os
import re
import zipfile
import zlib
from collections import Counter
from collections.abc import Mapping

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
# "<index>/<key>": the index of the name in the name list (ASCII digits, no leading zeros,
# so that two spellings cannot stand for one index) and a `to_dict` key.
_ENTRY_RE = re.compile(r"(0|[1-9][0-9]*)/([^/]+)")
# The first bytes of a zip archive: a file's local header, or the end record of an empty one.
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")

# What reading a damaged or foreign file can raise, beyond the ValueError of np.load:
# zipfile's BadZipFile, EOFError and OSError (a seek outside a truncated file), zlib and
# lzma errors of damaged compressed members, and RuntimeError, which covers zipfile's
# NotImplementedError (unknown compression method) and its error for encrypted members.
_READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, lzma.LZMAError,
                RuntimeError)


def save_packed(path: str | os.PathLike[str], mapping: Mapping[str, PackedWeight]) -> None:
    """Save packed weights to an ``.npz`` file (no pickling).

    Parameters
    ----------
    path : str or path-like
        Destination file (numpy appends ``.npz`` if missing; :func:`load_packed` finds the
        file by the same name, with or without it).
    mapping : dict[str, PackedWeight]
        Tensor name -> packed weight; each must provide ``to_dict()``
        returning ``{str: numpy.ndarray}``.

    Raises
    ------
    TypeError
        If `path` is not a str or path-like, `mapping` is not a mapping (one weight must
        be given a name: ``{"up": packed}``), or one of its values has no ``to_dict()``.
    ValueError
        If a name is not a string or would not read back as itself (numpy string
        arrays drop trailing NUL characters, so ``"a"`` and ``"a\\0"`` would load as one
        name), or a ``to_dict()`` is not a dict of non-object arrays under non-empty
        string keys without ``'/'``.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> import pyw8a8
    >>> w = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    >>> path = os.path.join(tempfile.mkdtemp(), "weights")
    >>> pyw8a8.save_packed(path, {"up": pyw8a8.pack_weight(w)})  # writes weights.npz
    >>> sorted(os.listdir(os.path.dirname(path)))
    ['weights.npz']
    >>> pyw8a8.load_packed(path)["up"].shape  # the same name finds it
    (16, 64)
    >>> pyw8a8.save_packed(path, pyw8a8.pack_weight(w))
    Traceback (most recent call last):
    ...
    TypeError: mapping must be a mapping of tensor names to packed weights ...
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or path-like, got {type(path).__name__}")
    if not isinstance(mapping, Mapping):
        raise TypeError(f"mapping must be a mapping of tensor names to packed weights "
                        f"(one weight: {{'name': packed}}), got {type(mapping).__name__}")
    for name, packed in mapping.items():
        if not callable(getattr(packed, "to_dict", None)):
            raise TypeError(f"mapping[{name!r}] must be a packed weight (with to_dict()), "
                            f"got {type(packed).__name__}")
    arrays = {_FORMAT_KEY: np.array(PACKED_FORMAT_VERSION, dtype=np.int64),
              _NAMES_KEY: _stored_names(list(mapping))}
    for i, (name, packed) in enumerate(mapping.items()):
        arrays.update(_weight_entries(i, name, packed.to_dict()))
    np.savez(path, **arrays)


def _stored_names(names):
    """The tensor names as the string array saved, each checked to read back as itself."""
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"tensor names must be strings, got {name!r}")
    stored = np.array(names, dtype=np.str_)
    for name, back in zip(names, stored.tolist()):
        if back != name:
            raise ValueError(f"tensor name {name!r} cannot be stored: it would load as "
                             f"{back!r} (numpy drops trailing NUL characters)")
    return stored


def _weight_entries(index, name, arrays):
    """The ``"<index>/<key>"`` entries of the packed weight `name`'s ``to_dict()``."""
    if not isinstance(arrays, dict):
        raise ValueError(f"{name}: to_dict() must return a dict")
    entries = {}
    for key, value in arrays.items():
        if not isinstance(key, str) or not key or "/" in key:
            raise ValueError(f"{name}: to_dict() key {key!r} must be a non-empty string "
                             "without '/'")
        arr = np.asarray(value)
        if arr.dtype == object:
            raise ValueError(f"{name}: to_dict()[{key!r}] is an object array")
        entries[f"{index}/{key}"] = arr
    return entries


def _read_members(path):
    """[(entry name, value)] of every member of the ``.npz`` file at `path`, each read (so
    its zip CRC is checked), or None if the file does not start like a zip archive; a
    value is a numpy array, or bytes for a member that is not a ``.npy`` file."""
    with open(path, "rb") as fh:  # a missing or unreadable file raises its own OSError
        # np.load would try anything else as a pickle (refused, with a misleading message)
        # or as a .npy array: neither is a packed-weight file.
        if fh.read(4) not in _ZIP_MAGICS:
            return None
        fh.seek(0)
        try:
            with np.load(fh, allow_pickle=False) as npz:
                return [(f, npz[f]) for f in npz.files]
        except _READ_ERRORS as exc:
            raise ValueError(f"{path}: corrupted or truncated packed-weight file ({exc})") from exc


def _repeated(items):
    """The items that occur more than once, sorted."""
    return sorted(item for item, count in Counter(items).items() if count > 1)


def _describe(value):
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {value.shape}"
    return "raw bytes (not a .npy member)"


def load_packed(path: str | os.PathLike[str],
                cls: type[PackedWeight] = PackedWeight) -> dict[str, PackedWeight]:
    """Load packed weights written by `save_packed`.

    Parameters
    ----------
    path : str or path-like
        The file, with its ``.npz`` suffix (which `save_packed` adds) or without it, as
        it was given to `save_packed`: a name without the suffix that names no file is
        read with it.
    cls : type, default=PackedWeight
        Class with ``from_dict`` that rebuilds each packed weight.

    Returns
    -------
    dict[str, PackedWeight]
        In the order they were saved.

    Raises
    ------
    TypeError
        If `path` is not a str or path-like.
    FileNotFoundError
        If `path` does not exist, with or without ``.npz`` (the message names it).
    OSError
        If `path` cannot be opened otherwise (a directory, no permission).
    ValueError
        If the contents are not a valid packed-weight file; the message names the file
        and, where there is one, the entry or tensor: not an ``.npz`` archive of
        ``save_packed``, corrupted or truncated (a failed zip CRC included), duplicate
        entries or tensor names, an entry of the wrong type or shape, an unsupported
        container format version, or a packed weight ``cls.from_dict`` rejects.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> import pyw8a8
    >>> path = os.path.join(tempfile.mkdtemp(), "weights.npz")
    >>> up = pyw8a8.pack_weight(np.random.default_rng(0).standard_normal((32, 64)))
    >>> pyw8a8.save_packed(path, {"up": up, "down": pyw8a8.pack_weight(np.eye(64))})
    >>> loaded = pyw8a8.load_packed(path)
    >>> list(loaded), loaded["up"].shape  # in the order saved
    (['up', 'down'], (32, 64))
    >>> bool(np.array_equal(loaded["up"].int8(), up.int8()))
    True
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or path-like, got {type(path).__name__}")
    named = os.fspath(path)
    if not os.path.exists(named) and not str(named).endswith(".npz") and \
            os.path.exists(str(named) + ".npz"):
        path = str(named) + ".npz"  # what np.savez wrote for save_packed(path)
    members = _read_members(path)
    if members is None:
        raise ValueError(f"{path}: not a pyw8a8 packed-weight file (not an .npz archive)")
    entries = dict(members)
    names = _container_names(path, entries, _repeated(f for f, _ in members))
    return _packed_weights(path, names, entries, cls)


def _packed_weights(path, names, entries, cls):
    """{name: packed weight} of the ``"<index>/<key>"`` `entries`, rebuilt by `cls`."""
    parts = [{} for _ in names]
    for f, value in entries.items():
        m = _ENTRY_RE.fullmatch(f)
        if m is None or int(m[1]) >= len(names):
            raise ValueError(f"{path}: unexpected entry {f!r}")
        if not isinstance(value, np.ndarray):
            raise ValueError(f"{path}: entry {f!r} is {_describe(value)}, not an array")
        parts[int(m[1])][m[2]] = value
    out = {}
    for name, d in zip(names, parts):
        if not d:
            raise ValueError(f"{path}: no arrays stored for {name!r}")
        try:
            out[name] = cls.from_dict(d)
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}: invalid packed weight {name!r}: {exc}") from exc
    return out


def _container_names(path, entries, repeated):
    """The tensor names of the file's `entries` (its members by name; `repeated`, the names
    of members stored twice), its container entries checked and taken out of `entries`."""
    if not {_FORMAT_KEY, _NAMES_KEY} <= set(entries):
        raise ValueError(f"{path}: not a pyw8a8 packed-weight file (no {_FORMAT_KEY!r} "
                         f"and {_NAMES_KEY!r} entries)")
    if repeated:
        raise ValueError(f"{path}: duplicate entries {repeated}")
    version = entries.pop(_FORMAT_KEY)
    if not (isinstance(version, np.ndarray) and version.shape == ()
            and version.dtype.kind in "iu"):
        raise ValueError(f"{path}: entry {_FORMAT_KEY!r} must be an integer scalar, got "
                         f"{_describe(version)}")
    if int(version) != PACKED_FORMAT_VERSION:
        raise ValueError(f"{path}: unsupported packed format version {int(version)} "
                         f"(this pyw8a8 reads {PACKED_FORMAT_VERSION})")
    names = entries.pop(_NAMES_KEY)
    if not (isinstance(names, np.ndarray) and names.ndim == 1 and names.dtype.kind == "U"):
        raise ValueError(f"{path}: entry {_NAMES_KEY!r} must be a 1-D array of strings, got "
                         f"{_describe(names)}")
    names = names.tolist()
    repeated = _repeated(names)
    if repeated:
        raise ValueError(f"{path}: duplicate tensor names {repeated}")
    return names
