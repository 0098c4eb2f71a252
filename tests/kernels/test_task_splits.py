"""The task splits of the one call path (``_simd/product.h``): every split the tuner may
choose gives the same bits, including the split over M alone, whose tasks quantize their
own rows (w8_tasks_own_rows), and a row holding NaN is reported the same way by each."""
import numpy as np
import pytest

import pyw8a8
from pyw8a8 import _dispatch, _kernels, tuning
from pyw8a8._layout import W8_NR

M, K, N = 200, 300, 100  # rows not a multiple of any ISA's tile, K not of 64
THREADS = 2


def _splits(ops, n, kp):
    cands = tuning.candidates(ops, M, n, kp, THREADS)
    owning = [c for c in cands if c[4] >= n]
    # Both kinds must be there, or the comparison below would not test the owning split.
    assert owning and len(owning) < len(cands), cands
    return [tuning.fit(c, M) for c in cands]


def _run(ops, x, plans, blocking, glu=None):
    """The compiled call of x with `plans` on `ops` and THREADS threads, over `blocking`."""
    kind = _kernels.CALL_ONE if len(plans) == 1 else _kernels.CALL_GLU
    pyw8a8.set_num_threads(THREADS)  # the conftest fixture restores the default count
    with pyw8a8._cpu.use_ops(ops):
        return _kernels.call(x, *plans, *[None] * (4 - len(plans)), glu, kind,
                             blocking=blocking)


@pytest.mark.parametrize("encoding", ["biased", "signed"])
@pytest.mark.parametrize("rotate", [False, True])
def test_every_split_gives_the_same_bits(any_isa, encoding, rotate):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((M, K)).astype(np.float32)
    packed = pyw8a8.pack_weight(rng.standard_normal((N, K)).astype(np.float32),
                                encoding=encoding, rotate=rotate)
    expected = pyw8a8.matmul(x, packed)  # whatever blocking the tuner starts with
    ops = _dispatch.IsaOps(any_isa)
    for blocking in _splits(ops, N, packed.kp):
        out = _run(ops, x, [packed.plan()], blocking)
        np.testing.assert_array_equal(out, expected, err_msg=str(blocking))


def test_every_split_of_a_gated_pair_gives_the_same_bits(any_isa):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((M, K)).astype(np.float32)
    gate, up = (pyw8a8.pack_weight(rng.standard_normal((N, K)).astype(np.float32),
                                   rotate=False) for _ in range(2))
    expected = pyw8a8.matmul_pair(x, gate, up, glu="gelu_tanh")
    ops = _dispatch.IsaOps(any_isa)
    for blocking in _splits(ops, N, gate.kp):
        out = _run(ops, x, [gate.plan(), up.plan()], blocking, glu="gelu_tanh")
        np.testing.assert_array_equal(out, expected, err_msg=str(blocking))


@pytest.mark.parametrize("bad_rows", [[150], [190, 20], [0, M - 1]])
def test_a_bad_row_is_reported_by_every_split(any_isa, bad_rows):
    """Whichever task meets a bad row first, the call reports the first one in row order."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((M, K)).astype(np.float32)
    for i, r in enumerate(bad_rows):
        x[r, i] = np.nan if i % 2 == 0 else np.inf
    plan = pyw8a8.pack_weight(rng.standard_normal((N, K)).astype(np.float32)).plan()
    ops = _dispatch.IsaOps(any_isa)
    for blocking in _splits(ops, N, plan.Kp):
        with pytest.raises(ValueError, match=rf"in row {min(bad_rows)};"):
            _run(ops, x, [plan], blocking)


def test_the_owning_split_is_the_default_where_the_weight_fits_in_l2():
    ops = _dispatch.IsaOps("scalar")
    small = tuning.candidates(ops, 1024, W8_NR * 4, 256, THREADS)
    assert small[0][4] >= W8_NR * 4  # over M only: each task all the columns
    large = tuning.candidates(ops, 1024, 1 << 16, 1 << 12, THREADS)
    assert large[0][4] < 1 << 16
    # From one row tile a thread, the split over M only is a candidate (the default where
    # the weight fits in L2); with fewer rows, the split is over N only.
    one_tile = tuning.candidates(ops, ops.mr * THREADS, W8_NR * 4, 256, THREADS)
    assert one_tile[0][3:5] == (ops.mr, W8_NR * 4)
    assert any(c[4] == 1 << 16
               for c in tuning.candidates(ops, ops.mr * THREADS, 1 << 16, 1 << 12, THREADS))
    fewer = tuning.candidates(ops, ops.mr * THREADS - 1, 1 << 16, 1 << 12, THREADS)
    assert all(c[4] < 1 << 16 for c in fewer)


def test_amx_times_k_ranges_whose_a_block_fits_in_l1_beside_the_whole_k():
    # AMX accumulates its tiles over the whole K by default; each split also gets a
    # K-range over which two row tiles of A and the B micro-panels fit in half of L1
    # (its bits are those of any blocking: the emulated kernels' K-ranges, tests/c).
    if "amx" not in _dispatch.isa_names():
        pytest.skip("this build has no AMX kernels (its compiler predates AMX)")
    amx = _dispatch.IsaOps("amx")
    kp, cands = 2048, tuning.candidates(amx, 1024, 640, 2048, THREADS)
    assert cands[0][0] == kp  # the whole K first, as before
    l1 = [c for c in cands if c[0] < kp]
    half_l1 = (_dispatch.cache_bytes(1) or 32 * 1024) // 2
    assert l1 and all(c[1] == 2 * amx.mr for c in l1)
    assert all(64 <= c[0] and c[0] % 64 == 0 and
               c[0] * (2 * amx.mr + W8_NR * amx.npanels) <= half_l1 for c in l1)
    assert {c[3:5] for c in l1} == {c[3:5] for c in cands}  # one for every split


def test_amx_times_the_next_strip_prefetched_up_to_two_row_tiles():
    # At 64 rows each thread streams the whole weight from L3 (issue 60): every candidate is
    # also timed with the kernel that prefetches the next strip (its bits: tests/c's
    # prefetching variants, on the emulated tiles).
    if "amx" not in _dispatch.isa_names():
        pytest.skip("this build has no AMX kernels (its compiler predates AMX)")
    amx = _dispatch.IsaOps("amx")
    assert amx.prefetches
    for m, tried in ((1, True), (2 * amx.mr, True), (2 * amx.mr + 1, False)):
        cands = tuning.candidates(amx, m, 6912, 1152, THREADS)
        plain = [c for c in cands if not c[5]]
        assert sorted(c[:5] for c in cands if c[5]) == (sorted(c[:5] for c in plain)
                                                        if tried else []), m


@pytest.mark.parametrize("encoding", ["biased", "signed"])
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("k", [640, 2048])  # one row's tile as one stream, and side by side
def test_prefetching_kernels_give_the_same_bits(any_isa, encoding, rows, k):
    """A row or two are also timed with the kernels that prefetch the weight: each such
    candidate gives the bits of every other, float and gated outputs alike."""
    ops = _dispatch.IsaOps(any_isa)
    rng = np.random.default_rng(k + rows)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    gate, up = (pyw8a8.pack_weight(rng.standard_normal((N, k)).astype(np.float32),
                                   encoding=encoding) for _ in range(2))
    cands = tuning.candidates(ops, rows, N, gate.kp, THREADS)
    assert any(c[5] for c in cands) == ops.prefetches, cands
    # a third row tile brings the reuse that hides the weight's latency: not tried there
    assert not any(c[5] for c in tuning.candidates(ops, 2 * ops.mr + 1, N, gate.kp, THREADS))
    for plans, expected, glu in (
            ([gate.plan()], pyw8a8.matmul(x, gate), None),
            ([gate.plan(), up.plan()], pyw8a8.matmul_pair(x, gate, up, glu="silu"), "silu")):
        for c in cands:
            out = _run(ops, x, plans, tuning.fit(c, rows), glu)
            np.testing.assert_array_equal(out, expected, err_msg=str(c))
