"""Memory and pipeline-bubble model of a run, and the layout it recommends for a number of GPUs.

Per pipeline stage and rank: weights, gradients and optimizer states (:func:`parameter_bytes`: the ZeRO
paper's accounting, Rajbhandari et al. 2020, with the buffers DeepSpeed's optimizers add to it), and
activations (:mod:`prores.model.size`, per micro-batch). DeepSpeed's 1F1B schedule
keeps min(m, p - s) micro-batches in flight on stage s (m micro-batches a step, p stages), so stage 0
holds p micro-batches' activations. With ``model.recompute=block`` a stage keeps only each block's
input per micro-batch, plus one block's activations while it is recomputed.

Not modelled: the allocator's slack, the CUDA context and NCCL's buffers, for which the planner leaves
``HEADROOM`` of every GPU free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from prores.model.size import (Shape, block_activations, block_parameters, embedding_activations,
                               embedding_parameters, head_activations, head_parameters, logits_buffers)

HEADROOM = 0.10
GiB = 2**30
REDUCE_BUCKET = 500_000_000  # DeepSpeed's default zero_optimization.reduce_bucket_size, in elements


@dataclass(frozen=True)
class ParameterBytes:
    """What ``params`` parameters cost one rank: the optimizer's state lives all along, the gradients from
    the backward pass through the optimizer step, and the step adds its own buffers while the backward
    pass's activations are gone (so a stage's peak holds the larger of the two)."""

    weights: int
    grads: int
    optimizer: int
    step: int  # what the optimizer step adds while the activations are gone


def parameter_bytes(params: int, bf16: bool, zero_stage: int, dp: int, device: str = "cuda") -> ParameterBytes:
    """The ZeRO paper's accounting (Rajbhandari et al. 2020: 2 + 2 bytes of bf16 weights and gradients, 12 of
    fp32 master weights and Adam moments), with the buffers DeepSpeed's optimizers add, as read in
    deepspeed/runtime/zero/stage_1_and_2.py and bf16_optimizer.py and measured (benchmarks/memory.py):

    * ZeRO-1: the weights (w = 2 bytes in bf16, 4 in fp32) and their gradients (w) whole on every rank, the
      fp32 master copy of this rank's partition (4, in fp32 runs too) and Adam's two moments (8) as its 1/dp
      share; the step adds, as 1/dp shares, the partition's reduced gradients (w) and their fp32 copy (4),
      and the denominator torch's AdamW computes out of place (4). On a GPU the pipeline engine also keeps
      the whole reduce bucket (``REDUCE_BUCKET`` elements of w bytes) where there is something to reduce: at
      dp 1 prores turns contiguous gradients off (launcher.builders.ONE_REPLICA_ZERO) and no bucket exists;
      on a CPU its pages stay untouched.
    * ZeRO-0 fp32 (prores's GlobalNormAdamW): weights, gradients and moments; the step adds the denominator.
    * ZeRO-0 bf16 (DeepSpeed's bf16 optimizer): bf16 weights, bf16 gradients and an fp32 accumulator of them,
      the fp32 master and the moments; the step adds the master's fp32 gradient and the denominator."""
    w = 2 if bf16 else 4
    if zero_stage == 1:
        bucket = REDUCE_BUCKET * w if device == "cuda" and dp > 1 else 0
        return ParameterBytes(params * w, params * w, params * (4 + 8) // dp + bucket, params * (w + 4 + 4) // dp)
    if bf16:
        return ParameterBytes(params * w, params * (w + 4), params * (4 + 8), params * (4 + 4))
    return ParameterBytes(params * w, params * w, params * 8, params * 4)


def uniform_blocks(num_blocks: int, stages: int) -> list[int]:
    """As even as possible; earlier stages take the remainder."""
    base, extra = divmod(num_blocks, stages)
    return [base + (1 if s < extra else 0) for s in range(stages)]


def balanced_blocks(block_params: int, first: int, last: int, num_blocks: int, stages: int) -> list[int]:
    """Blocks per stage (each at least one) that minimise the largest stage's parameters, where stage 0
    also holds ``first`` parameters (the embedding) and the last stage ``last`` (final norm and head).
    Blocks beyond that minimum's needs are taken back from the most loaded stage, the earliest of equals
    (earlier stages hold more micro-batches in flight), so the stages end as even as they can."""
    extra = [0] * stages
    extra[0] += first
    extra[-1] += last

    def capacity(cap: int) -> list[int]:
        return [max(0, (cap - x) // block_params) for x in extra]

    caps = sorted({n * block_params + x for n in range(1, num_blocks + 1) for x in set(extra)})
    cap = next(c for c in caps if min(capacity(c)) >= 1 and sum(capacity(c)) >= num_blocks)
    counts, surplus = capacity(cap), sum(capacity(cap)) - num_blocks
    for _ in range(surplus):  # take back from the most loaded stage, the earliest of equals
        s = max((s for s in range(stages) if counts[s] > 1), key=lambda s: (counts[s] * block_params + extra[s], -s))
        counts[s] -= 1
    return counts


def blocks_per_stage(cfg, vocab_size: int, tp: Optional[int] = None, pp: Optional[int] = None) -> list[int]:
    """``parallel.stage_layers`` when given, else the split ``parallel.partition`` asks for."""
    m, tp, pp = cfg.model, tp or cfg.parallel.tp, pp or cfg.parallel.pp
    if cfg.parallel.stage_layers and pp == cfg.parallel.pp:
        return list(cfg.parallel.stage_layers)
    if cfg.parallel.partition == "uniform" or pp == 1:
        return uniform_blocks(m.num_layers, pp)
    return balanced_blocks(block_parameters(m, tp), embedding_parameters(m, vocab_size, tp),
                           head_parameters(m, vocab_size, tp), m.num_layers, pp)


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    micro_batch: int
    micro_batches: int  # per step and data-parallel rank (grad_accum)
    recompute: str  # none | block

    def describe(self) -> str:
        return (f"tp={self.tp} pp={self.pp} dp={self.dp} micro_batch_size={self.micro_batch}"
                f" grad_accum={self.micro_batches} recompute={self.recompute}")


@dataclass(frozen=True)
class StageMemory:
    """Bytes per rank of one pipeline stage."""

    blocks: int
    parameters: int  # the count, per tensor-parallel rank
    weights: int
    grads: int
    optimizer: int
    step: int  # what the optimizer step adds while the activations are gone
    diagnostics: int  # LayerDiagnostics' copy of the stage's block weights, held through a statistics step
    activations: int  # one micro-batch, without recompute
    recomputed: int  # one micro-batch, with model.recompute=block
    in_flight: int  # micro-batches whose activations the stage holds at once
    peak: int  # weights + grads + optimizer + diagnostics + the larger of the in-flight activations (with the layout's
    # recompute) and the optimizer step's buffers


def bubble(pp: int, micro_batches: int) -> float:
    """The share of a 1F1B step a stage idles: (p - 1) / (m + p - 1)."""
    return (pp - 1) / (micro_batches + pp - 1)


def planned_backend(cfg) -> str:
    """The kernels a planned run uses: ``auto`` picks triton on the GPUs that `prores plan` sizes."""
    return "triton" if cfg.kernels.backend == "auto" else cfg.kernels.backend


def stages(cfg, vocab_size: int, layout: Layout, device: str = "cuda") -> list[StageMemory]:
    """Per pipeline stage, what one of its ranks holds; ``device``: the GPUs `prores plan` sizes, or "cpu"
    (what the memory benchmark measures: DeepSpeed's reduce bucket counts only where gradients touch it)."""
    m, bf16 = cfg.model, cfg.train.precision == "bf16" or (cfg.train.precision == "auto" and device == "cuda")
    element = 2 if bf16 else 4
    shape = Shape(m.seq_length, layout.micro_batch, element, stream=4 if m.fp32_residual else element)
    backend = planned_backend(cfg)
    one_block = block_activations(m, shape, layout.tp, backend)
    block_input = m.seq_length * layout.micro_batch * m.hidden_size * shape.stream_bytes
    out = []
    counts = blocks_per_stage(cfg, vocab_size, layout.tp, layout.pp)
    for s, n in enumerate(counts):
        params, ends = n * block_parameters(m, layout.tp), 0
        if s == 0:
            params += embedding_parameters(m, vocab_size, layout.tp)
            ends += embedding_activations(m, shape)
        if s == len(counts) - 1:
            params += head_parameters(m, vocab_size, layout.tp)
            ends += head_activations(m, shape, vocab_size, layout.tp, backend) + logits_buffers(m, shape, vocab_size,
                                                                                               layout.tp)
        in_flight = min(layout.micro_batches, layout.pp - s)
        full, kept = n * one_block + ends, n * block_input + ends
        held = in_flight * full if layout.recompute == "none" else in_flight * kept + one_block
        p = parameter_bytes(params, bf16, cfg.parallel.zero_stage, layout.dp, device)
        copy = n * block_parameters(m, layout.tp) * element if "layer_stats" in cfg.train.callbacks else 0
        out.append(StageMemory(n, params, p.weights, p.grads, p.optimizer, p.step, copy, full, kept + one_block,
                               in_flight, p.weights + p.grads + p.optimizer + copy + max(held, p.step)))
    return out


def candidates(cfg, gpus: int, global_batch: int):
    """Every layout of ``gpus`` that the config's shapes allow and that keeps the global batch, tp within
    one 8-GPU node."""
    m = cfg.model
    for tp in (t for t in (1, 2, 4, 8) if gpus % t == 0 and m.num_heads % t == 0 and m.ffn_hidden_size % t == 0
                                          and m.vocab_multiple % t == 0):
        for pp in (p for p in range(1, min(gpus // tp, m.num_layers) + 1) if gpus // tp % p == 0):
            dp = gpus // (tp * pp)
            if global_batch % dp:
                continue
            per_rank = global_batch // dp
            for micro in (b for b in range(1, per_rank + 1) if per_rank % b == 0):
                for recompute in ("none", "block"):
                    yield Layout(tp, pp, dp, micro, per_rank // micro, recompute)


def cost(layout: Layout) -> tuple:
    """The order of preference: no recompute (it costs about a third more compute), the smallest
    model-parallel group (tp and pp communicate every micro-batch), the smallest bubble, then the
    largest micro-batch (better kernel efficiency)."""
    return (layout.recompute != "none", layout.tp * layout.pp, bubble(layout.pp, layout.micro_batches),
            -layout.micro_batch)


@dataclass(frozen=True)
class Recommendation:
    best: Optional[Layout]  # the preferred layout that fits, if any
    tried: int
    smallest: tuple[int, Layout]  # the lowest fullest-stage peak of all layouts tried, and its layout


def recommend(cfg, vocab_size: int, gpus: int, gpu_memory: int) -> Recommendation:
    """Of the layouts of ``gpus`` GPUs that keep the config's global batch on them, the preferred one whose
    every stage fits in ``gpu_memory`` less the headroom."""
    global_batch = cfg.train.global_batch(max(1, gpus // (cfg.parallel.tp * cfg.parallel.pp)))
    peaks = [(max(s.peak for s in stages(cfg, vocab_size, layout)), layout)
             for layout in candidates(cfg, gpus, global_batch)]
    fits = [layout for peak, layout in peaks if peak <= gpu_memory * (1 - HEADROOM)]
    return Recommendation(min(fits, key=cost) if fits else None, len(peaks),
                          min(peaks, key=lambda p: (p[0], cost(p[1]))))


def parse_memory(text: str) -> int:
    """``80GB``, ``80GiB``, ``80G`` or ``80``: GiB, as GPU memory is quoted (an 80GB H100 has 80 GiB)."""
    number = text.strip().upper().removesuffix("B").removesuffix("I").removesuffix("G")
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"--gpu-memory {text!r}: expected a size in GiB such as 80GB or 141GiB")
    return int(value * GiB)


def _gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def stage_table(stage_list: list[StageMemory]) -> str:
    rows = ["| stage | blocks | parameters | weights | grads | optimizer (step) | statistics copy | activations /"
            " micro-batch (recompute) | in flight | peak |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for i, s in enumerate(stage_list):
        rows.append(f"| {i} | {s.blocks} | {s.parameters / 1e6:.1f}M | {_gib(s.weights)} | {_gib(s.grads)} |"
                    f" {_gib(s.optimizer)} ({_gib(s.step)}) | {_gib(s.diagnostics)} | {_gib(s.activations)} ({_gib(s.recomputed)}) | {s.in_flight} |"
                    f" {_gib(s.peak)} |")
    return "\n".join(rows)


def describe_plan(cfg, vocab_size: int, gpus: int, gpu_memory: int) -> str:
    """What `prores plan` prints: the configured layout on ``gpus`` GPUs, then the recommended one."""
    m, p = cfg.model, cfg.parallel
    usable = gpu_memory * (1 - HEADROOM)
    lines = [f"{m.num_layers} blocks of width {m.hidden_size}, {m.seq_length} tokens, {cfg.train.precision}"
             f"{' (bf16 on these GPUs)' if cfg.train.precision == 'auto' else ''},"
             f" ZeRO-{p.zero_stage}; memory in GiB per GPU, parameters per tensor-parallel rank;"
             f" {gpus} GPUs of {_gib(gpu_memory)} GiB, {_gib(usable)} usable ({HEADROOM:.0%} left for"
             " buffers)", ""]
    if gpus % (p.tp * p.pp) == 0:
        layout = Layout(p.tp, p.pp, gpus // (p.tp * p.pp), cfg.train.micro_batch_size, cfg.train.grad_accum,
                        m.recompute)
        table = stages(cfg, vocab_size, layout)
        verdict = "fits" if max(s.peak for s in table) <= usable else "does NOT fit"
        lines += [f"as configured: {layout.describe()} ({verdict}), bubble"
                  f" {bubble(layout.pp, layout.micro_batches):.1%}", "", stage_table(table), ""]
    else:
        lines += [f"as configured (tp={p.tp} x pp={p.pp}) the layout does not divide {gpus} GPUs", ""]
    rec = recommend(cfg, vocab_size, gpus, gpu_memory)
    best, tried = rec.best, rec.tried
    if best is None:
        peak, layout = rec.smallest
        lines += [f"does not fit: of the {tried} layouts of {gpus} GPUs, the smallest needs {_gib(peak)} GiB"
                  f" on its fullest stage ({layout.describe()}), more than the {_gib(usable)} GiB usable."
                  " Use more or larger GPUs, or a smaller model, sequence or global batch."]
        return "\n".join(lines)
    table = stages(cfg, vocab_size, best)
    lines += [f"recommended: {best.describe()}, bubble {bubble(best.pp, best.micro_batches):.1%}; fullest stage"
              f" {_gib(max(s.peak for s in table))} of {_gib(usable)} GiB (best of {tried} layouts, preferring no"
              " recompute, then the smallest tp x pp, the smallest bubble, the largest micro-batch)", "",
              stage_table(table), "",
              f"  --set parallel.tp={best.tp} --set parallel.pp={best.pp} --set train.micro_batch_size={best.micro_batch}"
              f" --set train.grad_accum={best.micro_batches} --set model.recompute={best.recompute}"
              f" --set parallel.partition={p.partition}"]
    return "\n".join(lines)
