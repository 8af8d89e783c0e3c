"""kernels.backend=block (prores/model/block_compile.py): a block compiled whole has no graph break, one graph
serves every block of a stack, and a new alpha does not recompile. (Its losses against eager's:
tests/test_fused.py::test_switching_backend_changes_nothing_but_speed.)"""

import pytest
import torch

from prores.config import load_config
from prores.model.block import Block
from prores.model.block_compile import _trace_tp_group_lookup, compile_block
from prores.model.prores import ProRes


def block(layout: str, layer: int = 2, backend: str = "eager") -> Block:
    cfg = load_config("cpu-depth.yaml", ("model.num_layers=4", f"model.norm_layout={layout}", "model.seq_length=16",
                                         f"model.init={'deepnorm' if layout == 'deepnorm' else 'normal'}"))
    return Block(cfg.model, ProRes("linear", 3, 4), layer, seed=1, backend=backend)


@pytest.mark.parametrize("layout", ["pre", "post", "sandwich", "deepnorm", "layerscale", "hybridnorm"])
def test_a_block_is_one_graph(world_of_one, layout):
    """Without the traced tp-group lookup Megatron's linear layers break the graph four times (its deprecation
    warning); with it, Dynamo traces the whole block, alpha < 1 included."""
    _trace_tp_group_lookup()
    b = block(layout)
    b.set_step(1)
    x = torch.randn(16, 2, 64, requires_grad=True)
    found = torch._dynamo.explain(b)(x)
    assert (found.graph_count, found.graph_break_count) == (1, 0), [r.reason for r in found.break_reasons]


def test_one_graph_for_every_block_and_alpha(world_of_one):
    """Four blocks of a stack, each at two steps (two alphas): one compiled graph, forward and backward."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    blocks = [block("pre", layer, backend="block") for layer in range(1, 5)]
    x = torch.randn(16, 2, 64, requires_grad=True)
    for step in (1, 2):
        h = x
        for b in blocks:
            b.set_step(step)
            h = b(h)
        h.sum().backward()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert "_orig_mod" not in "".join(blocks[0].state_dict())  # compiled in place: the eager block's names


def test_the_layer_statistics_stay_out_of_the_compiled_block(world_of_one):
    """LayerDiagnostics' forward hook on every block, on at some steps and off at others: still one graph and no
    graph break (traced, the hook breaks the graph and recompiles for each layer it has counted)."""
    from prores.monitor.layer_stats import LayerDiagnostics

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    diagnostics = LayerDiagnostics()
    blocks = [block("pre", layer, backend="block") for layer in range(1, 5)]
    for layer, b in enumerate(blocks, 1):
        b.register_forward_hook(diagnostics._hook(layer))
    x = torch.randn(16, 2, 64, requires_grad=True)
    for step in range(1, 5):
        diagnostics.active, diagnostics._forward = step % 2 == 1, {}
        h = x
        for b in blocks:
            b.set_step(step)
            h = b(h)
        h.sum().backward()
        assert sorted(diagnostics._forward) == ([1, 2, 3, 4] if step % 2 else [])
    counters = torch._dynamo.utils.counters
    assert (counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())) == (1, 0)


def test_a_compiled_block_takes_the_rotary_tables_as_an_input(world_of_one):
    """Traced, the rotary tables' cosines and sines were computed in every block's forward and backward (18% of
    a 48-block step): with the cache filled outside the trace, the block's graph holds no cos or sin, and the
    tables it multiplies by are the cached ones."""
    from prores.model import attention

    torch._dynamo.reset()
    attention._ROPE_TABLES.clear()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    b = block("pre")
    compile_block(b, backend=record)
    x = torch.randn(16, 2, 64, requires_grad=True)
    y = b(x)
    ops = {n.target for g in graphs for n in g.graph.nodes}
    assert len(graphs) == 1 and torch.nn.functional.scaled_dot_product_attention in ops
    assert not ops & {torch.cos, torch.sin, torch.Tensor.cos, torch.Tensor.sin}, ops
    assert list(attention._ROPE_TABLES) == [(16, 16, 10000.0, torch.float32, torch.device("cpu"))]
    assert torch.equal(y, block("pre")(x))  # the same block, eager
