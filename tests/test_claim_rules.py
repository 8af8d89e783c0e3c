"""Each claim rule of prores/study/claims.py, branch by branch (holds, does not hold, not shown), on small
synthetic arms: runs with hand-set losses, series and analyses, whose verdict is worked out by hand here.

The spreads are chosen so the arithmetic is plain: ProRes's two seeds end at 2.00 and 2.02, a sample std
of 0.01414, so "beyond twice the spread" is beyond 0.0283; a paired difference that is the same on both
seeds has no spread at all.
"""

from pathlib import Path

import pytest

from prores.config import operational_keys
from prores.study.claims import FAILS, HOLDS, UNMEASURED, UNSHOWN, Study
from prores.study.prores_effect import pairs
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
PRORES = (2.00, 2.02)  # ProRes's two seeds at every depth


def run(method, depth, seed, loss=None, state="completed", scalars=None, run_dir=Path("/nonexistent"), steps=100):
    return Run(f"{method}-L{depth}-s{seed}", run_dir, {"model.num_layers": depth, "method": method}, seed, state,
               METHODS[method] | {"model.num_layers": depth}, {"final_valid_loss": loss, "steps": steps},
               scalars or {})


def arm(method, depth, losses, **kw):
    """A method's runs at a depth, seeds 1, 2, ... with these final losses."""
    return [run(method, depth, seed, loss, **kw) for seed, loss in enumerate(losses, 1)]


def prores_and(depth, shift, *others):
    """ProRes at ``depth``, Pre-LN ``shift`` above it on each seed (a paired lead with no spread), and others."""
    return arm("Pre-LN + ProRes", depth, PRORES) + arm("Pre-LN", depth, [x + shift for x in PRORES]) + list(others)


def claim(runs, key):
    claims = {c.key: c for c in Study(runs, lambda r: r.grid["method"]).claims()}
    return claims[key].verdict


@pytest.mark.parametrize("scaled, verdict", [
    (2.20, HOLDS),   # 2.20 - mean 2.01 = +0.19, beyond 0.0283, and Pre-LN +0.1 with no spread: lowest everywhere
    (1.90, FAILS),   # -0.11: lower than ProRes beyond the spread
    (2.02, UNSHOWN),  # +0.01: above, but within twice the spread
])
def test_prores_lowest_at_every_depth(scaled, verdict):
    runs = prores_and(12, 0.1, *arm("Scaled Init", 12, [2.20])) + prores_and(24, 0.1, *arm("Scaled Init", 24, [scaled]))
    assert claim(runs, "c-lowest") == verdict


@pytest.mark.parametrize("leads, verdict", [
    ((0.05, 0.10, 0.20), HOLDS),     # Spearman 1, and 0.20 - 0.05 = 0.15 beyond 0.0283
    ((0.20, 0.10, 0.05), FAILS),     # Spearman -1
    ((0.100, 0.105, 0.110), UNSHOWN),  # Spearman 1 but 0.110 - 0.100 = 0.01 within 0.0283
    ((0.10, 0.30, 0.20), UNSHOWN),   # 0.10 beyond 0.0283, but ranks (1, 3, 2) against (1, 2, 3): Spearman 0.5 < 0.6
])
def test_prores_lead_grows_with_depth(leads, verdict):
    runs = [r for depth, lead in zip((12, 24, 48), leads) for r in prores_and(depth, lead)]
    assert claim(runs, "c-lead-grows") == verdict


def test_a_lead_over_two_depths_is_not_measured():
    assert claim(prores_and(12, 0.1) + prores_and(24, 0.2), "c-lead-grows") == UNMEASURED


@pytest.mark.parametrize("shallow, deep, verdict", [
    (0.01, 0.10, HOLDS),    # within 0.0283 at 12, behind beyond it at 72
    (0.01, -0.05, FAILS),   # not behind at 72
    (0.10, 0.10, UNSHOWN),  # behind at 72 as claimed, but already behind at 12
])
def test_lns_matches_prores_then_falls_behind(shallow, deep, verdict):
    mean = sum(PRORES) / 2
    runs = (prores_and(12, 0.1, *arm("LNS", 12, [mean + shallow]))
            + prores_and(72, 0.1, *arm("LNS", 72, [mean + deep])))
    assert claim(runs, "lns") == verdict


@pytest.mark.parametrize("shallow, deep, verdict", [
    (0.05, -0.10, HOLDS),   # DeepNorm above Pre-LN at 12, below it by 0.10 (beyond 0.0283) at 72
    (0.05, 0.05, FAILS),    # not below Pre-LN at 72
    (0.05, -0.01, UNSHOWN),  # below at 72, but within the spread
])
def test_deepnorm_overtakes_pre_ln(shallow, deep, verdict):
    # Pre-LN's own seeds are 2.10 and 2.12 (spread 0.01414, mean 2.11); DeepNorm has one seed
    runs = (prores_and(12, 0.1, *arm("DeepNorm", 12, [2.11 + shallow]))
            + prores_and(72, 0.1, *arm("DeepNorm", 72, [2.11 + deep])))
    assert claim(runs, "deepnorm") == verdict


@pytest.mark.parametrize("pre, verdict", [
    ({12: (2.30, 2.32), 24: (2.20, 2.22), 72: (2.00, 2.02)}, FAILS),   # deepest 2.01 below best shallow 2.21 by 0.2
    ({12: (2.30, 2.32), 24: (2.20, 2.22), 72: (2.21, 2.23)}, HOLDS),   # deepest 2.22 is not below 2.21: stalls
    ({12: (2.30, 2.32), 24: (2.20, 2.22)}, UNMEASURED),                # nothing from 72 blocks
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
    ((0.19, 0.21), HOLDS),   # Post-LN gains 0.20, Pre-LN 0.05 (seeds 0.04, 0.06): 0.15 beyond 0.0283
    ((0.02, 0.04), FAILS),   # 0.03, below Pre-LN's 0.05
    ((0.05, 0.07), UNSHOWN),  # 0.06: above 0.05 by 0.01, within the spread
])
def test_post_ln_gains_the_most(post_gains, verdict):
    runs = (arm("Pre-LN + ProRes", 12, PRORES) + arm("Pre-LN", 12, [PRORES[0] + 0.04, PRORES[1] + 0.06])
            + arm("Post-LN + ProRes", 12, (2.5, 2.5)) + arm("Post-LN", 12, [2.5 + g for g in post_gains]))
    assert claim(runs, "a-post-gains") == verdict


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
