"""The paired bootstrap and the answer intervals of the report."""

import math

import numpy as np
import pytest

from pyw8a8.evaluate.bootstrap import mean_interval, paired_bootstrap
from pyw8a8.evaluate.metrics import answer_intervals

from evaluate_helpers import CONTROL_CHOICES, LABELS, TARGET_CHOICES


def test_constant_values_have_a_point_interval():
    assert mean_interval(np.ones(50)) == (1.0, 1.0)
    assert mean_interval(np.zeros(3), resamples=7) == (0.0, 0.0)


def test_a_proportion_matches_the_normal_approximation():
    # 300 of 1000: the interval is p +- 1.96 sqrt(p (1 - p) / n) = 0.3 +- 0.0284 up to
    # the bootstrap's own noise (a few thousandths at 10,000 resamples).
    values = np.zeros(1000)
    values[:300] = 1.0
    low, high = mean_interval(values)
    half = 1.96 * math.sqrt(0.3 * 0.7 / 1000)
    assert low == pytest.approx(0.3 - half, abs=0.004)
    assert high == pytest.approx(0.3 + half, abs=0.004)
    assert low < 0.3 < high


def test_the_seed_fixes_the_interval():
    values = np.random.default_rng(5).normal(size=40)
    assert mean_interval(values) == mean_interval(values)
    assert mean_interval(values, seed=1) != mean_interval(values)
    low, high = mean_interval(values)
    assert low < values.mean() < high


def test_the_confidence_sets_the_percentiles():
    # Resamples of one value of two: the mean of n draws of {0, 1}; a narrower coverage
    # gives a narrower interval inside the wider one.
    values = np.array([0.0, 1.0] * 10)
    low95, high95 = mean_interval(values)
    low50, high50 = mean_interval(values, confidence=0.5)
    assert low95 < low50 < 0.5 < high50 < high95


def test_resampling_is_paired():
    x = np.random.default_rng(3).normal(size=30)
    # The same indices for both arrays: the difference of a sample with itself never moves,
    # and a shift by one is exactly one in every resample.  Unpaired draws would spread both.
    assert paired_bootstrap(lambda a, b: a.mean(1) - b.mean(1), [x, x.copy()]) == (0.0, 0.0)
    low, high = paired_bootstrap(lambda a, b: a.mean(1) - b.mean(1), [x + 1.0, x])
    assert low == pytest.approx(1.0) and high == pytest.approx(1.0)


def test_the_statistic_sees_batches_of_resamples():
    shapes = []

    def stat(a):
        shapes.append(a.shape)
        return a.mean(axis=1)
    paired_bootstrap(stat, [np.arange(4.0)], resamples=10)
    assert shapes == [(10, 4)]


@pytest.mark.parametrize("samples, kwargs, message", [
    ([], {}, "at least one array"),
    ([np.ones((2, 2))], {}, "1-D"),
    ([np.ones(0)], {}, "must not be empty"),
    ([np.ones(3), np.ones(4)], {}, "same length"),
    ([np.ones(3)], {"resamples": 0}, "resamples"),
    ([np.ones(3)], {"resamples": 2.5}, "resamples"),
    ([np.ones(3)], {"confidence": 1.0}, "confidence"),
])
def test_bad_arguments_are_named(samples, kwargs, message):
    with pytest.raises(ValueError, match=message):
        paired_bootstrap(lambda *a: a[0].mean(1), samples, **kwargs)


def test_answer_intervals_contain_the_hand_worked_rates():
    # Control A,A,C,A and target B,B,C,B on labels 0..3: accuracy 2/4 each, 2 flips,
    # 3 answer changes (evaluate_helpers.py).
    iv = answer_intervals(LABELS, CONTROL_CHOICES, TARGET_CHOICES)
    assert set(iv) == {"target_accuracy", "accuracy_change", "flip_rate", "answer_change_rate"}
    for key, point in [("target_accuracy", 0.5), ("accuracy_change", 0.0), ("flip_rate", 0.5),
                       ("answer_change_rate", 0.75)]:
        low, high = iv[key]
        assert low <= point <= high
    # per question the target's correctness changes by -1, +1, 0, 0: differences of means
    # of 4 draws lie in [-1, 1], and both signs occur
    assert -1.0 <= iv["accuracy_change"][0] < 0.0 < iv["accuracy_change"][1] <= 1.0
    same = answer_intervals(LABELS, CONTROL_CHOICES, CONTROL_CHOICES)
    assert same["accuracy_change"] == same["flip_rate"] == same["answer_change_rate"] == [0, 0]
    with pytest.raises(ValueError, match="same length"):
        answer_intervals(LABELS, CONTROL_CHOICES, TARGET_CHOICES[:3])
