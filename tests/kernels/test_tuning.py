"""The blocking tuner: which candidate it settles on, and what it never judges."""
from pyw8a8 import _dispatch, _kernels
from pyw8a8.tuning import ROUNDS, Tuner, candidates, fit, kc_for, m_bucket

SHAPE = dict(m=64, n=512, kp=640, nthreads=2)


def _choose(tuner, ops, streams=1):
    return tuner.choose(ops, 0, 1, SHAPE["m"], SHAPE["n"], SHAPE["kp"], SHAPE["nthreads"],
                        streams)


def test_first_call_is_untimed_and_the_fastest_candidate_settles():
    ops = _dispatch.IsaOps("scalar")
    cands = candidates(ops, SHAPE["m"], SHAPE["n"], SHAPE["kp"], SHAPE["nthreads"])
    assert len(cands) > 1
    tuner = Tuner()
    key, index, blocking = _choose(tuner, ops)
    # The shape's first call (its one-time costs) runs the default and is never recorded.
    assert index == -1 and blocking == fit(cands[0], SHAPE["m"])
    tuner.record(key, index, 1e9)
    fastest = len(cands) - 1
    for _ in range(ROUNDS * len(cands)):
        key, index, blocking = _choose(tuner, ops)
        if index is None:
            break
        assert blocking == fit(cands[index], SHAPE["m"])
        tuner.record(key, index, 1.0 if index != fastest else 0.5)
    key, index, blocking = _choose(tuner, ops)
    assert index is None and blocking == fit(cands[fastest], SHAPE["m"])


def test_two_weights_of_one_shape_in_one_call_settle():
    """matmul_pair's two weights of one shape share an entry, each call choosing (and
    recording) twice: it settles all the same, also with an even number of candidates
    (whose rounds the call count, stepped by two, never ended at a multiple of)."""
    import numpy as np

    import pyw8a8
    rng = np.random.default_rng(0)
    for m in (1, 3, 24):
        x = rng.standard_normal((m, 160)).astype(np.float32)
        gate, up = (pyw8a8.pack_weight(rng.standard_normal((48, 160)).astype(np.float32))
                    for _ in range(2))
        for _ in range(4 * ROUNDS * 8):
            pyw8a8.matmul_pair(x, gate, up)
        ops, nthreads = pyw8a8._cpu.active_ops(m), pyw8a8._threads.threads_for(m * 160 * 96)
        for plan in (gate.plan(), up.plan()):
            assert plan.settled_blocking(_kernels.CALL_PAIR, ops, m, nthreads) is not None, m


def test_gated_pairs_have_their_own_entry_sized_for_two_weights():
    ops = _dispatch.IsaOps("avx2") if "avx2" in _dispatch.isa_names() else _dispatch.IsaOps(
        "scalar")
    tuner = Tuner()
    single, _, _ = _choose(tuner, ops)
    pair, _, blocking = _choose(tuner, ops, streams=2)
    assert single != pair
    kp = 1 << 16  # long enough that L1, not K, bounds the K-range
    assert kc_for(ops, kp, 2) <= kc_for(ops, kp) // 2
    assert blocking[0] == kc_for(ops, SHAPE["kp"], 2)


def test_calls_of_one_or_two_row_tiles_take_the_whole_k():
    """Where no third row tile would reuse a B micro-panel from L1, a K-range only adds a
    pass over the output."""
    ops = _dispatch.IsaOps("scalar")
    kp = 1 << 16  # long enough that L1, not K, bounds the K-range
    assert kc_for(ops, kp) < kp
    assert kc_for(ops, kp, m=1) == kc_for(ops, kp, m=2 * ops.mr) == kp
    assert kc_for(ops, kp, m=2 * ops.mr + 1) == kc_for(ops, kp)
    tuner = Tuner()
    for m, kc in ((1, kp), (2 * ops.mr, kp), (8 * ops.mr, kc_for(ops, kp))):
        assert tuner.choose(ops, 0, 1, m, 512, kp, 2)[2][0] == kc
    # Their candidates are those of one bucket per row count (so no other call's K-range
    # comes with them): every ISA that K-blocks has tiles of at most 8 rows.
    for name in _dispatch.isa_names():
        isa = _dispatch.IsaOps(name)
        assert isa.whole_k or m_bucket(2 * isa.mr) == 2 * isa.mr, name


def test_the_whole_k_is_a_candidate_where_its_panels_fit_in_half_of_l2():
    """A K-range costs a pass over the output's sums: where the B micro-panels over the
    whole K fit in half of L2, each task split is also tried over the whole K."""
    from pyw8a8 import tuning
    ops = _dispatch.IsaOps("scalar")
    ncols = _kernels.W8_NR * ops.npanels
    fitting = tuning.L2_BYTES // 2 // ncols // 64 * 64
    for kp, tried in ((fitting, True), (fitting + 64, False)):
        assert kc_for(ops, kp) < kp
        cands = candidates(ops, 256, 512, kp, 2)
        assert cands[0][0] == kc_for(ops, kp)  # the default keeps the L1-sized ranges
        whole = [c for c in cands if c[0] == kp]
        assert bool(whole) == tried, kp
        if tried:  # one per task split
            assert {c[3:5] for c in whole} == {c[3:5] for c in cands}
    # An ISA that never K-blocks, and a K that fits one range, have nothing to add.
    assert all(c[0] == 256 for c in candidates(ops, 256, 512, 256, 2))


def test_unsettled_counts_the_shapes_still_tried_and_settling_waits_for_them():
    """Tuner.unsettled() falls to zero once every shape met has settled, and the torch
    bench's warm-up (torch_sharing.settle_tuning) calls until then, not once more.

    How many calls a shape takes to settle follows from its count of blocking candidates,
    which the CPU kind sets (its ISA's tiles, its caches): one on AMX at some shapes, which
    settles on creation. So the products run on the portable scalar ISA, whose candidates
    at this shape are 3 to 5 for any L1 of 16-192 KiB and L2 of 256 KiB-16 MiB, and the
    test checks each warm-up call against the tuner's state, not a count."""
    import numpy as np

    import pyw8a8
    from pyw8a8 import tuning
    from pyw8a8.tools.torch_sharing import SETTLE_ENCODES, settle_tuning
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 192)).astype(np.float32)
    w = pyw8a8.pack_weight(rng.standard_normal((80, 192)).astype(np.float32))
    pyw8a8.set_num_threads(2)  # the conftest fixture restores the default count
    tuning.clear()
    assert tuning.unsettled() == 0
    with pyw8a8.use_isa("scalar"):
        pyw8a8.matmul(x, w)
        assert tuning.unsettled() == 1
        cands = candidates(_dispatch.IsaOps("scalar"), 40, 80, w.kp, 2)
        tried = len(cands)
        # A shape of n candidates settles after 2n to under 4n timed calls (two rounds at
        # least, ROUNDS * n calls at most, each round finished): with two products an
        # encode, n to under 2n encodes, which more than one and fewer than SETTLE_ENCODES
        # hold for 2 <= n <= 8.
        assert 2 <= tried <= SETTLE_ENCODES // 2, cands
        before = []

        def encode():
            before.append(tuning.unsettled())
            pyw8a8.matmul(x, w)
            pyw8a8.matmul(x, w)

        calls = settle_tuning(encode)
        # Every call found the shape still being tried, and after the last none is.
        assert before == [1] * calls and tuning.unsettled() == 0
        assert tried <= calls < 2 * tried
        assert settle_tuning(encode) == 1  # settled: one call, the minimum
