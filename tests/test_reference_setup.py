"""The ProRes paper's training setup as configuration (issue 42): the learning-rate convention, the decay groups
and the embedding's init, each against the reference's formula, quoted from its source (dandingsky/ProRes at
5253e0d); the code under test is prores's own."""

import math

import pytest
import torch

from prores.config import load_config
from prores.launcher.builders import decays, lr_lambda, setup_text
from prores.model.gpt import gpt_pieces
from prores.model.prores import ProRes


def reference_wsd(step: int, total: int, warmup: int, decay_ratio: float) -> float:
    """peft_pretraining/training_utils.py, get_warmup_stable_decay_scheduler's lr_lambda:
        decay_steps = int(num_training_steps*decay_ratio)
        stable_steps = num_training_steps - warmup_steps - decay_steps
        if step < warmup_steps: return step / max(1, warmup_steps)
        elif step < warmup_steps + stable_steps: return 1.0
        elif step < num_training_steps: return (num_training_steps - step) / decay_steps
        else: return 0.0"""
    decay_steps = int(total * decay_ratio)
    stable_steps = total - warmup - decay_steps
    if step < warmup:
        return step / max(1, warmup)
    if step < warmup + stable_steps:
        return 1.0
    return (total - step) / decay_steps if step < total else 0.0


@pytest.mark.parametrize("total, warmup", [(100, 10), (250, 5), (1000, 20)])
def test_the_reference_convention_is_the_references_lambdalr(total, warmup):
    cfg = load_config(None, (f"train.steps={total}", f"optim.warmup_steps={warmup}", "optim.lr_schedule=wsd",
                             "optim.decay_fraction=0.1", "optim.min_lr_ratio=0", "optim.lr_convention=reference"))
    ours = lr_lambda(cfg)
    assert [ours(s) for s in range(total)] == pytest.approx([reference_wsd(s, total, warmup, 0.1) for s in range(total)])
    prores = lr_lambda(load_config(None, (f"train.steps={total}", f"optim.warmup_steps={warmup}",
                                          "optim.decay_fraction=0.1", "optim.min_lr_ratio=0")))
    # prores's own: the same values one update earlier
    assert [prores(s) for s in range(total - 1)] == pytest.approx([reference_wsd(s + 1, total, warmup, 0.1)
                                                                  for s in range(total - 1)])
    assert ours(0) == 0.0 and prores(0) == 1 / warmup


def pieces(*overrides):
    cfg = load_config(None, ("model.num_layers=2", "model.hidden_size=16", "model.ffn_hidden_size=32",
                             "model.num_heads=2", "model.seq_length=8", "model.vocab_multiple=8", *overrides))
    module = torch.nn.ModuleList(p.cls(**p.kwargs) for p in gpt_pieces(cfg.model, ProRes("linear", 2, 2), 64, seed=1))
    return cfg, module


def test_the_reference_decay_groups(world_of_one):
    """torchrun_main.py: no_decay = ["bias", "layernorm.weight", "embed_tokens"] over HF Llama's names, so the
    blocks' input_layernorm/post_attention_layernorm gains and the embedding do not decay and the final
    model.norm.weight and lm_head.weight do."""
    cfg, module = pieces("optim.decay=reference")
    names = {id(p): n for n, p in module.named_parameters()}
    decayed = sorted(names[i] for i in decays(module, "reference"))
    matrices = sorted(n for n, p in module.named_parameters() if p.dim() >= 2)
    embedding = [n for n in matrices if n.endswith("word_embeddings.weight")]
    final = [n for n, p in module.named_parameters() if n.startswith(f"{len(module) - 2}.norm.weight")]
    assert len(embedding) == 1 and len(final) == 1
    assert decayed == sorted(set(matrices) - set(embedding) | set(final))
    assert sorted(names[i] for i in decays(module, "matrices")) == matrices
    # by hand: the embedding, two blocks of four matrices and two norm gains, the final norm's gain, the head:
    # 15 tensors; decaying 8 block matrices, the head and the final gain
    assert "on 10 of 15 parameter tensors (optim.decay=reference)" in setup_text(cfg, module)


def test_the_embedding_std_rule(world_of_one):
    """modeling_llama.py's _init_weights: the token embedding's std is initializer_range·√hidden_size."""
    _, plain = pieces()
    _, wide = pieces("model.embedding_init=sqrt_width")
    a, b = plain[0].word_embeddings.weight, wide[0].word_embeddings.weight
    assert torch.equal(b, a * math.sqrt(16))  # the same draw, scaled
    assert torch.equal(plain[1].mlp.linear_fc1.weight, wide[1].mlp.linear_fc1.weight)  # nothing else moves
