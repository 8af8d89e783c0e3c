"""prores's Pre-LN + ProRes model at alpha < 1 against stock transformers.LlamaForCausalLM on its weights, with
the alphas applied to the Llama's two branch outputs by forward hooks: what the ProRes paper's code computes (an
HF Llama whose decoder layers scale both branches by alpha). No reference code needed."""

import pytest
import torch
import torch.nn.functional as F

from prores.config import load_config
from prores.eval.export import llama_config, llama_weights
from prores.launcher.restore import OneProcessModel

L, T, STEP = 5, 2.0, 3  # linear: alpha_l = min(3 / (2 l), 1) = 1, 0.75, 0.5, 0.375, 0.3


def alpha(layer: int) -> float:
    """The paper's linear schedule, by hand."""
    return min(STEP / (T * layer), 1.0)


@pytest.fixture(scope="module")
def model(world_of_one):
    cfg = load_config(None, (f"model.num_layers={L}", "model.hidden_size=24", "model.ffn_hidden_size=40",
                             "model.num_heads=3", "model.seq_length=32", "prores.schedule=linear",
                             f"prores.T={T}"))
    ours = OneProcessModel.of_config(cfg)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # non-trivial norm gains, so a gain mapped to the wrong norm cannot hide
        for p in (p for piece in ours.pieces for p in piece.parameters() if p.dim() == 1):
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    for block in ours.blocks:
        block.set_step(STEP)
    assert [float(b.alpha) if b.alpha is not None else 1.0 for b in ours.blocks] == \
        pytest.approx([alpha(b.layer_number) for b in ours.blocks], rel=1e-7)
    return ours


def hf_llama(ours, hooks: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    state = llama_weights(ours.pieces, ours.cfg.model)
    hf = LlamaForCausalLM(LlamaConfig(**llama_config(ours.cfg.model, state["model.embed_tokens.weight"].shape[0])))
    missing, unexpected = hf.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # a tied head is the embedding
    if hooks:
        for i, layer in enumerate(hf.model.layers):
            a = alpha(i + 1)
            layer.self_attn.register_forward_hook(lambda mod, args, out, a=a: (out[0] * a, *out[1:]))
            layer.mlp.register_forward_hook(lambda mod, args, out, a=a: out * a)
    return hf.eval()


def per_token_losses(logits, tokens):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten(), reduction="none")


def test_stock_llama_with_alpha_hooks_gives_prores_losses_at_alpha_below_one(model):
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(4))
    ours = per_token_losses(model.logits(tokens), tokens)
    with torch.no_grad():
        theirs = per_token_losses(hf_llama(model, hooks=True)(tokens).logits, tokens)
        unhooked = per_token_losses(hf_llama(model, hooks=False)(tokens).logits, tokens)
    # two fp32 implementations of one computation (the export test at alpha 1 measures ~2e-7 relative)
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
    # the hooks are what make it so: without them the Llama is another model
    assert (unhooked - ours).abs().max() > 100 * (theirs - ours).abs().max() + 1e-3
