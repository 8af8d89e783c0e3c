"""The ProRes paper's claims (arXiv 2603.05369, §4.4, Fig. 1-4, Table 2), computed from a depth study.

Each claim states its rule here, in words and in code, and ends in a verdict: ``holds``, ``does not
hold``, or ``not shown beyond the seed spread``; ``not measured`` where the study lacks the runs it
needs. The rules were written before the CPU depth study ran and are applied by `prores report` as
they are; nothing here is tuned to an outcome.

Methods are recognised by their resolved configs, not by their names (a sweep labels them as it likes):
ProRes is Pre-LN with the default init and a ProRes schedule; Pre-LN the same without; LNS, DeepNorm and
Post-LN by their layouts. A cell's number is its final validation loss (the paper compares perplexity,
exp of it: the same order); a diverged or failed cell counts as worse than any loss.

The seed spread: at a depth, the sample standard deviation of ProRes's (or Pre-LN's) final losses over
its seeds. A difference between two methods is "beyond the spread" when it exceeds twice that spread
(a paired difference over the seeds both have, when both have several, uses its own spread instead).
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import numpy

from prores.monitor.spikes import SpikeScore
from prores.study.runs import Run

HOLDS, FAILS, UNSHOWN, UNMEASURED = "holds", "does not hold", "not shown beyond the seed spread", "not measured"
SPIKE_SIGMA, SPIKE_WINDOW = 7.0, 1000  # the paper's: 7σ above the mean of the previous 1000 steps ...
SPIKE_SPAN = (0.1, 0.9)  # ... counted over 10-90% of training
NEAR_ZERO = 0.01  # a spike score "near zero": at most 1% of the steps in the span
EARLY = 0.1  # "early in training": the logged step nearest 10% of it
GROWS = 0.6  # "the lead grows with depth": Spearman correlation of the lead with depth at least this


def prores_on(config: dict) -> bool:
    """A run's flat config has a ProRes schedule."""
    return config.get("prores.schedule") not in (None, "none")


def role(config: dict) -> Optional[str]:
    """``prores``, ``pre``, ``lns``, ``deepnorm``, ``post``, ``post+prores``, or None (another method)."""
    layout, init = config.get("model.norm_layout"), config.get("model.init")
    on = prores_on(config)
    if config.get("model.norm") == "dyt" or config.get("model.depth_mup_alpha"):  # another method on top
        return None
    if layout == "pre" and init == "normal":
        return "prores" if on else "pre"
    if layout == "post":
        return "post+prores" if on else "post"
    if layout in ("lns", "deepnorm") and not on:
        return layout
    return None


@dataclass
class Arm:
    """A method at a depth: its runs over seeds."""

    label: str
    depth: int
    role: Optional[str]
    runs: list[Run]

    @property
    def losses(self) -> dict[int, float]:
        """Seed -> final validation loss of each completed run; a diverged or failed run -> inf."""
        out = {}
        for r in self.runs:
            if r.completed:
                out[r.seed] = r.summary["final_valid_loss"]
            elif r.state in ("diverged", "failed"):
                out[r.seed] = math.inf
        return out

    @property
    def mean(self) -> float:
        return statistics.fmean(self.losses.values()) if self.losses else math.nan

    @property
    def spread(self) -> Optional[float]:
        values = [v for v in self.losses.values() if math.isfinite(v)]
        return statistics.stdev(values) if len(values) > 1 else None

    @property
    def unstable(self) -> bool:
        return any(r.state in ("diverged", "failed") for r in self.runs)


def cells_of(runs: list[Run], label_of: Callable[[Run], str]) -> dict[tuple[str, int], "Arm"]:
    cells: dict[tuple[str, int], Arm] = {}
    for r in runs:
        if r.depth is None or not r.config:
            continue
        key = (label_of(r), r.depth)
        cells.setdefault(key, Arm(key[0], r.depth, role(r.config), [])).runs.append(r)
    return cells


def difference(a: Arm, b: Arm) -> tuple[float, Optional[float]]:
    """b's loss minus a's: paired over the seeds both finished when there are several (mean, std), else the
    difference of the means and a's seed spread."""
    la, lb = a.losses, b.losses
    common = sorted(set(la) & set(lb))
    pairs = [lb[s] - la[s] for s in common]
    if len(pairs) > 1 and all(map(math.isfinite, pairs)):
        return statistics.fmean(pairs), statistics.stdev(pairs)
    return b.mean - a.mean, a.spread


def beyond(diff: float, spread: Optional[float]) -> bool:
    """A positive difference larger than twice its spread (with no spread, any positive difference)."""
    return diff > 2 * (spread or 0.0)


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (ties share their mean rank)."""
    def ranks(v):
        order = numpy.argsort(v, kind="stable")
        r = numpy.empty(len(v))
        r[order] = numpy.arange(len(v), dtype=float)
        for value in set(v):  # ties
            tied = numpy.asarray(v) == value
            r[tied] = r[tied].mean()
        return r
    rx, ry = ranks(list(x)), ranks(list(y))
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(numpy.corrcoef(rx, ry)[0, 1])


def fit(x, y) -> tuple[float, float]:
    """Least-squares line y = a + b·x: (b, R²)."""
    x, y = numpy.asarray(x, float), numpy.asarray(y, float)
    b, a = numpy.polyfit(x, y, 1)
    ss_res, ss_tot = float(((y - (a + b * x)) ** 2).sum()), float(((y - y.mean()) ** 2).sum())
    return float(b), (1.0 - ss_res / ss_tot) if ss_tot > 0 else 1.0


@dataclass
class Claim:
    key: str
    statement: str
    rule: str
    verdict: str
    numbers: dict = field(default_factory=dict)


class Study:
    """The cells of a depth study by role and depth."""

    def __init__(self, runs: list[Run], label_of: Callable[[Run], str]):
        self.runs = runs
        self.cells = cells_of(runs, label_of)
        self.depths = sorted({d for _, d in self.cells})

    def of(self, role_: str, depth: int) -> Optional[Arm]:
        found = [c for c in self.cells.values() if c.role == role_ and c.depth == depth]
        return found[0] if found else None

    def at(self, depth: int) -> list[Arm]:
        return [c for c in self.cells.values() if c.depth == depth]

    # ------------------------------------------------------------------ (c) ProRes lowest, its lead grows

    def lowest(self) -> list[Claim]:
        per_depth, leads = {}, {}
        for d in self.depths:
            pro = self.of("prores", d)
            if pro is None or not pro.losses:
                continue
            margins = {}
            for other in self.at(d):
                if other is pro or not other.losses:
                    continue
                diff, spread = difference(pro, other)
                margins[other.label] = {"minus_prores": diff, "spread": spread}
            if not margins:
                continue
            worst = [m for m in margins.values() if m["minus_prores"] < 0 and beyond(-m["minus_prores"], m["spread"])]
            clear = all(beyond(m["minus_prores"], m["spread"]) for m in margins.values())
            best = min(self.at(d), key=lambda c: c.mean if c.losses else math.inf)
            per_depth[d] = {"best": best.label, "prores": pro.mean, "prores_spread": pro.spread,
                            "margins": margins, "verdict": FAILS if worst else HOLDS if clear else UNSHOWN}
            leads[d] = min(m["minus_prores"] for m in margins.values())
        verdicts = [v["verdict"] for v in per_depth.values()]
        lowest = Claim("c-lowest", "ProRes has the lowest perplexity at every depth (Fig. 1).",
                       "At every depth every other method's final loss minus ProRes's is positive and beyond the seed"
                       " spread: holds; some method lower than ProRes beyond the spread at some depth: does not"
                       " hold; else not shown.",
                       UNMEASURED if not verdicts else FAILS if FAILS in verdicts else
                       HOLDS if all(v == HOLDS for v in verdicts) else UNSHOWN, {"per_depth": per_depth})
        depths = sorted(leads)
        rho = spearman(depths, [leads[d] for d in depths]) if len(depths) > 2 else math.nan
        spread = statistics.fmean([s for d in depths if (s := per_depth[d]["prores_spread"]) is not None] or [0.0])
        grows = (HOLDS if rho >= GROWS and beyond(leads[depths[-1]] - leads[depths[0]], spread) else
                 FAILS if rho <= 0 else UNSHOWN) if not math.isnan(rho) else UNMEASURED
        lead = Claim("c-lead-grows", "ProRes's lead grows with depth (Fig. 1).",
                     f"The lead (the runner-up's loss minus ProRes's) against depth: Spearman rank correlation at"
                     f" least {GROWS} and the deepest lead beyond the shallowest by more than twice the mean seed"
                     " spread: holds; a correlation at or below 0: does not hold; else not shown.",
                     grows, {"lead": {d: leads[d] for d in depths}, "spearman": rho})
        return [lowest, lead]

    # ------------------------------------------------------------------ LNS, DeepNorm, Pre-LN against depth

    def versus(self, role_: str, key: str, statement: str, rule: str, shallow_ok: Callable, deep_ok: Callable,
               fails: Callable, baseline: str = "prores") -> Claim:
        """A method against a baseline (``baseline`` minus method's loss) at depths up to 48 and from 72."""
        rows = {}
        for d in self.depths:
            base, other = self.of(baseline, d), self.of(role_, d)
            if base is None or other is None or not base.losses or not other.losses:
                continue
            diff, spread = difference(base, other)
            rows[d] = {"minus_" + baseline: diff, "spread": spread}
        shallow = {d: r for d, r in rows.items() if d <= 48}
        deep = {d: r for d, r in rows.items() if d >= 72}
        if not shallow or not deep:
            verdict = UNMEASURED
        elif all(shallow_ok(r) for r in shallow.values()) and all(deep_ok(r) for r in deep.values()):
            verdict = HOLDS
        else:
            verdict = FAILS if fails(shallow, deep) else UNSHOWN
        return Claim(key, statement, rule, verdict, {"per_depth": rows})

    def lns(self) -> Claim:
        within = lambda r: abs(r["minus_prores"]) <= 2 * (r["spread"] or 0.0)  # noqa: E731
        return self.versus(
            "lns", "lns", "LNS matches ProRes up to 48 layers and falls behind beyond 72 (Fig. 1).",
            "LNS's loss minus ProRes's within twice the seed spread at every depth up to 48, and beyond it at every"
            " depth from 72: holds; LNS not behind beyond the spread at any depth from 72: does not hold; else not"
            " shown.", within, lambda r: beyond(r["minus_prores"], r["spread"]),
            lambda shallow, deep: not any(beyond(r["minus_prores"], r["spread"]) for r in deep.values()))

    def deepnorm(self) -> Claim:
        better = lambda r: beyond(-r["minus_pre"], r["spread"])  # noqa: E731  (DeepNorm below Pre-LN)
        return self.versus(
            "deepnorm", "deepnorm", "DeepNorm overtakes Pre-LN from 72 layers (Fig. 1).",
            "Pre-LN's loss minus DeepNorm's beyond twice Pre-LN's seed spread at every depth from 72, and not"
            " beyond it up to 48: holds; DeepNorm not below Pre-LN at any depth from 72: does not hold; else not"
            " shown.", lambda r: not better(r), better,
            lambda shallow, deep: all(r["minus_pre"] >= 0 for r in deep.values()), baseline="pre")

    def depth_scaling(self) -> list[Claim]:
        """Per method: loss against depth, whether it keeps improving, the slope over the deepest depths."""
        table = {}
        for label in sorted({c.label for c in self.cells.values()}):
            cells = sorted((c for c in self.cells.values() if c.label == label), key=lambda c: c.depth)
            means = {c.depth: c.mean for c in cells}
            finite = [d for d in means if math.isfinite(means[d])]
            deepest = finite[-3:]
            table[label] = {
                "role": cells[0].role, "loss": means, "unstable_at": [c.depth for c in cells if c.unstable],
                "keeps_improving": all(means[b] < means[a] for a, b in zip(finite, finite[1:])),
                "slope_per_block_deepest": fit(deepest, [means[d] for d in deepest])[0] if len(deepest) > 1 else None,
            }
        pre = [c for c in self.cells.values() if c.role == "pre"]
        verdict = UNMEASURED
        numbers = {"per_method": table}
        if len(pre) > 1:
            by_depth = {c.depth: c for c in pre}
            deepest, shallow = max(by_depth), [d for d in by_depth if d <= 48]
            spread = statistics.fmean([c.spread for c in pre if c.spread is not None] or [0.0])
            if any(c.unstable for d, c in by_depth.items() if d >= 72):
                verdict = HOLDS
            elif shallow and deepest >= 72:
                best_shallow = min(by_depth[d].mean for d in shallow)
                gain = best_shallow - by_depth[deepest].mean
                numbers |= {"pre_best_up_to_48": best_shallow, "pre_deepest": by_depth[deepest].mean,
                            "pre_gain_from_depth": gain, "pre_spread": spread}
                verdict = FAILS if beyond(gain, spread) else HOLDS
        return [Claim("pre-stalls", "Pre-LN stalls or becomes unstable as depth grows (Fig. 1).",
                      "A Pre-LN cell from 72 blocks diverged or failed, or the deepest Pre-LN is not below its best"
                      " loss up to 48 blocks by more than twice its mean seed spread: holds; it is: does not hold.",
                      verdict, numbers)]

    # ------------------------------------------------------------------ (d) spikes

    def spikes(self) -> Claim:
        scores = {}
        for c in self.cells.values():
            per_seed = [spike_scores(r) for r in c.runs if r.completed]
            per_seed = [s for s in per_seed if s is not None]
            if per_seed:
                scores.setdefault(c.label, {})[c.depth] = {
                    series: statistics.fmean(s[series] for s in per_seed) for series in ("train/loss", "train/grad_norm")}
        pro = {d: s for c in self.cells.values() if c.role == "prores" for d, s in scores.get(c.label, {}).items()}
        verdict = UNMEASURED if not pro else HOLDS if all(v <= NEAR_ZERO for s in pro.values() for v in s.values()) else FAILS
        return Claim("d-spikes", "The spike score stays near zero with ProRes at every depth (Fig. 2).",
                     f"Spike score: the share of steps in {SPIKE_SPAN[0]:.0%}-{SPIKE_SPAN[1]:.0%} of training whose loss"
                     f" (grad norm) is more than {SPIKE_SIGMA:g}σ above the mean of the previous {SPIKE_WINDOW} steps,"
                     " the window capped at a tenth of the run; mean over seeds. At most"
                     f" {NEAR_ZERO:g} for both series at every depth: holds; above it somewhere: does not hold.",
                     verdict, {"per_method": scores})

    # ------------------------------------------------------------------ (b) activation growth

    def per_run(self, measure: Callable[[Run], Optional[dict]]) -> dict:
        """``{role: {depth: {seed: measure(run)}}}`` over the Pre-LN and ProRes runs it measures."""
        rows: dict = {}
        for c in self.cells.values():
            for r in c.runs if c.role in ("pre", "prores") else ():
                value = measure(r)
                if value is not None:
                    rows.setdefault(c.role, {}).setdefault(c.depth, {})[r.seed] = value
        return rows

    def growth(self) -> Claim:
        rows = self.per_run(act_shape)
        verdicts = {}
        for d in sorted(set(rows.get("pre", {})) & set(rows.get("prores", {}))):
            pre = [s["early"]["exponential"] for s in rows["pre"][d].values()]
            pro = [s["early"]["exponential"] for s in rows["prores"][d].values()]
            verdicts[d] = (HOLDS if all(pre) and not any(pro) else FAILS if not any(pre) or all(pro) else UNSHOWN)
        v = list(verdicts.values())
        return Claim("b-growth", "Pre-LN's activation norm grows exponentially with layer index early in training;"
                                 " with ProRes it grows roughly linearly (Fig. 3).",
                     f"Per run, each block's act RMS at the logged step nearest {EARLY:.0%} of training, fitted"
                     " against the block index as log RMS (exponential) and as RMS (linear): exponential-like when the"
                     " log fit's R² is the higher. At a depth: every Pre-LN seed exponential-like and every ProRes"
                     " seed linear-like: holds; no Pre-LN seed exponential-like, or every ProRes seed: does not hold;"
                     " else not shown. Overall: holds at every depth, does not hold at one, else not shown.",
                     UNMEASURED if not v else FAILS if FAILS in v else HOLDS if all(x == HOLDS for x in v) else UNSHOWN,
                     {"per_role": rows, "per_depth": verdicts})

    # ------------------------------------------------------------------ (e) representation evolution

    def evolution(self) -> Claim:
        rows = self.per_run(cosine_order)
        pro = rows.get("prores", {})
        means = {d: statistics.fmean(v["spearman"] for v in seeds.values()) for d, seeds in pro.items()}
        verdict = (UNMEASURED if not means else HOLDS if all(m <= -0.5 for m in means.values()) else
                   FAILS if any(m >= 0 for m in means.values()) else UNSHOWN)
        return Claim("e-evolution", "Under ProRes each layer's output converges shallow layers first (Fig. 4).",
                     f"Per run, each block's cosine to its final-checkpoint output (`prores analyze`) at the checkpoint"
                     f" nearest {EARLY:.0%} of training, and its Spearman correlation with the block index (negative:"
                     " shallow blocks nearer their final output). ProRes's mean over seeds at most -0.5 at every"
                     " depth: holds; at or above 0 at some depth: does not hold; else not shown.",
                     verdict, {"per_role": rows, "prores_mean": means})

    # ------------------------------------------------------------------ (a) Post-LN gains the most

    def post_gains(self) -> Claim:
        rows = {}
        for d in self.depths:
            pairs = {name: (self.of(a, d), self.of(b, d)) for name, a, b in (("pre", "pre", "prores"),
                                                                             ("post", "post", "post+prores"))}
            if any(x is None or y is None or not x.losses or not y.losses for x, y in pairs.values()):
                continue
            gains = {name: difference(y, x) for name, (x, y) in pairs.items()}  # without minus with ProRes
            rows[d] = {f"{name}_gain": g for name, (g, _) in gains.items()} | {
                "spread": max((s for _, s in gains.values() if s is not None), default=None)}
        per = [(HOLDS if beyond(r["post_gain"] - r["pre_gain"], r["spread"]) else
                FAILS if r["post_gain"] <= r["pre_gain"] else UNSHOWN) for r in rows.values()]
        return Claim("a-post-gains", "Post-LN gains the most from ProRes (Table 2).",
                     "At each depth where Post-LN and Pre-LN both ran with and without ProRes: Post-LN's gain (its loss"
                     " without minus with) above Pre-LN's by more than twice the larger seed spread: holds; at or"
                     " below it: does not hold; else not shown. Overall: holds at every such depth, does not hold at"
                     " every one, else not shown.",
                     UNMEASURED if not per else HOLDS if all(p == HOLDS for p in per) else
                     FAILS if all(p == FAILS for p in per) else UNSHOWN, {"per_depth": rows})

    def claims(self) -> list[Claim]:
        return [*self.lowest(), self.lns(), self.deepnorm(), *self.depth_scaling(), self.spikes(), self.growth(),
                self.evolution(), self.post_gains()]


# ---------------------------------------------------------------------- per-run measurements


def span(steps: int) -> tuple[int, int]:
    return int(round(SPIKE_SPAN[0] * steps)), int(round(SPIKE_SPAN[1] * steps))


def spike_scores(run: Run) -> Optional[dict[str, float]]:
    """Both series' spike scores over 10-90% of the run (every step must be logged: train.log_interval=1)."""
    steps = run.summary.get("steps")
    if not steps:
        return None
    lo, hi = span(steps)
    out = {}
    for series in ("train/loss", "train/grad_norm"):
        values = run.scalars.get(series, {})
        if len(values) < steps:
            return None
        score = SpikeScore(SPIKE_SIGMA, min(SPIKE_WINDOW, max(2, steps // 10)))
        for step in sorted(values):
            score.add(step, values[step])
        out[series] = sum(lo <= s < hi for s in score.spikes) / (hi - lo)
    return out


def act_profile(run: Run, step: int) -> dict[int, float]:
    prefix = "layers/act_rms/layer_"
    return {int(t[len(prefix):]): v[step] for t, v in run.scalars.items() if t.startswith(prefix) and step in v}


def act_shape(run: Run) -> Optional[dict]:
    """The act-RMS profile over blocks at the logged step nearest 10% of training and at the last one: the
    fits of log RMS and of RMS against the block index (slope, R²), the per-block growth factor exp(slope)."""
    first = run.scalars.get("layers/act_rms/layer_001")
    if not run.completed or not first or run.depth < 3:
        return None
    steps = sorted(first)
    out = {}
    for name, step in (("early", min(steps, key=lambda s: abs(s - EARLY * run.summary["steps"]))), ("end", steps[-1])):
        profile = act_profile(run, step)
        layers = sorted(profile)
        rms = [profile[l] for l in layers]
        log_slope, log_r2 = fit(layers, numpy.log(rms))
        _, lin_r2 = fit(layers, rms)
        out[name] = {"step": step, "r2_log": log_r2, "r2_linear": lin_r2, "growth_per_block": math.exp(log_slope),
                     "exponential": log_r2 > lin_r2}
    return out


def cosine_order(run: Run) -> Optional[dict]:
    """From ``analysis/cosine.csv`` (`prores analyze`): the row nearest 10% of training and the Spearman
    correlation of its cosines with the block index."""
    path = run.run_dir / "analysis" / "cosine.csv"
    if not run.completed or not path.is_file():
        return None
    rows = list(csv.reader(open(path)))
    layers = [int(c.rsplit("_", 1)[1]) for c in rows[0][1:]]
    table = {int(r[0]): [float(v) for v in r[1:]] for r in rows[1:]}
    step = min(table, key=lambda s: abs(s - EARLY * run.summary["steps"]))
    if step == max(table):
        return None  # only the final checkpoint: nothing to compare
    return {"step": step, "spearman": spearman(layers, table[step])}


def claims_json(claims: list[Claim]) -> list[dict]:
    def clean(v):
        if isinstance(v, float):
            return None if not math.isfinite(v) else v
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    return [clean(asdict(c)) for c in claims]


def claims_from_json(data: list[dict]) -> list[Claim]:
    """The inverse of :func:`claims_json`: JSON's string keys back to the depths and seeds (ints) they were."""
    def restore(v):
        if isinstance(v, dict):
            return {int(k) if k.lstrip("-").isdigit() else k: restore(x) for k, x in v.items()}
        return [restore(x) for x in v] if isinstance(v, list) else v
    return [Claim(**{**c, "numbers": restore(c["numbers"])}) for c in data]


def _num(v, digits: int = 4, sign: str = "+") -> str:
    """A difference (signed), or with ``sign=""`` a value."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    return f"{v:{sign}.{digits}f}" if isinstance(v, float) else str(v)


def _spread(diff, spread) -> str:
    return _num(diff) + ("" if spread is None else f" ± {spread:.4f}")


def _details(c: Claim) -> list[str]:
    """The claim's numbers as a table (what claims.json holds in full)."""
    n = c.numbers
    if c.key == "c-lowest":
        return ["| depth | best | ProRes loss | other − ProRes |", "| ---: | --- | --- | --- |"] + [
            f"| {d} | {r['best']} | {_num(r['prores'], sign='')}"
            + ("" if r["prores_spread"] is None else f" ± {r['prores_spread']:.4f}") + " | "
            + "; ".join(f"{label} {_spread(m['minus_prores'], m['spread'])}" for label, m in r["margins"].items()) + " |"
            for d, r in n["per_depth"].items()]
    if c.key == "c-lead-grows":
        return ["| depth | lead |", "| ---: | ---: |"] + [f"| {d} | {_num(v)} |" for d, v in n["lead"].items()] + [
            "", f"Spearman correlation with depth: {_num(n['spearman'], 2)}"]
    if c.key in ("lns", "deepnorm"):
        base = "minus_prores" if c.key == "lns" else "minus_pre"
        return ["| depth | " + ("LNS − ProRes" if c.key == "lns" else "DeepNorm − Pre-LN") + " |", "| ---: | --- |"] + [
            f"| {d} | {_spread(r[base], r['spread'])} |" for d, r in n["per_depth"].items()]
    if c.key == "pre-stalls":
        methods = n["per_method"]
        depths = sorted({d for m in methods.values() for d in m["loss"]})
        return (["| method | " + " | ".join(map(str, depths)) + " | keeps improving | slope over the deepest (per block) |",
                 "|---" * (len(depths) + 3) + "|"]
                + [f"| {label} | " + " | ".join(_num(m["loss"].get(d), sign="") for d in depths)
                   + f" | {m['keeps_improving']} | {_num(m['slope_per_block_deepest'], 6)} |"
                   for label, m in methods.items()])
    if c.key == "d-spikes":
        methods = n["per_method"]
        depths = sorted({d for m in methods.values() for d in m})
        return (["| method | " + " | ".join(f"{d} (loss / grad)" for d in depths) + " |", "|---" * (len(depths) + 1) + "|"]
                + [f"| {label} | " + " | ".join(
                    f"{m[d]['train/loss']:.3f} / {m[d]['train/grad_norm']:.3f}" if d in m else "—" for d in depths) + " |"
                   for label, m in methods.items()])
    if c.key == "b-growth":
        out = ["| role | depth | early: R² log / linear, growth per block | end: R² log / linear, growth per block |",
               "| --- | ---: | --- | --- |"]
        for r, depths in n["per_role"].items():
            for d, seeds in sorted(depths.items()):
                cols = []
                for when in ("early", "end"):
                    vals = [s[when] for s in seeds.values()]
                    cols.append(f"{statistics.fmean(v['r2_log'] for v in vals):.3f} /"
                                f" {statistics.fmean(v['r2_linear'] for v in vals):.3f},"
                                f" {statistics.fmean(v['growth_per_block'] for v in vals):.4f}")
                out.append(f"| {r} | {d} | {cols[0]} | {cols[1]} |")
        return out
    if c.key == "e-evolution":
        return ["| role | depth | Spearman (cosine, block index), per seed |", "| --- | ---: | --- |"] + [
            f"| {r} | {d} | " + ", ".join(f"{v['spearman']:+.2f} (step {v['step']})" for v in seeds.values()) + " |"
            for r, depths in n["per_role"].items() for d, seeds in sorted(depths.items())]
    if c.key == "a-post-gains":
        return ["| depth | Pre-LN's gain | Post-LN's gain |", "| ---: | --- | --- |"] + [
            f"| {d} | {_num(r['pre_gain'])} | {_num(r['post_gain'])} |" for d, r in n["per_depth"].items()]
    return []


def claims_markdown(claims: list[Claim]) -> list[str]:
    lines = ["## Claims", "", "Each claim with the rule that decides it (`prores/study/claims.py`; the numbers in"
             " full in [claims.json](claims.json)); losses are final validation losses in nats, differences with"
             " their seed spread.", "", "| claim | verdict |", "| --- | --- |"]
    lines += [f"| {c.statement} | **{c.verdict}** |" for c in claims]
    for c in claims:
        lines += ["", f"### {c.statement}", "", f"**{c.verdict}.** Rule: {c.rule}", ""] + _details(c)
    return lines + [""]
