"""TP × PP × DP through the real launchers on CPU/gloo: the layout changes nothing but speed.

Every layout trains the same tiny fp32 model on the same data for 10 steps;
per-step loss, pre-clip grad norm and every per-layer diagnostic must equal
the one-process run within rtol 1e-5, and the final weights, gathered from the
DeepSpeed checkpoints, must match too. Every layout also diverges on purpose:
all its ranks stop at the step one process stops at, and none hangs.
"""

import csv
import glob
import json
import math
import signal
from pathlib import Path

import pytest
from PIL import Image
from tensorboard.backend.event_processing import event_accumulator

from conftest import (NO_SLURM, PORT, deepspeed_launcher, need, run_cli, slurm_available, srun, torchrun,
                      train_args)
from prores.config import load_config
from prores.model.gpt import gpt_pieces
from prores.model.prores import ProRes
from prores.parallel.consolidate import consolidated_weights
from prores.study.analyze import analyze

pytestmark = pytest.mark.slow

STEPS, RTOL = 10, 1e-5
# AdamW with eps far above every sqrt(v) (gradients here are < 0.1): the update is lr·m̂/(sqrt(v̂)+eps),
# to first order lr/eps times an average of gradients, so a layout's round-off in a gradient is passed
# on to the weights at its own relative size. (With the default eps=1e-8 Adam divides by each element's
# own gradient scale: an element whose gradient is round-off-sized moves by up to ±lr on either layout,
# whatever the layout got right.) lr 0.1 gives updates of the order of Adam's at lr 3e-4.
#
# Final weights are compared on the update, per tensor: max|w - w_ref| <= WEIGHT_TOL·max|w_ref - w_init|.
# The worst-case fp32 error of a sum of n terms, in any order, with or without FMA or wider SIMD
# lanes, is gamma_n ~ n·u (u = 2^-24). A block gradient here sums over the 128 tokens of a batch and
# back through 6 blocks of 64-wide and 128-wide reductions: n ~ 128 + 6·(64 + 128) ~ 1300, so
# gamma_n ~ 8e-5 of the terms' magnitudes. WEIGHT_TOL is that bound, not a measurement (measured on an
# AVX-512 EPYC: 1.3e-6; with eps=1e-8 the same runs differed by 2.5e-4 of the update).
# On top of that, each step rounds the stored weight w - Δ to fp32 itself: where the two layouts' Δ
# differ by a hair, the two sums may round to neighbouring floats, one ulp (2^-24·|w|) apart, each step.
# That term matters for norm gains (|w| ~ 1, updates ~ 1e-4: one ulp is 7e-4 of the update).
WEIGHT_TOL = 1e-4
ULP = 2.0**-24
COMMON = ("model.num_layers=6", "model.hidden_size=64", "model.ffn_hidden_size=128", "model.num_heads=4",
          "model.seq_length=32", "model.dropout=0.0", "train.precision=fp32", f"train.steps={STEPS}",
          "train.micro_batch_size=4", "train.log_interval=1", "train.eval_interval=5",
          "optim.lr=0.1", "optim.eps=1.0", "optim.warmup_steps=2", "prores.T=1", "data.eval_samples=8",
          "logging.stats_interval=3", "checkpoint.interval=5",
          "logging.progress_bar=false", f"data.eval.fixture={Path(__file__).parent / 'fixtures' / 'tiny_corpus.jsonl'}",
          # the layouts are compared on the plain-torch kernels: Inductor's start-up (~7 CPU-seconds a process, over
          # a hundred processes here) would be most of this file's time. The compiled kernels cross the machine in
          # the "-block" pair below, and tests/test_fused.py holds them to the reference formulas.
          "kernels.backend=eager")
UNEVEN = ("parallel.pp=2", "parallel.stage_layers=[2, 4]")
SATURATED_FROM = 6  # T·L: from this step every block runs the saturated path (alpha None, no multiply)

# name: (launcher, overrides on top of COMMON)
LAYOUTS = {
    "1x1x1": (None, ()),
    "tp2": (torchrun(2), ("parallel.tp=2",)),
    "dp2": (deepspeed_launcher(2), ("train.micro_batch_size=2",)),  # same global batch of 4
    "tp2pp2": (deepspeed_launcher(4), ("parallel.tp=2", "parallel.pp=2")),
    # ZeRO-0 clips with prores's global norm (DeepSpeed's misses replicated params on later stages)
    "tp2pp2-zero0": (torchrun(4), ("parallel.tp=2", "parallel.pp=2", "parallel.zero_stage=0")),
    # four micro-batches a step: the two stages overlap in DeepSpeed's 1F1B schedule (pp2 of the plain kind is
    # pp2-uneven, pp2-tied and these)
    "pp2-accum4": (torchrun(2), ("parallel.pp=2", "train.micro_batch_size=1", "train.grad_accum=4")),
    # each block compiled whole (what kernels.backend=auto takes on a CPU with a C++ compiler) on TP × PP
    "1x1x1-block": (None, ("kernels.backend=block",)),
    "tp2pp2-block": (torchrun(4), ("parallel.tp=2", "parallel.pp=2", "kernels.backend=block")),
    # blocks recomputed in the backward pass: the same numbers as without (bitwise, see RECOMPUTED)
    "tp2pp2-recompute": (torchrun(4), ("parallel.tp=2", "parallel.pp=2", "model.recompute=block")),
    "pp2-uneven": (torchrun(2), UNEVEN),
    # the head reads the embedding's weight on the last stage: DeepSpeed all-reduces the tied gradient
    "1x1x1-tied": (None, ("model.tie_embeddings=true",)),
    "pp2-tied": (torchrun(2), ("model.tie_embeddings=true", "parallel.pp=2")),
    # srun on two slurmd nodes (n1, n2): the rendezvous crosses "nodes" through MASTER_ADDR=n1
    "dp2-2nodes": (srun(2, nodes=2), ("train.micro_batch_size=2",)),
    # two containers' entrypoints (deepspeed --no_ssh --node_rank 0/1), without the containers
    "dp2-docker-nodes": (["bash", str(Path(__file__).parent / "two_nodes.sh"), PORT],
                         ("train.micro_batch_size=2",)),
}
# The baseline zoo on the machine, each against one process of its own: a per-channel gain (LayerScale, here
# on DyT's element-wise tanh in place of the norms), a layout that changes with the global block index inside
# stage 1 (Mix-LN, Post-LN in blocks 1-4), HybridNorm's norms across the tp ranks, and depth-µP's parameter
# groups (the blocks' learning rate and eps rescaled) under ZeRO-1 over dp=2.
ZOO = {
    # DyT does not normalise: at width 64 with std 0.02 its MLP gains get gradients ~6e-8, and lr·g is below
    # half an fp32 ulp of 1, so they would never move and nothing would be compared. With the fan-in std
    # 1/√64 every gain moves by ≥ 5e-4 (~10⁴ ulps) in the 10 steps.
    "layerscale": (("model.norm_layout=layerscale", "model.layerscale_init=0.1", "model.norm=dyt",
                    "model.init_std=0.125"), [("tp2pp2", torchrun(4))]),
    "mixln": (("model.norm_layout=mixln", "model.mixln_ratio=0.67"), [("tp2pp2", torchrun(4))]),
    "depthmup": (("model.depth_mup_alpha=1.0", "model.depth_mup_base=2"), [("dp2", torchrun(2))]),
    # HybridNorm's Q, K, V norms span the projection, whose heads tp splits: mean and variance summed over tp
    "hybridnorm": (("model.norm_layout=hybridnorm", "model.norm=layernorm"), [("tp2pp2", torchrun(4))]),
}
for method, (overrides, layouts) in ZOO.items():
    LAYOUTS[f"1x1x1-{method}"] = (None, overrides)
    for name, launcher in layouts:
        LAYOUTS[f"{name}-{method}"] = (launcher, overrides + LAYOUTS[name][1])
RECOMPUTED = {"tp2pp2-recompute": "tp2pp2"}
BASELINE = {name: {"pp2-tied": "1x1x1-tied", "tp2pp2-block": "1x1x1-block"}
            .get(name, "1x1x1") for name in LAYOUTS}
BASELINE |= {f"{name}-{method}": f"1x1x1-{method}" for method, (_, layouts) in ZOO.items() for name, _ in layouts}


def scalars_by_file(run_dir):
    out = {}
    for path in sorted(glob.glob(str(run_dir / "events.out.tfevents.*"))):
        acc = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        out[path] = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    return out


def train_every_layout(tmp_path_factory, label: str, extra=(), timeout=900, names=tuple(LAYOUTS)) -> dict:
    """name: (run directory, launcher, finished process) for COMMON + the layout's overrides + ``extra``;
    None for a Slurm layout where no Slurm answers."""
    have_slurm = slurm_available()
    out = {}
    for name in names:
        launcher, overrides = LAYOUTS[name]
        if launcher and launcher[0] == "srun" and not have_slurm:
            out[name] = None
            continue
        run_dir = tmp_path_factory.mktemp(label + name)
        out[name] = (run_dir, launcher, run_cli(*train_args(run_dir, COMMON + overrides + extra), launcher=launcher,
                                                timeout=timeout))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    results = {}
    for name, done in train_every_layout(tmp_path_factory, "").items():
        if done is None:
            results[name] = None
            continue
        run_dir, _, proc = done
        assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        per_file = scalars_by_file(run_dir)
        merged = {tag: values for f in per_file.values() for tag, values in f.items()}
        results[name] = {"dir": run_dir, "files": per_file, "scalars": merged,
                         "overrides": COMMON + LAYOUTS[name][1], "stdout": proc.stdout}
    return results


def first_divergence(got: dict, want: dict, rtol: float):
    assert sorted(got) == sorted(want), f"logged steps differ: {sorted(got)} vs {sorted(want)}"
    for step in sorted(want):
        if not math.isclose(got[step], want[step], rel_tol=rtol, abs_tol=0.0):
            return step, got[step], want[step]
    return None


@pytest.mark.parametrize("name", [n for n in LAYOUTS if not n.startswith("1x1x1")])
@pytest.mark.parametrize("tag", ["train/loss", "train/grad_norm", "valid/loss", "eval/fixture/loss"])
def test_same_curve_as_one_process(runs, name, tag):
    need(runs[name] is not None, NO_SLURM)
    got, want = runs[name]["scalars"][tag], runs[BASELINE[name]]["scalars"][tag]
    assert len(want) >= (STEPS if tag.startswith("train") else 2)
    bad = first_divergence(got, want, RTOL)
    assert bad is None, (f"{name} {tag} first diverges at step {bad[0]}: {bad[1]!r} vs one process"
                         f" {bad[2]!r} (rel {abs(bad[1] - bad[2]) / abs(bad[2]):.2e} > {RTOL})")


LAYER_FAMILIES = ["prores/alpha", "layers/act_rms", "layers/cos_in_out", "layers/grad_norm", "layers/update_ratio"]


@pytest.mark.parametrize("name", list(RECOMPUTED))
def test_recompute_changes_no_number(runs, name):
    """Bit for bit: losses, norms and every per-layer statistic (a recomputed forward is not counted)."""
    got, want = runs[name]["scalars"], runs[RECOMPUTED[name]]["scalars"]
    tags = sorted(t for t in want if t != "train/tokens_per_sec")
    assert sorted(t for t in got if t != "train/tokens_per_sec") == tags
    for tag in tags:
        assert got[tag] == want[tag], f"{name} {tag}: {got[tag]} vs {want[tag]} without recompute"


def test_the_runs_pass_the_warmup_into_the_saturated_path(runs):
    cfg = load_config(None, COMMON)
    assert cfg.prores.T * cfg.model.num_layers == SATURATED_FROM < STEPS
    alpha = runs["1x1x1"]["scalars"]["prores/alpha/layer_006"]
    assert alpha[SATURATED_FROM - 1] < 1.0 and all(alpha[s] == 1.0 for s in range(SATURATED_FROM, STEPS))


@pytest.mark.parametrize("name", [n for n in LAYOUTS if not n.startswith("1x1x1")])
@pytest.mark.parametrize("family", LAYER_FAMILIES)
def test_per_layer_diagnostics_as_one_process(runs, name, family):
    """Each value written once, by the rank owning the layer, equal to the one-process value."""
    need(runs[name] is not None, NO_SLURM)
    got, want = runs[name], runs[BASELINE[name]]
    tags = sorted(t for t in want["scalars"] if t.startswith(family + "/"))
    assert tags and sorted(t for t in got["scalars"] if t.startswith(family + "/")) == tags
    for tag in tags:
        assert sum(tag in f for f in got["files"].values()) == 1, f"{tag} written by more than one rank"
        bad = first_divergence(got["scalars"][tag], want["scalars"][tag], RTOL)
        assert bad is None, f"{name} {tag} at step {bad[0]}: {bad[1]!r} vs one process {bad[2]!r}"


def test_layerscale_gains_are_logged_as_one_process(runs):
    """layers/gain: each block's mean |λ|, written once by the stage that owns the block."""
    got, want = runs["tp2pp2-layerscale"], runs["1x1x1-layerscale"]
    tags = sorted(t for t in want["scalars"] if t.startswith("layers/gain/"))
    assert len(tags) == 6 and sorted(t for t in got["scalars"] if t.startswith("layers/gain/")) == tags
    for tag in tags:
        assert sum(tag in f for f in got["files"].values()) == 1
        assert first_divergence(got["scalars"][tag], want["scalars"][tag], RTOL) is None, tag


@pytest.mark.parametrize("name", [n for n in LAYOUTS if not n.startswith("1x1x1")])
def test_piece_gradient_norms_add_up_to_the_global_norm(runs, name):
    need(runs[name] is not None, NO_SLURM)
    scalars = runs[name]["scalars"]
    pieces = [t for t in scalars if t.startswith("layers/grad_norm/")]
    for step in scalars[pieces[0]]:
        total = sum(scalars[t][step] ** 2 for t in pieces)
        assert math.isclose(total, scalars["train/grad_norm"][step] ** 2, rel_tol=2 * RTOL), (name, step)


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    """Every layout with a learning rate that overflows the weights: step 1's gradients are not finite."""
    # timeout: a rank that disagreed would hang in a collective
    done = train_every_layout(tmp_path_factory, "diverge-", ("optim.lr=1e30", "train.steps=4"), timeout=300,
                              names=DIVERGING)
    return {name: None if d is None else {"dir": d[0], "launcher": d[1], "proc": d[2],
                                          "summary": json.loads((d[0] / "summary.json").read_text())}
            for name, d in done.items()}


# Each launcher (one process, torchrun, the deepspeed launcher on one and two nodes, srun over two nodes) and
# each way a step's stop is reached: tp × pp under ZeRO-1 and ZeRO-0 (prores's clipping), four micro-batches in
# 1F1B, a tied embedding whose gradient crosses the stages before the stop is decided, dp. Recompute acts inside
# the backward pass and changes no number (RECOMPUTED); the zoo's methods, the kernel backend, the stages'
# sizes change no launcher or stop path.
DIVERGING = ["1x1x1", "tp2pp2", "tp2pp2-zero0", "pp2-accum4", "pp2-tied", "dp2-2nodes", "dp2-docker-nodes"]


@pytest.mark.parametrize("name", DIVERGING)
def test_a_diverging_run_stops_on_every_rank_at_the_same_step(diverged, name):
    need(diverged[name] is not None, NO_SLURM)
    run, one = diverged[name], diverged["1x1x1"]
    proc = run["proc"]
    launcher = run["launcher"][0] if run["launcher"] else None
    if launcher == "torchrun":  # the workers end their agent instead of letting it print a traceback (the cli)
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    elif launcher == "srun":  # --kill-on-bad-exit: ranks still exiting when the first exits with 3 get SIGTERM
        assert proc.returncode != 0 and "Exited with exit code 3" in proc.stderr, proc.stderr[-3000:]
    else:
        assert proc.returncode == 3, proc.stderr[-3000:]
    assert run["summary"]["status"] == "diverged"
    assert run["summary"]["diverged_at"] == one["summary"]["diverged_at"] == 1
    assert (proc.stdout + proc.stderr).count("diverged at step 1: loss") == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (run["dir"] / "checkpoints").exists() or not any((run["dir"] / "checkpoints").glob("global_step*"))


@pytest.mark.parametrize("name", ["1x1x1", "tp2pp2", "pp2-tied"])
def test_analyze_reads_the_checkpoints_of_any_layout(runs, name, world_of_one):
    """`prores analyze` on TP shards, pipeline stages and tied weights: the one-process table, whose last
    row (the final checkpoint against itself) is 1. Within 1e-4: the weights agree to 1e-4 of an update."""
    out = analyze(runs[name]["dir"])
    rows = list(csv.reader(open(out / "cosine.csv")))
    want = list(csv.reader(open(analyze(runs[BASELINE[name]]["dir"]) / "cosine.csv")))
    assert rows[0] == ["step"] + [f"layer_{l:03d}" for l in range(1, 7)] and [r[0] for r in rows[1:]] == ["5", "10"]
    assert all(float(v) == 1.0 for v in rows[-1][1:]) and all(-1 <= float(v) < 1 for v in rows[1][1:])
    assert all(math.isclose(float(a), float(b), abs_tol=1e-4) for r, w in zip(rows[1:], want[1:]) for a, b in zip(r, w))
    assert Image.open(out / "cosine.png").size == (700, 450)
    acc = event_accumulator.EventAccumulator(str(out), size_guidance={event_accumulator.IMAGES: 0})
    acc.Reload()
    assert [i.step for i in acc.Images("analysis/cosine")] == [STEPS]


@pytest.mark.parametrize("name", [n for n in LAYOUTS if not n.startswith("1x1x1")])
def test_final_weights_match_after_gathering(runs, name, world_of_one):
    need(runs[name] is not None, NO_SLURM)
    cfg = load_config(None, runs[name]["overrides"])
    m = cfg.model
    specs = gpt_pieces(m, ProRes(cfg.prores.schedule, cfg.prores.T, m.num_layers), 258, cfg.train.seed)
    pieces = [p.cls(**p.kwargs) for p in specs]
    initial = {f"{i:02d}/{n}": p.detach() for i, piece in enumerate(pieces) for n, p in piece.named_parameters()}
    tag = f"checkpoints/global_step{STEPS}"
    got = consolidated_weights(runs[name]["dir"] / tag, pieces)
    want = consolidated_weights(runs[BASELINE[name]]["dir"] / tag, pieces)
    tied_again = [i for i, p in enumerate(specs) if p.tie_key and any(q.tie_key == p.tie_key for q in specs[:i])]
    expected = sum(len(list(p.parameters())) for i, p in enumerate(pieces) if i not in tied_again)
    assert got.keys() == want.keys() and len(got) == expected  # a tied weight is saved once
    worst = 0.0
    for key in want:
        update = (want[key] - initial[key]).abs().max().item()
        assert update > 0, f"{key} was never updated"
        err = (got[key] - want[key]).abs().max().item() / update
        rounding = STEPS * ULP * want[key].abs().max().item() / update
        assert err <= WEIGHT_TOL + rounding, (f"{name} {key}: max|w - w_ref| is {err:.3e} of the largest update,"
                                              f" above {WEIGHT_TOL:g} + {rounding:.1e} (the weights' own rounding)")
        worst = max(worst, err)
    print(f"{name}: worst weight difference {worst:.2e} of the update")


def test_raw_text_is_preprocessed_once_by_rank_0(runs):
    """4 ranks share one run directory: the corpus and the eval file are each tokenized once."""
    lines = [l for l in runs["tp2pp2"]["stdout"].splitlines() if "prores preprocess:" in l]
    assert len(lines) == 2, lines
    assert sum("/cache/text/shakespeare-" in l for l in lines) == 1
    assert sum("/cache/text/tiny_corpus-" in l for l in lines) == 1


def test_alpha_written_once_per_layer_by_the_owning_stage(runs):
    """pp=2 with 2+4 blocks: stage 0 writes layers 1-2, stage 1 layers 3-6 (and the loss); no overlap."""
    run = runs["pp2-uneven"]
    files = list(run["files"].values())
    assert len(files) == 2
    owned = [sorted(int(t[-3:]) for t in f if t.startswith("prores/alpha/")) for f in files]
    assert sorted(owned) == [[1, 2], [3, 4, 5, 6]]
    stats = [sorted(int(t[-3:]) for t in f if t.startswith("layers/act_rms/")) for f in files]
    assert sorted(stats) == [[1, 2], [3, 4, 5, 6]]
    loss_writers = [f for f in files if "train/loss" in f]
    assert len(loss_writers) == 1 and "prores/alpha/layer_006" in loss_writers[0]
    cfg = load_config(None, run["overrides"])
    prores = ProRes(cfg.prores.schedule, cfg.prores.T, cfg.model.num_layers)
    for l in range(1, 7):
        logged = run["scalars"][f"prores/alpha/layer_{l:03d}"]
        assert sorted(logged) == list(range(STEPS))
        assert all(v == pytest.approx(prores.alpha(l, s), abs=1e-7) for s, v in logged.items())


@pytest.mark.parametrize("launcher,overrides,message", [
    (torchrun(2), ("parallel.pp=3", "model.num_layers=6"),
     "world size 2 is not divisible by parallel.tp × parallel.pp = 1 × 3"),
    (None, ("parallel.tp=3",), "parallel.tp=3 does not divide model.num_heads=4"),
    (None, ("parallel.pp=13",), "parallel.pp=13 exceeds model.num_layers=12"),
    (None, ("parallel.pp=2", "parallel.stage_layers=[5, 6]"),
     "parallel.stage_layers=[5, 6]: give 2 positive block counts"),
])
def test_bad_layouts_fail_once_and_clearly(tmp_path, launcher, overrides, message):
    proc = run_cli(*train_args(tmp_path, overrides), launcher=launcher, timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.count(message) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]


# bf16 carries 8 significant bits, u = 2^-9. The layouts round in different places (tensor-parallel
# partial sums and their all-reduce are rounded to bf16; one process rounds the whole sum once). The
# losses are fp32 means over 128 tokens of an fp32 cross-entropy on bf16 logits: allowed 2u = 2^-8.
# A gradient element passes through up to two extra roundings per block on its way back through 6
# blocks: the grad norm is allowed 16u = 2^-5. (Measured: 8e-5 and 1e-3.)
U_BF16 = 2.0**-9
BF16_LOSS_RTOL, BF16_GRAD_RTOL = 2 * U_BF16, 16 * U_BF16
# The per-layer families, as functions of the same roundings:
# * act_rms/layer_l: block l's output has passed l blocks, each adding at most two roundings (attention and
#   MLP branch) in a different place, so it is off by <= 2·l·u relative, and its RMS by as much: <= 12u for
#   the 6 blocks; allowed 16u, the grad norms' bound.
# * cos_in_out/layer_l: a cosine of two vectors each off by <= 16u relative moves by <= 2·16u absolute.
# * grad_norm/<piece>: a piece's share of the global norm, with its bound (16u relative).
# * update_ratio/layer_l = ||Δw|| / ||w|| of the stored bf16 weights, rounded from fp32 masters: each of w
#   before and after is off its master by <= u|w|, so ||Δw|| by <= 2u·||w||, the ratio by <= 2u absolute on
#   each layout, 4u between two; on top of the masters' own difference, which follows the gradients (Adam
#   with eps = 1: the update is lr/eps times an average of gradients), 16u relative.
# * prores/alpha: the schedule, the same numbers on every layout: exactly equal.
BF16_FAMILY_BOUNDS = {  # family: (relative, absolute) allowed difference
    "layers/act_rms": (16 * U_BF16, 0.0),
    "layers/cos_in_out": (0.0, 32 * U_BF16),
    "layers/grad_norm": (16 * U_BF16, 0.0),
    "layers/update_ratio": (16 * U_BF16, 4 * U_BF16),
    "prores/alpha": (0.0, 0.0),
}
BF16 = ("train.precision=bf16", "model.fp32_residual=false")
BF16_LAYOUTS = {  # name: (launcher, overrides, the one-process run it is compared with)
    "1x1x1-bf16": (None, BF16, None),
    "tp2pp2-bf16": (torchrun(4), BF16 + ("parallel.tp=2", "parallel.pp=2"), "1x1x1-bf16"),
    "dp2-bf16": (torchrun(2), BF16 + ("train.micro_batch_size=2",), "1x1x1-bf16"),  # same global batch of 4
    "1x1x1-bf16-fp32res": (None, ("train.precision=bf16", "model.fp32_residual=true"), None),
    "pp2-bf16-fp32res": (torchrun(2), ("train.precision=bf16", "model.fp32_residual=true", "parallel.pp=2"),
                         "1x1x1-bf16-fp32res"),
}


@pytest.fixture(scope="module")
def bf16_runs(tmp_path_factory):
    out = {}
    for name, (launcher, overrides, _) in BF16_LAYOUTS.items():
        run_dir = tmp_path_factory.mktemp(name)
        proc = run_cli(*train_args(run_dir, COMMON + overrides), launcher=launcher, timeout=900)
        assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        files = scalars_by_file(run_dir)
        out[name] = {"files": files, "scalars": {tag: v for f in files.values() for tag, v in f.items()}}
    return out


BF16_COMPARED = [n for n, (_, _, one) in BF16_LAYOUTS.items() if one]


@pytest.mark.parametrize("name", BF16_COMPARED)
def test_bf16_layouts_train_like_one_bf16_process(bf16_runs, name):
    got, want = bf16_runs[name]["scalars"], bf16_runs[BF16_LAYOUTS[name][2]]["scalars"]
    for tag, rtol in (("train/loss", BF16_LOSS_RTOL), ("valid/loss", BF16_LOSS_RTOL),
                      ("train/grad_norm", BF16_GRAD_RTOL)):
        bad = first_divergence(got[tag], want[tag], rtol)
        assert bad is None, f"{name} {tag} at step {bad[0]}: {bad[1]!r} vs one bf16 process {bad[2]!r} (rtol {rtol:g})"


@pytest.mark.parametrize("name", BF16_COMPARED)
@pytest.mark.parametrize("family", list(BF16_FAMILY_BOUNDS))
def test_bf16_per_layer_diagnostics_as_one_bf16_process(bf16_runs, name, family):
    """Each value written once, by the rank owning the layer, within the family's bf16 bound."""
    got, want = bf16_runs[name], bf16_runs[BF16_LAYOUTS[name][2]]
    rtol, atol = BF16_FAMILY_BOUNDS[family]
    tags = sorted(t for t in want["scalars"] if t.startswith(family + "/"))
    assert tags and sorted(t for t in got["scalars"] if t.startswith(family + "/")) == tags
    for tag in tags:
        assert sum(tag in f for f in got["files"].values()) == 1, f"{tag} written by more than one rank"
        assert sorted(got["scalars"][tag]) == sorted(want["scalars"][tag])
        for step, value in want["scalars"][tag].items():
            assert math.isclose(got["scalars"][tag][step], value, rel_tol=rtol, abs_tol=atol), (
                f"{name} {tag} at step {step}: {got['scalars'][tag][step]!r} vs one bf16 process {value!r}"
                f" (rtol {rtol:g}, atol {atol:g})")


def test_the_fp32_residual_stream_crosses_pipeline_stages_in_fp32(bf16_runs):
    """pp=2 changes no arithmetic of the forward pass, so with the stream sent between stages in fp32 the
    first step's loss, computed from the same initial weights, is the one-process loss bit for bit (sent in
    bf16, stage 1 would start from a rounded stream), and so is every gradient element. Their global norm
    is a sum of the stages' sums of squares, in another order: torch sums pairwise, within log2(n)·u of
    the exact sum (n ~ 1e5 elements: 17·2^-24 = 1e-6). Later steps differ in the last bits: clipping
    divides by that norm, and an update a hair apart can round a bf16 weight to the next value;
    test_bf16_layouts_train_like_one_bf16_process bounds those steps."""
    got, want = bf16_runs["pp2-bf16-fp32res"]["scalars"], bf16_runs["1x1x1-bf16-fp32res"]["scalars"]
    assert got["train/loss"][0] == want["train/loss"][0]
    assert math.isclose(got["train/grad_norm"][0], want["train/grad_norm"][0], rel_tol=1e-6)


DEEP = ("model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_heads=4", "model.seq_length=32",
        "train.precision=fp32", "train.micro_batch_size=2", "train.grad_accum=2", "train.steps=3",
        "train.log_interval=1", "train.eval_interval=3", "data.eval_samples=4", "optim.warmup_steps=1",
        "logging.stats_interval=1", "checkpoint.interval=0", "logging.progress_bar=false", "kernels.backend=eager")


def test_120_blocks_over_4_stages_with_recompute_train_like_one_process(tmp_path):
    """configs/depth/120.yaml at a CPU width: pp=4 (30 blocks a stage) with every block recomputed, under
    torchrun, against one process without recompute."""
    runs = {}
    for name, launcher, extra in (("pp4", torchrun(4), ("parallel.pp=4", "model.recompute=block")),
                                  ("pp1", None, ())):
        args = ["train", "depth/120.yaml", "--run-dir", str(tmp_path / name)]
        for o in DEEP + extra:
            args += ["--set", o]
        proc = run_cli(*args, launcher=launcher, timeout=900)
        assert proc.returncode == 0, f"{name}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        merged = {}
        for f in scalars_by_file(tmp_path / name).values():
            merged.update(f)
        runs[name] = merged
    for tag in ("train/loss", "train/grad_norm", "valid/loss", "layers/act_rms/layer_120"):
        bad = first_divergence(runs["pp4"][tag], runs["pp1"][tag], RTOL)
        assert bad is None, f"{tag} at step {bad[0]}: {bad[1]!r} vs one process {bad[2]!r}"


def test_recompute_replays_dropout(tmp_path):
    """With dropout, a recomputed block must draw the masks of its first forward again (DeepSpeed restores
    the RNG states it saved): the same losses, bit for bit, as without recompute."""
    losses = {}
    for recompute in ("none", "block"):
        run_dir = tmp_path / recompute
        proc = run_cli(*train_args(run_dir, COMMON + ("model.dropout=0.1", f"model.recompute={recompute}",
                                                      "train.steps=4", "checkpoint.interval=0")), timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        losses[recompute] = {t: v for f in scalars_by_file(run_dir).values() for t, v in f.items()}["train/loss"]
    assert losses["block"] == losses["none"]
