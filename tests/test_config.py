"""Config loading and validation: one clear message per mistake, through the real CLI too."""

import pytest
import yaml

from conftest import run_cli
from prores.config import DEFAULT_CONFIG, PACKAGED_CONFIGS, ConfigError, load_config
from prores.errors import UsageError


def test_default_is_the_packaged_tiny_config():
    cfg = load_config()
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    assert cfg.model.num_layers == raw["model"]["num_layers"] >= 12
    assert cfg.data.corpus == "shakespeare" and cfg.data.tokenizer == "byte"


def test_overrides_are_typed_yaml():
    cfg = load_config(None, ("model.num_layers=48", "optim.betas=[0.8, 0.9]", "model.tie_embeddings=true",
                             "optim.lr=1e-3", "optim.warmup_steps=5"))
    assert cfg.model.num_layers == 48 and cfg.optim.betas == [0.8, 0.9]
    assert cfg.model.tie_embeddings is True and cfg.optim.lr == 1e-3 and cfg.optim.warmup_steps == 5


def test_int_is_accepted_for_float():
    assert load_config(None, ("optim.lr=1",)).optim.lr == 1.0


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.num_layer=4", "unknown config key 'model.num_layer'. Did you mean 'model.num_layers'?"),
        ("modle.num_layers=4", "unknown config key 'modle'. Did you mean 'model'?"),
        ("model.num_layers=deep", "model.num_layers: expected int, got 'deep' (str)."),
        ("model.num_layers=4.5", "model.num_layers: expected int, got 4.5 (float)."),
        ("model.tie_embeddings=1", "model.tie_embeddings: expected bool, got 1 (int)."),
        ("train.steps=true", "train.steps: expected int, got True (bool)."),
        ("prores.schedule=linaer", "prores.schedule: 'linaer' is not allowed; choose one of linear, "),
        ("prores.schedule=linaer", "Did you mean 'linear'?"),
        ("model.norm_layout=prenorm", "model.norm_layout: 'prenorm' is not allowed"),
        ("model.num_heads=5", "model.hidden_size=128 is not divisible by model.num_heads=5"),
        ("train.steps=0", "train.steps: 0 is below the minimum 1."),
        ("model.norm_layout=deepnorm", "the deepnorm layout and the deepnorm init gains go together"),
        ("parallel.tp=3", "parallel.tp=3 does not divide model.num_heads=4"),
        ("parallel.pp=13", "parallel.pp=13 exceeds model.num_layers=12"),
        ("optim.betas=0.9", "optim.betas: expected a list, got 0.9 (float)."),
        ("model", "--set 'model': expected KEY=VALUE"),
        ("data.weights=[1.0]", "data.weights=[1.0]: give one non-negative number per data.paths entry (0)"),
        ("data.split='95'", "data.split='95': expected 'train,valid[,test]' shares"),
        ("data.split=100,0,0", "with train and valid above zero"),
        ("data.eval={a b: x}", "data.eval: 'a b': 'x': each entry is name: PREFIX or text file"),
        ("data.eval=[x]", "data.eval: expected dict, got ['x'] (list)."),
    ],
)
def test_bad_values_name_key_value_and_fix(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, (override,))
    assert message in str(err.value)


def test_missing_config_file():
    with pytest.raises(ConfigError, match="config file 'nope.yaml' does not exist"):
        load_config("nope.yaml")


def test_packaged_configs_resolve_by_relative_name():
    assert load_config("depth/24.yaml").model.num_layers == 24


@pytest.mark.parametrize("depth", [12, 24, 48, 72, 96, 120])
def test_depth_configs_have_the_paper_shapes(depth):
    cfg = load_config(PACKAGED_CONFIGS / "depth" / f"{depth}.yaml")
    m = cfg.model
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_heads) == (depth, 512, 1368, 8)
    assert cfg.prores.T == (500 if depth >= 96 else 1000)
    assert m.seq_length == 1024 and m.norm == "rmsnorm" and m.mlp == "swiglu" and m.position == "rope"


@pytest.mark.parametrize("name,shape", [("350m.yaml", (24, 1024, 16)), ("1.3b.yaml", (24, 2048, 16))])
def test_large_configs_load(name, shape):
    m = load_config(PACKAGED_CONFIGS / name).model
    assert (m.num_layers, m.hidden_size, m.num_heads) == shape


def test_cli_prints_one_line_and_no_traceback():
    proc = run_cli("train", "--set", "model.num_layer=4", timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "prores: error: unknown config key 'model.num_layer'. Did you mean 'model.num_layers'?"
        " Known keys here: " + ", ".join(
            ["num_layers", "hidden_size", "ffn_hidden_size", "num_heads", "seq_length", "dropout", "norm_layout",
             "norm", "norm_eps", "init", "init_std", "embedding_init", "lns_scale", "position", "rope_base", "mlp",
             "tie_embeddings", "vocab_multiple", "fp32_residual", "recompute", "layerscale_init", "rezero_init", "mixln_ratio",
             "dyt_init", "depth_mup_alpha", "depth_mup_base"]) + ".")


def test_empty_sections_and_overrides_into_them(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\nprores:\n  schedule: equal\n")
    cfg = load_config(path, ("model.num_layers=24",))
    assert cfg.model.num_layers == 24 and cfg.model.hidden_size == 128 and cfg.prores.schedule == "equal"


def test_a_global_batch_size_fixes_the_batch_and_accumulation_follows_dp():
    train = load_config(None, ["train.global_batch_size=8", "train.micro_batch_size=2", "train.grad_accum=5"]).train
    assert [(train.accumulation(dp), train.global_batch(dp)) for dp in (1, 2, 4)] == [(4, 8), (2, 8), (1, 8)]
    with pytest.raises(UsageError, match=r"train.global_batch_size=8 is not a multiple of train.micro_batch_size x"
                                         r" dp = 2 x 3: pick a micro-batch size that divides it"):
        train.accumulation(3)
    plain = load_config(None, ["train.micro_batch_size=2", "train.grad_accum=5"]).train
    assert [plain.global_batch(dp) for dp in (1, 3)] == [10, 30]  # unset: micro x accum x dp
