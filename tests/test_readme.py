"""The README's two set-up commands are the ones CI and users run."""

import re
from pathlib import Path

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
