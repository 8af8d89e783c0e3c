"""`python scripts/redecide_claims.py`: the kept studies' verdicts under today's rules, from the results.csv each
kept in docs/ (their run directories are gone). The depth and horizon studies' claims that need only final losses
are decided again (:func:`prores.study.claims.redecided`; the others stay as their claims.json kept them), their
final-ppl-against-depth figures are drawn again, and the zoo and horizon pages' "ProRes on − off" tables are
written again, by the report's own code. Then `python scripts/docs_reference.py`
writes the claims pages. tests/test_docs.py fails when a kept file differs from what this writes."""

import json
import re
from pathlib import Path

from prores.monitor.heatmaps import png
from prores.study.claims import claims_from_json, claims_json, redecided
from prores.study.prores_effect import effect_table
from prores.study.report import cell_label, markdown_table, plot_ppl_vs_depth
from prores.study.runs import from_results

DOCS = Path(__file__).resolve().parent.parent / "docs"
CLAIMS = {"cpu_depth": "cpu-depth.yaml", "cpu_horizon": "cpu-horizon.yaml",
          "cpu_horizon_reference": "cpu-horizon-reference.yaml"}  # kept study -> the spec that made it
ON_OFF = {"results/zoo.md": ("cpu_zoo", "cpu-zoo.yaml"), "results/cpu-horizon.md": ("cpu_horizon", "cpu-horizon.yaml")}


def claims(study: str) -> list[dict]:
    kept = claims_from_json(json.loads((DOCS / f"{study}_claims.json").read_text()))
    runs = from_results(DOCS / f"{study}_results.csv", CLAIMS[study])
    return claims_json(redecided(kept, runs, lambda r: cell_label(r.grid)))


def on_off_page(page: str) -> str:
    study, spec = ON_OFF[page]
    table = "\n".join(markdown_table(effect_table(from_results(DOCS / f"{study}_results.csv", spec))))
    text = (DOCS / page).read_text()
    old = re.search(r"^\| method \| depth \| off \| on \|.*?\n(?=[^|])", text, re.S | re.M)
    return text[:old.start()] + table + "\n" + text[old.end():]


def main() -> None:
    for study, spec in CLAIMS.items():
        (DOCS / f"{study}_claims.json").write_text(json.dumps(claims(study), indent=1) + "\n")
        runs = from_results(DOCS / f"{study}_results.csv", spec)
        (DOCS / f"{study}_ppl_vs_depth.png").write_bytes(png(plot_ppl_vs_depth(runs, list(runs[0].grid))))
    for page in ON_OFF:
        (DOCS / page).write_text(on_off_page(page))


if __name__ == "__main__":
    main()
