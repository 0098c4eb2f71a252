"""Arrays the kernels stream start on a cache line (_layout.ALIGN_BYTES): packed panels,
however the weight was made, and the outputs pyw8a8 allocates (from ALIGNED_FROM_BYTES)."""
import mmap
import pickle

import numpy as np
import pytest
from memory_maps import smaps_field

import pyw8a8
from pyw8a8._layout import (
    ALIGN_BYTES,
    ALIGNED_FROM_BYTES,
    HUGE_PAGE_FROM_BYTES,
    RECYCLED_BUFFERS,
    RECYCLED_BYTES,
    data_address,
    empty_aligned,
    empty_output,
    is_aligned,
    recycled_bytes,
)


def _weight(n=40, k=100, seed=0):
    return np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)


SHAPES = [(0, 3), (1, 1), (2, 3, 5), (7, 13), (3, 257, 31), (1, ALIGNED_FROM_BYTES),
          (ALIGNED_FROM_BYTES // 4,), (ALIGNED_FROM_BYTES // 4 - 1,), (2,) * 16]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float32, np.float64])
def test_empty_aligned(shape, dtype):
    arr = empty_aligned(shape, np.dtype(dtype))
    assert arr.shape == shape and arr.dtype == dtype and arr.flags.c_contiguous
    assert arr.flags.writeable and is_aligned(arr)
    arr[...] = 1
    assert (arr == 1).all()


def _mapping(arr):
    """The mmap an array's memory belongs to, or None."""
    while isinstance(arr, np.ndarray):
        arr = arr.base
    if isinstance(arr, memoryview):
        arr = arr.obj
    return arr if isinstance(arr, mmap.mmap) else None


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="huge-page advice is Linux's")
def test_a_large_weight_array_is_a_mapping_of_its_own_eligible_for_huge_pages():
    small = empty_aligned((HUGE_PAGE_FROM_BYTES - 1,), np.uint8)
    large = empty_aligned((HUGE_PAGE_FROM_BYTES // 4, 2, 2), np.int8)
    assert _mapping(small) is None and _mapping(large) is not None
    assert data_address(large) % mmap.PAGESIZE == 0 and large.flags.writeable
    large[...] = 1
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        thp = f.read()
    # advised before its first write ("hg"), so where THP is on the kernel may back it
    # with huge pages
    assert "hg" in smaps_field(data_address(large), "VmFlags")
    if "[never]" not in thp:
        assert smaps_field(data_address(large), "THPeligible") in ("1", None)
    # a packed weight that large is made there, and pickles back there
    w = np.random.default_rng(0).standard_normal((4096, 1024)).astype(np.float32)
    packed = pyw8a8.pack_weight(w, rotate=False)
    assert packed.panels.nbytes >= HUGE_PAGE_FROM_BYTES and _mapping(packed.panels)
    assert _mapping(pickle.loads(pickle.dumps(packed)).panels)


@pytest.mark.parametrize("shape", SHAPES + [()])
def test_empty_output_is_float32_aligned_from_its_threshold(shape):
    """The outputs of the products (allocated in C): float32, C order, writeable; from
    ALIGNED_FROM_BYTES on, a view of a buffer it keeps alive, starting on a cache line."""
    arr = empty_output(shape)
    assert arr.shape == shape and arr.dtype == np.float32 and arr.flags.c_contiguous
    assert arr.flags.writeable and arr.flags.aligned
    if arr.nbytes >= ALIGNED_FROM_BYTES:
        assert is_aligned(arr) and arr.base is not None
    arr[...] = 1
    assert (arr == 1).all()


@pytest.mark.parametrize("rows", [ALIGNED_FROM_BYTES // 4096, 1024, RECYCLED_BYTES // 4096 + 1])
def test_outputs_own_their_memory_and_recycle_it(rows):
    """From ALIGNED_FROM_BYTES on an output owns plain memory (no numpy huge-page advice,
    _outputs says why), aligned, pickled by value; freed, it is kept for the next output of
    about its size (the same address comes back), within RECYCLED_BYTES: many calls do not
    grow the process, and a buffer larger than the limit is freed, not kept."""
    import gc
    import resource
    arr = empty_output((rows, 1024))
    assert type(arr.base).__name__ == "_OutputMemory"
    assert is_aligned(arr) and arr.flags.writeable
    arr[...] = 2
    assert np.array_equal(pickle.loads(pickle.dumps(arr)), arr)
    address, kept, held = data_address(arr), arr.nbytes <= RECYCLED_BYTES, recycled_bytes()
    del arr
    gc.collect()
    if kept:
        assert data_address(empty_output((rows, 1024))) == address
    else:
        assert recycled_bytes() == held
    assert recycled_bytes() <= RECYCLED_BYTES
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(50 if kept else 4):  # one at a time
        empty_output((rows, 1024)).fill(1)
    gc.collect()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB


def test_recycling_keeps_the_newest_buffers_and_takes_one_of_about_the_size():
    """Outputs of 12 sizes freed in turn: the last RECYCLED_BUFFERS are kept; a request
    takes the newest kept buffer of its size to twice it, and one larger than every kept
    buffer gets memory of its own."""
    sizes = [ALIGNED_FROM_BYTES // 4 + 1024 * i for i in range(12)]
    # Outputs of earlier tests may still be kept, and one of them taken below: first
    # RECYCLED_BUFFERS outputs too large for any request here replace them.
    flush = [empty_output((ALIGNED_FROM_BYTES,)) for _ in range(RECYCLED_BUFFERS)]
    del flush
    arrays = [empty_output((n,)) for n in sizes]
    addresses = [data_address(a) for a in arrays]
    for i in range(len(arrays)):
        arrays[i] = None
    assert recycled_bytes() <= RECYCLED_BYTES
    kept = addresses[len(sizes) - RECYCLED_BUFFERS:]
    largest = empty_output((sizes[-1],))
    assert data_address(largest) == addresses[-1]
    smallest = empty_output((sizes[0],))  # every kept one is under twice its size
    assert data_address(smallest) == kept[-2]
    huge = empty_output((64 * ALIGNED_FROM_BYTES,))
    assert data_address(huge) not in addresses


def test_empty_output_refuses_too_many_dimensions():
    with pytest.raises(ValueError, match="65 dimensions"):
        empty_output((1,) * 65)


@pytest.mark.parametrize("rotate", [False, True])
def test_packed_panels_are_aligned(rotate):
    w = _weight()
    assert is_aligned(pyw8a8.pack_weight(w, rotate=rotate).panels)
    qw = np.clip(np.rint(w * 20), -127, 127).astype(np.int8)
    assert is_aligned(pyw8a8.pack_quantized(qw, np.ones(len(w), np.float32)).panels)


def test_unaligned_panels_are_copied_once_to_an_aligned_array():
    """Panels from a pickle or built by hand may start anywhere numpy put them: the
    weight's plan replaces them once by an aligned copy, with the same bytes and results."""
    x = _weight(5, 100, seed=1)
    packed = pyw8a8.pack_weight(_weight())
    expected = pyw8a8.matmul(x, packed)
    buf = np.empty(packed.panels.nbytes + ALIGN_BYTES + 16, np.uint8)
    start = (16 - data_address(buf)) % ALIGN_BYTES  # 16 bytes past a cache line
    off = buf[start:start + packed.panels.nbytes].reshape(packed.panels.shape)
    off[...] = packed.panels
    assert not is_aligned(off)
    hand = pyw8a8.PackedWeight(packed.shape, packed.encoding, off, packed.psum,
                               packed.scales, packed.rotate, packed.block, packed.seed)
    np.testing.assert_array_equal(pyw8a8.matmul(x, hand), expected)
    assert is_aligned(hand.panels) and hand.panels is not off
    np.testing.assert_array_equal(hand.panels, off)
    again = pickle.loads(pickle.dumps(hand))
    np.testing.assert_array_equal(pyw8a8.matmul(x, again), expected)
    assert is_aligned(again.panels)


def test_outputs_are_aligned():
    x = _weight(3, 100, seed=2)
    packed = pyw8a8.pack_weight(_weight(ALIGNED_FROM_BYTES // 4 // 3 + 1))  # N x 3 rows
    assert is_aligned(pyw8a8.matmul(x, packed))
    bias = np.ones(packed.shape[0], np.float32)
    assert is_aligned(pyw8a8.matmul(x[None], packed, bias=bias))
    y1, y2 = pyw8a8.matmul_pair(x, packed, packed)
    assert is_aligned(y1) and is_aligned(y2)
    assert is_aligned(pyw8a8.matmul_pair(x, packed, packed, glu="silu"))
