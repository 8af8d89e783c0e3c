"""A checkpoint resumed on another layout holds, on every rank, exactly the state that was saved: compared
tensor by tensor, not through losses.

A source run trains on one layout (tp, pp, dp) and keeps its step-2 checkpoint; ``state_dump.py`` resumes that
checkpoint on another layout and writes what every rank then holds (DeepSpeed's own view of its ZeRO
partitions). The expected state is cut here, by name, straight from the saved files: each dp rank's
``param_slice_mappings`` (DeepSpeed's address of every parameter's fragment in that rank's partition) over its
fp32 partition and Adam moments, the tp shards glued along Megatron's partition attributes. Nothing of
prores's resharding takes part in the expected side.

The shapes hide nothing: DyT's and ReZero's scalar parameters, odd widths (36 wide, 54 FFN: 27 a tp rank), dp
3 -> 2 and 2 -> 3 (group paddings that are not 0), tp, pp and dp changed at once, tied embeddings, uneven
stages, bf16, dropout on (so the RNG streams matter)."""

import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy
import pytest
import torch

from conftest import child_env, run_cli, torchrun
from prores.model.sharding import unshard

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
STEP = 2  # the checkpoint every resume here starts from (of 4)
BASE = ("model.num_layers=3", "model.hidden_size=36", "model.ffn_hidden_size=54", "model.num_heads=2",
        "model.seq_length=16", "model.dropout=0.1", "train.global_batch_size=12", "train.micro_batch_size=1",
        "train.steps=4", "train.log_interval=1", "train.eval_interval=4", "data.eval_samples=12",
        "checkpoint.interval=2", "checkpoint.keep_last=0", "kernels.backend=eager", "optim.warmup_steps=2",
        "logging.progress_bar=false")
CONFIGS = {"fp32-dyt": BASE + ("model.norm=dyt",),
           "bf16-rezero-tied": BASE + ("model.norm_layout=rezero", "model.rezero_init=0.1", "model.tie_embeddings=true",
                                       "train.precision=bf16", "model.fp32_residual=false")}
# (config, source layout, target layout), layouts as (tp, pp, dp); each kind of change, alone and together
PAIRS = [("fp32-dyt", (1, 1, 3), (1, 1, 2)), ("fp32-dyt", (1, 1, 3), (2, 2, 1)),
         ("fp32-dyt", (1, 1, 2), (1, 1, 3)), ("fp32-dyt", (1, 1, 2), (2, 1, 1)),
         ("fp32-dyt", (2, 1, 2), (1, 1, 2)), ("fp32-dyt", (2, 1, 2), (1, 1, 4)),
         ("bf16-rezero-tied", (1, 2, 2), (2, 1, 1)), ("bf16-rezero-tied", (1, 2, 2), (1, 3, 1))]
STAGES = {2: ("parallel.stage_layers=[2, 1]",), 3: ()}  # pp2 uneven


def layout_args(config: str, layout: tuple) -> tuple[list, tuple]:
    tp, pp, dp = layout
    n = tp * pp * dp
    return (torchrun(n) if n > 1 else None,
            CONFIGS[config] + (f"parallel.tp={tp}", f"parallel.pp={pp}") + STAGES.get(pp, ()))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """One run per (config, source layout), trained once, its checkpoints of steps 2 and 4 kept."""
    made = {}

    def source(config: str, layout: tuple) -> Path:
        if (config, layout) not in made:
            run_dir = tmp_path_factory.mktemp(f"{config}-{'-'.join(map(str, layout))}")
            launcher, overrides = layout_args(config, layout)
            proc = run_cli("train", "--run-dir", str(run_dir), *[a for o in overrides for a in ("--set", o)],
                           launcher=launcher)
            assert proc.returncode == 0, proc.stderr[-3000:]
            made[(config, layout)] = run_dir
        return made[(config, layout)]
    return source


def cut_to(run: Path, step: int) -> None:
    """The run as it was when its step-``step`` checkpoint was its newest (killed before the next)."""
    for tag in (run / "checkpoints").glob("global_step*"):
        if int(tag.name.removeprefix("global_step")) > step:
            shutil.rmtree(tag)
    (run / "checkpoints" / "latest").write_text(f"global_step{step}")
    (run / "summary.json").unlink(missing_ok=True)


def resumed(source: Path, config: str, layout: tuple, tmp: Path) -> tuple[list[dict], str]:
    """Every rank's state right after resuming ``source``'s step-2 checkpoint on ``layout``, in rank order, and
    what the resume said."""
    run = tmp / "run"
    shutil.copytree(source, run)
    cut_to(run, STEP)
    launcher, overrides = layout_args(config, layout)
    command = [*(launcher[:-2] if launcher else [sys.executable]), str(HERE / "state_dump.py"), str(run), str(tmp / "dump"),
               *overrides]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    n = layout[0] * layout[1] * layout[2]
    return [torch.load(tmp / "dump" / f"rank{r}.pt", weights_only=False) for r in range(n)], proc.stdout


def zero_file(tag: Path, dp_rank: int, mp: int) -> Path:
    name = f"zero_pp_rank_{dp_rank}_mp_rank_{mp:02d}_optim_states.pt"
    return tag / name if (tag / name).is_file() else tag / f"bf16_{name}"


def saved_state(tag: Path, layout: tuple, attrs: dict) -> dict:
    """``{name: {"fp32", "exp_avg", "exp_avg_sq": full tensor}}`` from the files of checkpoint ``tag`` written on
    ``layout``: per (stage, tp rank), each dp rank's fragment of each parameter by DeepSpeed's slice mappings;
    then the tp shards glued (``attrs``: a parameter's Megatron partition attributes)."""
    tp, pp, dp = layout
    shards: dict[str, dict] = {}
    for stage in range(pp):
        for r in range(tp):
            mp = stage * tp + r  # the ranks of data index 0 in DeepSpeed's (pipe, data, model) order
            shapes = torch.load(tag / f"mp_rank_{mp:02d}_model_states.pt", weights_only=False)["param_shapes"]
            zero = [torch.load(zero_file(tag, d, mp), weights_only=False)["optimizer_state_dict"] for d in range(dp)]
            for g, group in enumerate(shapes):
                for name, shape in group.items():
                    value = {}
                    for key in ("fp32", "exp_avg", "exp_avg_sq"):
                        parts = []
                        for z in zero:
                            frag = z["param_slice_mappings"][g].get(name)
                            flat = (z["single_partition_of_fp32_groups"][g] if key == "fp32"
                                    else z["base_optimizer_state"]["state"][g][key])
                            if frag is not None:
                                parts.append(flat[frag.start:frag.start + frag.numel])
                        value[key] = torch.cat(parts).view(shape)
                    shards.setdefault(name, {}).setdefault(r, []).append(value)
    full = {}
    for name, by_tp in shards.items():
        for copies in by_tp.values():  # a tied parameter is on two stages: the same on both
            assert all(all(torch.equal(c[k], copies[0][k]) for k in c) for c in copies), name
        full[name] = {key: unshard([by_tp[r][0][key] for r in range(tp)], attrs[name]) for key in copies[0]}
    return full


def loaded_state(ranks: list[dict]) -> tuple[dict, dict]:
    """The same from the resumed ranks' dumps (each parameter already whole over dp), and each parameter's
    partition attributes; every copy of a parameter (dp replicas, tied stages) must be the same."""
    by_name: dict[str, dict] = {}
    for state in ranks:
        for name, p in state["params"].items():
            tp_rank = state["coords"]["tp_rank"]
            held = by_name.setdefault(name, {})
            if tp_rank in held:
                assert all(torch.equal(held[tp_rank][k], p[k]) for k in ("fp32", "exp_avg", "exp_avg_sq")), name
            held[tp_rank] = p
    attrs, full = {}, {}
    for name, held in by_name.items():
        p = held[0]
        attrs[name] = SimpleNamespace(tensor_model_parallel=p["sharded"], partition_dim=p["partition_dim"],
                                      partition_stride=p["partition_stride"])
        full[name] = {k: unshard([held[r][k] for r in sorted(held)], attrs[name])
                      for k in ("fp32", "exp_avg", "exp_avg_sq")}
    return full, attrs


def expected_rng(tag: Path, source: tuple, target: tuple, coords: dict, seed: int = 1234) -> torch.Tensor:
    """The rule: a rank whose (stage, replica) existed in the source layout, with the same pp and dp, keeps that
    stream (its tp rank 0's, whose peers shared it); any other draws afresh from the seed, the step and
    its (stage, replica)."""
    if (source[1], source[2]) == (target[1], target[2]):
        rank = coords["pp_rank"] * source[2] * source[0] + coords["dp_rank"] * source[0]  # (pipe, data, model)
        return torch.load(tag / "rng" / f"rank{rank}.pt", weights_only=True)["torch"]
    seed = int(numpy.random.SeedSequence([seed, coords["pp_rank"], coords["dp_rank"], STEP]).generate_state(1)[0])
    return torch.Generator().manual_seed(seed).get_state()


@pytest.mark.parametrize("config,source,target", PAIRS,
                         ids=[f"{c}-{'.'.join(map(str, s))}-to-{'.'.join(map(str, t))}" for c, s, t in PAIRS])
def test_every_rank_holds_exactly_the_saved_state_after_a_layout_change(sources, config, source, target, tmp_path):
    ranks, out = resumed(sources(config, source), config, target, tmp_path)
    tag = tmp_path / "run" / "checkpoints" / f"global_step{STEP}"
    assert f"resuming step {STEP} from tp{source[0]} x pp{source[1]} x dp{source[2]} on" in out
    got, attrs = loaded_state(ranks)
    want = saved_state(tag, source, attrs)
    assert got.keys() == want.keys()
    for name in want:
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            assert torch.equal(got[name][key], want[name][key]), (name, key)
    scalars = [name for name in want if want[name]["fp32"].numel() == 1]
    assert scalars, "the case must hold scalar parameters"
    for state in ranks:  # the module's weights are the masters in its dtype
        for name, p in state["params"].items():
            assert torch.equal(p["module"], p["fp32"].to(p["module"].dtype)), name
    model = torch.load(tag / "mp_rank_00_model_states.pt", weights_only=False)
    zero = torch.load(zero_file(tag, 0, 0), weights_only=False)["optimizer_state_dict"]["base_optimizer_state"]
    for state in ranks:
        assert state["counters"] == {"global_steps": model["global_steps"], "global_samples": model["global_samples"],
                                     "skipped_steps": model["skipped_steps"],
                                     "last_epoch": model["lr_scheduler"]["last_epoch"],
                                     "step_count": model["lr_scheduler"]["_step_count"]}
        assert state["lrs"] == [g["lr"] for g in zero["param_groups"]]
        assert state["adam_steps"] == [float(zero["state"][g]["step"]) for g in range(len(zero["param_groups"]))]
        assert state["data"] == model["data"] and state["prores"] == model["prores"]
        assert torch.equal(state["rng"]["torch"], expected_rng(tag, source, target, state["coords"])), state["coords"]
    streams = {}
    for state in ranks:  # tp peers share a stream; replicas and stages each have their own
        c = state["coords"]
        streams.setdefault((c["pp_rank"], c["dp_rank"]), []).append(state["rng"]["torch"])
    assert all(all(torch.equal(s, group[0]) for s in group) for group in streams.values())
    firsts = [group[0] for group in streams.values()]
    assert all(not torch.equal(a, b) for i, a in enumerate(firsts) for b in firsts[i + 1:])


# the repro: DyT (a scalar alpha in every norm), 2 blocks of width 32, dp 2, resumed on dp 1 at step 4
REPRO = ("model.norm=dyt", "model.num_layers=2", "model.hidden_size=32", "model.ffn_hidden_size=64",
         "model.num_heads=2", "model.seq_length=32", "train.micro_batch_size=2", "train.steps=8",
         "train.log_interval=1", "train.eval_interval=4", "data.eval_samples=16", "checkpoint.interval=4",
         "checkpoint.keep_last=0", "kernels.backend=eager", "optim.warmup_steps=2", "logging.progress_bar=false")


def test_a_dp2_dyt_checkpoint_resumed_on_dp1_continues_the_straight_run(tmp_path):
    """Its masters at the resume are the saved ones exactly, and every loss after it the straight run's up to the
    order of the sums (dp 2 adds two micro-batches' gradients in another order than dp 1's accumulation)."""
    from test_resume import scalars

    straight = tmp_path / "straight"
    args = [a for o in REPRO for a in ("--set", o)]
    proc = run_cli("train", "--run-dir", str(straight), *args, launcher=torchrun(2))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    cut_to(run, 4)
    proc = subprocess.run([sys.executable, str(HERE / "state_dump.py"), str(shutil.copytree(run, tmp_path / "copy")),
                           str(tmp_path / "dump"), *REPRO, "train.micro_batch_size=4"],
                          capture_output=True, text=True, timeout=600, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, attrs = loaded_state([torch.load(tmp_path / "dump" / "rank0.pt", weights_only=False)])
    want = saved_state(run / "checkpoints" / "global_step4", (1, 1, 2), attrs)
    assert all(torch.equal(got[n]["fp32"], want[n]["fp32"]) for n in want)
    proc = run_cli("train", "--run-dir", str(run), *args, "--set", "train.micro_batch_size=4")
    assert proc.returncode == 0 and "resuming step 4 from tp1 x pp1 x dp2 on tp1 x pp1 x dp1" in proc.stdout
    a, b = scalars(straight), scalars(run)
    for step in range(4, 8):
        assert b["train/loss"][step] == pytest.approx(a["train/loss"][step], rel=1e-5), step
    assert b["valid/loss"][8] == pytest.approx(a["valid/loss"][8], rel=1e-5)
