"""The saved format of a packed weight: its format versions, the arrays of ``to_dict`` and
the checks that a weight read back (from a file or a pickle) is one this version can run.

A file is read with every check, its contents included (`read_dict`); a pickle is trusted
code anyway, so unpickling checks the format, the settings and the layout only
(`checked`), which keeps it O(1) beyond the copy of the bytes.
"""
import operator

import numpy as np

from .._kernels import FORMAT_PADDED, FORMAT_UNPADDED
from ..rotation import MAX_BLOCK, MAX_SEED, MIN_BLOCK, check_rotation
from .panels import ENCODINGS

# Written with the lowest format that holds them: unpadded weights stay readable by older
# versions.
FORMAT_VERSIONS = (FORMAT_UNPADDED, FORMAT_PADDED)
_READS = ", ".join(map(str, FORMAT_VERSIONS))


def format_version(k, rotated_k):
    """The lowest format that holds a weight of K = `k` features stored as `rotated_k`."""
    return FORMAT_PADDED if rotated_k != k else FORMAT_UNPADDED


def check_rotate(value):
    """The `rotate` setting of a packed weight, as a bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"packed weight rotate must be a bool, got {value!r}")
    return bool(value)


def check_block(value):
    """The rotation block of a packed weight: a power of two in [MIN_BLOCK, MAX_BLOCK]."""
    try:
        block = operator.index(value)
    except TypeError:
        raise ValueError(f"packed weight block must be an int, got {value!r}") from None
    if not (MIN_BLOCK <= block <= MAX_BLOCK and block & (block - 1) == 0):
        raise ValueError(f"packed weight block must be a power of two from {MIN_BLOCK} to "
                         f"{MAX_BLOCK}, got {block}")
    return block


def check_seed(value):
    """The rotation seed of a packed weight, in [0, 2**32 - 1]."""
    try:
        seed = operator.index(value)
    except TypeError:
        raise ValueError(f"packed weight seed must be an int, got {value!r}") from None
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"packed weight seed must be in [0, 2**32 - 1], got {seed}")
    return seed


def as_dict(weight):
    """The arrays that describe `weight` (a PackedWeight), for ``np.savez``."""
    return {
        "format_version": np.array(weight._format_version(), dtype=np.int64),
        "shape": np.array(weight.shape, dtype=np.int64),
        "encoding": np.array(ENCODINGS.index(weight.encoding), dtype=np.int64),
        "rotation": np.array([int(weight.rotate), weight.block, weight.seed],
                             dtype=np.int64),
        "panels": weight.panels,
        "psum": weight.psum,
        "scales": weight.scales,
    }


def pickled_version(version):
    """The format of a pickled weight, checked."""
    try:
        version = int(version)
    except (TypeError, ValueError):
        raise ValueError(f"not a pickled packed weight: format {version!r}") from None
    if version not in FORMAT_VERSIONS:
        raise ValueError(f"packed weight format {version} is not supported (pickled by a "
                         f"newer pyw8a8? this one reads {_READS})")
    return version


def checked(cls, version, shape, encoding, rotate, block, seed, panels, psum, scales):
    """A weight of class `cls` of these settings and arrays, its version, settings and
    layout checked (O(1); not its contents)."""
    if version not in FORMAT_VERSIONS:
        raise ValueError(f"packed weight format {version} is not supported "
                         f"(this pyw8a8 reads {_READS})")
    if rotate:
        try:  # format 1 predates the zero-padded last block
            check_rotation(shape[1], block, seed, "w", pad=version >= FORMAT_PADDED)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"packed weight rotation: {exc}") from None
    panels, psum, scales = (np.require(a, requirements=["C", "A"])
                            if isinstance(a, np.ndarray) else a
                            for a in (panels, psum, scales))
    weight = cls(shape, encoding, panels, psum, scales, bool(rotate), block, seed)
    weight.check_layout()
    return weight


def read_dict(cls, d):
    """A weight of class `cls` from `as_dict` arrays (a mapping, perhaps an ``np.load``
    file), every size, dtype and content checked: see ``PackedWeight.from_dict``."""
    import zipfile  # only to name its errors: imported when a file is read
    import zlib
    try:
        version = int(d["format_version"])
        n, k = (int(v) for v in d["shape"])
        index = int(d["encoding"])
        if not 0 <= index < len(ENCODINGS):
            raise IndexError(f"encoding index {index}")
        rotate, block, seed = (int(v) for v in d["rotation"])
        panels, psum, scales = d["panels"], d["psum"], d["scales"]
    # The others: reading a member of a damaged np.load file.
    except (KeyError, ValueError, IndexError, TypeError, EOFError, OSError,
            zipfile.BadZipFile, zlib.error) as exc:
        raise ValueError(f"not a packed weight: {exc!r}") from None
    weight = checked(cls, version, (n, k), ENCODINGS[index], rotate, block, seed, panels,
                     psum, scales)
    weight.check_contents()
    return weight
