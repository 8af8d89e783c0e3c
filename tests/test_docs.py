"""The manual (mkdocs.yml, docs/): it builds in strict mode, so a broken link, anchor or picture fails, and
its reference pages are the registries', generated at build time."""

import html
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prores.cli import build_parser
from prores.config import key_docs, methods_markdown
from prores.model.layouts import LAYOUTS
from prores.model.prores import SCHEDULES
from prores.study.claims import claims_from_json, claims_json

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def page(site, name: str) -> str:
    return html.unescape((site / name / "index.html").read_text())


def test_the_config_keys_page_has_every_key_with_its_default(site):
    text = page(site, "reference/config-keys")
    for d in key_docs():
        assert f"<code>{d.key}</code>" in text, d.key
    assert text.count("<tr>") == len(key_docs()) + 1  # a row each, and the header: nothing else


def test_the_methods_page_has_every_layout_and_schedule(site):
    text = page(site, "reference/methods")
    assert methods_markdown().count("\n| `") == len(LAYOUTS) + 1  # the rows, and DyT
    for name in [*LAYOUTS, *SCHEDULES]:
        assert f"<code>{name}</code>" in text, name


def test_the_cli_page_has_every_command_and_option(site):
    text = page(site, "reference/cli")
    commands = next(a for a in build_parser()._actions if isinstance(a.choices, dict)).choices
    for name, sub in commands.items():
        assert f"prores {name}" in text
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in text, f"prores {name} {flag}"


def test_the_claims_page_is_the_claims_json_the_report_wrote(site):
    data = json.loads((ROOT / "docs" / "cpu_depth_claims.json").read_text())
    assert claims_json(claims_from_json(data)) == data  # the round trip loses nothing
    text = page(site, "results/cpu-depth-claims")
    for claim in data:
        assert claim["statement"] in text and f"<strong>{claim['verdict']}</strong>" in text


def test_the_api_page_shows_the_callback_protocol(site):
    text = page(site, "reference/api")
    for hook in ("pre_step", "pre_update", "post_step", "pre_checkpoint", "on_end"):
        assert f"prores.run.callbacks.Callback.{hook}" in text or hook in text
