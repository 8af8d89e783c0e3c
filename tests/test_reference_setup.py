"""The ProRes paper's training setup as configuration (issue 42): the learning-rate convention, the decay groups
and the embedding's init, each against the reference's formula, quoted from its source (dandingsky/ProRes at
5253e0d); the code under test is prores's own."""

import math

import pytest
import torch

from prores.config import load_config
from prores.launcher.builders import build_optimizer, decays, lr_lambda, setup_text
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


def test_the_preset_is_the_reference_setup_and_the_sweep_uses_it_whole():
    import yaml

    from prores.config import PRESETS
    from prores.study.sweep import PACKAGED_SWEEPS, expand

    preset = yaml.safe_load((PRESETS / "paper-setup.yaml").read_text())
    assert preset == {"model.embedding_init": "sqrt_width", "optim.decay": "reference",
                      "optim.lr_convention": "reference", "optim.implementation": "fused", "model.lns_scale": "gain"}
    sweep = yaml.safe_load((PACKAGED_SWEEPS / "cpu-horizon-reference.yaml").read_text())
    assert sweep["presets"] == ["paper-setup"] and not preset.keys() & sweep["set"].keys()
    _, cells = expand("cpu-horizon-reference.yaml")  # the preset first in every cell, the sweep's own keys after
    assert len(cells) == 18 and all(c.overrides[0] == "@paper-setup" for c in cells)
    cfg = load_config("cpu-depth.yaml", tuple(cells[0].overrides))
    assert (cfg.model.embedding_init, cfg.optim.decay, cfg.train.steps) == ("sqrt_width", "reference", 1000)
    cfg = load_config("cpu-depth.yaml", ("@paper-setup",))
    assert (cfg.model.embedding_init, cfg.optim.decay, cfg.optim.lr_convention, cfg.optim.implementation) == \
        ("sqrt_width", "reference", "reference", "fused")
    # later --set wins, as with any two assignments
    assert load_config(None, ("@paper-setup", "optim.decay=matrices")).optim.decay == "matrices"


def test_the_embedding_sweep_is_the_horizon_studys_cells_with_one_key_changed():
    """cpu-horizon-embedding.yaml isolates one of the preset's five choices: its cells must be the default horizon
    study's Pre-LN and ProRes cells at 48 and 120 blocks, run for run, with only the embedding's init added."""
    from prores.study.sweep import expand

    _, horizon = expand("cpu-horizon.yaml")
    _, embedding = expand("cpu-horizon-embedding.yaml")
    wanted = {c.name: c for c in horizon if c.name[:4] in ("L048", "L120") and "Pre_LN" in c.name
              and "Scaled" not in c.name}
    assert sorted(c.name for c in embedding) == sorted(wanted) and len(embedding) == 12
    for cell in embedding:
        default, changed = (load_config("cpu-depth.yaml", tuple(c.overrides)) for c in (wanted[cell.name], cell))
        assert changed.model.embedding_init == "sqrt_width" and default.model.embedding_init == "matrix"
        changed.model.embedding_init = "matrix"
        assert changed == default, cell.name


def test_updates_under_the_preset_are_the_references_training_loop(world_of_one):
    """torchrun_main.py's recipe, written out: AdamW(groups by HF name with no_decay = ["bias",
    "layernorm.weight", "embed_tokens"], betas=(0.9, 0.95), eps=1e-8, fused=True); its WSD LambdaLR; before each
    step grad_norm = get_total_norm(grads) and clip_grads_with_norm_(params, clip, grad_norm). prores's builder
    under --set @paper-setup (GlobalNormAdamW: fp32, ZeRO-0) must make the same updates from the same gradients.
    The clipping norms are two fp32 sums in different orders (a relative 1e-6 at most at this size); Adam's step
    m̂/(√v̂+ε) does not depend on the gradients' scale but through ε, so the weights agree to rounding."""
    from prores.eval.export import llama_weights

    steps, warmup, lr = 5, 2, 1e-2
    common = ("@paper-setup", "train.precision=fp32", "parallel.zero_stage=0", f"optim.lr={lr}",
              f"optim.warmup_steps={warmup}", f"train.steps={steps}", "optim.decay_fraction=0.4",
              "optim.clip_grad=0.5", "optim.weight_decay=0.1")
    cfg, ours = pieces(*common)
    _, theirs = pieces(*common)
    optimizer = build_optimizer(cfg, ours, world_of_one)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))

    by_storage = {}
    for name, t in llama_weights(list(theirs), cfg.model).items():
        by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(name)
    # Q, K and V are cut from one fused matrix (copies): they go by its name, which no no_decay entry matches
    named = [(by_storage.get(p.untyped_storage().data_ptr(), [n]), p) for n, p in theirs.named_parameters()]
    assert sum(n == [f"{i}.self_attention.linear_qkv.weight"] for i in (1, 2) for n, _ in named) == 2
    no_decay = ["bias", "layernorm.weight", "embed_tokens"]
    decays_ = lambda names: not any(nd in n for n in names for nd in no_decay)  # noqa: E731
    reference = torch.optim.AdamW([{"params": [p for n, p in named if decays_(n)], "weight_decay": 0.1},
                                   {"params": [p for n, p in named if not decays_(n)], "weight_decay": 0.0}],
                                  lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    reference_schedule = torch.optim.lr_scheduler.LambdaLR(
        reference, lambda s: reference_wsd(s, steps, warmup, 0.4))

    gen = torch.Generator().manual_seed(5)
    for _ in range(steps):
        for a, b in zip(ours.parameters(), theirs.parameters()):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        optimizer.step()
        schedule.step()
        grads = [p.grad for p in theirs.parameters()]
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2)
        torch.nn.utils.clip_grads_with_norm_(list(theirs.parameters()), 0.5, norm)
        reference.step()
        reference_schedule.step()
    assert [g["lr"] for g in optimizer.param_groups] == [reference.param_groups[0]["lr"]] * 2
    _, initial = pieces(*common)
    for a, b, start, (names, _) in zip(ours.parameters(), theirs.parameters(), initial.parameters(), named):
        # a wrong decay group would show as lr·λ·|p| ≈ 2e-5 a step, far above this
        bound = 4 * 2**-24 * a.detach().abs() + steps * lr * 1e-5
        assert not torch.equal(a, start), names
        assert ((a - b).abs() <= bound).all(), names
        for moment in ("exp_avg", "exp_avg_sq"):
            # sums of clipped gradients whose clip factors differ by ~1e-6 relative; a sum may cancel, so the
            # bound is relative to the tensor's largest moment, not to each element
            mine, ref = optimizer.state[a][moment], reference.state[b][moment]
            torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
        assert float(optimizer.state[a]["step"]) == float(reference.state[b]["step"]) == steps


def test_lns_as_learnable_gains_initialised_at_one_over_sqrt_l(world_of_one):
    """modeling_llama.py (norm_type lns, lns_prores): input_layernorm.weight.data.fill_(1/math.sqrt(layer_index+1))
    and the same for post_attention_layernorm, layer_index from 0. The forward at step 0 is the fixed scale's,
    bit for bit; one AdamW step from the same gradients moves the two apart (the gain's update is lr-sized,
    the fixed scale's is lr/√l-sized)."""
    from prores.launcher.builders import param_groups

    _, fixed = pieces("model.norm_layout=lns")
    _, gain = pieces("model.norm_layout=lns", "model.lns_scale=gain")
    for block in (fixed[1], fixed[2]):
        assert float(block.norm1.weight[0]) == float(block.norm2.weight[0]) == 1.0
    for layer_index, block in enumerate((gain[1], gain[2])):
        for norm in (block.norm1, block.norm2):
            assert torch.equal(norm.weight, torch.full_like(norm.weight, 1 / math.sqrt(layer_index + 1)))
            assert norm.out_scale == 1.0
    x = torch.randn(8, 2, 16, generator=torch.Generator().manual_seed(6))
    for a, b in zip(fixed[1:3], gain[1:3]):
        a.set_step(10), b.set_step(10)  # alpha 1: the branches count
        assert torch.equal(a(x), b(x)) and not torch.equal(a(x), x)
    cfg = load_config(None, ("optim.lr=1e-2",))
    for module in (fixed, gain):
        optimizer = torch.optim.AdamW(param_groups(module, cfg.optim))
        for p in module.parameters():
            p.grad = torch.ones_like(p)
        optimizer.step()
    assert not torch.equal(fixed[2](x), gain[2](x))


def test_deepnorm_xavier_is_the_references_draw(world_of_one):
    """modeling_llama.py _init_weights for norm_type deeppost: xavier_normal_(weight, gain=(num_layers*8)**-0.25)
    on v_proj, o_proj, gate_proj, up_proj and down_proj, xavier_normal_(gain=1) on q_proj and k_proj; xavier's
    std is gain·√(2/(fan_in + fan_out)) of each HF matrix. prores draws the same normal (seed by name) as its
    deepnorm scheme, so each piece is that draw times the ratio of the two stds."""
    base = ("model.norm_layout=deepnorm", "model.num_layers=2", "model.ffn_hidden_size=40")
    _, ours = pieces(*base, "model.init=deepnorm-xavier")
    _, plain = pieces(*base, "model.init=deepnorm")
    h, f, L, std = 16, 40, 2, 0.02
    gain = (8 * L) ** -0.25
    xavier = lambda fan_in, fan_out: math.sqrt(2 / (fan_in + fan_out))  # noqa: E731
    for a, b in zip(ours[1:3], plain[1:3]):
        qkv_a = a.self_attention.linear_qkv.weight.view(2, 3, h // 2, h)  # [head, (q, k, v), head_dim, h]
        qkv_b = b.self_attention.linear_qkv.weight.view(2, 3, h // 2, h)
        for part, ratio in ((0, xavier(h, h) / std), (1, xavier(h, h) / std), (2, xavier(h, h) / std)):
            torch.testing.assert_close(qkv_a[:, part], qkv_b[:, part] * ratio, rtol=2**-22, atol=0)
        for name, fans in (("linear_fc1", (h, f)), ("linear_fc2", (f, h))):
            wa, wb = getattr(a.mlp, name).weight, getattr(b.mlp, name).weight
            torch.testing.assert_close(wa, wb * xavier(*fans) / std, rtol=2**-22, atol=0)
        torch.testing.assert_close(a.self_attention.linear_proj.weight,
                                   b.self_attention.linear_proj.weight * xavier(h, h) / std, rtol=2**-22, atol=0)
        # the absolute scale, by hand: V at gain·1/√h, Q at 1/√h
        assert float(qkv_a[:, 2].std() / qkv_a[:, 0].std()) == pytest.approx(gain, rel=0.3)
    assert torch.equal(ours[0].word_embeddings.weight, plain[0].word_embeddings.weight)
