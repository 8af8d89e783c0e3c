"""`prores compare SHORT LONG` (prores/study/compare.py) on two small results.csv files whose every number is worked
out here by hand."""

import csv
import math

import pytest

from conftest import run_cli
from prores.errors import UsageError
from prores.study.compare import compare, kendall_tau, ranks

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
    #   tau = (2 - 1) / 3. ProRes - Pre-LN by seed: short (-0.1, -0.1) -> -0.1 ± 0; long (-0.3, -0.4) -> -0.35
    #   ± 0.0707: the lead grows. Depth 48: LNS diverged in the long study (worst), Pre-LN seed 2 diverged in the
    #   short one; short order ProRes 2.5 < LNS 2.6 < Pre-LN (a failed seed: worst); long: ProRes 2.0 < Pre-LN
    #   2.1 < LNS: of the three pairs only (LNS, Pre-LN) swaps: tau = (2 - 1) / 3; the paired difference uses
    #   seed 1 only in the short study (-0.2), both seeds in the long one (-0.1 ± 0): the lead shrinks.
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
    assert kendall_tau([math.inf, math.inf, 1], [math.inf, math.inf, 1]) == pytest.approx(2 / 3)  # failed ones tie
    assert ranks([2.1, 2.0, 2.05]) == [3, 1, 2] and ranks([1.0, math.inf, 0.5]) == [2, 3, 1]


def test_the_comparison_of_two_studies_by_hand(studies):
    text = compare(*studies)
    assert text.splitlines()[0].endswith("(250 steps) against " + str(studies[1]) + " (1000 steps)")
    for row in ["| 12 | LNS | 2.0500 | 2 | 1.7000 | 3 |", "| 12 | Pre-LN | 2.1000 | 3 | 1.6000 | 2 |",
                "| 12 | Pre-LN + ProRes | 2.0000 | 1 | 1.2500 | 1 |",
                "| 48 | LNS | 2.6000 | 2 | failed | 3 |", "| 48 | Pre-LN | failed | 3 | 2.1000 | 2 |",
                "| 12 | 3 | +0.333 |", "| 48 | 3 | +0.333 |",
                "| 12 | -0.1000 ± 0.0000 (2 seeds) | -0.3500 ± 0.0707 (2 seeds) | grows |",
                "| 48 | -0.2000 (1 seed) | -0.1000 ± 0.0000 (2 seeds) | shrinks |"]:
        assert row in text.splitlines(), row
    assert "Only short" not in text  # a method only one study ran is not compared


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
