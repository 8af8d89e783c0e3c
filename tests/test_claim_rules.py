"""Each claim rule of prores/study/claims.py, branch by branch (holds, does not hold, not shown), on small
synthetic arms: runs with hand-set losses, series and analyses, whose verdict is worked out by hand here.

A comparison is a paired difference over seeds with its 95% t-interval. The per-seed differences are chosen so
the arithmetic is plain: with three seeds t(0.975, 2) = 4.3027 and the half-width is 4.3027·sd/√3 = 2.4841·sd,
so (0.10, 0.11, 0.12) is 0.11 ± 0.0248 (shown above 0), (0.00, 0.02, 0.04) is 0.02 ± 0.0497 (includes 0);
with two seeds t(0.975, 1) = 12.706, so (0.05, 0.07) is 0.06 ± 0.1271 (12.706·0.01): not shown, though the rule before issue 41
("beyond twice the seed spread": 0.06 > 0.0283) called it shown.
"""

import math
from pathlib import Path

import pytest

from prores.config import operational_keys
from prores.study.claims import FAILS, HOLDS, UNMEASURED, UNSHOWN, Study
from prores.study.intervals import ABOVE, BELOW, OVERLAPS, interval
from prores.study.prores_effect import effect_table, pairs
from prores.study.runs import Run

METHODS = {
    "Pre-LN + ProRes": {"model.norm_layout": "pre", "model.init": "normal", "prores.schedule": "linear"},
    "Pre-LN": {"model.norm_layout": "pre", "model.init": "normal", "prores.schedule": "none"},
    "Scaled Init": {"model.norm_layout": "pre", "model.init": "scaled", "prores.schedule": "none"},
    "LNS": {"model.norm_layout": "lns", "model.init": "normal", "prores.schedule": "none"},
    "DeepNorm": {"model.norm_layout": "deepnorm", "model.init": "deepnorm", "prores.schedule": "none"},
    "Post-LN": {"model.norm_layout": "post", "model.init": "normal", "prores.schedule": "none"},
    "Post-LN + ProRes": {"model.norm_layout": "post", "model.init": "normal", "prores.schedule": "linear"},
}
PRORES = (2.00, 2.02, 2.04)  # ProRes's three seeds at every depth
ABOVE3, ACROSS3, BELOW3 = (0.10, 0.11, 0.12), (0.00, 0.02, 0.04), (-0.10, -0.11, -0.12)  # per-seed differences
LEAD = (0.10, 0.10, 0.10)  # Pre-LN above ProRes by 0.1 on every seed


def run(method, depth, seed, loss=None, state="completed", scalars=None, run_dir=Path("/nonexistent"), steps=100):
    return Run(f"{method}-L{depth}-s{seed}", run_dir, {"model.num_layers": depth, "method": method}, seed, state,
               METHODS[method] | {"model.num_layers": depth}, {"final_valid_loss": loss, "steps": steps},
               scalars or {})


def arm(method, depth, losses, **kw):
    """A method's runs at a depth, seeds 1, 2, ... with these final losses."""
    return [run(method, depth, seed, loss, **kw) for seed, loss in enumerate(losses, 1)]


def above(method, depth, diffs, base=PRORES):
    """A method whose loss is ``base`` plus ``diffs``, seed by seed (as many seeds as diffs)."""
    return arm(method, depth, [b + d for b, d in zip(base, diffs)])


def prores_and(depth, lead=LEAD, *others):
    """ProRes at ``depth``, Pre-LN ``lead`` above it seed by seed, and others."""
    return arm("Pre-LN + ProRes", depth, PRORES) + above("Pre-LN", depth, lead) + list(others)


def claim(runs, key):
    claims = {c.key: c for c in Study(runs, lambda r: r.grid["method"]).claims()}
    return claims[key].verdict


def test_the_intervals_worked_by_hand():
    for diffs, mean, half, verdict in ((ABOVE3, 0.11, 2.484138 * 0.01, ABOVE), (ACROSS3, 0.02, 2.484138 * 0.02, OVERLAPS),
                                       (BELOW3, -0.11, 2.484138 * 0.01, BELOW), ((0.05, 0.07), 0.06, 0.127062, OVERLAPS)):
        iv = interval(list(diffs))
        assert (iv.mean, iv.low, iv.high, iv.verdict) == (pytest.approx(mean), pytest.approx(mean - half, abs=1e-6),
                                                          pytest.approx(mean + half, abs=1e-6), verdict)


def test_a_divergence_is_decided_by_the_signs():
    """A diverged run's loss is +inf: differences that contain one are shown only when they all share its sign."""
    assert (interval([math.inf, 0.1, 0.2]).low, interval([math.inf, 0.1, 0.2]).verdict) == (0.1, ABOVE)
    assert interval([-math.inf, -0.3]).verdict == BELOW
    assert interval([math.inf, -0.01, 0.2]).verdict == OVERLAPS
    assert interval([math.inf - math.inf, 0.1, 0.2]).mean == pytest.approx(0.1)  # both failed: a tie
    assert interval([math.inf]).verdict is None  # one seed shows nothing


@pytest.mark.parametrize("scaled, verdict", [
    (ABOVE3, HOLDS),       # Scaled Init and Pre-LN shown above ProRes at both depths
    (BELOW3, FAILS),       # Scaled Init shown below ProRes at 24
    (ACROSS3, UNSHOWN),    # above on average, the interval includes 0
    ((0.05, 0.07), UNSHOWN),  # two seeds: 0.06 ± 0.127
    ((0.20,), HOLDS),      # one seed, 2.20: unpaired, 2.20 − 2.02 = +0.18 ± 0.0994 (ProRes's variance)
    ((0.05,), UNSHOWN),    # one seed, 2.05: +0.03 ± 0.0994
    ("diverged", HOLDS),   # diverged on every seed: worse than any loss
])
def test_prores_lowest_at_every_depth(scaled, verdict):
    other = ([run("Scaled Init", 24, s, state="diverged") for s in (1, 2, 3)] if scaled == "diverged"
             else above("Scaled Init", 24, scaled))
    runs = prores_and(12, LEAD, *above("Scaled Init", 12, ABOVE3)) + prores_and(24, LEAD, *other)
    assert claim(runs, "c-lowest") == verdict


@pytest.mark.parametrize("leads, verdict", [
    # the leads at 12, 24, 48 blocks, seed by seed; the rule reads the means' ranks and the 48 − 12 change per seed
    (((0.05,) * 3, (0.10,) * 3, (0.19, 0.20, 0.21)), HOLDS),         # Spearman 1, change (0.14, 0.15, 0.16) above 0
    (((0.20,) * 3, (0.10,) * 3, (0.05,) * 3), FAILS),                # Spearman -1
    (((0.10,) * 3, (0.105,) * 3, (0.10, 0.11, 0.12)), UNSHOWN),      # Spearman 1, change (0.00, 0.01, 0.02) includes 0
    (((0.10,) * 3, (0.30,) * 3, (0.19, 0.20, 0.21)), UNSHOWN),       # change above 0, but Spearman 0.5 < 0.6
])
def test_prores_lead_grows_with_depth(leads, verdict):
    runs = [r for depth, lead in zip((12, 24, 48), leads) for r in prores_and(depth, lead)]
    assert claim(runs, "c-lead-grows") == verdict


def test_a_lead_over_two_depths_is_not_measured():
    assert claim(prores_and(12) + prores_and(24), "c-lead-grows") == UNMEASURED


@pytest.mark.parametrize("shallow, deep, verdict", [
    (ACROSS3, ABOVE3, HOLDS),    # matches at 12 (includes 0), shown behind at 72
    (ACROSS3, BELOW3, FAILS),    # shown ahead at 72
    (ABOVE3, ABOVE3, UNSHOWN),   # behind at 72 as claimed, but already behind at 12
    (ACROSS3, ACROSS3, UNSHOWN),  # not shown behind at 72, nor ahead (before issue 41: does not hold)
])
def test_lns_matches_prores_then_falls_behind(shallow, deep, verdict):
    runs = prores_and(12, LEAD, *above("LNS", 12, shallow)) + prores_and(72, LEAD, *above("LNS", 72, deep))
    assert claim(runs, "lns") == verdict


@pytest.mark.parametrize("shallow, deep, verdict", [
    ((0.04, 0.05, 0.06), BELOW3, HOLDS),    # DeepNorm behind Pre-LN at 12, shown below it at 72
    ((0.04, 0.05, 0.06), ABOVE3, FAILS),    # shown behind Pre-LN at 72
    ((0.04, 0.05, 0.06), (-0.04, -0.02, 0.00), UNSHOWN),  # below at 72 on average, the interval includes 0
])
def test_deepnorm_overtakes_pre_ln(shallow, deep, verdict):
    pre = [p + l for p, l in zip(PRORES, LEAD)]  # DeepNorm's differences are from Pre-LN's own seeds
    runs = (prores_and(12, LEAD, *above("DeepNorm", 12, shallow, pre))
            + prores_and(72, LEAD, *above("DeepNorm", 72, deep, pre)))
    assert claim(runs, "deepnorm") == verdict


@pytest.mark.parametrize("pre, verdict", [
    # best up to 48 is 24 blocks (mean 2.22); the rule's gain is Pre-LN at 24 minus at 72, seed by seed
    ({12: (2.30, 2.32, 2.34), 24: (2.20, 2.22, 2.24), 72: (2.00, 2.03, 2.06)}, FAILS),    # (0.20, 0.19, 0.18)
    ({12: (2.30, 2.32, 2.34), 24: (2.20, 2.22, 2.24), 72: (2.30, 2.33, 2.36)}, HOLDS),    # (-0.10, -0.11, -0.12)
    ({12: (2.30, 2.32, 2.34), 24: (2.20, 2.22, 2.24), 72: (2.20, 2.21, 2.22)}, UNSHOWN),  # (0.00, 0.01, 0.02)
    ({12: (2.30, 2.32, 2.34), 24: (2.20, 2.22, 2.24)}, UNMEASURED),                       # nothing from 72 blocks
])
def test_pre_ln_stalls_with_depth(pre, verdict):
    runs = [r for depth, losses in pre.items() for r in arm("Pre-LN", depth, losses)]
    assert claim(runs, "pre-stalls") == verdict


def test_a_diverged_pre_ln_run_from_72_blocks_is_instability():
    runs = arm("Pre-LN", 12, (2.30, 2.32)) + arm("Pre-LN", 72, (2.00,)) + [run("Pre-LN", 72, 2, state="diverged")]
    assert claim(runs, "pre-stalls") == HOLDS


def series(spikes_at=(), steps=100) -> dict[int, float]:
    """A loss alternating 1.0 and 1.1 (std 0.05 in any window), 10.0 at the given steps: a spike each."""
    return {s: 10.0 if s in spikes_at else 1.0 + 0.1 * (s % 2) for s in range(1, steps + 1)}


@pytest.mark.parametrize("spikes_at, verdict", [
    ((), HOLDS),
    ((50,), FAILS),  # one spike in the 80 steps of 10-90% of training: 0.0125 > 0.01
    ((5,), HOLDS),   # before 10% of training: not counted
])
def test_the_spike_score_stays_near_zero_with_prores(spikes_at, verdict):
    runs = [run("Pre-LN + ProRes", 12, seed, 2.0 + seed / 100,
                scalars={"train/loss": series(spikes_at), "train/grad_norm": series()}) for seed in (1, 2)]
    assert claim(runs, "d-spikes") == verdict


def profile(shape: str, depth: int = 6) -> dict:
    """Each block's act RMS at steps 10 and 100: exponential (1.5^l) or linear (1 + l) in the block index."""
    rms = {"exp": lambda l: 1.5 ** l, "linear": lambda l: 1.0 + l}[shape]
    return {f"layers/act_rms/layer_{l:03d}": {10: rms(l), 100: rms(l)} for l in range(1, depth + 1)}


@pytest.mark.parametrize("pre, prores, verdict", [
    (("exp", "exp"), ("linear", "linear"), HOLDS),
    (("linear", "linear"), ("linear", "linear"), FAILS),  # no Pre-LN seed exponential-like
    (("exp", "exp"), ("exp", "exp"), FAILS),             # every ProRes seed exponential-like
    (("exp", "linear"), ("linear", "linear"), UNSHOWN),   # one Pre-LN seed of two
])
def test_activation_growth_exponential_then_linear(pre, prores, verdict):
    runs = ([run("Pre-LN", 6, seed, 2.1, scalars=profile(shape)) for seed, shape in enumerate(pre, 1)]
            + [run("Pre-LN + ProRes", 6, seed, 2.0, scalars=profile(shape)) for seed, shape in enumerate(prores, 1)])
    assert claim(runs, "b-growth") == verdict


def analysed(tmp_path, seed, cosines_at_10) -> Run:
    """A ProRes run whose `prores analyze` found these cosines (block 1, 2, 3, ...) at step 10 of 100."""
    run_dir = tmp_path / f"s{seed}"
    (run_dir / "analysis").mkdir(parents=True)
    layers = range(1, len(cosines_at_10) + 1)
    (run_dir / "analysis" / "cosine.csv").write_text(
        "step," + ",".join(f"layer_{l:03d}" for l in layers) + "\n"
        + "10," + ",".join(map(str, cosines_at_10)) + "\n100," + ",".join("1.0" for _ in layers) + "\n")
    return run("Pre-LN + ProRes", 12, seed, 2.0, run_dir=run_dir)


@pytest.mark.parametrize("seeds, verdict", [
    (((0.9, 0.8, 0.7, 0.6), (0.9, 0.7, 0.8, 0.5)), HOLDS),   # Spearman -1 and -0.8: mean -0.9
    (((0.6, 0.7, 0.8, 0.9), (0.9, 0.8, 0.7, 0.6)), FAILS),   # +1 and -1: mean 0
    (((0.9, 0.8, 0.7, 0.6), (0.6, 0.9, 0.8, 0.7)), UNSHOWN),  # -1 and +0.2 (below): mean -0.4
])
def test_shallow_layers_converge_first(tmp_path, seeds, verdict):
    runs = [analysed(tmp_path, seed, cosines) for seed, cosines in enumerate(seeds, 1)]
    assert claim(runs, "e-evolution") == verdict


def test_the_evolution_rule_reads_spearman_as_computed_here(tmp_path):
    """The third case's second seed by hand: the ranks of (0.6, 0.9, 0.8, 0.7) are (1, 4, 3, 2) against the
    blocks' (1, 2, 3, 4): d² = 0 + 4 + 0 + 4 = 8, rho = 1 - 6·8/(4·15) = +0.2."""
    study = Study([analysed(tmp_path, 1, (0.6, 0.9, 0.8, 0.7))], lambda r: r.grid["method"])
    assert study.evolution().numbers["prores_mean"][12] == pytest.approx(1 - 6 * 8 / (4 * 15))


@pytest.mark.parametrize("post_gains, verdict", [
    # Pre-LN gains (0.04, 0.05, 0.06); the rule reads Post-LN's gain minus Pre-LN's, seed by seed
    ((0.19, 0.21, 0.20), HOLDS),    # (0.15, 0.16, 0.14): shown above 0
    ((0.00, 0.02, 0.01), FAILS),    # (-0.04, -0.03, -0.05): shown below 0
    ((0.05, 0.07, 0.06), UNSHOWN),  # (0.01, 0.02, 0.00): includes 0
])
def test_post_ln_gains_the_most(post_gains, verdict):
    runs = (arm("Pre-LN + ProRes", 12, PRORES) + above("Pre-LN", 12, (0.04, 0.05, 0.06))
            + arm("Post-LN + ProRes", 12, (2.5,) * 3) + above("Post-LN", 12, post_gains, (2.5,) * 3))
    assert claim(runs, "a-post-gains") == verdict


@pytest.mark.parametrize("on_minus_off, cell, verdict", [
    (BELOW3, "-0.1100 [-0.1348, -0.0852]", "helps"),
    (ABOVE3, "+0.1100 [+0.0852, +0.1348]", "hurts"),
    ((-0.05, -0.07), "-0.0600 [-0.1871, +0.0671]", "not shown"),  # before issue 41: "helps" (beyond 0.0283)
    ((-0.05,), "-0.0500", "not shown"),
])
def test_the_on_off_table_by_hand(on_minus_off, cell, verdict):
    off = (2.10, 2.12, 2.14)[:len(on_minus_off)]
    table = effect_table(arm("Pre-LN", 48, off) + above("Pre-LN + ProRes", 48, on_minus_off, off))
    assert table[1][4:] == [cell, str(len(on_minus_off)), verdict]


def test_unmeasured_without_the_runs_a_rule_needs():
    runs = arm("Pre-LN", 12, (2.1, 2.12))
    claims = {c.key: c.verdict for c in Study(runs, lambda r: r.grid["method"]).claims()}
    assert claims == {k: UNMEASURED for k in claims}, claims


def test_the_on_off_pairs_ignore_operational_keys_only():
    """A cell that a newer prores resumed carries more callbacks and checkpoint keys: still the same training,
    still a pair. Another lr is another training: no pair."""
    base = run("Pre-LN", 48, 1, 2.10)
    newer = run("Pre-LN + ProRes", 48, 1, 2.00)
    newer.config |= {"train.callbacks": ["hang_watchdog", "scalars"], "checkpoint.interval": 100,
                     "train.hang_timeout": 600.0}
    assert [(off.name, on.name) for ps in pairs([base, newer]).values() for off, on in ps] == \
        [("Pre-LN-L48-s1", "Pre-LN + ProRes-L48-s1")]
    for key, value in (("optim.lr", 3e-3), ("monitor.spike_window", 50), ("monitor.spike_sigma", 5.0),
                       ("logging.stats_interval", 7)):  # each changes the training or a reported metric
        other = run("Pre-LN + ProRes", 48, 1, 2.00)
        other.config[key] = value
        assert pairs([base, other]) == {}, key
    assert operational_keys() >= {"train.callbacks", "checkpoint.interval", "train.hang_timeout"}
    assert not operational_keys() & {"optim.lr", "train.steps", "train.eval_interval", "model.num_layers",
                                     "monitor.spike_window", "monitor.spike_sigma", "logging.stats_interval"}


def test_one_seed_against_several_is_a_two_sample_interval():
    """A method run on one seed against ProRes's three: mean(b) − mean(a) with ProRes's variance (the one arm
    that has one), on 3 + 1 − 2 = 2 degrees of freedom: half-width t(2)·s·√(1/3 + 1). ProRes (2.00, 2.02, 2.04):
    s = 0.02, half-width 4.302653 · 0.02 · 1.154701 = 0.099366."""
    iv = Study(prores_and(12, LEAD, *arm("LNS", 12, [2.12])), lambda r: r.grid["method"]).lowest()[0] \
        .numbers["per_depth"][12]["margins"]["LNS"]
    assert (iv["minus_prores"], iv["low"], iv["high"], iv["unpaired"]) == (
        pytest.approx(0.10), pytest.approx(0.10 - 0.099366, abs=1e-6), pytest.approx(0.10 + 0.099366, abs=1e-6), (3, 1))
    diverged = [run("LNS", 12, 1, state="diverged")]
    assert claim(prores_and(12, LEAD, *diverged) + prores_and(24, LEAD, *arm("LNS", 24, [2.5])), "c-lowest") == HOLDS
