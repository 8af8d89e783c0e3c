"""Learning-rate multipliers against values computed by hand."""

import math

import pytest

from prores.run.lr import LR_SCHEDULES

TOTAL, WARMUP = 100, 10


@pytest.mark.parametrize("step,expected", [
    (0, 0.1), (4, 0.5), (9, 1.0), (10, 1.0), (50, 1.0), (89, 1.0),  # warmup, then flat
    (90, 0.9), (94, 0.5), (99, 0.0),  # linear decay over the last 10 steps
])
def test_wsd(step, expected):
    assert LR_SCHEDULES["wsd"](step, TOTAL, WARMUP, 0.0, 0.1) == pytest.approx(expected)


def test_wsd_decays_to_min_ratio():
    assert LR_SCHEDULES["wsd"](99, TOTAL, WARMUP, 0.1, 0.1) == pytest.approx(0.1)
    assert LR_SCHEDULES["wsd"](94, TOTAL, WARMUP, 0.1, 0.1) == pytest.approx(0.55)


@pytest.mark.parametrize("step,expected", [
    (0, 0.1), (9, 1.0), (54, 0.5 * (1 + math.cos(math.pi * 45 / 90))), (99, 0.0),
])
def test_cosine(step, expected):
    assert LR_SCHEDULES["cosine"](step, TOTAL, WARMUP, 0.0, 0.1) == pytest.approx(expected)


def test_constant():
    assert [LR_SCHEDULES["constant"](s, TOTAL, 2, 0.0, 0.1) for s in (0, 1, 50)] == [0.5, 1.0, 1.0]
