"""End to end: `prores train` on the packaged tiny config, read back from TensorBoard.

One real run (through the console script, DeepSpeed's pipeline engine and
ZeRO-1) is checked against (a) a plain-PyTorch reference of the first steps
built here from the same pieces, and (b) the learning goal: validation loss
well below the unigram-entropy baseline.
"""

import ast
import io
import json
import subprocess
import sys

import pytest
import torch
import yaml
from PIL import Image
from tensorboard.backend.event_processing import event_accumulator, event_file_loader
from tensorboard.plugins.custom_scalar import layout_pb2

from conftest import child_env, run_cli, train_args
from prores.config import load_config
from prores.data.tokenizers import ByteTokenizer
from prores.run.lr import LR_SCHEDULES
from prores.launcher.builders import build_data
from prores.model.block import Block
from prores.model.gpt import gpt_pieces, lm_loss
from prores.model.prores import ProRes

pytestmark = pytest.mark.slow

STEPS = 120
STATS = 2  # logging.stats_interval
OVERRIDES = (f"train.steps={STEPS}", "train.eval_interval=60", "train.log_interval=1",
             f"logging.stats_interval={STATS}", "logging.progress_bar=false")
LEARNING_MARGIN = 0.8  # nats/token below the unigram entropy after 120 steps (measured: ~1.0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tiny")
    proc = run_cli(*train_args(run_dir, OVERRIDES))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    scalars = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    return run_dir, scalars, proc.stdout


def test_validation_loss_beats_unigram_baseline(run):
    run_dir, scalars, stdout = run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS
    assert summary["final_valid_loss"] == pytest.approx(scalars["valid/loss"][STEPS], rel=1e-6)
    assert summary["final_valid_loss"] < summary["unigram_entropy"] - LEARNING_MARGIN
    assert f"vs unigram entropy {summary['unigram_entropy']:.4f}" in stdout
    assert scalars["valid/ppl"][STEPS] == pytest.approx(2.718281828 ** scalars["valid/loss"][STEPS], rel=1e-5)
    assert sorted(scalars["valid/loss"]) == [60, 120]


def test_tensorboard_tags_cover_every_layer(run):
    _, scalars, _ = run
    L = load_config().model.num_layers
    layers = [f"layer_{l:03d}" for l in range(1, L + 1)]
    expected = {f"train/{t}" for t in ("loss", "lr", "grad_norm", "tokens_per_sec", "samples", "loss_spike_score",
                                       "grad_norm_spike_score", "skipped_steps")} | {"valid/loss", "valid/ppl"}
    expected |= {f"prores/alpha/{x}" for x in layers}
    expected |= {f"layers/{family}/{x}" for family in ("act_rms", "cos_in_out", "grad_norm", "update_ratio")
                 for x in layers}
    expected |= {"layers/grad_norm/embedding", "layers/grad_norm/final_norm", "layers/grad_norm/head"}
    assert set(scalars) == expected
    assert sorted(scalars["train/loss"]) == list(range(STEPS))
    micro = load_config(None, OVERRIDES).train.micro_batch_size
    assert scalars["train/samples"] == {t: (t + 1) * micro for t in range(STEPS)}  # after the update at t
    for family in ("act_rms", "cos_in_out", "grad_norm", "update_ratio"):
        assert sorted(scalars[f"layers/{family}/layer_001"]) == list(range(0, STEPS, STATS))


def test_block_gradient_norms_add_up_to_the_global_norm(run):
    _, scalars, _ = run
    pieces = [t for t in scalars if t.startswith("layers/grad_norm/")]
    for step in range(0, STEPS, STATS):
        total = sum(scalars[t][step] ** 2 for t in pieces)
        assert total == pytest.approx(scalars["train/grad_norm"][step] ** 2, rel=1e-5), step


def test_heatmaps_and_the_custom_scalars_layout_are_in_the_run(run):
    run_dir, _, _ = run
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.IMAGES: 0})
    acc.Reload()
    assert sorted(acc.Tags()["images"]) == ["heatmaps/act_rms", "heatmaps/alpha", "heatmaps/grad_norm"]
    for tag in acc.Tags()["images"]:
        images = acc.Images(tag)
        # the painter rests between pictures: a tag's picture of step 60 may be overtaken by step 120's
        assert [i.step for i in images] in ([60, 120], [120])
        picture = Image.open(io.BytesIO(images[-1].encoded_image_string))
        assert picture.format == "PNG" and picture.size == (images[-1].width, images[-1].height) == (700, 450)
    # the first picture of the first evaluation is drawn at once, and the last evaluation's always
    assert any([i.step for i in acc.Images(t)] == [60, 120] for t in acc.Tags()["images"])
    events = [e for path in run_dir.glob("events.out.tfevents.*")
              for e in event_file_loader.EventFileLoader(str(path)).Load()]
    layouts = [v for e in events for v in e.summary.value if v.tag == "custom_scalars__config__"]
    assert len(layouts) == 1  # once per run
    layout = layout_pb2.Layout.FromString(layouts[0].tensor.string_val[0])
    charts = {c.title: list(c.multiline.tag) for category in layout.category for c in category.chart}
    assert charts == {f: [f"^{f}/.*"] for f in ("prores/alpha", "layers/act_rms", "layers/cos_in_out",
                                                "layers/grad_norm", "layers/update_ratio")}


def test_summary_has_the_status_and_the_spikes_the_scores_count(run):
    run_dir, scalars, _ = run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["diverged_at"] is None
    for tag in ("train/loss", "train/grad_norm"):
        spikes = summary["spikes"][tag]
        assert spikes["count"] == len(spikes["steps"]) and all(0 <= s < STEPS for s in spikes["steps"])
        assert scalars[f"{tag}_spike_score"][STEPS - 1] == pytest.approx(spikes["count"] / STEPS)
        assert spikes["score"] == pytest.approx(spikes["count"] / STEPS)


def test_logged_alpha_is_the_schedule_at_the_logged_step(run):
    _, scalars, _ = run
    cfg = load_config(None, OVERRIDES)
    prores = ProRes(cfg.prores.schedule, cfg.prores.T, cfg.model.num_layers)
    for l in range(1, cfg.model.num_layers + 1):
        logged = scalars[f"prores/alpha/layer_{l:03d}"]
        assert sorted(logged) == list(range(STEPS))
        for step, value in logged.items():
            assert value == pytest.approx(prores.alpha(l, step), abs=1e-7), (l, step)


def test_act_rms_at_step_0_is_the_embedding_for_every_layer(run):
    """At t=0 every alpha is 0, so each pre-LN block passes the embedding through unchanged."""
    _, scalars, _ = run
    rms0 = [scalars[f"layers/act_rms/layer_{l:03d}"][0] for l in range(1, 13)]
    assert max(rms0) == pytest.approx(min(rms0), rel=1e-6)
    assert rms0[0] == pytest.approx(0.02, rel=0.05)  # the embedding std


def test_resolved_config_is_written(run):
    """What ran: the config with ``train.precision=auto`` made concrete (fp32 on a CPU), said at start-up."""
    run_dir, _, stdout = run
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    asked = load_config(None, OVERRIDES).to_dict()
    assert asked["train"]["precision"] == "auto"
    asked["train"]["precision"] = "fp32"
    assert written == asked
    assert "train.precision=auto: using fp32 (on CPU)" in stdout.splitlines()
    setup = next(line for line in stdout.splitlines() if line.startswith("setup: "))  # the defaults, said
    cfg = load_config(None, OVERRIDES)
    assert setup.startswith(f"setup: token embedding init std {cfg.model.init_std:g} (model.embedding_init=matrix);")
    assert setup.endswith(f"the first update at {1 / cfg.optim.warmup_steps:.4g}·lr (optim.lr_convention=prores)")
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"global_step{STEPS}"


def test_first_steps_match_a_plain_pytorch_reference(run, world_of_one):
    """Same pieces, same data, torch AdamW + clip_grad_norm_: loss, pre-clip grad norm and lr per step,
    and, at the stats steps, every per-layer diagnostic computed here from its definition."""
    run_dir, scalars, _ = run
    cfg = load_config(None, OVERRIDES)
    tok = ByteTokenizer()
    data = build_data(cfg, run_dir, tok).train  # the run's own cached dataset
    prores = ProRes(cfg.prores.schedule, cfg.prores.T, cfg.model.num_layers)
    modules = [p.cls(**p.kwargs) for p in gpt_pieces(cfg.model, prores, tok.vocab_size, cfg.train.seed)]
    names = ["embedding"] + [f"layer_{l:03d}" for l in range(1, cfg.model.num_layers + 1)] + ["final_norm", "head"]
    params = [p for m in modules for p in m.parameters()]
    o = cfg.optim
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=o.lr, betas=tuple(o.betas), eps=o.eps)

    def norm(tensors):
        return torch.sqrt(sum(t.double().square().sum() for t in tensors)).item()

    for step in range(4):
        lr = o.lr * LR_SCHEDULES[o.lr_schedule](step, cfg.train.steps, o.warmup_steps, o.min_lr_ratio,
                                                  o.decay_fraction)
        for group in opt.param_groups:
            group["lr"] = lr
        for m in modules:
            if isinstance(m, Block):
                m.set_step(step)
        tokens, labels = next(data)
        h, streams = tokens, []
        for m in modules:
            h = m(h)
            streams.append(h.detach())
        loss = lm_loss(h, labels)
        opt.zero_grad()
        loss.backward()
        grad_norms = {n: norm(p.grad for p in m.parameters()) for n, m in zip(names, modules)}
        before = [[p.detach().clone() for p in m.parameters()] for m in modules]
        total = torch.nn.utils.clip_grad_norm_(params, o.clip_grad)
        opt.step()
        assert scalars["train/loss"][step] == pytest.approx(loss.item(), rel=1e-5), step
        assert scalars["train/grad_norm"][step] == pytest.approx(total.item(), rel=1e-4), step
        assert scalars["train/lr"][step] == pytest.approx(lr, rel=1e-6), step
        if step % STATS:
            continue
        for n, g in grad_norms.items():
            assert scalars[f"layers/grad_norm/{n}"][step] == pytest.approx(g, rel=1e-4, abs=1e-12), (n, step)
        for l in range(1, cfg.model.num_layers + 1):
            x, y = streams[l - 1], streams[l]  # the block's input and output residual stream [s, b, h]
            tag = f"layer_{l:03d}"
            cos = (x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1))
            delta = norm(p.detach() - old for p, old in zip(modules[l].parameters(), before[l]))
            assert scalars[f"layers/act_rms/{tag}"][step] == pytest.approx(y.square().mean().sqrt().item(), rel=1e-5)
            assert scalars[f"layers/cos_in_out/{tag}"][step] == pytest.approx(cos.mean().item(), rel=1e-5)
            assert scalars[f"layers/update_ratio/{tag}"][step] == pytest.approx(
                delta / norm(modules[l].parameters()), rel=1e-4), (tag, step)


def test_no_resume_never_overwrites_an_existing_run(run):
    run_dir, _, _ = run
    before = sorted(p.name for p in run_dir.rglob("*"))
    proc = run_cli("train", "--run-dir", str(run_dir), "--no-resume", timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"run directory '{run_dir}' already has checkpoints" in proc.stderr
    assert sorted(p.name for p in run_dir.rglob("*")) == before


def test_a_gelu_mlp_with_learned_positions_trains(tmp_path):
    """The MLP and position choices the paper does not use, built and trained: the validation loss is
    more than a nat below the uniform guess over the 258 byte-tokenizer symbols (ln 258 = 5.55) by step
    30 and still falling at 60 (measured: 3.06 and 2.73)."""
    proc = run_cli(*train_args(tmp_path, ("model.mlp=gelu", "model.position=learned", "model.num_layers=4",
                                          "train.steps=60", "train.eval_interval=30", "train.log_interval=10",
                                          "optim.lr=3e-3", "optim.warmup_steps=10", "prores.T=5",
                                          "kernels.backend=eager", "logging.progress_bar=false")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    acc = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    valid = {e.step: e.value for e in acc.Scalars("valid/loss")}
    assert sorted(valid) == [30, 60] and valid[60] < valid[30] < 5.55 - 1.0, valid
    cfg = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert cfg["model"]["mlp"] == "gelu" and cfg["model"]["position"] == "learned"


TINY_TRAINER = """
import sys, tempfile
from pathlib import Path
import prores.launcher.builders as builders
if sys.argv[1] == "deepspeed-defaults":
    builders.one_replica = lambda dp: False
from prores.config import load_config
from prores.launcher.train import Trainer
cfg = load_config(None, ("logging.progress_bar=false", "train.steps=100", "train.eval_interval=100",
                         "model.num_layers=3", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_heads=2",
                         "model.seq_length=32", "train.micro_batch_size=2", "kernels.backend=eager",
                         "prores.schedule=linear", "prores.T=1", "optim.clip_grad=0.05", *sys.argv[2:]))
trainer = Trainer(cfg, Path(tempfile.mkdtemp()))
trainer.call("on_start")
"""
ZERO_BITS = TINY_TRAINER + """
print(" ".join(trainer.step_once()["train/loss"].hex() for _ in range(6)))
"""
WITHOUT_MONITORS = TINY_TRAINER + """
from prores.monitor.registry import without_monitors
def seen():
    return [type(c).__name__ for c in trainer.callbacks], [len(b._forward_hooks) for b in trainer.blocks.values()]
before = seen()
with without_monitors(trainer):
    trainer.step_once()
    print(seen())
print(seen() == before, before)
"""


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_one_replica_zero_shortcuts_change_no_bit(precision):
    """With one data-parallel replica prores drops ZeRO-1's bookkeeping for a reduction (builders.one_replica:
    ONE_REPLICA_ZERO and its own ReduceGrads): six steps, clipped at every one, give the losses of DeepSpeed's
    defaults and its own ReduceGrads bit for bit."""
    losses = [subprocess.run([sys.executable, "-c", ZERO_BITS, arm, f"train.precision={precision}"],
                             capture_output=True, text=True, timeout=300, env=child_env(), check=True).stdout.split()[-6:]
              for arm in ("prores", "deepspeed-defaults")]
    assert losses[0] == losses[1] and len(set(losses[0])) == 6


IN_EFFECT = """
import prores.launcher.builders as builders
from deepspeed.runtime.pipe.engine import PipelineEngine
from deepspeed.runtime.pipe.schedule import ReduceGrads
calls, original = [], builders.hand_gradients_to_zero
builders.hand_gradients_to_zero = lambda engine: (calls.append(type(engine.optimizer).__name__), original(engine))
def refuse(self, *args, **kwargs):
    raise AssertionError("DeepSpeed's own ReduceGrads ran")
PipelineEngine._INSTRUCTION_MAP[ReduceGrads] = refuse  # the engine runs its instructions from this map
""" + TINY_TRAINER + """
trainer.step_once()
trainer.step_once()
print(calls)
"""


@pytest.mark.parametrize("zero", [1, 0])
def test_the_one_replica_reduce_grads_is_the_one_that_runs(zero):
    """At dp 1 with ZeRO-1 each step runs prores's ReduceGrads and never DeepSpeed's (which would fail here); without
    ZeRO (another optimizer, with no epilogue to call) DeepSpeed's runs and prores's never."""
    proc = subprocess.run([sys.executable, "-c", IN_EFFECT, "prores", f"parallel.zero_stage={zero}"],
                          capture_output=True, text=True, timeout=300, env=child_env())
    if zero:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split("\n")[-2] == "['DeepSpeedZeroOptimizer', 'DeepSpeedZeroOptimizer']"
    else:
        assert proc.returncode != 0 and "DeepSpeed's own ReduceGrads ran" in proc.stderr


def test_without_monitors_leaves_the_acting_callbacks_and_puts_all_back():
    """The benchmarks' arm without monitors (registry.without_monitors): inside, the callbacks that are not
    MONITORS, in their order, and no diagnostics hook on a block; after, the run's own list and one hook a block."""
    out = subprocess.run([sys.executable, "-c", WITHOUT_MONITORS, "prores"], capture_output=True, text=True,
                         timeout=300, env=child_env(), check=True).stdout.splitlines()
    inside, after = out[-2], out[-1]
    names, hooks = ast.literal_eval(after.split(" ", 1)[1])
    assert after.startswith("True ") and hooks == [1, 1, 1]
    watching = {"LogScalars", "SpikeScores", "LayerDiagnostics", "Heatmaps"}  # registry.MONITORS' classes
    assert watching <= set(names)
    assert ast.literal_eval(inside) == ([n for n in names if n not in watching], [0, 0, 0])
