"""The same W8A8 product on a dask cluster: activations as a ``dask.array``, chunked by rows.

Needs the optional extra ``pip install ".[dask]"`` in the pyw8a8 checkout (``dask[array]`` and
``distributed``)::

    import pyw8a8.dask
    weight = pyw8a8.dask.pack_weight(w)          # pack on the client, ship to every worker once
    y = pyw8a8.dask.matmul(x, weight)            # x: dask.array (..., K), chunked by rows

Each chunk runs the ordinary :func:`pyw8a8.matmul`, so the result is bit-identical to the
in-process product of the whole array. With a ``distributed.Client`` (the default client,
or ``client=``) the packed weight is scattered to every worker once and each chunk's task
reads it from its worker's memory; without one (dask's local schedulers) it is one key of
the graph, shared by every chunk.
"""
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ._validation import float_array
from .matmul import matmul as _w8a8_matmul
from .packing import PackedWeight
from .packing import pack_weight as _pack_weight
from .quantize import quantize_rows

if TYPE_CHECKING:
    from distributed import Client

try:
    import dask
    import dask.array as da
    from dask.delayed import Delayed
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('pyw8a8.dask needs dask[array] and distributed: pip install '
                      '".[dask]" in the pyw8a8 checkout') from exc


def _default_client(client):
    """The client to ship weights with: `client`, else distributed's default, else None."""
    if client is not None:
        return client
    try:
        from distributed import default_client
    except ImportError:
        return None
    try:
        return default_client()
    except ValueError:  # no client in this process: dask's local schedulers
        return None


def _check_layout(packed, name):
    """Check a PackedWeight on the client, before it is shipped, naming the argument."""
    try:
        packed.check_layout()
    except ValueError as exc:
        raise ValueError(f"{name} is not a consistent PackedWeight: {exc}") from None


class SharedWeight:
    """A :class:`~pyw8a8.PackedWeight` held by a dask cluster, for use in many graphs.

    Made by :func:`pack_weight`; pass it to :func:`matmul` as often as needed. With a
    ``distributed`` client the weight lives on every worker (scattered once, replicated
    on all of them) for as long as this object is referenced; without one it is a
    ``dask.delayed`` value shared by every chunk of a graph.

    Attributes
    ----------
    shape : tuple of int
        (N, K) of the weight.
    packed_repr : str
        The repr of the packed weight (block, padding, encoding, size).
    ref : distributed.Future or dask.delayed.Delayed
        What the graphs' tasks take as their weight argument.

    Raises
    ------
    TypeError
        If `packed` is not a PackedWeight.
    ValueError
        If its settings or arrays are inconsistent (see
        :meth:`~pyw8a8.PackedWeight.check_layout`).
    """

    __slots__ = ("shape", "packed_repr", "ref")

    shape: tuple[int, int]
    packed_repr: str
    ref: Any  # a distributed.Future or a dask Delayed

    def __init__(self, packed: PackedWeight, client: "Client | None" = None) -> None:
        if not isinstance(packed, PackedWeight):
            raise TypeError(f"packed must be a PackedWeight, got {type(packed).__name__}")
        _check_layout(packed, "packed")
        self.shape = packed.shape
        self.packed_repr = repr(packed)
        client = _default_client(client)
        if client is not None:
            # One transfer per worker; hash=True names the data by its contents, so
            # shipping the same weight again reuses the copies the workers already hold.
            self.ref = client.scatter(packed, broadcast=True, hash=True)
        else:
            self.ref = dask.delayed(packed, name=f"pyw8a8-weight-{uuid.uuid4().hex}")

    def __repr__(self) -> str:
        where = ("in the graph" if isinstance(self.ref, Delayed)
                 else f"on the cluster's workers, key {self.ref.key}")
        return f"SharedWeight({self.packed_repr}, {where})"


def pack_weight(w: npt.ArrayLike | PackedWeight, *, client: "Client | None" = None,
                **kwargs: Any) -> SharedWeight:
    """Pack a weight on the client and ship it to the cluster once, for many graphs.

    Parameters
    ----------
    w : array_like of float32 or float64, shape (N, K)
        Weights in the ``torch.nn.Linear.weight`` layout; a PackedWeight is shipped as is.
    client : distributed.Client, optional
        Where to ship it (default: distributed's default client; without one, a
        ``dask.delayed`` value for dask's local schedulers).
    **kwargs
        Packing options of :func:`pyw8a8.pack_weight` (``encoding``, ``rotate``,
        ``block``, ``seed``, ``pad``).

    Returns
    -------
    SharedWeight
        For :func:`matmul`; the workers keep the weight while it is referenced.

    Raises
    ------
    TypeError, ValueError
        As :func:`pyw8a8.pack_weight`; for a PackedWeight w, TypeError with packing
        options and ValueError if it is inconsistent (see
        :meth:`~pyw8a8.PackedWeight.check_layout`).
    """
    if isinstance(w, PackedWeight):
        if kwargs:
            raise TypeError(f"w is already packed; packing options {sorted(kwargs)} do not "
                            "apply")
        _check_layout(w, "w")
        packed = w
    else:
        packed = _pack_weight(w, **kwargs)
    return SharedWeight(packed, client)


def _matmul_chunk(x, packed, block_info=None):
    """One chunk's product: the ordinary in-process matmul (runs on a worker)."""
    try:
        return _w8a8_matmul(x, packed)
    except ValueError:
        error = None if block_info is None else _row_error(x, packed, block_info[0])
        if error is None:
            raise
        raise error from None


def _row_error(x, packed, info):
    """The ValueError of the chunk x's first bad row, naming the row in the whole array
    (`info`: dask's block_info of x), or None if no row is bad.

    matmul numbers the rows of the chunk it is given; this error path checks them again
    with matmul's own checks, told where the rows sit in the whole array."""
    shape = tuple(info["shape"])
    starts = [start for start, _ in info["array-location"][:-1]]
    block = packed.block if packed.rotate else 0
    try:
        # Along the last leading dimension a chunk's rows are consecutive in the whole
        # array too, so each such run is checked in one call, numbered from its first row.
        for index in np.ndindex(x.shape[:-2]):
            first = int(np.ravel_multi_index(
                [s + i for s, i in zip(starts, index + (0,))], shape[:-1]))
            rows = float_array(x[index], "x", shape=shape, row_offset=first)
            quantize_rows(np.ascontiguousarray(rows.reshape(-1, rows.shape[-1])),
                          packed.kp, name="x", shape=shape, block=block, seed=packed.seed,
                          row_offset=first)
    except ValueError as exc:
        return exc
    return None


def matmul(x: da.Array, packed: SharedWeight | PackedWeight, *,
           client: "Client | None" = None) -> da.Array:
    """Lazy W8A8 product ``x @ w.T`` of a dask array, chunk by chunk.

    Parameters
    ----------
    x : dask.array.Array of float32 or float64, shape (..., K)
        Activations (either byte order) with any leading dimensions, chunked along them
        however suits (rows per chunk set the work per task), in one chunk along K.
    packed : SharedWeight or PackedWeight
        From :func:`pack_weight` (shipped once, reusable across graphs), or a
        :func:`pyw8a8.pack_weight` result, shipped now for this graph (scattered to every
        worker with a distributed client, else one key of the graph).
    client : distributed.Client, optional
        Where to ship a PackedWeight (default: distributed's default client, if any).

    Returns
    -------
    dask.array.Array of float32, shape (..., N)
        Chunked as x along the leading dimensions, one chunk along N. Computed, it is
        bit-identical to ``pyw8a8.matmul(x.compute(), packed)``.

    Raises
    ------
    TypeError
        x is not a dask array of float32/float64, or `packed` is neither a SharedWeight
        nor a PackedWeight.
    ValueError
        x has no dimensions, its last dimension differs from K, or it is chunked along K;
        a PackedWeight is inconsistent. When a chunk is computed, a row holding NaN/Inf
        (or a float64 value beyond float32's range) raises the ValueError of
        :func:`pyw8a8.matmul`, naming the row in the whole of x, not in its chunk.

    Examples
    --------
    >>> import dask.array as da
    >>> import numpy as np
    >>> import pyw8a8
    >>> import pyw8a8.dask
    >>> rng = np.random.default_rng(0)
    >>> w = rng.standard_normal((48, 128)).astype(np.float32)
    >>> x = da.from_array(rng.standard_normal((1000, 128)).astype(np.float32), chunks=(256, 128))
    >>> weight = pyw8a8.dask.pack_weight(w)  # no cluster here: dask's local scheduler
    >>> y = pyw8a8.dask.matmul(x, weight)
    >>> y.shape, y.chunks[0], y.dtype
    ((1000, 48), (256, 256, 256, 232), dtype('float32'))
    >>> packed = pyw8a8.pack_weight(w)
    >>> bool(np.array_equal(y.compute(), pyw8a8.matmul(x.compute(), packed)))  # bit for bit
    True
    """
    packed = _checked(x, packed, client)
    return da.map_blocks(_matmul_chunk, x, packed.ref, dtype=np.float32,
                         chunks=x.chunks[:-1] + ((packed.shape[0],),),
                         meta=np.empty((0,) * x.ndim, dtype=np.float32),
                         name="pyw8a8-matmul-" + dask.base.tokenize(x, packed.ref))


def _checked(x, packed, client):
    """`matmul`'s arguments checked, in this order: `x`'s type, the weight (a PackedWeight
    shipped now: the SharedWeight is returned), `x`'s shape."""
    if not isinstance(x, da.Array):
        raise TypeError(f"x must be a dask.array.Array, got {type(x).__name__} (for numpy "
                        "arrays use pyw8a8.matmul)")
    if x.dtype.newbyteorder("=") not in (np.float32, np.float64):  # any byte order
        raise TypeError(f"x must be float32 or float64, got {x.dtype}")
    if isinstance(packed, PackedWeight):
        packed = SharedWeight(packed, client)
    elif not isinstance(packed, SharedWeight):
        raise TypeError(f"packed must be a SharedWeight from pyw8a8.dask.pack_weight or a "
                        f"PackedWeight, got {type(packed).__name__}")
    k = packed.shape[1]
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension (K features), got a scalar")
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features in its last dimension (shape "
                         f"{x.shape}) but the weight expects K={k}")
    if len(x.chunks[-1]) != 1:
        raise ValueError(
            f"x is chunked along K, its last dimension (chunks {x.chunks[-1]}): every "
            f"chunk must hold whole rows of K={k} features, since each row is quantized "
            f"(and rotated) as a whole; chunk along the leading dimensions only, e.g. "
            f"x.rechunk({{{x.ndim - 1}: -1}})")
    return packed
