"""The README's two set-up commands are the ones CI and users run."""

import csv
import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_COMMAND = "bash scripts/test.sh"


def readme_commands():
    """The quick start's commands: (train, test)."""
    quick_start = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", quick_start, re.S)[:2]


def test_readme_has_exactly_two_setup_commands():
    train, test = readme_commands()
    assert train.startswith("pip install") and train.endswith("&& prores train")
    assert test == TEST_COMMAND


def test_the_test_script_installs_like_the_train_command_plus_the_test_extras():
    train_install = readme_commands()[0].removesuffix(" && prores train")
    script = (ROOT / "scripts" / "test.sh").read_text().splitlines()
    assert train_install.replace("pip install -e .", "pip install -e '.[test]'") in script


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert TEST_COMMAND in ci


def test_the_readme_plan_example_is_what_prores_plan_prints():
    from prores.config import load_config
    from prores.parallel.plan import GiB, describe_plan

    plan = describe_plan(load_config("depth/120.yaml"), 258, gpus=8, gpu_memory=80 * GiB)
    assert f"```\n{plan}\n```" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("study", ["cpu_depth", "cpu_zoo"])
def test_the_readme_study_tables_quote_their_reports(study):
    """The README's study tables are `prores report`'s: each row's final validation loss is the mean ± sample
    std, computed here, of the completed seeds in the report's results.csv (kept in docs/)."""
    rows = list(csv.DictReader((ROOT / "docs" / f"{study}_results.csv").open()))
    grid = list(rows[0])[:list(rows[0]).index("name")]  # the sweep's grid axes, the report's first columns
    groups = {}
    for r in rows:
        if r["status"] == "completed":
            groups.setdefault(tuple(r[c] for c in grid), []).append(float(r["final_valid_loss"]))
    readme = (ROOT / "README.md").read_text()
    for key, losses in groups.items():
        loss = f"{statistics.fmean(losses):.4f}" + (f" ± {statistics.stdev(losses):.4f}" if len(losses) > 1 else "")
        assert re.search(r"^\| " + re.escape(" | ".join(key)) + r" \|(?:.*\|)? " + re.escape(loss) + r" \|", readme,
                         re.M), f"{study}: no README row {key} with final valid loss {loss}"


def test_the_readme_quotes_the_depth_studys_claims():
    for claim in json.loads((ROOT / "docs" / "cpu_depth_claims.json").read_text()):
        assert f"| {claim['statement']} | **{claim['verdict']}** |" in (ROOT / "README.md").read_text()


def test_the_readme_quotes_the_chaos_benchmark_as_kept_in_docs():
    """The README's chaos printout is docs/chaos.txt, which the command quoted above it wrote."""
    readme = (ROOT / "README.md").read_text()
    quoted = re.search(r"python benchmarks/chaos.py --faults 10 --seed 1 [^\n]*> docs/chaos.txt\n```\n\n"
                       r"```text\n(.*?)```", readme, re.S)
    assert quoted, "no chaos printout in the README"
    assert quoted.group(1).strip() == (ROOT / "docs" / "chaos.txt").read_text().strip()
