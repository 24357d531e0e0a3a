"""The measured step-time model (step_model.py), with synthetic measurements."""

from __future__ import annotations

import pytest

from scheduler_service.ledger.step_model import StepModel, StepSample


def test_unmeasured_model_predicts_nothing():
    model = StepModel()
    assert not model.measured
    assert model.predict_ms(1) is None


def test_measured_rows_predict_their_mean_and_between_is_the_line():
    model = StepModel()
    model.observe(StepSample(rows=1, steps=10, seconds=0.100))  # 10 ms
    model.observe(StepSample(rows=5, steps=4, seconds=0.120))  # 30 ms
    assert model.predict_ms(1) == pytest.approx(10.0)
    assert model.predict_ms(5) == pytest.approx(30.0)
    assert model.predict_ms(3) == pytest.approx(20.0)


def test_above_the_largest_is_proportional_to_rows_and_below_the_smallest_is_its_mean():
    one = StepModel()
    one.observe(StepSample(rows=2, steps=1, seconds=0.020))
    assert one.predict_ms(4) == pytest.approx(40.0)  # pessimistic: proportional to rows
    assert one.predict_ms(1) == pytest.approx(20.0)  # below: the smallest's mean
    two = StepModel()
    two.observe(StepSample(rows=1, steps=1, seconds=0.010))
    two.observe(StepSample(rows=3, steps=1, seconds=0.014))
    # not the measured line's 18 ms: beyond what was measured, no batching gain is assumed
    assert two.predict_ms(6) == pytest.approx(28.0)


def test_a_noisy_mean_never_makes_more_rows_predict_less():
    model = StepModel()
    model.observe(StepSample(rows=4, steps=1, seconds=0.040))
    model.observe(StepSample(rows=6, steps=1, seconds=0.030))  # measured on a quiet moment
    assert model.predict_ms(6) == pytest.approx(40.0)
    assert model.predict_ms(8) >= 40.0


def test_a_report_of_many_steps_moves_the_mean_more_than_one_step():
    few, many = StepModel(weight=0.1), StepModel(weight=0.1)
    for model in (few, many):
        model.observe(StepSample(rows=1, steps=1, seconds=0.010))
    few.observe(StepSample(rows=1, steps=1, seconds=0.020))
    many.observe(StepSample(rows=1, steps=50, seconds=1.0))
    assert few.predict_ms(1) == pytest.approx(11.0)
    assert many.predict_ms(1) > 19.0
    assert many.steps == 51


@pytest.mark.parametrize("rows, steps, seconds", [(0, 1, 0.1), (1, 0, 0.1), (1, 1, -1.0),
                                                  (1, 1, float("nan"))])
def test_a_bad_sample_is_refused(rows, steps, seconds):
    with pytest.raises(ValueError):
        StepSample(rows=rows, steps=steps, seconds=seconds)


def test_the_workers_p90_decode_is_kept_by_rows_and_never_read_below_the_mean():
    model = StepModel()
    model.observe(StepSample(rows=2, steps=10, seconds=0.300, tail_seconds=0.060))  # mean 30
    model.observe(StepSample(rows=4, steps=10, seconds=0.500))  # a worker that says no tail
    assert model.predict_ms(2) == pytest.approx(30.0)
    assert model.predict_tail_ms(2) == pytest.approx(60.0)
    # Rows with no tail said: the tails' own prediction (proportional above), never below the
    # mean's; a model whose worker says none at all reads the mean.
    assert model.predict_tail_ms(4) == pytest.approx(120.0)
    assert model.predict_tail_ms(1) == pytest.approx(60.0)
    plain = StepModel()
    plain.observe(StepSample(rows=2, steps=10, seconds=0.300))
    assert plain.predict_tail_ms(2) == pytest.approx(30.0)
    with pytest.raises(ValueError, match="tail_seconds"):
        StepSample(rows=1, steps=1, seconds=0.1, tail_seconds=-1.0)
