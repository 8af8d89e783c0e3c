"""alpha(l, t) against values computed by hand, for every schedule in the registry."""

import math

import pytest

from prores.model.prores import SCHEDULES, ProRes

T, L = 10, 4
# (schedule, l, t, expected) with T=10, L=4. Boundaries: t=0, the warmup edge of
# layer l (t = T·l for linear), and far beyond.
TABLE = [
    ("linear", 1, 0, 0.0), ("linear", 1, 5, 0.5), ("linear", 1, 10, 1.0), ("linear", 1, 99, 1.0),
    ("linear", 4, 10, 0.25), ("linear", 4, 39, 0.975), ("linear", 4, 40, 1.0),
    ("linear-sqrt", 4, 10, 0.5), ("linear-sqrt", 1, 10, 1.0), ("linear-sqrt", 2, 5, 0.5),
    ("linear-square", 4, 20, 0.25), ("linear-square", 2, 10, 0.25), ("linear-square", 4, 40, 1.0),
    ("equal", 1, 5, 0.5), ("equal", 4, 5, 0.5), ("equal", 4, 10, 1.0), ("equal", 3, 0, 0.0),
    ("reverse", 4, 5, 0.5), ("reverse", 1, 10, 0.25), ("reverse", 1, 40, 1.0), ("reverse", 2, 15, 0.5),
    ("stagewise-0", 1, 5, 0.5), ("stagewise-0", 2, 5, 0.0), ("stagewise-0", 2, 15, 0.5),
    ("stagewise-0", 4, 30, 0.0), ("stagewise-0", 4, 35, 0.5), ("stagewise-0", 4, 40, 1.0),
    ("stagewise-L", 2, 0, 0.25), ("stagewise-L", 2, 15, 0.625), ("stagewise-L", 4, 40, 1.0),
    ("stagewise-sqrt-L", 1, 0, 0.5), ("stagewise-sqrt-L", 3, 25, 0.75), ("stagewise-sqrt-L", 4, 40, 1.0),
    ("stagewise-sqrt-l", 4, 0, 0.5), ("stagewise-sqrt-l", 4, 35, 0.75), ("stagewise-sqrt-l", 1, 0, 1.0),
    ("fix-L", 1, 0, 0.25), ("fix-L", 4, 1000, 0.25),
    ("fix-sqrt-L", 2, 7, 0.5), ("fix-sqrt-l", 4, 3, 0.5), ("fix-sqrt-l", 1, 3, 1.0),
    ("none", 3, 0, 1.0), ("none", 1, 123, 1.0),
]


@pytest.mark.parametrize("schedule,layer,step,expected", TABLE)
def test_alpha_table(schedule, layer, step, expected):
    assert ProRes(schedule, T, L).alpha(layer, step) == pytest.approx(expected, abs=1e-12)


def test_table_covers_every_schedule():
    assert {row[0] for row in TABLE} == set(SCHEDULES)


# The first step from which every alpha is exactly 1 forever (None: never).
SATURATION = {"linear": 40, "linear-sqrt": 40, "linear-square": 40, "equal": 10, "reverse": 40,
              "stagewise-0": 40, "stagewise-L": 40, "stagewise-sqrt-L": 40, "stagewise-sqrt-l": 40, "fix-L": None,
              "fix-sqrt-L": None, "fix-sqrt-l": None, "none": 0}


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_saturation_step_is_exactly_where_all_alphas_reach_one(schedule):
    p = ProRes(schedule, T, L)
    at = SATURATION[schedule]
    for step in range(0, 60):
        all_one = all(p.alpha(l, s) == 1.0 for l in range(1, L + 1) for s in range(step, step + 60))
        assert p.saturated(step) == (at is not None and step >= at)
        if p.saturated(step):
            assert all_one
    if at is not None and at > 0:
        assert not all(p.alpha(l, at - 1) == 1.0 for l in range(1, L + 1))


def test_a_fractional_T():
    """prores.T = 2.5 with L = 4: block l saturates at step 2.5·l, the whole stack at step 10 (T·L)."""
    p = ProRes("linear", 2.5, 4)
    assert [p.alpha(3, t) for t in (0, 3, 5, 7, 8)] == pytest.approx([0.0, 0.4, 2 / 3, 14 / 15, 1.0], abs=1e-15)
    assert p.alpha(4, 9) == 0.9 and p.alpha(4, 10) == 1.0
    assert [p.saturated(t) for t in (9, 10)] == [False, True]
    q = ProRes("stagewise-0", 2.5, 4)  # block 2 warms up over steps 2.5..5
    assert [q.alpha(2, t) for t in (2, 3, 4, 5)] == pytest.approx([0.0, 0.2, 0.6, 1.0], abs=1e-15)
    assert ProRes("equal", 0.5, 4).saturated(1) and not ProRes("equal", 1.5, 4).saturated(1)


def test_alpha_is_monotone_and_bounded():
    for name in SCHEDULES:
        p = ProRes(name, 7, 5)
        for l in range(1, 6):
            values = [p.alpha(l, t) for t in range(0, 50)]
            assert all(0.0 <= v <= 1.0 for v in values)
            assert values == sorted(values), name


def test_global_index_is_one_based_and_checked():
    p = ProRes("linear", T, L)
    with pytest.raises(ValueError, match="outside 1..4"):
        p.alpha(0, 5)
    with pytest.raises(ValueError, match="outside 1..4"):
        p.alpha(5, 5)
    assert p.alpha(1, 3) == 0.3 and p.alpha(3, 3) == pytest.approx(0.1)
    assert math.isclose(ProRes("linear-sqrt", T, L).alpha(3, 3), math.sqrt(0.1))


def reference_alphas(name: str, t: int, P: int, L: int) -> list[float]:
    """torchrun_main.py (dandingsky/ProRes at 5253e0d), for update step t and prores_warmup_steps P:
        layerwise_warmup_steps = np.linspace(P // L, P, L)   (flipped for linear_reverse)
        linear: np.clip(t / w, 0, 1); sqrt: np.clip(np.sqrt(t / w), 0, 1); square: np.clip((t / w)**2, 0, 1)
        stagewise_*: np.clip(m + (1 - m) * (t - concat([0], w[:-1])) / np.diff(w, prepend=0), m, 1), with
            m = 0, 1/L, sqrt(1/L) or 1/sqrt([1..L]) for stagewise_0, _L, _sqrt_L, _sqrt_l"""
    w = [P // L + i * (P - P // L) / (L - 1) for i in range(L)]
    if name == "linear_reverse":
        w = w[::-1]
    clip = lambda x, lo=0.0: min(max(x, lo), 1.0)  # noqa: E731
    if name in ("linear", "linear_reverse"):
        return [clip(t / x) for x in w]
    if name in ("sqrt", "linear_sqrt"):
        return [clip(math.sqrt(t / x)) for x in w]
    if name in ("square", "linear_square"):
        return [clip((t / x) ** 2) for x in w]
    lows = {"stagewise_0": [0.0] * L, "stagewise_L": [1 / L] * L, "stagewise_sqrt_L": [math.sqrt(1 / L)] * L,
            "stagewise_sqrt_l": [1 / math.sqrt(l) for l in range(1, L + 1)]}[name]
    before = [0.0] + w[:-1]
    return [clip(m + (1 - m) * (t - b) / (x - b), m) for m, b, x in zip(lows, before, w)]


REFERENCE = ["linear", "linear_reverse", "sqrt", "square", "linear_sqrt", "linear_square", "stagewise_0",
             "stagewise_L", "stagewise_sqrt_L", "stagewise_sqrt_l"]


@pytest.mark.parametrize("name", REFERENCE)
@pytest.mark.parametrize("T, L", [(10, 4), (5, 7), (3, 12)])
def test_the_reference_names_are_the_references_schedules_at_a_whole_T(name, T, L):
    from prores.config import load_config

    ours = ProRes(load_config(None, (f"prores.schedule={name}",)).prores.schedule, T, L)
    for t in range(0, T * L + 3):
        assert [ours.alpha(l, t) for l in range(1, L + 1)] == pytest.approx(reference_alphas(name, t, T * L, L),
                                                                          abs=1e-12), t


def test_at_a_fractional_T_prores_keeps_T_times_l_where_the_reference_rounds():
    """cpu-depth.yaml's T = 2.5 at 48 blocks: P = 120, the reference's first block saturates at 120 // 48 = 2."""
    ours = ProRes("linear", 2.5, 48)
    assert reference_alphas("linear", 2, 120, 48)[0] == 1.0 and ours.alpha(1, 2) == 0.8
    assert ours.alpha(1, 3) == 1.0 and ours.alpha(48, 120) == reference_alphas("linear", 120, 120, 48)[47] == 1.0


@pytest.mark.parametrize("name, fix", [("linear_equal", "prores.schedule=equal with prores.T set to T·L"),
                                       ("fix_sqrt_l", "prores.schedule=fix-sqrt-l knowing so")])
def test_a_reference_name_with_another_schedule_is_refused_with_the_fix(name, fix):
    from prores.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=f"prores.schedule: '{name}'.*{fix}"):
        load_config(None, (f"prores.schedule={name}",))
