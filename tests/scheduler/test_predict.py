"""The run-time predictor: last runs per key, its correction once outlived, its bounds and its error quantiles."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import RuntimePredictor

NAME = ("vision", "resnet")
TENANT = ("vision",)
KEYS = (NAME, TENANT)


def test_without_history_the_prediction_is_the_max_runtime():
    assert RuntimePredictor().predict(KEYS, 3600.0) == 3600.0


def test_the_mean_of_the_last_two_runs_of_the_most_specific_key():
    p = RuntimePredictor()
    for runtime in (100.0, 200.0, 600.0):
        p.observe(KEYS, runtime, 3600.0)
    assert p.predict(KEYS, 3600.0) == 400.0
    # Another job name of the tenant: the tenant's last two runs.
    p.observe((("vision", "bert"), TENANT), 1000.0, 3600.0)
    assert p.predict((("vision", "vit"), TENANT), 3600.0) == 800.0
    assert p.predict(KEYS, 3600.0) == 400.0
    # Another tenant: nothing known.
    assert p.predict((("nlp", "resnet"), ("nlp",)), 7200.0) == 7200.0


def test_the_prediction_is_capped_by_the_max_runtime_and_floored_by_the_minimum():
    p = RuntimePredictor(min_runtime_s=60.0)
    p.observe(KEYS, 5.0, 3600.0)
    assert p.predict(KEYS, 3600.0) == 60.0
    assert p.predict(KEYS, 30.0) == 30.0  # a limit below the floor wins
    p.observe(KEYS, 5000.0, 7200.0)
    assert p.predict(KEYS, 1000.0) == 1000.0


def test_a_job_that_outlives_its_prediction_is_predicted_to_run_twice_as_long_then_four_times():
    p = RuntimePredictor()
    p.observe(KEYS, 100.0, 3600.0)
    p.observe(KEYS, 100.0, 3600.0)
    assert p.predict(KEYS, 3600.0, elapsed_s=99.0) == 100.0
    assert p.predict(KEYS, 3600.0, elapsed_s=100.0) == 200.0
    assert p.predict(KEYS, 3600.0, elapsed_s=250.0) == 400.0
    assert p.predict(KEYS, 3600.0, elapsed_s=3000.0) == 3200.0
    assert p.predict(KEYS, 3600.0, elapsed_s=3300.0) == 3600.0  # capped
    assert p.predict(KEYS, 3600.0, elapsed_s=4000.0) == 3600.0  # past its limit: the limit


def test_remaining_scales_by_the_error_quantile_within_the_limit():
    p = RuntimePredictor()
    p.observe(KEYS, 1000.0, 3600.0)  # predicted 3600 (no history): ratio 1000/3600
    p.observe(KEYS, 2000.0, 3600.0)  # predicted 1000: ratio 2
    assert p.quantiles((0.0, 1.0)) == pytest.approx((1000.0 / 3600.0, 2.0))
    assert p.remaining(KEYS, 3600.0, 0.0) == 1500.0
    assert p.remaining(KEYS, 3600.0, 500.0) == 1000.0
    assert p.remaining(KEYS, 3600.0, 500.0, q=1.0) == 2000.0
    assert p.remaining(KEYS, 3600.0, 500.0, q=0.0) == pytest.approx(1000.0 * 1000.0 / 3600.0)
    assert p.remaining(KEYS, 2000.0, 500.0, q=1.0) == 1500.0  # never past the limit


def test_quantiles_before_any_run_are_one_and_the_window_is_bounded():
    p = RuntimePredictor(ratio_window=3)
    assert p.quantiles() == (1.0, 1.0, 1.0)
    for runtime in (100.0, 100.0, 200.0, 400.0, 800.0):
        p.observe(KEYS, runtime, 1000.0)
    # Ratios: 100/1000, 100/100, 200/100, 400/150, 800/300; only the last three count.
    qs = p.quantiles((0.0, 0.5, 1.0))
    assert qs == pytest.approx((2.0, 400.0 / 150.0, 800.0 / 300.0))
    with pytest.raises(ValueError, match="quantile"):
        p.quantiles((1.5,))


def test_bad_settings_are_refused_naming_them():
    with pytest.raises(ValueError, match="history"):
        RuntimePredictor(history=0)
    with pytest.raises(ValueError, match="ratio_window"):
        RuntimePredictor(ratio_window=0)
    with pytest.raises(ValueError, match="min_runtime_s"):
        RuntimePredictor(min_runtime_s=-1.0)


key_lists = st.sampled_from([(("a", "x"), ("a",)), (("a", "y"), ("a",)), (("b", "x"), ("b",))])
runs = st.lists(st.tuples(key_lists, st.floats(0.0, 1e6), st.floats(0.0, 1e6)), max_size=30)
limits = st.floats(0.0, 1e6)
elapsed = st.floats(0.0, 2e6)


def _fed(history: list[tuple[tuple[tuple[str, ...], ...], float, float]]) -> RuntimePredictor:
    p = RuntimePredictor()
    for keys, runtime, limit in history:
        p.observe(keys, runtime, limit)
    return p


@settings(max_examples=200, deadline=None)
@given(runs, limits, elapsed)
def test_a_prediction_is_within_its_bounds(history, limit, elapsed_s):
    p = _fed(history)
    keys = (("a", "x"), ("a",))
    got = p.predict(keys, limit, elapsed_s)
    assert min(60.0, limit) <= got <= limit
    assert got >= min(elapsed_s, limit)
    assert 0.0 <= p.remaining(keys, limit, elapsed_s) <= max(0.0, limit - elapsed_s)
    assert 0.0 <= p.remaining(keys, limit, elapsed_s, q=0.9) <= max(0.0, limit - elapsed_s)


@settings(max_examples=200, deadline=None)
@given(runs, limits, elapsed, elapsed)
def test_the_correction_is_monotone_in_elapsed_time(history, limit, e1, e2):
    p = _fed(history)
    keys = (("a", "x"), ("a",))
    low, high = sorted((e1, e2))
    assert p.predict(keys, limit, low) <= p.predict(keys, limit, high)


@settings(max_examples=100, deadline=None)
@given(runs, limits, elapsed)
def test_the_same_history_gives_the_same_predictions(history, limit, elapsed_s):
    a, b = _fed(history), _fed(history)
    keys = (("b", "x"), ("b",))
    assert a.predict(keys, limit, elapsed_s) == b.predict(keys, limit, elapsed_s)
    assert a.quantiles() == b.quantiles()


@settings(max_examples=100, deadline=None)
@given(runs, st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6))
def test_quantiles_are_ordered(history, qs):
    p = _fed(history)
    ordered = sorted(qs)
    got = p.quantiles(ordered)
    assert list(got) == sorted(got)
    assert all(x >= 0.0 for x in got)
