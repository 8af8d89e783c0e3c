"""The planner: piece sizes against built pieces, activations against what autograd keeps, the stage
split, the bubble, `prores plan`, and peak memory against a measured `prores train` step."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from prores.config import load_config
from prores.run.rng import stream_seed
from prores.model.attention import rope_tables
from prores.model.block import Block
from prores.model.gpt import Embedding, FinalNorm, Head, lm_loss
from prores.model.prores import ProRes
from prores.model.size import (Shape, block_activations, block_parameters, embedding_parameters,
                               head_activations, head_parameters, padded_vocab_size)
from prores.parallel.plan import (REDUCE_BUCKET, Layout, balanced_blocks, blocks_per_stage, bubble, parameter_bytes,
                                  stages)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import memory  # noqa: E402  (benchmarks/memory.py)

SMALL = ("model.num_layers=4", "model.hidden_size=64", "model.ffn_hidden_size=160", "model.num_heads=4",
         "model.seq_length=32")
SHAPES = {
    "pre, rmsnorm, swiglu, rope": (),
    "post": ("model.norm_layout=post",),
    "sandwich": ("model.norm_layout=sandwich",),
    "lns, layernorm": ("model.norm_layout=lns", "model.norm=layernorm"),
    "lns as gains": ("model.norm_layout=lns", "model.lns_scale=gain"),
    "gelu, learned positions": ("model.mlp=gelu", "model.position=learned"),
    "tied": ("model.tie_embeddings=true",),
    "deepnorm": ("model.norm_layout=deepnorm", "model.init=deepnorm"),
}
METHODS = {  # what their gains, extra norms and DyT keep (test_methods.py counts their parameters)
    "layerscale": ("model.norm_layout=layerscale",),
    "rezero": ("model.norm_layout=rezero", "model.rezero_init=0.5"),
    "admin": ("model.norm_layout=admin",),
    "mixln (post block)": ("model.norm_layout=mixln", "model.mixln_ratio=0.5"),
    "periln": ("model.norm_layout=periln",),
    "hybridnorm": ("model.norm_layout=hybridnorm",),
    "hybridnorm, layernorm": ("model.norm_layout=hybridnorm", "model.norm=layernorm"),
    "dyt": ("model.norm=dyt",),
    "depth-mup": ("model.depth_mup_alpha=1", "model.depth_mup_base=2"),
}
VARIANTS = {**SHAPES, **METHODS}
VOCAB = 258  # the byte tokenizer


def saved_bytes(fn, exclude) -> int:
    """Bytes of the distinct storages autograd keeps for the backward pass of ``fn()``, other than
    ``exclude`` (parameters and the given input) and scalars (alpha, alpha/c: the plan leaves out a few
    bytes a block)."""
    storages = {}

    def pack(t):
        if t.numel() > 1:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    return sum(n for ptr, n in storages.items() if ptr not in skip)


def shared_tables(m, dtype) -> list[torch.Tensor]:
    """RoPE's cached cos and sin, which every block shares (like a parameter, not a block's activation)."""
    if m.position != "rope":
        return []
    return list(rope_tables(m.seq_length, m.hidden_size // m.num_heads, m.rope_base, dtype, torch.device("cpu")))


@pytest.mark.parametrize("variant", list(SHAPES))
def test_parameter_counts_are_those_of_the_built_pieces(variant, world_of_one):
    m = load_config(None, SMALL + VARIANTS[variant]).model
    count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    assert block_parameters(m) == count(Block(m, ProRes("linear", 10, m.num_layers), 2, 0))
    vocab = padded_vocab_size(VOCAB, m.vocab_multiple)  # what gpt_pieces gives the pieces
    assert embedding_parameters(m, VOCAB) == count(Embedding(m, vocab, 0))
    final = count(FinalNorm(m, 0)) if variant not in ("post", "deepnorm") else 0
    head = count(Embedding(m, vocab, 0).word_embeddings) if m.tie_embeddings else count(Head(m, vocab, 0))
    assert head_parameters(m, VOCAB) == final + head


def test_tensor_parallel_counts_by_hand():
    """120.yaml, tp=2: the 4h² + 3hf matrices split, the two 512-wide RMSNorm gains replicated."""
    m = load_config("depth/120.yaml").model
    assert block_parameters(m, tp=2) == (4 * 512**2 + 3 * 512 * 1368) // 2 + 2 * 512 == 1_575_936
    assert embedding_parameters(m, VOCAB, tp=2) == 384 * 512 // 2


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("backend", ["eager", pytest.param("triton", marks=pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed (the [test] extra has it)"))])
def test_block_activations_are_what_autograd_keeps(variant, precision, backend, world_of_one):
    """Exact: the formula counts every tensor a block keeps but scalars. The Triton kernels (run here by
    its interpreter) keep less than the eager ones: what the GPU plan counts."""
    m = load_config(None, SMALL + VARIANTS[variant]).model
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    block = Block(m, ProRes("linear", 10, m.num_layers), 2, 0, backend=backend).to(dtype)
    block.set_step(3)
    x = torch.randn(m.seq_length, 2, m.hidden_size, dtype=dtype, requires_grad=True)
    kept = saved_bytes(lambda: block(x * 1), list(block.parameters()) + shared_tables(m, dtype))
    assert block_activations(m, Shape(m.seq_length, 2, dtype.itemsize), backend=backend) == kept


@pytest.mark.parametrize("backend", ["eager", "triton"])
def test_a_bf16_block_on_an_fp32_stream(backend, world_of_one):
    """model.fp32_residual: the stream (and what the Triton norms keep of it) fp32, the branches bf16."""
    if backend == "triton" and importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (the [test] extra has it)")
    m = load_config(None, SMALL).model
    block = Block(m, ProRes("linear", 10, m.num_layers), 2, 0, backend=backend).to(torch.bfloat16)
    block.set_step(3)
    x = torch.randn(m.seq_length, 2, m.hidden_size, dtype=torch.float32, requires_grad=True)
    kept = saved_bytes(lambda: block(x * 1), list(block.parameters()) + shared_tables(m, torch.bfloat16))
    assert block_activations(m, Shape(m.seq_length, 2, 2, stream=4), backend=backend) == kept


@pytest.mark.parametrize("variant", ["pre, rmsnorm, swiglu, rope", "post", "lns, layernorm"])
def test_head_activations_are_what_autograd_keeps(variant, world_of_one):
    m = load_config(None, SMALL + VARIANTS[variant]).model
    vocab = padded_vocab_size(VOCAB, m.vocab_multiple)
    final, head = FinalNorm(m, 0), Head(m, vocab, 0)
    x = torch.randn(m.seq_length, 2, m.hidden_size, requires_grad=True)
    labels = torch.randint(0, VOCAB, (2, m.seq_length))
    ends = (lambda: lm_loss(head(final(x * 1)), labels)) if variant != "post" else (lambda: lm_loss(head(x * 1), labels))
    kept = saved_bytes(ends, [*final.parameters(), *head.parameters()])
    assert head_activations(m, Shape(m.seq_length, 2, 4), VOCAB) == kept


@pytest.mark.parametrize("block,first,last,blocks,stages,want", [
    (10, 0, 0, 12, 4, [3, 3, 3, 3]),  # nothing but blocks: even
    (10, 25, 25, 12, 4, [2, 4, 4, 2]),  # stage loads 45, 40, 40, 45: none can give a block without exceeding 45
    (10, 0, 30, 12, 3, [5, 5, 2]),  # a head of three blocks' worth: 50, 50, 50
    (3, 100, 100, 120, 8, [1, 19, 19, 20, 20, 20, 20, 1]),  # ends of 33 blocks each: the middle takes 118
    (10, 5, 5, 5, 5, [1, 1, 1, 1, 1]),  # one block a stage at least
])
def test_stages_balanced_by_parameters(block, first, last, blocks, stages, want):
    assert balanced_blocks(block, first, last, blocks, stages) == want


def test_the_partition_key_picks_the_split():
    cfg = load_config("depth/120.yaml", ("parallel.pp=8", "parallel.partition=parameters"))
    split = blocks_per_stage(cfg, VOCAB)
    assert sum(split) == 120 and len(split) == 8
    m = cfg.model
    loads = [n * block_parameters(m) for n in split]
    loads[0] += embedding_parameters(m, VOCAB)
    loads[-1] += head_parameters(m, VOCAB)
    assert max(loads) - min(loads) <= block_parameters(m)  # as even as whole blocks allow
    assert blocks_per_stage(load_config("depth/120.yaml", ("parallel.pp=8",)), VOCAB) == [15] * 8
    assert blocks_per_stage(load_config("depth/120.yaml", ("parallel.pp=2", "parallel.stage_layers=[50, 70]",
                                                           "parallel.partition=parameters")), VOCAB) == [50, 70]


def test_the_reduce_bucket_exists_only_with_something_to_reduce():
    """ZeRO-1 in bf16 on GPUs: at dp 1 prores turns contiguous gradients off (no bucket); at dp 2 DeepSpeed keeps
    the whole bucket, 500M elements of 2 bytes, beside the 12 bytes of master and moments per parameter, halved."""
    one, two = (parameter_bytes(1000, True, 1, dp, "cuda") for dp in (1, 2))
    assert (one.weights, one.grads, one.optimizer, one.step) == (2000, 2000, 12000, 10000)
    assert (two.optimizer, two.step) == (6000 + REDUCE_BUCKET * 2, 5000)
    assert parameter_bytes(1000, True, 1, 2, "cpu").optimizer == 6000  # untouched pages


def test_the_last_stage_holds_its_logits_and_their_gradient_and_statistics_steps_a_weight_copy():
    """By hand, for a 2-stage bf16 plan of width 64 with a 32,000-token vocabulary: the last stage adds DeepSpeed's
    buffered logits and their gradient (2 x 32,000 x 2 bytes a token, 32 x 4 tokens a micro-batch) to what
    autograd keeps of the head; every stage holds a bf16 copy of its blocks' weights while layer statistics run."""
    cfg = load_config(None, (*SMALL, "train.precision=bf16"))
    layout = Layout(tp=1, pp=2, dp=1, micro_batch=4, micro_batches=2, recompute="none")
    shape = Shape(32, 4, 2, stream=4)
    first, last = stages(cfg, 32000, layout)
    head = head_activations(cfg.model, shape, 32000, 1, "triton")
    assert last.activations - first.activations == head + 32 * 4 * 2 * 32000 * 2 - 32 * 4 * 8  # less the ids
    assert first.diagnostics == last.diagnostics == 2 * block_parameters(cfg.model, 1) * 2
    quiet = stages(load_config(None, (*SMALL, "train.precision=bf16", "train.callbacks=[scalars]")), 32000, layout)
    assert quiet[0].diagnostics == 0 and quiet[0].peak == first.peak - first.diagnostics


def test_bubble():
    assert bubble(1, 4) == 0.0 and bubble(4, 4) == 3 / 7 and bubble(8, 32) == 7 / 39


def test_plan_for_120_blocks_on_8_gpus_fits():
    proc = run_cli("plan", "depth/120.yaml", "--gpus", "8", "--gpu-memory", "80GB", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "as configured: tp=1 pp=1 dp=8 micro_batch_size=8 grad_accum=4 recompute=none (fits)" in out
    assert "recommended: " in out and "--set parallel.tp=" in out
    assert "| stage | blocks | parameters |" in out


def test_plan_says_when_nothing_fits():
    proc = run_cli("plan", "depth/120.yaml", "--gpus", "1", "--gpu-memory", "1GB", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "does not fit: of the " in proc.stdout and "more than the 0.90 GiB usable" in proc.stdout


def test_plan_refuses_a_bad_memory_size():
    proc = run_cli("plan", "--gpus", "8", "--gpu-memory", "lots", timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "prores: error: --gpu-memory 'lots': expected a size in GiB such as 80GB or 141GiB")


def test_dropout_streams_differ_between_data_parallel_ranks_stages_and_resumes_only():
    seeds = {(pp, dp, step): stream_seed(1234, pp, dp, step) for pp in range(4) for dp in range(16) for step in (0, 7)}
    assert len(set(seeds.values())) == len(seeds)
    assert stream_seed(1234, 1, 3) == seeds[(1, 3, 0)] != stream_seed(1235, 1, 3)


# Where the plan claims ±15% of the measured peak (the README's table has every case): activations
# dominating (fp32 and bf16, recompute, DeepNorm, tp=2, both stages of pp=2 with two micro-batches in
# flight on the first) and parameters dominating (bf16's bytes, ZeRO-1 sharded over dp=2).
MEASURED = ["swiglu, rope", "swiglu, rope, recompute", "deepnorm", "bf16", "tp2", "pp2, 2 micro-batches in flight",
            "parameters, bf16", "parameters, fp32, dp2 ZeRO-1"]


@pytest.mark.slow
@pytest.mark.parametrize("case", MEASURED)
def test_planned_peak_memory_is_within_15_percent_of_a_measured_step(case):
    """benchmarks/memory.py's measure: every rank's peak resident set in fresh `prores train` processes
    (one, or under torchrun), less the runtime's fixed cost, measured the same way on a tiny model."""
    for rank in memory.case(case):
        assert 0.85 <= rank["planned"] / rank["above"] <= 1.15, (case, rank)