"""The start-interval calibrator: earlier estimates' outcomes turn a raw estimate into an honest interval."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.calibrate import WaitCalibrator


def test_with_nothing_observed_the_raw_estimate_is_given_as_it_is():
    assert WaitCalibrator().interval(5400.0) == (5400.0, 5400.0, 5400.0)


def test_a_biased_estimator_is_corrected_by_the_ratio_its_band_saw():
    cal = WaitCalibrator(min_samples=5)
    for actual in (2.0, 2.0, 2.0, 2.0, 2.0):
        cal.observe(3600.0, actual * 3600.0)  # it always took twice as long as predicted
    assert cal.interval(7200.0) == pytest.approx((14_400.0, 14_400.0, 14_400.0))


def test_an_estimate_of_now_gets_the_actual_waits_of_its_band_not_a_ratio():
    cal = WaitCalibrator(min_samples=3)
    for actual in (0.0, 600.0, 1200.0):
        cal.observe(0.0, actual)
    low, median, high = cal.interval(10.0)
    assert median == pytest.approx(600.0) and low < median < high <= 1200.0


def test_a_thin_band_borrows_the_ratios_of_all_bands():
    cal = WaitCalibrator(min_samples=4)
    for _ in range(4):
        cal.observe(2 * 3600.0, 3 * 3600.0)  # ratio 1.5, in the 30 min - 3 h band
    assert cal.interval(20 * 3600.0)[1] == pytest.approx(30 * 3600.0)  # the 12 h+ band has none of its own


def test_the_interval_holds_about_eight_in_ten_outcomes_of_a_steady_queue():
    rng = random.Random(7)
    cal = WaitCalibrator(window=400, min_samples=50)
    hits = total = 0
    for i in range(3000):
        predicted = rng.uniform(3600.0, 6 * 3600.0)
        actual = predicted * rng.lognormvariate(0.3, 0.6)  # biased and noisy
        if i > 500:
            low, _, high = cal.interval(predicted)
            hits += low <= actual <= high
            total += 1
        cal.observe(predicted, actual)
    assert 0.74 <= hits / total <= 0.86


@given(st.lists(st.tuples(st.floats(0, 1e6), st.floats(0, 1e6)), max_size=80), st.floats(0, 1e6))
def test_intervals_are_ordered_and_never_negative(history: list[tuple[float, float]], raw: float):
    cal = WaitCalibrator(min_samples=3)
    for predicted, actual in history:
        cal.observe(predicted, actual)
    low, median, high = cal.interval(raw)
    assert 0.0 <= low <= median <= high


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="window"):
        WaitCalibrator(window=0)


def test_groups_are_calibrated_apart_and_a_thin_group_borrows_from_all():
    cal = WaitCalibrator(min_samples=3)
    for _ in range(3):
        cal.observe(3600.0, 2 * 3600.0, "1")  # one-GPU jobs start twice as late as predicted
        cal.observe(3600.0, 0.5 * 3600.0, "9-32")  # gangs twice as early
    assert cal.interval(3600.0, "1")[1] == pytest.approx(7200.0)
    assert cal.interval(3600.0, "9-32")[1] == pytest.approx(1800.0)
    low, _, high = cal.interval(3600.0, "2-8")  # no samples of its own: every group's ratios
    assert low == pytest.approx(1800.0) and high == pytest.approx(7200.0)


def test_it_says_whether_it_can_calibrate_an_estimate():
    cal = WaitCalibrator(min_samples=2)
    assert not cal.calibrates(3600.0, "1")
    cal.observe(3600.0, 7200.0, "1")
    assert not cal.calibrates(3600.0, "1")  # one sample: the raw estimate stands
    cal.observe(3600.0, 7200.0, "1")
    assert cal.calibrates(3600.0, "1") and cal.calibrates(20 * 3600.0, "33+")  # another band, another group: borrowed
    assert not cal.calibrates(10.0, "1")  # an estimate of now has no ratios to borrow
    assert cal.interval(10.0, "1") == (10.0, 10.0, 10.0)
