"""The ProRes paper's claims (arXiv 2603.05369, §4.4, Fig. 1-4, Table 2), computed from a depth study.

Each claim states its rule here, in words and in code, and ends in a verdict: ``holds``, ``does not
hold``, or ``not shown``; ``not measured`` where the study lacks the runs it needs. The rules are applied by
`prores report` as they are; nothing here is tuned to an outcome.

Methods are recognised by their resolved configs, not by their names (a sweep labels them as it likes):
ProRes is Pre-LN with the default init and a ProRes schedule; Pre-LN the same without; LNS, DeepNorm and
Post-LN by their layouts. A cell's number is its final validation loss (the paper compares perplexity,
exp of it: the same order); a diverged or failed cell counts as worse than any loss.

What the seeds can tell (issue 41): a comparison of methods is a paired difference over the seeds the arms
share (:func:`paired`), with its 95% t-interval on n − 1 degrees of freedom (:mod:`prores.study.intervals`).
A difference is *shown* positive (negative) when its whole interval lies above (below) 0. A claim holds when
every difference it needs is shown on its side, does not hold when one is shown on the other side, and is not
shown otherwise: with one seed, or no seed in common, nothing is shown. (Until issue 41 the rules read
"beyond twice the seed spread", which two seeds pass far more easily: t = 12.7 at one degree of freedom.)
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import numpy

from prores.monitor.spikes import SpikeScore
from prores.study.intervals import ABOVE, BELOW, Interval, interval, unpaired
from prores.study.runs import Run

HOLDS, FAILS, UNSHOWN, UNMEASURED = "holds", "does not hold", "not shown", "not measured"
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


def paired(*terms: tuple[float, Arm]) -> Interval:
    """Σ coefficient · loss, per seed, over the seeds every arm finished, with its 95% t-interval; with no seed in
    common, the same sum of the arms' means and no interval."""
    common = sorted(set.intersection(*(set(arm.losses) for _, arm in terms)))
    if not common:
        return Interval(sum(c * arm.mean for c, arm in terms), None, None, 0)
    return interval([sum(c * arm.losses[s] for c, arm in terms) for s in common])


def difference(a: Arm, b: Arm) -> Interval:
    """b's loss minus a's: paired over the seeds both have when there are two or more, else the difference of
    their means with the variance pooled from the arm that has several seeds (:func:`intervals.unpaired`)."""
    if len(set(a.losses) & set(b.losses)) > 1:
        return paired((1.0, b), (-1.0, a))
    return unpaired(list(a.losses.values()), list(b.losses.values()))


def numbers(name: str, iv: Interval) -> dict:
    """An interval as claims.json keeps it: ``{name: mean, "low", "high", "seeds", "unpaired"}``."""
    return {name: iv.mean, "low": iv.low, "high": iv.high, "seeds": iv.n, "unpaired": iv.unpaired}


def kept_interval(row: dict, name: str) -> Interval:
    """The inverse of :func:`numbers`."""
    return Interval(row[name], row["low"], row["high"], row["seeds"], tuple(row["unpaired"]) if row["unpaired"] else None)


def shown(iv: Interval, side: str) -> bool:
    """The whole interval lies on ``side`` of 0 (:data:`ABOVE` or :data:`BELOW`)."""
    return iv.verdict == side


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
        per_depth, leads, margins_at = {}, {}, {}
        for d in self.depths:
            pro = self.of("prores", d)
            if pro is None or not pro.losses:
                continue
            others = [c for c in self.at(d) if c is not pro and c.losses]
            if not others:
                continue
            margins = {c.label: difference(pro, c) for c in others}
            best = min(self.at(d), key=lambda c: c.mean if c.losses else math.inf)
            verdict = (FAILS if any(shown(iv, BELOW) for iv in margins.values()) else
                       HOLDS if all(shown(iv, ABOVE) for iv in margins.values()) else UNSHOWN)
            per_depth[d] = {"best": best.label, "prores": pro.mean, "prores_spread": pro.spread,
                            "margins": {label: numbers("minus_prores", iv) for label, iv in margins.items()},
                            "verdict": verdict}
            leads[d] = min(iv.mean for iv in margins.values())
            margins_at[d] = (pro, others)
        verdicts = [v["verdict"] for v in per_depth.values()]
        lowest = Claim("c-lowest", "ProRes has the lowest perplexity at every depth (Fig. 1).",
                       "At every depth every other method's final loss minus ProRes's shown above 0 (paired over"
                       " seeds, 95% interval): holds; some method shown below ProRes at some depth: does not hold;"
                       " else not shown.",
                       UNMEASURED if not verdicts else FAILS if FAILS in verdicts else
                       HOLDS if all(v == HOLDS for v in verdicts) else UNSHOWN, {"per_depth": per_depth})
        depths = sorted(leads)
        rho = spearman(depths, [leads[d] for d in depths]) if len(depths) > 2 else math.nan
        change = self.lead_change(*(margins_at[d] for d in (depths[0], depths[-1]))) if depths else None
        grows = (UNMEASURED if math.isnan(rho) else FAILS if rho <= 0 else
                 HOLDS if rho >= GROWS and shown(change, ABOVE) else UNSHOWN)
        lead = Claim("c-lead-grows", "ProRes's lead grows with depth (Fig. 1).",
                     f"The lead (the runner-up's loss minus ProRes's, per seed) against depth: Spearman rank"
                     f" correlation of its mean at least {GROWS} and the deepest lead minus the shallowest shown"
                     " above 0 (paired over seeds, 95% interval): holds; a correlation at or below 0: does not"
                     " hold; else not shown.",
                     grows, {"lead": {d: leads[d] for d in depths}, "spearman": rho,
                             **({"deepest_minus_shallowest": numbers("change", change)} if change else {})})
        return [lowest, lead]

    @staticmethod
    def lead_change(shallow: tuple[Arm, list[Arm]], deep: tuple[Arm, list[Arm]]) -> Interval:
        """The per-seed lead at the deepest depth minus that at the shallowest, over the seeds every arm of both
        depths finished; a seed's lead is the lowest of the other methods' losses minus ProRes's."""
        arms = [shallow[0], *shallow[1], deep[0], *deep[1]]
        common = sorted(set.intersection(*(set(a.losses) for a in arms)))

        def lead(at, s):
            return min(o.losses[s] for o in at[1]) - at[0].losses[s]
        if not common:
            return Interval(math.nan, None, None, 0)
        return interval([lead(deep, s) - lead(shallow, s) for s in common])

    # ------------------------------------------------------------------ LNS, DeepNorm, Pre-LN against depth

    def versus(self, role_: str, key: str, statement: str, rule: str, shallow_ok: Callable, deep_ok: Callable,
               fails: Callable, baseline: str = "prores") -> Claim:
        """A method against a baseline (method's loss minus ``baseline``'s, paired over seeds) at depths up to 48
        and from 72; the three callables take the interval at a depth (``fails``: at some depth from 72)."""
        found = {}
        for d in self.depths:
            base, other = self.of(baseline, d), self.of(role_, d)
            if base is not None and other is not None and base.losses and other.losses:
                found[d] = difference(base, other)
        shallow = [iv for d, iv in found.items() if d <= 48]
        deep = [iv for d, iv in found.items() if d >= 72]
        if not shallow or not deep:
            verdict = UNMEASURED
        elif all(map(shallow_ok, shallow)) and all(map(deep_ok, deep)):
            verdict = HOLDS
        else:
            verdict = FAILS if any(map(fails, deep)) else UNSHOWN
        return Claim(key, statement, rule, verdict,
                     {"per_depth": {d: numbers("minus_" + baseline, iv) for d, iv in found.items()}})

    def lns(self) -> Claim:
        return self.versus(
            "lns", "lns", "LNS matches ProRes up to 48 layers and falls behind beyond 72 (Fig. 1).",
            "LNS's loss minus ProRes's (paired over seeds, 95% interval) includes 0 at every depth up to 48 and is"
            " shown above 0 at every depth from 72: holds; shown below 0 (LNS ahead) at some depth from 72: does"
            " not hold; else not shown.",
            lambda iv: iv.verdict is not None and not shown(iv, ABOVE) and not shown(iv, BELOW),
            lambda iv: shown(iv, ABOVE), lambda iv: shown(iv, BELOW))

    def deepnorm(self) -> Claim:
        return self.versus(
            "deepnorm", "deepnorm", "DeepNorm overtakes Pre-LN from 72 layers (Fig. 1).",
            "DeepNorm's loss minus Pre-LN's (paired over seeds, 95% interval) shown below 0 at every depth from 72,"
            " and not up to 48: holds; shown above 0 (DeepNorm behind) at some depth from 72: does not hold; else"
            " not shown.",
            lambda iv: not shown(iv, BELOW), lambda iv: shown(iv, BELOW), lambda iv: shown(iv, ABOVE),
            baseline="pre")

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
        numbers_ = {"per_method": table}
        if len(pre) > 1:
            by_depth = {c.depth: c for c in pre}
            deepest, shallow = max(by_depth), [d for d in by_depth if d <= 48]
            if any(c.unstable for d, c in by_depth.items() if d >= 72):
                verdict = HOLDS
            elif shallow and deepest >= 72:
                best = min(shallow, key=lambda d: by_depth[d].mean)
                gain = paired((1.0, by_depth[best]), (-1.0, by_depth[deepest]))
                numbers_ |= {"pre_best_up_to_48": by_depth[best].mean, "pre_best_depth": best,
                             "pre_deepest": by_depth[deepest].mean, **numbers("pre_gain_from_depth", gain)}
                verdict = FAILS if shown(gain, ABOVE) else HOLDS if shown(gain, BELOW) else UNSHOWN
        return [Claim("pre-stalls", "Pre-LN stalls or becomes unstable as depth grows (Fig. 1).",
                      "A Pre-LN cell from 72 blocks diverged or failed, or the best Pre-LN up to 48 blocks minus the"
                      " deepest (per seed, 95% interval) shown below 0 (deeper is worse): holds; shown above 0"
                      " (deeper is better): does not hold; else not shown.",
                      verdict, numbers_)]

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
            arms = [self.of(r, d) for r in ("pre", "prores", "post", "post+prores")]
            if any(a is None or not a.losses for a in arms):
                continue
            pre, pro, post, post_pro = arms
            rows[d] = (difference(pro, pre), difference(post_pro, post),  # gains: without minus with ProRes
                       paired((1.0, post), (-1.0, post_pro), (-1.0, pre), (1.0, pro)))
        per = [(HOLDS if shown(more, ABOVE) else FAILS if shown(more, BELOW) else UNSHOWN)
               for _, _, more in rows.values()]
        return Claim("a-post-gains", "Post-LN gains the most from ProRes (Table 2).",
                     "At each depth where Post-LN and Pre-LN both ran with and without ProRes: Post-LN's gain (its loss"
                     " without minus with) minus Pre-LN's, per seed, shown above 0 (95% interval): holds; shown below"
                     " 0: does not hold; else not shown. Overall: holds at every such depth, does not hold at every"
                     " one, else not shown.",
                     UNMEASURED if not per else HOLDS if all(p == HOLDS for p in per) else
                     FAILS if all(p == FAILS for p in per) else UNSHOWN,
                     {"per_depth": {d: {"pre_gain": a.mean, "post_gain": b.mean, **numbers("post_minus_pre", c)}
                                    for d, (a, b, c) in rows.items()}})

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


FROM_LOSSES = ("c-lowest", "c-lead-grows", "lns", "deepnorm", "pre-stalls", "a-post-gains")  # need final losses only


def redecided(kept: list[Claim], runs: list[Run], label_of: Callable[[Run], str]) -> list[Claim]:
    """A kept study's claims under today's rules: those that need only final losses decided again from ``runs``
    (:func:`prores.study.runs.from_results`), the others (spikes, activations, analyses: event files that are
    gone) with the verdicts and numbers kept, their statements and rules as the code words them now."""
    again = {c.key: c for c in Study(runs, label_of).claims()}
    renamed = {"not shown beyond the seed spread": UNSHOWN}  # the label of "not shown" until issue 41
    return [again[c.key] if c.key in FROM_LOSSES else
            Claim(c.key, again[c.key].statement, again[c.key].rule, renamed.get(c.verdict, c.verdict), c.numbers)
            for c in kept]


def claims_json(claims: list[Claim]) -> list[dict]:
    def clean(v):
        if isinstance(v, float):  # JSON has no infinity: a divergence's is kept as a string
            return None if math.isnan(v) else v if math.isfinite(v) else str(v)
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
        if v in ("inf", "-inf"):
            return float(v)
        return [restore(x) for x in v] if isinstance(v, list) else v
    return [Claim(**{**c, "numbers": restore(c["numbers"])}) for c in data]


def _num(v, digits: int = 4, sign: str = "+") -> str:
    """A difference (signed), or with ``sign=""`` a value."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    return f"{v:{sign}.{digits}f}" if isinstance(v, float) else str(v)


def _interval(row: dict, name: str) -> str:
    return kept_interval(row, name).text()


def _details(c: Claim) -> list[str]:
    """The claim's numbers as a table (what claims.json holds in full)."""
    n = c.numbers
    if c.key == "c-lowest":
        return ["| depth | best | ProRes loss | other − ProRes |", "| ---: | --- | --- | --- |"] + [
            f"| {d} | {r['best']} | {_num(r['prores'], sign='')}"
            + ("" if r["prores_spread"] is None else f" ± {r['prores_spread']:.4f}") + " | "
            + "; ".join(f"{label} {_interval(m, 'minus_prores')}" for label, m in r["margins"].items()) + " |"
            for d, r in n["per_depth"].items()]
    if c.key == "c-lead-grows":
        change = n.get("deepest_minus_shallowest")
        return ["| depth | lead |", "| ---: | ---: |"] + [f"| {d} | {_num(v)} |" for d, v in n["lead"].items()] + [
            "", f"Spearman correlation with depth: {_num(n['spearman'], 2)}"] + (
            ["", f"Deepest lead minus shallowest, per seed: {_interval(change, 'change')}"] if change else [])
    if c.key in ("lns", "deepnorm"):
        base = "minus_prores" if c.key == "lns" else "minus_pre"
        return ["| depth | " + ("LNS − ProRes" if c.key == "lns" else "DeepNorm − Pre-LN") + " |", "| ---: | --- |"] + [
            f"| {d} | {_interval(r, base)} |" for d, r in n["per_depth"].items()]
    if c.key == "pre-stalls":
        methods = n["per_method"]
        depths = sorted({d for m in methods.values() for d in m["loss"]})
        return (["| method | " + " | ".join(map(str, depths)) + " | keeps improving | slope over the deepest (per block) |",
                 "|---" * (len(depths) + 3) + "|"]
                + [f"| {label} | " + " | ".join(_num(m["loss"].get(d), sign="") for d in depths)
                   + f" | {m['keeps_improving']} | {_num(m['slope_per_block_deepest'], 6)} |"
                   for label, m in methods.items()]
                + ([] if "pre_gain_from_depth" not in n else
                   ["", f"Pre-LN's best up to 48 blocks ({n['pre_best_depth']}) minus its deepest, per seed:"
                        f" {_interval(n, 'pre_gain_from_depth')}"]))
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
        return ["| depth | Pre-LN's gain | Post-LN's gain | Post-LN's minus Pre-LN's, per seed |",
                "| ---: | --- | --- | --- |"] + [
            f"| {d} | {_num(r['pre_gain'])} | {_num(r['post_gain'])} | {_interval(r, 'post_minus_pre')} |"
            for d, r in n["per_depth"].items()]
    return []


def claims_markdown(claims: list[Claim]) -> list[str]:
    lines = ["## Claims", "", "Each claim with the rule that decides it (`prores/study/claims.py`; the numbers in"
             " full in [claims.json](claims.json)); losses are final validation losses in nats, differences paired"
             " over seeds with their 95% t-interval [low, high] (an infinite end where a run diverged; unpaired"
             " where two methods share fewer than two seeds).", "", "| claim | verdict |", "| --- | --- |"]
    lines += [f"| {c.statement} | **{c.verdict}** |" for c in claims]
    for c in claims:
        lines += ["", f"### {c.statement}", "", f"**{c.verdict}.** Rule: {c.rule}", ""] + _details(c)
    return lines + [""]
