"""Unit tests for pyw8a8.evaluate.metrics on hand-worked examples."""

import math

import numpy as np
import pytest

from pyw8a8.evaluate.metrics import (
    compare_answers,
    kl_divergence,
    kl_summary,
    log_softmax,
    option_kl,
)

# --- log_softmax -----------------------------------------------------------


def test_log_softmax_two_tokens_by_hand():
    # softmax([0, ln 3]) = [1/4, 3/4]
    out = log_softmax([0.0, math.log(3.0)])
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, [math.log(0.25), math.log(0.75)], rtol=1e-12)


def test_log_softmax_stable_for_huge_logits():
    out = log_softmax(np.array([1000.0, 1000.0, -1000.0], dtype=np.float32))
    assert np.all(np.isfinite(out[:2]))
    np.testing.assert_allclose(out[:2], [math.log(0.5)] * 2, rtol=1e-12)
    assert out[2] < -1000


def test_log_softmax_shift_invariant_and_batched():
    x = np.random.default_rng(0).normal(size=(3, 7))
    np.testing.assert_allclose(log_softmax(x), log_softmax(x + 123.0), atol=1e-12)
    np.testing.assert_allclose(np.exp(log_softmax(x)).sum(-1), 1.0, rtol=1e-12)


def test_log_softmax_handles_minus_inf_entries():
    out = log_softmax([0.0, -np.inf])
    assert out[0] == 0.0 and out[1] == -np.inf


@pytest.mark.parametrize(
    "bad", [np.float64(1.0), np.zeros((2, 0)), [np.nan, 0.0], [np.inf, 0.0], [-np.inf, -np.inf]]
)
def test_log_softmax_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        log_softmax(bad)


# --- KL --------------------------------------------------------------------


def test_kl_two_token_by_hand():
    # P = (1/2, 1/2), Q = (1/4, 3/4)
    # KL = 1/2 ln(2) + 1/2 ln(2/3) = 1/2 ln(4/3)
    kl = kl_divergence([0.0, 0.0], [0.0, math.log(3.0)])
    assert isinstance(kl, float)
    assert kl == pytest.approx(0.5 * math.log(4.0 / 3.0), rel=1e-12)


def test_kl_is_directional():
    # Reverse direction: KL(Q||P) = 1/4 ln(1/2) + 3/4 ln(3/2)
    kl = kl_divergence([0.0, math.log(3.0)], [0.0, 0.0])
    assert kl == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), rel=1e-12)
    assert kl != pytest.approx(0.5 * math.log(4.0 / 3.0))


def test_kl_identical_is_zero_and_shift_invariant():
    x = np.random.default_rng(1).normal(size=50).astype(np.float32)
    assert kl_divergence(x, x) == 0.0
    assert kl_divergence(x, x + 5.0) == pytest.approx(0.0, abs=1e-12)


def test_kl_batched_rows():
    p = np.array([[0.0, 0.0], [0.0, math.log(3.0)]])
    q = np.array([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    kl = kl_divergence(p, q)
    assert kl.shape == (2,)
    np.testing.assert_allclose(kl, [0.5 * math.log(4.0 / 3.0), 0.0], atol=1e-12)


def test_kl_zero_probability_in_control_contributes_nothing():
    # P = (1, 0), Q = (1/2, 1/2): KL = ln 2
    assert kl_divergence([0.0, -np.inf], [0.0, 0.0]) == pytest.approx(math.log(2.0))


def test_kl_shape_mismatch():
    with pytest.raises(ValueError, match="same shape"):
        kl_divergence([0.0, 1.0], [0.0, 1.0, 2.0])


def test_option_kl_restricts_to_options():
    # Full vocab of 5; options are ids 1 and 3. Other logits differ wildly and
    # must not matter.
    c = np.array([9.0, 0.0, -4.0, 0.0, 2.0])
    t = np.array([-7.0, 0.0, 8.0, math.log(3.0), 0.5])
    assert option_kl(c, t, [1, 3]) == pytest.approx(0.5 * math.log(4.0 / 3.0), rel=1e-12)
    # Same distributions over options -> 0 even though full-vocab KL is large.
    t2 = c.copy()
    t2[[0, 2, 4]] = [-5.0, 30.0, 1.0]
    assert option_kl(c, t2 + 1.0, [1, 3]) == pytest.approx(0.0, abs=1e-12)
    assert kl_divergence(c, t2) > 1.0


def test_option_kl_batched():
    c = np.zeros((3, 6))
    t = np.zeros((3, 6))
    t[1, 2] = math.log(3.0)
    out = option_kl(c, t, [0, 2])
    np.testing.assert_allclose(out, [0.0, 0.5 * math.log(4.0 / 3.0), 0.0], atol=1e-12)


@pytest.mark.parametrize("ids", [[], [1, 1], [0, 5], [-1, 2], [0.5, 1.0], [[0, 1]]])
def test_option_kl_bad_ids(ids):
    with pytest.raises(ValueError):
        option_kl(np.zeros(5), np.zeros(5), ids)


def test_option_kl_shape_mismatch():
    with pytest.raises(ValueError, match="same shape"):
        option_kl(np.zeros(5), np.zeros(6), [0, 1])


# --- compare_answers -------------------------------------------------------


def test_compare_answers_six_questions_by_hand():
    labels = [0, 1, 2, 3, 0, 1]
    control = [0, 1, 0, 3, 2, 3]  # correct: q0, q1, q3 -> 3/6
    target = [0, 2, 2, 1, 1, 3]
    # q0: right -> right (same)
    # q1: right -> wrong            correct_to_incorrect
    # q2: wrong -> right            incorrect_to_correct
    # q3: right -> wrong            correct_to_incorrect
    # q4: wrong(2) -> wrong(1)      wrong_to_wrong change
    # q5: wrong(3) -> wrong(3)      no change
    r = compare_answers(labels, control, target)
    assert r["n"] == 6
    assert r["control_correct"] == 3
    assert r["target_correct"] == 2
    assert r["control_accuracy"] == pytest.approx(0.5)
    assert r["target_accuracy"] == pytest.approx(2 / 6)
    assert r["correct_to_incorrect"] == 2
    assert r["incorrect_to_correct"] == 1
    assert r["flips"] == 3
    assert r["flip_rate"] == pytest.approx(0.5)
    assert r["wrong_to_wrong_changes"] == 1
    assert r["answer_changes"] == 4
    assert r["net_correct"] == -1
    assert r["top1_agreement"] == pytest.approx(2 / 6)


def test_compare_answers_identical():
    r = compare_answers([0, 1, 2], [0, 2, 2], [0, 2, 2])
    assert r["flips"] == 0 and r["answer_changes"] == 0
    assert r["top1_agreement"] == 1.0
    assert r["net_correct"] == 0


def test_compare_answers_flips_cancel_in_accuracy():
    # Same accuracy, but every answer flipped: the point of the paper.
    r = compare_answers([0, 0], [0, 1], [1, 0])
    assert r["control_accuracy"] == r["target_accuracy"] == 0.5
    assert r["flips"] == 2 and r["net_correct"] == 0


def test_compare_answers_empty():
    r = compare_answers([], [], [])
    assert r["n"] == 0 and r["flips"] == 0
    assert math.isnan(r["control_accuracy"]) and math.isnan(r["top1_agreement"])


def test_compare_answers_length_mismatch():
    with pytest.raises(ValueError, match="same length"):
        compare_answers([0, 1], [0, 1], [0])


@pytest.mark.parametrize("bad", [[0.5, 1.0], [[0, 1]]])
def test_compare_answers_bad_types(bad):
    with pytest.raises(ValueError):
        compare_answers(bad, [0, 1], [0, 1])


# --- kl_summary ------------------------------------------------------------


def test_kl_summary_by_hand():
    s = kl_summary([0.0, 1.0, 2.0, 3.0, 4.0])
    assert s["n"] == 5
    assert s["mean"] == 2.0
    assert s["median"] == 2.0
    # linear percentile: position 0.95 * 4 = 3.8 -> 3 + 0.8 * (4 - 3)
    assert s["p95"] == pytest.approx(3.8)
    assert s["max"] == 4.0


def test_kl_summary_single_value():
    s = kl_summary([0.25])
    assert s == {"n": 1, "mean": 0.25, "median": 0.25, "p95": 0.25, "max": 0.25}


@pytest.mark.parametrize("bad", [[], [[1.0, 2.0]], [np.nan]])
def test_kl_summary_bad(bad):
    with pytest.raises(ValueError):
        kl_summary(bad)
