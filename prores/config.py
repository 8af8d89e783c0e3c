"""Run configuration: typed dataclasses <- YAML + ``--set`` overrides.

The dataclasses below are the one registry of config keys. Every check that
concerns a single key lives in that key's field metadata (``choices``,
``minimum``); checks that relate several keys live in :func:`validate`.
Every problem is reported as one :class:`ConfigError` naming the key, the
value and the fix.

A key's allowed values come from the registry that implements them (schedules,
layouts, norms, init schemes, kernel backends, LR schedules, callbacks); each of
those registries is importable without torch, and so is this module.
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
from prores.model.init_schemes import DEEPNORM_SCHEMES, INIT_SCHEMES
from prores.model.kernels import BACKENDS, NORMS
from prores.model.layouts import LAYOUTS
from prores.model.prores import SCHEDULES, schedule_name
from prores.monitor.registry import CALLBACKS
from prores.run.lr import LR_SCHEDULES

PACKAGED_CONFIGS = Path(__file__).parent / "configs"
DEFAULT_CONFIG = PACKAGED_CONFIGS / "tiny.yaml"
PRESETS = PACKAGED_CONFIGS / "presets"  # named sets of --set choices: --set @NAME


class ConfigError(UsageError):
    """A bad config value. The message alone tells the user what to change."""


def _key(default, help: str, *, choices=None, minimum=None, above=None, operational=False, canonical=None):
    """A config key. ``operational``: it changes how a run is watched, saved or guarded, never what it
    computes, so two runs that differ only in such keys train the same numbers (the report pairs them).
    ``canonical``: maps another spelling of a value to the one kept (raising ValueError for one refused)."""
    meta = {"choices": choices, "minimum": minimum, "above": above, "help": help, "operational": operational,
            "canonical": canonical}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    num_layers: int = _key(12, "blocks (L)", minimum=1)
    hidden_size: int = _key(128, "width of the residual stream", minimum=1)
    ffn_hidden_size: int = _key(344, "MLP inner width", minimum=1)
    num_heads: int = _key(4, "attention heads", minimum=1)
    seq_length: int = _key(128, "tokens per sequence", minimum=2)
    dropout: float = _key(0.0, "hidden and attention dropout (0 as in the paper)", minimum=0.0)
    norm_layout: str = _key("pre", "the residual method: where the norms sit, which gains the branches carry and"
                                   " where alpha goes, see the method table", choices=tuple(LAYOUTS))
    norm: str = _key("rmsnorm", "the norm", choices=tuple(NORMS))
    norm_eps: float = _key(1e-5, "the norm's epsilon", minimum=0.0)
    init: str = _key("normal", "init scheme; deepnorm and deepnorm-xavier go with, and only with, the deepnorm"
                               " layout",
                     choices=tuple(INIT_SCHEMES))
    init_std: float = _key(0.02, "std of the normal init", minimum=0.0)
    embedding_init: str = _key("matrix", "the token embedding's init std: matrix, model.init_std as every matrix;"
                               " sqrt_width, model.init_std·√hidden_size (the ProRes paper's code)",
                               choices=("matrix", "sqrt_width"))
    lns_scale: str = _key("fixed", "LNS's 1/√l (model.norm_layout=lns): fixed, a constant on the norms' output (the"
                          " LNS paper's formula); gain, the blocks' learnable norm gains initialised at 1/√l (the"
                          " ProRes paper's code): the same forward at step 0, moved differently by AdamW",
                          choices=("fixed", "gain"))
    position: str = _key("rope", "position encoding", choices=("rope", "learned"))
    rope_base: float = _key(10000.0, "RoPE base frequency", minimum=1.0)
    mlp: str = _key("swiglu", "MLP kind", choices=("swiglu", "gelu"))
    tie_embeddings: bool = _key(False, "share the embedding with the output head")
    vocab_multiple: int = _key(128, "pad the vocab to a multiple of this (independent of tp)", minimum=1)
    fp32_residual: bool = _key(True, "under train.precision=bf16, keep the residual stream between blocks (and"
                                     " stages) in fp32 while the branches compute in bf16 (see the manual: docs/fitting.md)")
    recompute: str = _key("none", "activation recompute: block keeps only each block's input and recomputes"
                                  " the block in the backward pass (same numbers, less memory)",
                          choices=("none", "block"))
    layerscale_init: float = _key(0.0, "layerscale: λ's initial value; 0: CaiT's rule by depth (0.1 up to 18 blocks,"
                                       " 1e-5 up to 24, 1e-6 deeper; Touvron et al. 2021, arXiv 2103.17239)",
                                  minimum=0.0)
    rezero_init: float = _key(0.0, "rezero: the gain's initial value (0 in Bachlechner et al. 2020, arXiv"
                                   " 2003.04887, where alpha changes nothing until it moves)")
    mixln_ratio: float = _key(0.25, "mixln: the share ρ of blocks, from the first, in Post-LN (Li et al. 2024,"
                                    " arXiv 2412.13795)", minimum=0.0)
    dyt_init: float = _key(0.5, "model.norm=dyt: the initial value of each DyT's scalar a (0.5 in Zhu et al. 2025,"
                                " arXiv 2503.10622)", above=0.0)
    depth_mup_alpha: float = _key(0.0, "depth-µP: branch multiplier (L/L_base)^(−α) and the blocks' learning rate"
                                       " and AdamW eps rescaled; 0.5: depth-µP (Yang et al. 2023, arXiv 2310.02244),"
                                       " 1: CompleteP (Dey et al. 2025, arXiv 2505.01618); 0: off", minimum=0.0)
    depth_mup_base: int = _key(1, "depth-µP: the base depth L_base the hyperparameters were tuned at", minimum=1)


@dataclass
class ProResConfig:
    schedule: str = _key("linear", "alpha(l, t), see the schedule table; none turns ProRes off; the ProRes"
                                   " paper's code's names (sqrt, stagewise_sqrt_L, ...) are read as prores's",
                         choices=tuple(SCHEDULES), canonical=schedule_name)
    T: float = _key(1000.0, "per-layer warmup length in steps, a positive real: block l saturates at step"
                            " T·l under linear (so a short run keeps the paper's warmup fractions)", above=0.0)


@dataclass
class OptimConfig:
    lr: float = _key(3e-4, "peak learning rate (AdamW)", minimum=0.0)
    min_lr_ratio: float = _key(0.0, "final learning rate as a share of optim.lr", minimum=0.0)
    lr_schedule: str = _key("wsd", "wsd: warmup, flat, linear decay over the last optim.decay_fraction",
                            choices=tuple(LR_SCHEDULES))
    warmup_steps: int = _key(2000, "linear learning-rate warmup steps", minimum=0)
    decay_fraction: float = _key(0.1, "wsd: share of the steps in the final decay", minimum=0.0)
    betas: list = _key([0.9, 0.95], "AdamW betas")
    weight_decay: float = _key(0.1, "AdamW weight decay, on the parameters optim.decay names", minimum=0.0)
    decay: str = _key("matrices", "which parameters decay: matrices, every matrix (the embedding and head"
                      " included) and no vector; reference, the ProRes paper's code: all but the token embedding,"
                      " biases and the blocks' norm gains (so the final norm's gain decays)",
                      choices=("matrices", "reference"))
    lr_convention: str = _key("prores", "when the schedule's multiplier applies: prores, update t (from 1) takes the"
                              " multiplier of step t, so the first update is at lr/warmup; reference, one step"
                              " behind, as torch's LambdaLR in the ProRes paper's code (the first update at lr 0)",
                              choices=("prores", "reference"))
    eps: float = _key(1e-8, "AdamW epsilon", minimum=0.0)
    clip_grad: float = _key(1.0, "clip the global gradient norm to this; 0 disables clipping", minimum=0.0)
    implementation: str = _key("auto", "torch's AdamW kernel: auto, torch's own pick (a loop over tensors on CPU,"
                               " foreach on CUDA); foreach, one multi-tensor op per update term; fused, one kernel"
                               " over all tensors (faster; equal to the others within float rounding, not bitwise)",
                               choices=("auto", "foreach", "fused"))


@dataclass
class DataConfig:
    paths: list = _key([], "indexed datasets (PREFIX of PREFIX.bin/.idx); empty: use data.corpus")
    weights: list = _key([], "blend weights, one per data.paths entry; empty: in proportion to size")
    corpus: str = _key("shakespeare", "raw text used when data.paths is empty: shakespeare (packaged) or a"
                                      " .txt, .md or .jsonl file, preprocessed once into the run's cache")
    split: str = _key("95,5,0", "train,valid,test shares of every dataset's documents (Megatron's --split)")
    eval: dict = _key({}, "held-out sets, name: PREFIX or text file; logged as eval/<name>/loss and /ppl")
    tokenizer: str = _key("byte", "byte (256 bytes, <eod>, <pad>) or a local Hugging Face tokenizer.json")
    json_key: str = _key("text", "the text field of each jsonl line")
    eval_samples: int = _key(128, "samples per evaluation of the validation split and of each eval set, the same"
                                  " in every layout (a multiple of train.micro_batch_size x dp)", minimum=1)


@dataclass
class TrainConfig:
    steps: int = _key(300, "optimizer steps", minimum=1)
    micro_batch_size: int = _key(8, "sequences per micro-batch and data-parallel rank", minimum=1)
    grad_accum: int = _key(1, "micro-batches per step; global batch = micro x accum x dp", minimum=1)
    global_batch_size: int = _key(0, "samples per step whatever the world size: grad_accum follows as global /"
                                     " (micro x dp), so a job that comes back on more or fewer nodes resumes"
                                     " (Megatron's --global-batch-size); 0: micro x accum x dp", minimum=0)
    seed: int = _key(1234, "weights, data order and dropout", minimum=0)
    log_interval: int = _key(10, "steps between logged training scalars (and progress lines)", minimum=1,
                             operational=True)
    eval_interval: int = _key(100, "steps between evaluations (and one at the end)", minimum=1)
    precision: str = _key("auto", "parameters and compute: auto is bf16 (fp32 master weights) on a GPU with bf16,"
                                  " fp32 elsewhere (TF32 matmuls on CUDA)", choices=("auto", "fp32", "bf16"))
    on_nonfinite: str = _key("stop", "a step with a non-finite loss or grad norm (its update is dropped): stop"
                                     " the run as diverged, or skip it", choices=("stop", "skip"))
    max_skipped: int = _key(10, "with on_nonfinite=skip: stop as diverged after more non-finite steps in a row",
                            minimum=0)
    hang_timeout: float = _key(300.0, "seconds a rank may go without finishing a step before it counts the run"
                                      " hung: it writes its stacks to RUN/hangs/ and exits 124 (below parallel.timeout, so that a"
                                      " hang is found with its stacks before a collective's timeout ends the run);"
                                      " 0: no watchdog",
                               minimum=0.0, operational=True)
    hang_timeout_first_step: float = _key(1800.0, "the same bound for the first step (start-up, compilation)",
                                          minimum=0.0, operational=True)
    hang_timeout_eval: float = _key(1800.0, "the same bound for an evaluation", minimum=0.0, operational=True)
    max_restarts_without_progress: int = _key(3, "a job's restarts in a row that resume from the same checkpoint"
                                                 " before it stops instead (a new job starts with a fresh"
                                                 " budget); 0: no limit", minimum=0,
                                                 operational=True)
    callbacks: list = _key(list(CALLBACKS), "the run's callbacks, called in this default order whatever the"
                                            " list's (prores/monitor/registry.py)", choices=tuple(CALLBACKS),
                                            operational=True)

    def accumulation(self, dp: int) -> int:
        """Micro-batches per step and data-parallel rank over ``dp`` ranks (a UsageError if the global batch
        does not split evenly)."""
        if not self.global_batch_size:
            return self.grad_accum
        per_step = self.micro_batch_size * dp
        if self.global_batch_size % per_step:
            raise UsageError(f"train.global_batch_size={self.global_batch_size} is not a multiple of"
                             f" train.micro_batch_size x dp = {self.micro_batch_size} x {dp}: pick a micro-batch"
                             " size that divides it on this many processes.")
        return self.global_batch_size // per_step

    def global_batch(self, dp: int) -> int:
        """Samples per optimizer step over ``dp`` data-parallel ranks."""
        return self.micro_batch_size * self.accumulation(dp) * dp


@dataclass
class CheckpointConfig:
    interval: int = _key(0, "steps between checkpoints; 0: only at the end (and on a stop signal)", minimum=0,
                         operational=True)
    keep_last: int = _key(2, "keep the newest N checkpoints; 0: keep all", minimum=0, operational=True)
    keep_every: int = _key(0, "also keep every checkpoint whose step is a multiple of K; 0: none", minimum=0,
                           operational=True)
    save_timeout: float = _key(1800.0, "seconds a checkpoint save may take before the run counts as hung",
                               minimum=0.0, operational=True)
    keep_steps: list = _key([], "also keep the checkpoints of these steps, e.g. [30] for `prores analyze` at 10% of"
                                " a 300-step run", operational=True)


@dataclass
class ParallelConfig:
    tp: int = _key(1, "tensor-parallel size", minimum=1)
    pp: int = _key(1, "pipeline-parallel size; dp is the world size / (tp x pp)", minimum=1)
    zero_stage: int = _key(1, "ZeRO stage (optimizer states sharded over dp at 1)", choices=(0, 1))
    stage_layers: list = _key([], "blocks per pipeline stage, e.g. [2, 3]; empty: split by parallel.partition")
    partition: str = _key("uniform", "pipeline stages with equal numbers of blocks, or balanced by parameters"
                                     " (embedding and head included)", choices=("uniform", "parameters"))
    timeout: float = _key(600.0, "seconds a collective waits for its peers before it fails (the process groups'"
                                 " timeout, as Megatron's --distributed-timeout-minutes)", minimum=1.0,
                                 operational=True)


@dataclass
class LoggingConfig:
    # not operational: the report's activation metrics are read at these steps (issue 41)
    stats_interval: int = _key(10, "steps between per-layer statistics", minimum=1)
    progress_bar: bool = _key(True, "a progress bar on a terminal (a log gets plain lines either way)",
                              operational=True)


@dataclass
class MonitorConfig:
    # not operational: they define the report's spike scores, so runs paired on/off must share them
    spike_sigma: float = _key(7.0, "a spike: more than this many standard deviations above the window's mean",
                              minimum=0.0)
    spike_window: int = _key(1000, "steps before each step that its spike score compares with", minimum=2)


@dataclass
class KernelsConfig:
    backend: str = _key("auto", "residual-add + norm kernels, see the kernels table",
                        choices=("auto",) + tuple(BACKENDS))


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
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    kernels: KernelsConfig = field(default_factory=KernelsConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """``{"model.num_layers": 12, ...}``: every key with its value."""
        return {f"{section}.{k}": v for section, keys in self.to_dict().items() for k, v in keys.items()}


@dataclass(frozen=True)
class KeyDoc:
    key: str
    default: Any
    help: str
    choices: Optional[tuple]


def operational_keys() -> set[str]:
    """The keys that change how a run is watched, saved or guarded, never the numbers it computes."""
    return {f"{section}.{f.name}" for section, cls in typing.get_type_hints(Config).items()
            for f in dataclasses.fields(cls) if f.metadata["operational"]}


def key_docs() -> list[KeyDoc]:
    """Every config key, its default, help and allowed values, in registry order."""
    docs = []
    for section, cls in typing.get_type_hints(Config).items():
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            docs.append(KeyDoc(f"{section}.{f.name}", default, f.metadata["help"], f.metadata["choices"]))
    return docs


def yaml_value(value) -> str:
    """``value`` as one line of YAML, as ``--set KEY=VALUE`` reads it back."""
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip().removesuffix("\n...").strip()


def keys_markdown() -> str:
    """The manual's table of config keys (``prores config --markdown``)."""
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]
    for d in key_docs():
        some = "any of" if isinstance(d.default, list) else "one of"
        choices = f"; {some} {', '.join(f'`{c}`' for c in d.choices)}" if d.choices else ""
        rows.append(f"| `{d.key}` | `{yaml_value(d.default)}` | {d.help}{choices} |")
    return "\n".join(rows)


def methods_markdown() -> str:
    """The manual's table of residual methods (``prores config --markdown --methods``): the registry's."""
    rows = ["| `model.norm_layout` | block | source |", "| --- | --- | --- |"]
    rows += [f"| `{m.name}` | {m.doc} | {m.source} |" for m in LAYOUTS.values()]
    rows += [f"| `model.norm: {name}` | {doc} | |" for name, doc in NORMS.items() if name == "dyt"]
    return "\n".join(rows)


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
    for item in value if isinstance(value, list) and choices is not None else [value]:
        if choices is not None and item not in choices:
            hint = _did_you_mean(str(item), [str(c) for c in choices])
            raise ConfigError(
                f"{key}: {item!r} is not allowed; choose {'from' if isinstance(value, list) else 'one of'}"
                f" {', '.join(map(str, choices))}.{hint}"
            )
    if minimum is not None and value < minimum:
        raise ConfigError(f"{key}: {value!r} is below the minimum {minimum}.")
    above = meta.get("above")
    if above is not None and not value > above:
        raise ConfigError(f"{key}: {value!r} must be above {above:g}.")


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
            known = {f"{prefix}.{f}" if prefix else f: f for f in fields}
            raise ConfigError(
                f"unknown config key '{key}'.{_did_you_mean(key, known)}"
                f" Known keys here: {', '.join(fields)}."
            )
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value, key)
        else:
            kwargs[name] = _coerce(key, value, tp)
            canonical = fields[name].metadata.get("canonical")
            if canonical is not None:
                try:
                    kwargs[name] = canonical(kwargs[name])
                except ValueError as exc:
                    raise ConfigError(f"{key}: {exc}") from None
            _check_field(key, kwargs[name], fields[name].metadata)
    return cls(**kwargs)


def apply_override(data: dict, assignment: str) -> None:
    """Apply one ``section.key=value`` (the value is YAML) to a raw config mapping, or ``@PRESET``: every
    ``section.key: value`` of a preset file (:data:`PRESETS`, or a path), in its order."""
    if assignment.startswith("@"):
        path = find_file(assignment[1:] + ("" if assignment.endswith(".yaml") else ".yaml"), PRESETS, "preset")
        preset = yaml.safe_load(path.read_text()) or {}
        if not isinstance(preset, dict) or any(isinstance(v, dict) for v in preset.values()):
            raise ConfigError(f"preset {path}: expected flat 'section.key: value' lines, as --set takes them.")
        for key, value in preset.items():
            _assign(data, str(key), value, f"preset {path}: {key}")
        return
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set model.num_layers=48, or @PRESET"
                          f" (one of: {', '.join(sorted(p.stem for p in PRESETS.glob('*.yaml')))}).")
    path, raw = assignment.split("=", 1)
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {assignment!r}: the value is not valid YAML ({exc}).") from None
    _assign(data, path, value, f"--set {assignment!r}")


def _assign(data: dict, path: str, value, where: str) -> None:
    parts = path.strip().split(".")
    node = data
    for part in parts[:-1]:
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: '{part}' is not a section.")
    node[parts[-1]] = value


def find_file(name: str | Path, packaged: Path, what: str) -> Path:
    """``name`` as a path, else as a name under ``packaged``; one error that names the packaged file a path
    like ``configs/depth/120.yaml`` (a clone's) means, from wherever it was given."""
    path = Path(name)
    if path.is_file():
        return path
    if (packaged / path).is_file():
        return packaged / path
    parts = path.parts
    tails = [Path(*parts[i:]) for i in range(1, len(parts))]
    found = next((t for t in tails if (packaged / t).is_file()), None)
    hint = f" Did you mean the packaged '{found}'?" if found else ""
    raise ConfigError(f"{what} '{name}' does not exist.{hint} Packaged ones, named relative to {packaged},"
                      " work from any directory.")


def load_config(path: Optional[str | Path] = None, overrides: tuple[str, ...] = ()) -> Config:
    """Read YAML (default: the packaged tiny config), apply overrides, validate."""
    path = find_file(path, PACKAGED_CONFIGS, "config file") if path is not None else DEFAULT_CONFIG
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
    if (m.norm_layout == "deepnorm") != (m.init in DEEPNORM_SCHEMES):
        raise ConfigError(
            f"model.norm_layout={m.norm_layout} with model.init={m.init}: the deepnorm layout and"
            " the deepnorm init gains go together; set model.init to deepnorm (or deepnorm-xavier, the ProRes"
            " paper's code's) with the deepnorm layout, and to neither without it."
        )
    if m.mixln_ratio > 1:
        raise ConfigError(f"model.mixln_ratio={m.mixln_ratio} must lie in [0, 1]: the share of blocks in Post-LN.")
    if len(cfg.optim.betas) != 2 or not all(isinstance(b, (int, float)) for b in cfg.optim.betas):
        raise ConfigError(f"optim.betas: expected two numbers, got {cfg.optim.betas!r}.")
    if not 0.0 <= cfg.optim.decay_fraction <= 1.0:
        raise ConfigError(f"optim.decay_fraction={cfg.optim.decay_fraction} must lie in [0, 1].")
    _check_data(cfg.data)
    _check_steps(cfg.checkpoint.keep_steps)
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


def _check_steps(steps: list) -> None:
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in steps):
        raise ConfigError(f"checkpoint.keep_steps={steps}: give a list of positive step numbers, e.g. [30, 150].")


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


def warnings_of(cfg: Config) -> list[str]:
    """What is allowed but probably not meant."""
    o, t = cfg.optim, cfg.train
    out = []
    if o.warmup_steps > t.steps:
        out.append(f"optim.warmup_steps={o.warmup_steps} is more than train.steps={t.steps}: the learning rate"
                   f" never reaches optim.lr={o.lr:g} (it ends at {t.steps / o.warmup_steps:.0%} of it).")
    if 0 < t.hang_timeout >= cfg.parallel.timeout:
        out.append(f"train.hang_timeout={t.hang_timeout:g} is not below parallel.timeout={cfg.parallel.timeout:g}: a"
                   " rank waiting on a hung peer may fail in its collective first, recorded as 'rank lost' without"
                   " stacks.")
    return out


def config_text(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def dump_config(cfg: Config, path: Path) -> None:
    path.write_text(config_text(cfg))
