"""`prores compare FIRST SECOND` (prores/study/compare.py) on two small results.csv files whose every number is worked
out here by hand."""

import csv
import math

import pytest

from conftest import run_cli
from prores.errors import UsageError
from prores.study.compare import compare, kendall_tau, ranks, trend
from prores.study.intervals import interval, t975

FIELDS = ["model.num_layers", "method", "name", "seed", "status", "steps", "final_valid_loss"]


def results(path, steps, rows):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, FIELDS)
        w.writeheader()
        for depth, method, seed, loss in rows:
            w.writerow({"model.num_layers": depth, "method": method, "name": f"L{depth}-{method}-s{seed}",
                        "seed": seed, "status": "completed" if loss is not None else "diverged", "steps": steps,
                        "final_valid_loss": "" if loss is None else loss})
    return path


@pytest.fixture
def studies(tmp_path):
    # depth 12, three methods. Short: Pre-LN (2.0, 2.2) -> 2.1, ProRes (1.9, 2.1) -> 2.0, LNS 2.05:
    #   order ProRes < LNS < Pre-LN. Long: Pre-LN (1.5, 1.7) -> 1.6, ProRes (1.2, 1.3) -> 1.25, LNS 1.7:
    #   order ProRes < Pre-LN < LNS. Pairs (LNS, Pre-LN, ProRes): (LNS,Pre-LN) swapped, the two others agree:
    #   tau = (2 - 1) / 3. ProRes - Pre-LN by seed: short (-0.1, -0.1) -> -0.1, sd 0: [-0.1, -0.1]; long (-0.3,
    #   -0.4) -> -0.35, sd 0.0707107, half-width t(0.975, 1) 12.706205 x 0.0707107 / sqrt 2 = 0.635310: [-0.9853,
    #   +0.2853]: the lead grows; the change per seed (-0.2, -0.3) -> -0.25 [-0.8853, +0.3853], which includes 0.
    #   Depth 48: LNS diverged in the long study (worst), Pre-LN seed 2 diverged in the short one; short order
    #   ProRes 2.5 < LNS 2.6 < Pre-LN (a failed seed: worst); long: ProRes 2.0 < Pre-LN 2.1 < LNS: of the three
    #   pairs only (LNS, Pre-LN) swaps: tau = (2 - 1) / 3; the paired difference uses seed 1 at both lengths, the
    #   only one both methods completed at both (-0.2, then -0.1): the lead shrinks, by +0.1.
    short = results(tmp_path / "short.csv", 250, [
        (12, "Pre-LN", 1, 2.0), (12, "Pre-LN", 2, 2.2), (12, "Pre-LN + ProRes", 1, 1.9), (12, "Pre-LN + ProRes", 2, 2.1),
        (12, "LNS", 1, 2.05), (12, "Only short", 1, 1.0),
        (48, "Pre-LN", 1, 2.7), (48, "Pre-LN", 2, None), (48, "Pre-LN + ProRes", 1, 2.5), (48, "Pre-LN + ProRes", 2, 2.5),
        (48, "LNS", 1, 2.6)])
    long = results(tmp_path / "long.csv", 1000, [
        (12, "Pre-LN", 1, 1.5), (12, "Pre-LN", 2, 1.7), (12, "Pre-LN + ProRes", 1, 1.2), (12, "Pre-LN + ProRes", 2, 1.3),
        (12, "LNS", 1, 1.7),
        (48, "Pre-LN", 1, 2.1), (48, "Pre-LN", 2, 2.1), (48, "Pre-LN + ProRes", 1, 2.0), (48, "Pre-LN + ProRes", 2, 2.0),
        (48, "LNS", 1, None)])
    return short, long


def test_kendall_tau_and_ranks_by_hand():
    assert kendall_tau([1, 2, 3], [1, 2, 3]) == 1 and kendall_tau([1, 2, 3], [3, 2, 1]) == -1
    assert kendall_tau([1, 2, 3, 4], [2, 1, 3, 4]) == pytest.approx(4 / 6)  # one of six pairs swapped
    # tau-b: two failed runs tie in both orderings, which are the same: 2 concordant of 2 untied pairs each
    assert kendall_tau([math.inf, math.inf, 1], [math.inf, math.inf, 1]) == pytest.approx(1)
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(2 * 3))
    assert math.isnan(kendall_tau([1, 1], [1, 2]))
    assert ranks([2.1, 2.0, 2.05]) == [3, 1, 2] and ranks([1.0, math.inf, 0.5]) == [2, 3, 1]


def test_the_comparison_of_two_studies_by_hand(studies):
    text = compare(*studies)
    assert text.splitlines()[0].endswith("(250 steps) against " + str(studies[1]) + " (1000 steps)")
    for row in ["| 12 | LNS | 2.0500 | 2 | 1.7000 | 3 |", "| 12 | Pre-LN | 2.1000 | 3 | 1.6000 | 2 |",
                "| 12 | Pre-LN + ProRes | 2.0000 | 1 | 1.2500 | 1 |",
                "| 48 | LNS | 2.6000 | 2 | failed | 3 |", "| 48 | Pre-LN | failed | 3 | 2.1000 | 2 |",
                "| 12 | 3 | +0.333 |", "| 48 | 3 | +0.333 |",
                "| 12 | 1, 2 | -0.1000 [-0.1000, -0.1000] (2 seeds) | -0.3500 [-0.9853, +0.2853] (2 seeds) | the lead"
                " grows | -0.2500 [-0.8853, +0.3853] (2 seeds), includes 0 |",
                "| 48 | 1 | -0.2000 (1 seed) | -0.1000 (1 seed) | the lead shrinks | +0.1000 (1 seed) |"]:
        assert row in text.splitlines(), row
    assert "Only short" not in text  # a method only one study ran is not compared


def test_the_trend_never_says_grows_for_a_treatment_behind_at_both_lengths():
    assert [trend(a, b) for a, b in [(-0.1, -0.2), (-0.2, -0.1), (0.2, 0.1), (0.1, 0.2), (-0.1, 0.1), (0.1, -0.1),
                                     (-0.1, 0.0), (0.1, 0.0)]] == [
        "the lead grows", "the lead shrinks", "the gap closes", "the gap widens", "reverses: the lead becomes a gap",
        "reverses: the gap becomes a lead", "the lead is lost", "the gap closes to 0"]


def test_a_study_whose_treatment_is_behind_at_both_lengths_reads_as_a_gap(tmp_path):
    """Three seeds: the treatment behind by (0.3, 0.2, 0.4) at 250 steps and (0.1, 0.1, 0.1) at 1000: the gap
    closes (mean 0.3 -> 0.1); the change (-0.2, -0.1, -0.3) has mean -0.2, sd 0.1, half-width 4.302653 x 0.1 /
    sqrt 3 = 0.248414: [-0.4484, +0.0484], which includes 0."""
    rows = lambda d: [(12, "Pre-LN", s, 2.0) for s in (1, 2, 3)] + [  # noqa: E731
        (12, "Pre-LN + ProRes", s, 2.0 + x) for s, x in zip((1, 2, 3), d)]
    text = compare(results(tmp_path / "a.csv", 250, rows((0.3, 0.2, 0.4))),
                   results(tmp_path / "b.csv", 1000, rows((0.1, 0.1, 0.1))))
    row = next(line for line in text.splitlines() if line.startswith("| 12 | 1, 2, 3 |"))
    assert "grows" not in row and "| the gap closes | -0.2000 [-0.4484, +0.0484] (3 seeds), includes 0 |" in row


def test_two_setups_at_one_length_are_named_by_their_studies(tmp_path):
    """Both at 1000 steps: the columns take the files' names. ProRes - Pre-LN by seed: default (-0.1, -0.2, 0.0)
    -> -0.1, sd 0.1, half-width 4.302653 x 0.1 / sqrt 3 = 0.248414: [-0.3484, +0.1484]; reference (-0.3, -0.2,
    -0.1) -> -0.2 [-0.4484, +0.0484]: the lead grows; the change (-0.2, 0.0, -0.1) -> -0.1 [-0.3484, +0.1484]."""
    rows = lambda pre, pro: [(12, "Pre-LN", s, x) for s, x in zip((1, 2, 3), pre)] + [  # noqa: E731
        (12, "Pre-LN + ProRes", s, x) for s, x in zip((1, 2, 3), pro)]
    text = compare(results(tmp_path / "default_results.csv", 1000, rows((1.5, 1.7, 1.6), (1.4, 1.5, 1.6))),
                   results(tmp_path / "reference.csv", 1000, rows((1.6, 1.6, 1.6), (1.3, 1.4, 1.5)))).splitlines()
    assert "| model.num_layers | method | default | rank | reference | rank |" in text
    assert "| model.num_layers | seeds | default | reference | reference against default | change |" in text
    assert ("| 12 | 1, 2, 3 | -0.1000 [-0.3484, +0.1484] (3 seeds) | -0.2000 [-0.4484, +0.0484] (3 seeds) | the lead"
            " grows | -0.1000 [-0.3484, +0.1484] (3 seeds), includes 0 |") in text


def test_the_t_quantiles_are_students():
    scipy = pytest.importorskip("scipy.stats")
    for df in range(1, 61):
        assert t975(df) == pytest.approx(scipy.t.ppf(0.975, df), abs=1e-4), df
    assert interval([1.0]).low is None and interval([1.0, 3.0]).text() == "+2.0000 [-10.7062, +14.7062] (2 seeds)"
    assert interval([-1.0, -1.2, -0.8]).verdict == "below 0" and interval([1.0, 3.0]).verdict == "includes 0"


def test_runs_not_finished_yet_are_left_out_not_failed(studies):
    short, long = studies
    with open(long, "a") as fh:  # a long study still running: Pre-LN's third seed, and a method not started
        fh.write("48,Pre-LN,L48-Pre-LN-s3,3,running,,\n12,Only short,L12-Only-s1,1,pending,,\n")
    text = compare(short, long)
    assert f"**In progress**: 2 runs of {long} not finished yet (pending, running or stopped) left out." in text
    assert "| 48 | Pre-LN | failed | 3 | 2.1000 | 2 |" in text.splitlines()  # the running seed is not a failure
    assert "Only short" not in text


def test_prores_compare_on_the_command_line(studies, tmp_path):
    proc = run_cli("compare", *map(str, studies), timeout=120)
    assert proc.returncode == 0 and proc.stdout == compare(*studies), proc.stderr
    bad = run_cli("compare", str(tmp_path), str(studies[1]), timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == (f"prores: error: {tmp_path}: no results.csv; run `prores"
                                                          f" report {tmp_path}` first (or give its results.csv).")


def test_a_study_without_a_method_column_is_one_error(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("model.num_layers,name,seed,status,steps,final_valid_loss\n12,a,1,completed,10,2.0\n")
    with pytest.raises(UsageError, match="needs the columns model.num_layers and method"):
        compare(path, path)


def test_a_benchmark_spread_by_hand():
    """Rounds' ratios 1..5 (inclusive deciles: 1 + 0.1·4 and 1 + 0.9·4); the ratio is that of the medians."""
    from prores.study.intervals import Spread

    s = Spread.of([10, 20, 30, 40, 50], [10, 10, 10, 10, 10])
    assert (s.ratio, s.low, s.high) == (3.0, pytest.approx(1.4), pytest.approx(4.6))
    assert s.text() == "3.000 (1.400 to 4.600)"
    assert Spread.of([3.0], [2.0]) == Spread(1.5, 1.5, 1.5)  # one round: no spread to tell
    with pytest.raises(ValueError):
        Spread.of([1.0, 2.0], [1.0])
