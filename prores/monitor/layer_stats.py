"""Per-layer diagnostics, every ``logging.stats_interval`` steps, written by each stage's writer.

* ``layers/act_rms/layer_XXX``: RMS of the block's output;
* ``layers/cos_in_out/layer_XXX``: mean over tokens of the cosine between the block's input and
  output residual stream (how much the block still changes the representation);
* ``layers/grad_norm/layer_XXX``, and ``/embedding``, ``/final_norm``, ``/head``: L2 norm of the
  piece's gradient after the data-parallel reduction and before clipping (their squares add up to
  ``train/grad_norm``²);
* ``layers/update_ratio/layer_XXX``: ||Δw|| / ||w|| of the block over the step;
* ``layers/gain/layer_XXX``: the mean absolute value of the block's learnable residual gains (LayerScale's
  λ, ReZero's s, Admin's ω; methods without gains log none), after the step.

Layer numbers are global and 1-based. Each value is the one process's value on every TP × PP × DP
layout: forward statistics are summed over the micro-batches of every data-parallel rank, and norms
count tensor-parallel shards on every TP rank, replicated parameters once (:mod:`prores.parallel.grad_norm`).
The forward hooks add to on-device accumulators: nothing syncs with the host until the step's end.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state

from prores.run.callbacks import Callback
from prores.model.block import Block
from prores.model.gpt import Embedding, EmbeddingNorm, FinalNorm, Head
from prores.parallel.collectives import all_reduce_over
from prores.parallel.grad_norm import grouped_sq_norms, reduced_grad_share


def recomputing() -> bool:
    """Is this forward a recomputation, run by autograd inside a backward pass?"""
    return torch._C._current_graph_task_id() != -1


OTHER_PIECES = {Embedding: "embedding", EmbeddingNorm: "embedding_norm", FinalNorm: "final_norm", Head: "head"}


def owned_pieces(module: torch.nn.Module) -> dict:
    """``{1: block, 2: block, ..., "embedding": ..., "head": ...}``: the pieces whose weights this stage
    owns (a tied embedding copy serving as the head belongs to the first stage)."""
    pieces = {}
    for m in module.modules():
        if isinstance(m, Block):
            pieces[m.layer_number] = m
        elif type(m) in OTHER_PIECES and not all(getattr(p, "ds_pipe_replicated", False) for p in m.parameters()):
            pieces[OTHER_PIECES[type(m)]] = m
    return pieces


class LayerDiagnostics(Callback):
    def __init__(self):
        self.active = False
        self._forward: dict[int, torch.Tensor] = {}  # layer -> [sum of mean squares, sum of cosines, forwards]

    def on_start(self, trainer) -> None:
        self.pieces = owned_pieces(trainer.module)
        self.blocks = dict(sorted(trainer.blocks.items()))
        self.params = [list(b.parameters()) for b in self.blocks.values()]  # a group a block
        self.piece_params = [list(m.parameters()) for m in self.pieces.values()]
        self.weights = [p for params in self.params for p in params]  # read under no_grad: no detach each
        self.before = None  # the weights before a stats step's update, for ||Δw||
        self.handles = [b.register_forward_hook(self._hook(layer)) for layer, b in self.blocks.items()]
        self.dp_group = parallel_state.get_data_parallel_group()
        self.tp_group = parallel_state.get_tensor_model_parallel_group()

    def _hook(self, layer: int):
        # kept out of a block compiled whole (kernels.backend=block): traced, the hook would break its graph and
        # recompile for every layer it counted, up to Dynamo's limit
        @torch.compiler.disable
        def hook(module, inputs, output):
            # with model.recompute=block a block runs again inside the backward pass: count its first forward
            if self.active and not recomputing():
                x, y = inputs[0].detach().float(), output.detach().float()
                y_norm = torch.linalg.vector_norm(y, dim=-1)  # for the cosine and the RMS both
                cos = torch.linalg.vecdot(x, y) / (torch.linalg.vector_norm(x, dim=-1) * y_norm).clamp_min(1e-8)
                stats = torch.stack([y_norm.square().sum() / y.numel(), cos.mean(), torch.ones((), device=y.device)])
                self._forward[layer] = self._forward[layer] + stats if layer in self._forward else stats

        return hook

    @torch.no_grad()
    def pre_step(self, trainer, step: int) -> None:
        self.active = step % trainer.cfg.logging.stats_interval == 0
        self.grad_sq = None
        if self.active:  # kept from one stats step to the next: fresh copies of hundreds of tensors cost more
            if self.before is None:
                self.before = [w.clone() for w in self.weights]
            else:
                torch._foreach_copy_(self.before, self.weights)

    def pre_update(self, trainer, step: int) -> None:
        if self.active:
            dp_rank = trainer.topo.dp_rank
            self.grad_sq = grouped_sq_norms(self.piece_params,
                                            lambda p: reduced_grad_share(p, dp_rank), trainer.topo.tp_rank,
                                            [self.dp_group, self.tp_group], trainer.device)

    @torch.no_grad()
    def post_step(self, trainer, step: int, metrics: dict) -> None:
        if not self.active:
            return
        self.active = False
        writer, tp_rank = trainer.writer, trainer.topo.tp_rank
        if self.blocks:
            forward = torch.stack([self._forward.pop(l) for l in self.blocks])
            all_reduce_over(forward, self.dp_group)
            mean = (forward[:, :2] / forward[:, 2:]).cpu()
            writer.layer_scalars("layers/act_rms", dict(zip(self.blocks, mean[:, 0].sqrt().tolist())), step)
            writer.layer_scalars("layers/cos_in_out", dict(zip(self.blocks, mean[:, 1].tolist())), step)
            torch._foreach_sub_(self.before, self.weights)  # before - after: -Δw, in place
            minus_delta = dict(zip(map(id, self.weights), self.before))
            delta = grouped_sq_norms(self.params, lambda p: minus_delta[id(p)], tp_rank, [self.tp_group],
                                     trainer.device)
            weight = grouped_sq_norms(self.params, lambda p: p, tp_rank, [self.tp_group], trainer.device)
            writer.layer_scalars("layers/update_ratio", dict(zip(self.blocks, (delta / weight).sqrt().tolist())), step)
            gains = {l: torch.cat([g.detach().float().abs().flatten() for g in b.gains()]).mean()
                     for l, b in self.blocks.items() if b.gains()}
            if gains:
                writer.layer_scalars("layers/gain", dict(zip(gains, torch.stack(list(gains.values())).tolist())), step)
        if self.grad_sq is not None:
            writer.layer_scalars("layers/grad_norm", dict(zip(self.pieces, self.grad_sq.sqrt().tolist())), step)

    def on_end(self, trainer, summary) -> None:
        for h in self.handles:
            h.remove()
