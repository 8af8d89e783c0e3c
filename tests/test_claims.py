"""`prores report`'s claims (prores/study/claims.py) on a small depth study: every number in claims.json
against an independent computation here, from the run directories' event files, summaries and analyses."""

import csv
import json
import math
import statistics
from pathlib import Path

import numpy
import pytest
import yaml

from conftest import run_cli, t_interval
from prores.monitor.tensorboard import read_scalars
from prores.study.intervals import t975

pytestmark = pytest.mark.slow

DEPTHS = (3, 72)
STEPS = 20
# The event files keep float32 losses, the summaries (which the claims read) doubles: a loss of at most 6
# nats is off by at most 6·2^-24 < 4e-7, a difference or a spread of two by less than 1e-6.
LOSS = 1e-6
# An interval's end is mean ± t·spread·scale: the spread's error is multiplied by t (12.7 at one degree of
# freedom) and the scale (√(1/n_a + 1/n_b), or 1/√n paired), so its ends are good to LOSS·(1 + t·scale).
END_1DF = LOSS * (1 + 12.71 * 1.23)
SPEC = {
    "name": "claims",
    "base": "tiny.yaml",
    "set": {"model.hidden_size": 32, "model.ffn_hidden_size": 64, "model.num_heads": 2, "model.seq_length": 32,
            "train.micro_batch_size": 4, "train.steps": STEPS, "train.log_interval": 1, "train.eval_interval": 10,
            "data.eval_samples": 8, "logging.stats_interval": 2, "optim.lr": 3e-3, "optim.warmup_steps": 2,
            "kernels.backend": "eager", "checkpoint.interval": 2, "checkpoint.keep_last": 1,
            "checkpoint.keep_steps": [2], "prores.T": 0.1},
    "grid": {"model.num_layers": list(DEPTHS),
             "method": {"Pre-LN": {"prores.schedule": "none"}, "Pre-LN + ProRes": {"prores.schedule": "linear"},
                        "LNS": {"prores.schedule": "none", "model.norm_layout": "lns"},
                        "DeepNorm": {"prores.schedule": "none", "model.norm_layout": "deepnorm",
                                     "model.init": "deepnorm"},
                        "Post-LN": {"prores.schedule": "none", "model.norm_layout": "post"},
                        "Post-LN + ProRes": {"prores.schedule": "linear", "model.norm_layout": "post"}}},
    "seeds": [1],
    "where": [{"when": {"method": ["Pre-LN", "Pre-LN + ProRes"]}, "seeds": [1, 2]}],
}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("claims")
    (tmp / "spec.yaml").write_text(yaml.safe_dump(SPEC, sort_keys=False))
    proc = run_cli("sweep", str(tmp / "spec.yaml"), "--root", str(tmp), "--jobs", "2", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:]
    report = run_cli("report", str(tmp / "claims"), timeout=1800)
    assert report.returncode == 0, report.stderr[-3000:]
    claims = {c["key"]: c for c in json.loads((tmp / "claims" / "claims.json").read_text())}
    runs = {}
    for line in (tmp / "claims" / "cells.jsonl").read_text().splitlines():
        cell = json.loads(line)
        run_dir = Path(cell["run_dir"])
        runs[(cell["grid"]["method"], cell["grid"]["model.num_layers"], cell["grid"]["train.seed"])] = {
            "dir": run_dir, "scalars": read_scalars(run_dir), "summary": json.loads((run_dir / "summary.json").read_text())}
    return claims, runs, (tmp / "claims" / "report.md").read_text()


def final(run) -> float:
    valid = run["scalars"]["valid/loss"]
    return valid[max(valid)]


def seeds(runs, method, depth) -> dict[int, float]:
    return {s: final(r) for (m, d, s), r in runs.items() if m == method and d == depth}


def test_every_claim_has_a_rule_and_a_verdict(study):
    claims, _, report = study
    assert set(claims) == {"c-lowest", "c-lead-grows", "lns", "deepnorm", "pre-stalls", "d-spikes", "b-growth",
                           "e-evolution", "a-post-gains"}
    for c in claims.values():
        assert c["rule"] and c["verdict"] in ("holds", "does not hold", "not shown", "not measured")
        assert f"| {c['statement']} | **{c['verdict']}** |" in report


def test_prores_against_every_other_method(study):
    claims, runs, _ = study
    per_depth = claims["c-lowest"]["numbers"]["per_depth"]
    for depth in DEPTHS:
        pro = seeds(runs, "Pre-LN + ProRes", depth)
        row = per_depth[str(depth)]
        assert row["prores"] == pytest.approx(statistics.fmean(pro.values()), abs=LOSS)
        assert row["prores_spread"] == pytest.approx(statistics.stdev(pro.values()), abs=LOSS)
        for method in ("Pre-LN", "LNS", "DeepNorm", "Post-LN", "Post-LN + ProRes"):
            other = seeds(runs, method, depth)
            margin = row["margins"][method]
            if len(other) > 1:  # paired over the seeds both have
                diffs = [other[s] - pro[s] for s in sorted(set(pro) & set(other))]
                assert margin["minus_prores"] == pytest.approx(statistics.fmean(diffs), abs=LOSS)
                assert margin["seeds"] == len(diffs)
                assert (margin["low"], margin["high"]) == pytest.approx(t_interval(diffs)[1:], abs=END_1DF)
            else:  # one seed against ProRes's two: their means, with ProRes's variance on 2 + 1 - 2 = 1 df
                diff = other[1] - statistics.fmean(pro.values())
                half = t975(1) * statistics.stdev(pro.values()) * math.sqrt(1 / 2 + 1)
                assert margin["unpaired"] == [2, 1]
                assert margin["minus_prores"] == pytest.approx(diff, abs=LOSS)
                assert (margin["low"], margin["high"]) == pytest.approx((diff - half, diff + half), abs=END_1DF)
        means = {m: statistics.fmean(seeds(runs, m, depth).values()) for m in
                 ("Pre-LN", "Pre-LN + ProRes", "LNS", "DeepNorm", "Post-LN", "Post-LN + ProRes")}
        assert row["best"] == min(means, key=means.get)
    lead = claims["c-lead-grows"]["numbers"]["lead"]
    for depth in DEPTHS:
        assert lead[str(depth)] == min(m["minus_prores"] for m in per_depth[str(depth)]["margins"].values())


def test_lns_deepnorm_and_post_ln(study):
    claims, runs, _ = study
    for depth in DEPTHS:
        pro, pre = seeds(runs, "Pre-LN + ProRes", depth), seeds(runs, "Pre-LN", depth)
        lns = claims["lns"]["numbers"]["per_depth"][str(depth)]
        assert lns["minus_prores"] == pytest.approx(seeds(runs, "LNS", depth)[1] - statistics.fmean(pro.values()),
                                                    abs=LOSS)
        deep = claims["deepnorm"]["numbers"]["per_depth"][str(depth)]
        assert deep["minus_pre"] == pytest.approx(seeds(runs, "DeepNorm", depth)[1] - statistics.fmean(pre.values()),
                                                  abs=LOSS)
        post = claims["a-post-gains"]["numbers"]["per_depth"][str(depth)]
        assert post["post_gain"] == pytest.approx(seeds(runs, "Post-LN", depth)[1]
                                                  - seeds(runs, "Post-LN + ProRes", depth)[1], abs=LOSS)
        assert post["pre_gain"] == pytest.approx(statistics.fmean(pre[s] - pro[s] for s in pro), abs=LOSS)
        assert post["post_minus_pre"] == pytest.approx(post["post_gain"] - (pre[1] - pro[1]), abs=LOSS)  # seed 1
    scaling = claims["pre-stalls"]["numbers"]["per_method"]["Pre-LN"]
    assert scaling["loss"] == {str(d): pytest.approx(statistics.fmean(seeds(runs, "Pre-LN", d).values()), abs=LOSS)
                               for d in DEPTHS}


def test_the_report_pairs_each_method_with_and_without_prores(study):
    """report.md's "ProRes on − off": Pre-LN and Post-LN each against their ProRes run, paired by seed, and no
    other pair (LNS and DeepNorm have no ProRes twin); numbers at the table's 4 decimals."""
    _, runs, report = study
    section = report.split("## ProRes on − off", 1)[1].split("\n## ", 1)[0]
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
             if line.startswith("| ") and not line.startswith(("| method", "| ---"))]
    rows = {(r[0], int(r[1])): r for r in cells}
    assert set(rows) == {(m, d) for m in ("Pre-LN", "Post-LN") for d in DEPTHS}
    for (method, depth), row in rows.items():
        off, on = seeds(runs, method, depth), seeds(runs, f"{method} + ProRes", depth)
        diffs = [on[s] - off[s] for s in off]
        mean = statistics.fmean(diffs)
        assert float(row[2]) == pytest.approx(statistics.fmean(off.values()), abs=5e-5 + LOSS)
        assert float(row[3]) == pytest.approx(statistics.fmean(on.values()), abs=5e-5 + LOSS)
        assert float(row[4].split(" [")[0]) == pytest.approx(mean, abs=5e-5 + LOSS)
        assert row[5] == str(len(diffs))
        low, high = t_interval(diffs)[1:] if len(diffs) > 1 else (None, None)
        if low is not None:
            assert [float(x) for x in row[4].split(" [")[1].rstrip("]").split(", ")] == [
                pytest.approx(low, abs=5e-5 + END_1DF), pytest.approx(high, abs=5e-5 + END_1DF)]
        want = "not shown" if low is None or low <= 0 <= high else "helps" if high < 0 else "hurts"
        assert row[6] == want


def spike_steps(values: list[float], sigma: float, window: int) -> list[int]:
    """The rule restated: value more than sigma standard deviations above the previous window's mean, once
    min(10, window) previous values exist."""
    out = []
    for t, v in enumerate(values):
        past = numpy.array(values[max(0, t - window):t])
        if len(past) >= min(10, window) and v > past.mean() + sigma * past.std():
            out.append(t)
    return out


def test_spike_scores(study):
    claims, runs, _ = study
    scores = claims["d-spikes"]["numbers"]["per_method"]
    lo, hi = round(0.1 * STEPS), round(0.9 * STEPS)
    for (method, depth, seed), run in runs.items():
        if seed != 1 or method in ("Pre-LN", "Pre-LN + ProRes"):
            continue  # the single-seed methods: the score of their one run
        for series in ("train/loss", "train/grad_norm"):
            values = [run["scalars"][series][s] for s in range(STEPS)]
            spikes = spike_steps(values, 7.0, max(2, STEPS // 10))
            expect = sum(lo <= s < hi for s in spikes) / (hi - lo)
            assert scores[method][str(depth)][series] == pytest.approx(expect)


def r2(x, y) -> float:
    b, a = numpy.polyfit(x, y, 1)
    return 1 - ((y - a - b * x) ** 2).sum() / ((y - y.mean()) ** 2).sum()


def test_activation_growth_fits(study):
    claims, runs, _ = study
    rows = claims["b-growth"]["numbers"]["per_role"]
    depth = DEPTHS[-1]
    for method, role in (("Pre-LN", "pre"), ("Pre-LN + ProRes", "prores")):
        for seed in (1, 2):
            scalars = runs[(method, depth, seed)]["scalars"]
            logged = sorted(scalars["layers/act_rms/layer_001"])
            step = min(logged, key=lambda s: abs(s - 0.1 * STEPS))
            layers = numpy.arange(1, depth + 1, dtype=float)
            rms = numpy.array([scalars[f"layers/act_rms/layer_{l:03d}"][step] for l in range(1, depth + 1)])
            got = rows[role][str(depth)][str(seed)]["early"]
            assert got["step"] == step
            assert got["r2_log"] == pytest.approx(r2(layers, numpy.log(rms)), abs=1e-9)
            assert got["r2_linear"] == pytest.approx(r2(layers, rms), abs=1e-9)
            assert got["growth_per_block"] == pytest.approx(math.exp(numpy.polyfit(layers, numpy.log(rms), 1)[0]))
            assert got["exponential"] == (got["r2_log"] > got["r2_linear"])


def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2
        i = j + 1
    return numpy.array(r)


def test_representation_evolution(study):
    claims, runs, _ = study
    rows = claims["e-evolution"]["numbers"]["per_role"]
    depth = DEPTHS[-1]
    for method, role in (("Pre-LN", "pre"), ("Pre-LN + ProRes", "prores")):
        for seed in (1, 2):
            table = list(csv.reader(open(runs[(method, depth, seed)]["dir"] / "analysis" / "cosine.csv")))
            assert [r[0] for r in table[1:]] == ["2", str(STEPS)]  # the kept checkpoints: keep_steps and the last
            cos = [float(v) for v in table[1][1:]]
            rho = numpy.corrcoef(ranks(list(range(1, depth + 1))), ranks(cos))[0, 1]
            assert rows[role][str(depth)][str(seed)] == {"step": 2, "spearman": pytest.approx(rho)}


def test_methods_on_top_of_pre_ln_are_not_pre_ln():
    """A zoo sweep's DyT and CompleteP cells are Pre-LN layouts, but neither Pre-LN nor ProRes to the claims."""
    from prores.study.claims import role

    pre = {"model.norm_layout": "pre", "model.init": "normal", "model.norm": "rmsnorm"}
    assert role(pre | {"prores.schedule": "linear"}) == "prores" and role(pre | {"prores.schedule": "none"}) == "pre"
    assert role(pre | {"prores.schedule": "linear", "model.norm": "dyt"}) is None
    assert role(pre | {"prores.schedule": "none", "model.depth_mup_alpha": 1.0}) is None
