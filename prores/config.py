"""Run configuration: typed dataclasses <- YAML + ``--set`` overrides.

The dataclasses below are the one registry of config keys. Every check that
concerns a single key lives in that key's field metadata (``choices``,
``minimum``); checks that relate several keys live in :func:`validate`.
Every problem is reported as one :class:`ConfigError` naming the key, the
value and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from prores.errors import UsageError

from prores.model.fused import BACKENDS
from prores.model.layouts import LAYOUTS
from prores.model.prores import SCHEDULES
from prores.model.init import INIT_SCHEMES
from prores.launcher.lr import LR_SCHEDULES

PACKAGED_CONFIGS = Path(__file__).parent / "configs"
DEFAULT_CONFIG = PACKAGED_CONFIGS / "tiny.yaml"


class ConfigError(UsageError):
    """A bad config value. The message alone tells the user what to change."""


def _key(default, *, choices=None, minimum=None, help=""):
    meta = {"choices": choices, "minimum": minimum, "help": help}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    num_layers: int = _key(12, minimum=1)
    hidden_size: int = _key(128, minimum=1)
    ffn_hidden_size: int = _key(344, minimum=1)
    num_heads: int = _key(4, minimum=1)
    seq_length: int = _key(128, minimum=2)
    dropout: float = _key(0.0, minimum=0.0, help="hidden and attention dropout")
    norm_layout: str = _key("pre", choices=tuple(LAYOUTS))
    norm: str = _key("rmsnorm", choices=("layernorm", "rmsnorm"))
    norm_eps: float = _key(1e-5, minimum=0.0)
    init: str = _key("normal", choices=tuple(INIT_SCHEMES))
    init_std: float = _key(0.02, minimum=0.0)
    position: str = _key("rope", choices=("rope", "learned"))
    rope_base: float = _key(10000.0, minimum=1.0)
    mlp: str = _key("swiglu", choices=("swiglu", "gelu"))
    tie_embeddings: bool = _key(False)
    vocab_multiple: int = _key(128, minimum=1, help="pad the vocab to a multiple of this")


@dataclass
class ProResConfig:
    schedule: str = _key("linear", choices=tuple(SCHEDULES))
    T: int = _key(1000, minimum=1)


@dataclass
class OptimConfig:
    lr: float = _key(3e-4, minimum=0.0)
    min_lr_ratio: float = _key(0.0, minimum=0.0)
    lr_schedule: str = _key("wsd", choices=tuple(LR_SCHEDULES))
    warmup_steps: int = _key(2000, minimum=0)
    decay_fraction: float = _key(0.1, minimum=0.0, help="WSD: share of steps in the final decay")
    betas: list = _key([0.9, 0.95])
    weight_decay: float = _key(0.1, minimum=0.0)
    eps: float = _key(1e-8, minimum=0.0)
    clip_grad: float = _key(1.0, minimum=0.0, help="0 disables clipping")


@dataclass
class DataConfig:
    paths: list = _key([], help="indexed dataset prefixes (PREFIX.bin/.idx); empty: use data.corpus")
    weights: list = _key([], help="blend weights, one per path; empty: in proportion to size")
    corpus: str = _key("shakespeare", help="raw text used when data.paths is empty: 'shakespeare' or a"
                                           " .txt / .md / .jsonl file, preprocessed once into the run's cache")
    split: str = _key("95,5,0", help="train,valid,test shares of the documents of every path (Megatron --split)")
    eval: dict = _key({}, help="held-out sets, name: PREFIX or text file; logged as eval/<name>/loss|ppl")
    tokenizer: str = _key("byte", help="'byte' or a local tokenizer.json path")
    json_key: str = _key("text")
    eval_batches: int = _key(8, minimum=1, help="batches per evaluation of the validation split and each eval set")


@dataclass
class TrainConfig:
    steps: int = _key(300, minimum=1)
    micro_batch_size: int = _key(8, minimum=1)
    grad_accum: int = _key(1, minimum=1)
    seed: int = _key(1234, minimum=0)
    log_interval: int = _key(10, minimum=1)
    eval_interval: int = _key(100, minimum=1)
    precision: str = _key("fp32", choices=("fp32", "bf16"))


@dataclass
class CheckpointConfig:
    interval: int = _key(0, minimum=0, help="steps between checkpoints; 0: only at the end (and on a stop signal)")
    keep_last: int = _key(2, minimum=0, help="keep the newest N checkpoints; 0: keep all")
    keep_every: int = _key(0, minimum=0, help="also keep every checkpoint whose step is a multiple of K; 0: none")


@dataclass
class ParallelConfig:
    tp: int = _key(1, minimum=1)
    pp: int = _key(1, minimum=1)
    zero_stage: int = _key(1, choices=(0, 1))
    stage_layers: list = _key([], help="blocks per pipeline stage, e.g. [2, 3]; empty: uniform")


@dataclass
class LoggingConfig:
    stats_interval: int = _key(10, minimum=1, help="steps between per-layer statistics")
    progress_bar: bool = _key(True)


@dataclass
class KernelsConfig:
    backend: str = _key("auto", choices=("auto",) + tuple(BACKENDS))


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    prores: ProResConfig = field(default_factory=ProResConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    kernels: KernelsConfig = field(default_factory=KernelsConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------- loading


def _did_you_mean(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, value: Any, tp) -> Any:
    """Check ``value`` against the annotated type; ints are accepted as floats."""
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # PyYAML reads YAML 1.1, where 1e-3 (no dot) is a string
            return float(value)
        except ValueError:
            pass
    if tp is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r} ({type(value).__name__}).")
        return list(value)
    if (tp in (int, float) and isinstance(value, bool)) or not isinstance(value, tp):
        raise ConfigError(
            f"{key}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})."
        )
    return value


def _check_field(key: str, value: Any, meta: dict) -> None:
    choices, minimum = meta.get("choices"), meta.get("minimum")
    if choices is not None and value not in choices:
        hint = _did_you_mean(str(value), [str(c) for c in choices])
        raise ConfigError(
            f"{key}: {value!r} is not allowed; choose one of {', '.join(map(str, choices))}.{hint}"
        )
    if minimum is not None and value < minimum:
        raise ConfigError(f"{key}: {value!r} is below the minimum {minimum}.")


def _build(cls, data: dict, prefix: str):
    if data is None:  # an empty YAML section (`model:` with nothing under it)
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}.")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in fields:
            raise ConfigError(
                f"unknown config key '{key}'.{_did_you_mean(str(name), fields)}"
                f" Known keys here: {', '.join(fields)}."
            )
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value, key)
        else:
            kwargs[name] = _coerce(key, value, tp)
            _check_field(key, kwargs[name], fields[name].metadata)
    return cls(**kwargs)


def apply_override(data: dict, assignment: str) -> None:
    """Apply one ``section.key=value`` to a raw config mapping; the value is YAML."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set model.num_layers=48.")
    path, raw = assignment.split("=", 1)
    parts = path.strip().split(".")
    node = data
    for part in parts[:-1]:
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            raise ConfigError(f"--set {assignment!r}: '{part}' is not a section.")
    try:
        node[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {assignment!r}: the value is not valid YAML ({exc}).") from None


def load_config(path: Optional[str | Path] = None, overrides: tuple[str, ...] = ()) -> Config:
    """Read YAML (default: the packaged tiny config), apply overrides, validate."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    if not path.exists():
        packaged = PACKAGED_CONFIGS / path
        if packaged.exists():
            path = packaged
        else:
            raise ConfigError(f"config file '{path}' does not exist; packaged configs live in {PACKAGED_CONFIGS}.")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}).") from None
    for assignment in overrides:
        apply_override(data, assignment)
    return validate(_build(Config, data, ""))


def validate(cfg: Config) -> Config:
    """Checks that relate several keys. Returns ``cfg`` for chaining."""
    m = cfg.model
    if m.hidden_size % m.num_heads:
        raise ConfigError(
            f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads};"
            " pick a head count that divides the hidden size."
        )
    if m.position == "rope" and (m.hidden_size // m.num_heads) % 2:
        raise ConfigError(
            f"model.position=rope needs an even head size, got {m.hidden_size // m.num_heads};"
            " change model.num_heads or use model.position=learned."
        )
    if (m.norm_layout == "deepnorm") != (m.init == "deepnorm"):
        raise ConfigError(
            f"model.norm_layout={m.norm_layout} with model.init={m.init}: the deepnorm layout and"
            " the deepnorm init gains go together; set both to deepnorm or neither."
        )
    if len(cfg.optim.betas) != 2 or not all(isinstance(b, (int, float)) for b in cfg.optim.betas):
        raise ConfigError(f"optim.betas: expected two numbers, got {cfg.optim.betas!r}.")
    if not 0.0 <= cfg.optim.decay_fraction <= 1.0:
        raise ConfigError(f"optim.decay_fraction={cfg.optim.decay_fraction} must lie in [0, 1].")
    _check_data(cfg.data)
    tp = cfg.parallel.tp
    for key, value in (("model.num_heads", m.num_heads), ("model.ffn_hidden_size", m.ffn_hidden_size)):
        if value % tp:
            raise ConfigError(f"parallel.tp={tp} does not divide {key}={value}; choose a tp that divides it.")
    if m.vocab_multiple % tp:
        raise ConfigError(
            f"parallel.tp={tp} does not divide model.vocab_multiple={m.vocab_multiple};"
            " the padded vocab is split over tp ranks."
        )
    if cfg.parallel.pp > m.num_layers:
        raise ConfigError(
            f"parallel.pp={cfg.parallel.pp} exceeds model.num_layers={m.num_layers};"
            " every pipeline stage needs at least one block."
        )
    stages = cfg.parallel.stage_layers
    if stages:
        if (len(stages) != cfg.parallel.pp or not all(isinstance(n, int) and n >= 1 for n in stages)
                or sum(stages) != m.num_layers):
            raise ConfigError(
                f"parallel.stage_layers={stages}: give {cfg.parallel.pp} positive block counts (one per"
                f" pipeline stage) that add up to model.num_layers={m.num_layers}, or [] for a uniform split."
            )
    return cfg


def _check_data(d: DataConfig) -> None:
    if d.weights and (len(d.weights) != len(d.paths)
                      or not all(isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0 for w in d.weights)
                      or sum(d.weights) <= 0):
        raise ConfigError(f"data.weights={d.weights}: give one non-negative number per data.paths entry"
                          f" ({len(d.paths)}), not all zero, or [] to blend in proportion to size.")
    try:
        shares = [float(x) for x in d.split.split(",")]
    except ValueError:
        shares = []
    if not 2 <= len(shares) <= 3 or min(shares) < 0 or shares[0] <= 0 or shares[1] <= 0:
        raise ConfigError(f"data.split={d.split!r}: expected 'train,valid[,test]' shares with train and valid"
                          " above zero, e.g. '95,5,0'.")
    for name, source in d.eval.items():
        if not (isinstance(name, str) and name.replace("_", "").replace("-", "").isalnum()
                and isinstance(source, str)):
            raise ConfigError(f"data.eval: {name!r}: {source!r}: each entry is name: PREFIX or text file, with a"
                              " name of letters, digits, '_' or '-' (it becomes the tag eval/<name>/loss).")


def dump_config(cfg: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
