"""prores's training step against what a user of the ProRes paper would run instead (goal: prores at least 1.3x).

The peer is the paper's code's recipe on stock ``transformers.LlamaForCausalLM`` (the paper's code is an HF
Llama with a per-layer alpha; tests/test_hf_parity.py shows stock Llama with alpha hooks computes prores's
losses): the same initial weights (prores's, through ``prores.eval.export.llama_weights``), alpha applied to
its attention and MLP outputs by forward hooks when ProRes is on, torch's fused AdamW with the reference's decay
groups, ``clip_grad_norm_`` and the config's learning-rate schedule, on the same batches. prores's arm is
:meth:`Trainer.step_once` with its callbacks. Each round runs ``--steps`` steps of each arm, side by side (each
arm leads half the rounds); the ratio is that of the medians with the rounds' 10th to 90th percentile.

    python benchmarks/peer.py [--blocks 12] [--steps 10] [--config cpu-depth.yaml] [--set KEY=VALUE ...]

At the study's shape: ``--set model.num_layers=48`` (and 120), with ``--set prores.schedule=linear`` for ProRes;
``--set @paper-setup`` makes prores's decay groups and schedule the peer's too (speed does not depend on them).
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch
import torch.nn.functional as F

from _harness import benchmark_trainer, interleaved, machine

from prores.eval.export import llama_config, llama_weights
from prores.launcher.builders import lr_lambda
from prores.launcher.restore import OneProcessModel
from prores.launcher.train import Trainer
from prores.model.prores import ProRes
from prores.study.intervals import Spread


class HFPeer:
    """The paper's recipe on stock LlamaForCausalLM."""

    def __init__(self, cfg, trainer: Trainer):
        from transformers import LlamaConfig, LlamaForCausalLM

        m, o = cfg.model, cfg.optim
        ours = OneProcessModel.of_config(cfg)  # the trainer's initial weights: the init depends on the seed only
        state = llama_weights(ours.pieces, m)
        self.model = LlamaForCausalLM(LlamaConfig(**llama_config(m, state["model.embed_tokens.weight"].shape[0]),
                                                  attn_implementation="sdpa"))
        self.model.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=False)
        self.model.train()
        self.prores = ProRes(cfg.prores.schedule, cfg.prores.T, m.num_layers)
        self.alphas = [1.0] * m.num_layers
        if cfg.prores.schedule != "none":
            for i, layer in enumerate(self.model.model.layers):
                layer.self_attn.register_forward_hook(lambda mod, a, out, i=i: (out[0] * self.alphas[i], *out[1:]))
                layer.mlp.register_forward_hook(lambda mod, a, out, i=i: out * self.alphas[i])
        no_decay = ("bias", "layernorm.weight", "embed_tokens")  # torchrun_main.py's groups
        named = list(self.model.named_parameters())
        groups = [{"params": [p for n, p in named if not any(k in n for k in no_decay)],
                   "weight_decay": o.weight_decay},
                  {"params": [p for n, p in named if any(k in n for k in no_decay)], "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps, fused=True)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.cfg, self.data, self.step = cfg, copy.copy(trainer.data.train), 0

    def step_once(self) -> None:
        self.alphas = [self.prores.alpha(l, self.step) for l in range(1, len(self.alphas) + 1)]
        accum = self.cfg.train.accumulation(1)
        for _ in range(accum):
            tokens, labels = next(self.data)
            logits = self.model(input_ids=tokens).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten()) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.clip_grad)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.schedule.step()
        self.step += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=12, help="rounds: a block of --steps steps of each arm a round")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--config", default="cpu-depth.yaml")
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    cfg, trainer = benchmark_trainer(args.config, *args.set)
    peer = HFPeer(cfg, trainer)
    trainer.call("on_start")
    loops = {name: lambda steps, step_once=step_once: [step_once() for _ in range(steps)]
             for name, step_once in (("prores", trainer.step_once), ("hf", peer.step_once))}
    for steps in loops.values():  # warm-up
        steps(args.steps)
    rates = interleaved(loops, args.blocks, args.steps, trainer.tokens_per_step)
    ours, theirs = (statistics.median(rates[n]) for n in loops)
    print(f"{cfg.model.num_layers} blocks, ProRes {cfg.prores.schedule}, kernels {trainer.backend},"
          f" {trainer.tokens_per_step} tokens a step, {args.blocks} rounds of {args.steps} steps an arm on {machine()}")
    print(f"tokens/s: prores {ours:.0f}, HF Llama (the paper's recipe) {theirs:.0f}; prores / HF ="
          f" {Spread.of(rates['prores'], rates['hf']).text()} (the rounds' 10th to 90th percentile)")


if __name__ == "__main__":
    main()
