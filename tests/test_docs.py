"""The manual (mkdocs.yml, docs/): it builds in strict mode, so a broken link, anchor or picture fails, and
its reference pages are the registries', generated at build time."""

import csv
import math
import html
import re
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from prores.cli import build_parser
from prores.config import key_docs, methods_markdown
from prores.model.layouts import LAYOUTS
from prores.model.prores import SCHEDULES
from prores.study.claims import claims_from_json, claims_json
from prores.study.compare import compare
from conftest import t_interval

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_the_generated_pages_are_what_the_code_writes_now():
    proc = subprocess.run([sys.executable, "scripts/docs_reference.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


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


# What the results pages' study tables quote, by column header: the results.csv field and its digits.
COLUMNS = {"final valid loss": ("final_valid_loss", 4), "loss spikes, whole run": ("loss_spike_score", 4),
           "grad-norm spikes, whole run": ("grad_norm_spike_score", 4),
           "prores_rolling_ppl/bits_per_byte": ("eval:prores_rolling_ppl/bits_per_byte", 4),
           "last / first act RMS": ("act_rms_last_over_first", 3), "growth per block": ("act_rms_growth_per_block", 4)}


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every table of a Markdown page, as rows of cells (the separator row dropped)."""
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            tables.append([r for r in rows if not set("".join(r)) <= set("-: ")])
            rows = []
    return tables


def mean_spread(values: list[float], digits: int) -> str:
    """The report's "mean ± sample std" (one value alone), written independently of prores.study.runs."""
    mean = f"{statistics.fmean(values):.{digits}f}"
    return mean if len(values) == 1 else f"{mean} ± {statistics.stdev(values):.{digits}f}"


# The pages that quote `prores compare FIRST SECOND`, with the pairs of kept studies it compares there.
COMPARED = {"results/cpu-horizon.md": [("cpu_depth", "cpu_horizon")],
            "results/paper-setup.md": [("cpu_horizon", "cpu_horizon_reference"),
                                       ("cpu_horizon", "cpu_horizon_embedding"),
                                       ("cpu_horizon_embedding", "cpu_horizon_reference")]}


def comparison(page: str) -> str:
    """What `prores compare` prints for the pairs of kept studies a page compares: the tables it quotes."""
    return "\n".join(compare(*(ROOT / "docs" / f"{study}_results.csv" for study in pair))
                     for pair in COMPARED.get(page, ()))


@pytest.mark.parametrize("page", COMPARED)
def test_the_comparison_pages_quote_prores_compare(page):
    """Every table `prores compare` prints for the page's pairs of studies is on the page as printed: losses,
    ranks, Kendall's τ and the paired ProRes − Pre-LN in both."""
    want = markdown_tables(comparison(page))
    assert len(want) == 3 * len(COMPARED[page])
    quoted = markdown_tables((ROOT / "docs" / page).read_text())
    assert [t for t in want if t not in quoted] == []


STUDY_PAGES = [("results/cpu-depth.md", "cpu_depth"), ("results/zoo.md", "cpu_zoo"),
               ("results/cpu-horizon.md", "cpu_horizon"), ("results/paper-setup.md", "cpu_horizon_reference")]


@pytest.mark.parametrize("page, study", STUDY_PAGES + [("results/zoo.md", "cpu_zoo_hybridnorm_lr")])
def test_every_column_of_the_study_tables_is_its_results_csv(page, study):
    """Each row of each table that quotes a report (its first column is the first grid axis) is recomputed from
    the report's results.csv, kept in docs/: every column, so a column without a rule here fails. (The
    comparison tables are `prores compare`'s, checked above.)"""
    rows = list(csv.DictReader((ROOT / "docs" / f"{study}_results.csv").open()))
    fields = list(rows[0])
    grid = fields[:fields.index("name")]
    compared = markdown_tables(comparison(page)) if page in COMPARED else []
    tables = [t for t in markdown_tables((ROOT / "docs" / page).read_text()) if t[0][0] == grid[0]
              and t not in compared]
    assert tables, f"no study table on {page}"
    checked = 0
    for head, *body in tables:
        assert head[:len(grid)] == grid, head
        for cells in body:
            group = [r for r in rows if [r[k] for k in grid] == cells[:len(grid)]]
            done = [r for r in group if r["status"] == "completed"]
            assert done, cells
            for column, cell in zip(head[len(grid):], cells[len(grid):]):
                if column in COLUMNS:
                    field, digits = COLUMNS[column]
                    want = mean_spread([float(r[field]) for r in done], digits)
                elif column == "status":
                    want = f"completed {len(done)}"
                elif column == "seeds":
                    want = str(len(done))
                else:
                    raise AssertionError(f"{page}: no rule to check column {column!r}")
                assert cell == want, f"{page} {cells[:len(grid)]} {column}: {cell} (results.csv: {want})"
                checked += 1
    assert checked >= len({tuple(r[k] for k in grid) for r in rows})


@pytest.mark.parametrize("page, study", [("results/cpu-depth.md", "cpu_depth"), ("results/cpu-horizon.md", "cpu_horizon"),
                                         ("results/paper-setup.md", "cpu_horizon_reference")])
def test_scripts_refresh_tables_writes_the_pages_study_tables_as_they_are(page, study, tmp_path):
    """scripts/refresh_tables.py (which writes a page's study tables again once its results.csv has more rows)
    leaves the kept pages as they are: every table it owns is already its CSV's, and it touches no other."""
    copy = tmp_path / "page.md"
    copy.write_text((ROOT / "docs" / page).read_text())
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "refresh_tables.py"), str(copy),
                           str(ROOT / "docs" / f"{study}_results.csv")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert copy.read_text() == (ROOT / "docs" / page).read_text()
    assert re.search(r": [12] study tables written", proc.stdout), proc.stdout


def test_the_zoos_hybridnorm_rows_are_its_re_run():
    """docs/cpu_zoo_results.csv's HybridNorm runs are those of `prores report runs/cpu-zoo-hybridnorm` (the zoo's
    own cells, re-run when its Q, K, V norms were made to span the projection), field for field."""
    def runs(name, method=None):
        rows = csv.DictReader((ROOT / "docs" / name).open())
        return {r["name"]: r for r in rows if method is None or r["method"] == method}
    zoo, rerun = runs("cpu_zoo_results.csv", "HybridNorm"), runs("cpu_zoo_hybridnorm_results.csv")
    assert len(zoo) == 8 and zoo.keys() == rerun.keys()
    assert all(zoo[n] == {k: rerun[n][k] for k in zoo[n]} for n in zoo)


def test_the_zoo_on_off_table_is_its_results_csv():
    """ProRes on − off per method and depth, paired by seed, with its 95% t-interval, and the verdict by the
    report's rule (helps or hurts when the interval lies below or above 0), computed here from
    docs/cpu_zoo_results.csv (t's quantiles from scipy)."""
    from scipy import stats
    rows = [r for r in csv.DictReader((ROOT / "docs" / "cpu_zoo_results.csv").open()) if r["status"] == "completed"]
    loss = {(r["method"], r["model.num_layers"], r["ProRes"], r["seed"]): float(r["final_valid_loss"]) for r in rows}
    table = next(t for t in markdown_tables((ROOT / "docs" / "results" / "zoo.md").read_text()) if t[0][0] == "method")
    assert table[0] == ["method", "depth", "off", "on", "on − off (paired, 95% interval)", "seeds", "ProRes"]
    assert len(table) - 1 == len({(m, d) for m, d, _, _ in loss})
    for method, depth, off, on, diff, seeds, verdict in table[1:]:
        pairs = [(loss[method, depth, "off", s], loss[method, depth, "on", s]) for (m, d, p, s) in loss
                 if (m, d, p) == (method, depth, "off") and (method, depth, "on", s) in loss]
        d = [b - a for a, b in pairs]
        mean = statistics.fmean(d)
        half = stats.t.ppf(0.975, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
        assert off == f"{statistics.fmean(a for a, _ in pairs):.4f}" and on == f"{statistics.fmean(b for _, b in pairs):.4f}"
        assert diff == f"{mean:+.4f} [{mean - half:+.4f}, {mean + half:+.4f}]" and seeds == str(len(pairs))
        assert verdict == ("helps" if mean + half < 0 else "hurts" if mean - half > 0 else "not shown")


def test_the_horizon_on_off_table_is_its_results_csv():
    """Pre-LN and LayerScale with and without ProRes (the methods "X" and "X + ProRes"), on − off paired by seed
    with its 95% t-interval and the report's verdict, computed here from docs/cpu_horizon_results.csv."""
    from scipy import stats
    study = losses("cpu_horizon")
    table = next(t for t in markdown_tables((ROOT / "docs" / "results" / "cpu-horizon.md").read_text())
                 if t[0][0] == "method")
    assert [(m, d) for m, d, *_ in table[1:]] == [(m, str(d)) for m in ("Pre-LN", "LayerScale") for d in (12, 48, 120)]
    for method, depth, off, on, diff, seeds, verdict in table[1:]:
        a, b = study[int(depth), method], study[int(depth), f"{method} + ProRes"]
        d = [b[s] - a[s] for s in sorted(a.keys() & b.keys())]
        mean, half = statistics.fmean(d), stats.t.ppf(0.975, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
        assert (off, on, seeds) == (f"{statistics.fmean(a.values()):.4f}", f"{statistics.fmean(b.values()):.4f}", str(len(d)))
        assert diff == f"{mean:+.4f} [{mean - half:+.4f}, {mean + half:+.4f}]"
        assert verdict == ("helps" if mean + half < 0 else "hurts" if mean - half > 0 else "not shown")


def losses(study: str) -> dict[tuple, dict[str, float]]:
    """``{(depth, method[, ProRes]): {seed: final loss}}`` of a kept study's completed runs."""
    out: dict = {}
    for r in csv.DictReader((ROOT / "docs" / f"{study}_results.csv").open()):
        if r["status"] == "completed":
            key = (int(r["model.num_layers"]), r["method"]) + ((r["ProRes"],) if "ProRes" in r else ())
            out.setdefault(key, {})[r["seed"]] = float(r["final_valid_loss"])
    return out


def depth_quantities() -> list[tuple[str, float]]:
    """The depth page's "In short" figures, in order, as the named quantities they stand for."""
    study = losses("cpu_depth")
    pro, pre = "Pre-LN + ProRes", "Pre-LN"

    def lead(d):  # Pre-LN − ProRes, paired over the seeds
        return statistics.fmean(study[d, pre][s] - study[d, pro][s] for s in study[d, pro])

    def mean(d, m):
        return statistics.fmean(study[d, m].values())
    return [*((f"Pre-LN - ProRes at {d}", lead(d)) for d in (12, 24, 48, 72, 96, 120)),
            ("Pre-LN's worst seed at 120", max(study[120, pre].values())),
            ("Pre-LN at 12", mean(12, pre)), ("Pre-LN at 120", mean(120, pre)),
            ("ProRes at 12", mean(12, pro)), ("ProRes at 120", mean(120, pro))]


def zoo_quantities() -> list[tuple[str, float]]:
    """The zoo page's "In short" figures, in order, as the named quantities they stand for."""
    study = losses("cpu_zoo")

    def cell(m, on, d=48):
        values = list(study[d, m, on].values())
        return [(f"{m} {on} at {d}", statistics.fmean(values)), (f"{m} {on} at {d}: std", statistics.stdev(values))]

    def on_off(m, d):
        off, on = study[d, m, "off"], study[d, m, "on"]
        return t_interval([on[s] - off[s] for s in off])
    pre48 = on_off("Pre-LN", 48)
    return [*cell("Pre-LN", "on"), *cell("LayerScale", "off"), *cell("Mix-LN", "off"), *cell("CompleteP", "off"),
            *cell("Peri-LN", "on"), ("on - off, Pre-LN at 48", pre48[0]), ("on - off, Peri-LN at 48", on_off("Peri-LN", 48)[0]),
            ("on - off, HybridNorm at 12", on_off("HybridNorm", 12)[0]), ("on - off, Admin at 12", on_off("Admin", 12)[0]),
            ("its interval, Pre-LN at 48: low", pre48[1]), ("high", pre48[2]), ("on - off, DyT at 48", on_off("DyT", 48)[0])]


def horizon_quantities() -> list[tuple[str, float]]:
    """Every figure of the horizon page's "In short" paragraph, in order, as the named quantity it stands for:
    (name, value). A figure quoted for the wrong method, depth or length is out of this order and fails."""
    from prores.study.compare import finite_seeds, kendall_tau
    from prores.study.intervals import interval

    short, long = losses("cpu_depth"), losses("cpu_horizon")
    pro, pre, ls, lsp = "Pre-LN + ProRes", "Pre-LN", "LayerScale", "LayerScale + ProRes"

    def both(depth):  # the seeds both methods completed at both lengths, as prores compare pairs them
        return finite_seeds(short[depth, pro], short[depth, pre], long[depth, pro], long[depth, pre])

    def paired(study, depth):
        return interval([study[depth, pro][s] - study[depth, pre][s] for s in both(depth)])

    def change(depth):  # the lead after 1,000 steps minus after 250, per seed
        return interval([long[depth, pro][s] - long[depth, pre][s] - short[depth, pro][s] + short[depth, pre][s]
                         for s in both(depth)])

    def versus(a, b, depth):  # a − b at 1,000 steps, paired over the seeds both completed
        return interval([long[depth, a][s] - long[depth, b][s] for s in finite_seeds(long[depth, a], long[depth, b])])

    def mean(study, depth, method):
        return statistics.fmean(study[depth, method].values())

    def tau(depth):
        methods = sorted({m for d, m in short if d == depth} & {m for d, m in long if d == depth})
        return kendall_tau([mean(short, depth, m) for m in methods], [mean(long, depth, m) for m in methods])

    def ends(iv, what):
        return [(f"{what}: low", iv.low), (f"{what}: high", iv.high)]

    return [("ProRes - Pre-LN, 250 steps, 48", paired(short, 48).mean), ("the same, 1000 steps", paired(long, 48).mean),
            ("ProRes - Pre-LN, 250 steps, 120", paired(short, 120).mean),
            ("the same, 1000 steps", paired(long, 120).mean), ("ProRes - Pre-LN, 250 steps, 12", paired(short, 12).mean),
            ("the same, 1000 steps", paired(long, 12).mean),
            *ends(change(12), "the change at 12"), *ends(change(48), "the change at 48"),
            *ends(paired(long, 48), "ProRes - Pre-LN at 48, 1000"), *ends(paired(long, 120), "at 120"),
            ("tau at 12", tau(12)), ("tau at 48", tau(48)), ("tau at 120", tau(120)),
            ("LNS at 120, 250 steps", mean(short, 120, "LNS")), ("LNS at 120, 1000 steps", mean(long, 120, "LNS")),
            ("LNS - ProRes at 48, 1000", versus("LNS", pro, 48).mean),
            ("LNS - ProRes at 120, 1000", versus("LNS", pro, 120).mean),
            ("Scaled Init at 48", mean(long, 48, "Pre-LN + Scaled Init")), ("ProRes at 48", mean(long, 48, pro)),
            ("Scaled Init at 120", mean(long, 120, "Pre-LN + Scaled Init")), ("ProRes at 120", mean(long, 120, pro)),
            *((f"LayerScale at {d}", mean(long, d, ls)) for d in (12, 48, 120)),
            *((f"ProRes - LayerScale at {d}", versus(pro, ls, d).mean) for d in (12, 48, 120)),
            *((f"LayerScale + ProRes - LayerScale at {d}", versus(lsp, ls, d).mean) for d in (12, 48, 120)),
            ("Pre-LN at 12", mean(long, 12, pre)), ("Pre-LN at 120", mean(long, 120, pre))]


def reference_quantities() -> list[tuple[str, float]]:
    """The reference-setup page's "In short" figures, in order: ProRes − Pre-LN under each setup, paired over the
    seeds both methods completed under both (as prores compare pairs them), its intervals, their change."""
    from prores.study.compare import finite_seeds
    from prores.study.intervals import interval

    default, ref, emb = losses("cpu_horizon"), losses("cpu_horizon_reference"), losses("cpu_horizon_embedding")
    pro, pre = "Pre-LN + ProRes", "Pre-LN"

    def seeds(d, first=default, second=ref):
        return finite_seeds(first[d, pro], first[d, pre], second[d, pro], second[d, pre])

    def paired(study, d, other=None):  # over the seeds of the comparison it is quoted from
        return interval([study[d, pro][s] - study[d, pre][s] for s in seeds(d, default, other or ref)])

    def change(d, first=default, second=ref):
        return interval([second[d, pro][s] - second[d, pre][s] - first[d, pro][s] + first[d, pre][s]
                         for s in seeds(d, first, second)])

    def ends(iv, what):
        return [(f"{what}: low", iv.low), (f"{what}: high", iv.high)]

    def mean(study, d, method):
        return statistics.fmean(study[d, method].values())
    return [*((f"reference ProRes - Pre-LN at {d}", paired(ref, d).mean) for d in (12, 48, 120)),
            *((f"default ProRes - Pre-LN at {d}", paired(default, d).mean) for d in (12, 48, 120)),
            *ends(paired(ref, 12), "reference at 12"), *ends(paired(ref, 48), "reference at 48"),
            *ends(paired(ref, 120), "reference at 120"), *ends(change(48), "the change at 48"),
            *ends(change(120), "the change at 120"), ("default Pre-LN at 120", mean(default, 120, pre)),
            ("reference Pre-LN at 120", mean(ref, 120, pre)), ("default ProRes at 120", mean(default, 120, pro)),
            ("reference ProRes at 120", mean(ref, 120, pro)),
            *((f"embedding alone ProRes - Pre-LN at {d}", paired(emb, d, emb).mean) for d in (48, 120)),
            *ends(change(48, default, emb), "embedding's change at 48"),
            *ends(change(120, default, emb), "embedding's change at 120"),
            ("embedding alone Pre-LN at 120", mean(emb, 120, pre)),
            *((f"the rest's change at {d}", change(d, emb, ref).mean) for d in (48, 120)),
            *ends(change(48, emb, ref), "the rest's change at 48"), *ends(change(120, emb, ref), "the rest's at 120")]


def test_the_reference_pages_claims_are_the_rules_on_both_setups():
    """The depth claims over Pre-LN and Pre-LN + ProRes alone, as the page tabulates them for both setups, are
    what prores.study.claims decides from each kept CSV (the other methods of the default study left out)."""
    from prores.study.claims import Study
    from prores.study.report import cell_label
    from prores.study.runs import from_results

    def decided(study, spec):
        runs = [r for r in from_results(ROOT / "docs" / f"{study}_results.csv", spec)
                if r.grid["method"] in ("Pre-LN", "Pre-LN + ProRes")]
        lowest, grows = Study(runs, lambda r: cell_label(r.grid)).lowest()
        return {lowest.statement: lowest.verdict, grows.statement: grows.verdict,
                **{f"at {d} blocks": v["verdict"] for d, v in lowest.numbers["per_depth"].items()}}
    table = next(t for t in markdown_tables((ROOT / "docs" / "results" / "paper-setup.md").read_text())
                 if t[0][0].startswith("claim"))
    want = [decided("cpu_horizon", "cpu-horizon.yaml"), decided("cpu_horizon_reference", "cpu-horizon-reference.yaml")]
    assert sorted(row[0] for row in table[1:]) == sorted(want[0]) == sorted(want[1])
    for claim, default, reference in table[1:]:
        assert (default, reference) == (want[0][claim], want[1][claim]), claim


SUMMARIES = {"results/paper-setup.md": reference_quantities, "results/cpu-horizon.md": horizon_quantities, "results/cpu-depth.md": depth_quantities,
             "results/zoo.md": zoo_quantities}


@pytest.mark.parametrize("page", SUMMARIES)
def test_every_figure_of_a_summary_is_the_quantity_it_names(page):
    """A results page's "In short" figures (two or more decimals), in order, against the named quantities its
    function lists (each rounded as the page rounds it, signs as written): a figure quoted for the wrong method,
    depth or length is out of this order and fails."""
    text = (ROOT / "docs" / page).read_text()
    paragraph = text.split("**In short.**", 1)[1].split("\n\n", 1)[0].replace("−", "-")
    figures = re.findall(r"[-+]?\d+\.\d{2,}", paragraph)
    want = SUMMARIES[page]()
    assert len(figures) == len(want), figures
    for figure, (name, value) in zip(figures, want):
        digits = len(figure.split(".")[1])
        shown = f"{value:+.{digits}f}" if figure[0] in "+-" else f"{abs(value):.{digits}f}"
        assert figure == shown, (name, figure, shown)


@pytest.mark.parametrize("page, quoted, swapped, caught", [
    ("results/cpu-horizon.md", "(1.7449, 1.7251", "(1.7449, 1.7068", "LayerScale at 48"),
    ("results/cpu-depth.md", "+0.132, +0.153", "+0.153, +0.132", "Pre-LN - ProRes at 48"),
    ("results/paper-setup.md", "from 1.8307 to 1.7148", "from 1.7148 to 1.8307", "default Pre-LN at 120"),
    ("results/paper-setup.md", "(+0.0277 to +0.0739, and +0.0652 to +0.1184)", "(+0.0652 to +0.1184, and +0.0277 to"
     " +0.0739)", "embedding's change at 48"),
    ("results/zoo.md", "Mix-LN (2.3772 ± 0.0003), CompleteP (2.3970 ± 0.0177)",
     "Mix-LN (2.3970 ± 0.0177), CompleteP (2.3772 ± 0.0003)", "Mix-LN off at 48"),
])
def test_the_summary_test_fails_on_a_misattributed_figure(monkeypatch, page, quoted, swapped, caught):
    """The mutation: two figures of a summary swapped between the depths or methods they name."""
    path = ROOT / "docs" / page
    text = path.read_text()
    assert quoted in text
    mutated = text.replace(quoted, swapped)
    real_read = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda p, *a, **k: mutated if p == path else real_read(p, *a, **k))
    with pytest.raises(AssertionError, match=caught):
        test_every_figure_of_a_summary_is_the_quantity_it_names(page)
