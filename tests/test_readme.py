"""The README's two set-up commands are the ones CI and users run."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands():
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    return [b for b in blocks if b.startswith("pip install")]


def test_readme_has_exactly_two_setup_commands():
    train, test = readme_commands()
    assert train.endswith("&& prores train") and "pytest" in test
    assert train.split(" && ")[:2] == test.split(" && ")[:2]  # same torch pin and corpus install


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci
