"""The ``prores`` console script: ``train``, ``preprocess``, ``sweep``, ``report``, ``compare``, ``analyze``, ``eval``, ``export``,
``plan``, ``config``."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

from prores.errors import UsageError


def _quiet_warnings() -> None:
    """Warnings about optional packages of Megatron-core and DeepSpeed never show."""
    for message in ("Transformer Engine and Apex are not installed", "full scope is deprecated",
                    ".*tp_group is None"):
        warnings.filterwarnings("ignore", message=message)


def _quiet_dependencies(verbose: bool) -> None:
    """For the commands that load DeepSpeed (the others do not, and config and sweep never import
    torch): its start-up chatter (its logger, and the prints prores silences with it) shows only with
    --verbose."""
    import torch

    if not torch.cuda.is_available():  # said, not detected: DeepSpeed warns on every start when it detects a CPU
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.utils.logging import set_log_level_from_string

    set_log_level_from_string("info" if verbose else "warning")  # the logger and its handler


def default_run_dir(config: str | None, cfg) -> Path:
    """``runs/<config name>``, and ``-<hash>`` of what ``--set`` changed if it changed anything: a run
    with other settings never resumes from, or lands in, the plain config's directory."""
    from prores.config import DEFAULT_CONFIG, load_config

    plain = load_config(config).flat()
    changed = {k: v for k, v in cfg.flat().items() if plain[k] != v}
    name = Path(config or DEFAULT_CONFIG).stem
    if not changed:
        return Path("runs") / name
    return Path("runs") / f"{name}-{hashlib.sha256(json.dumps(changed, sort_keys=True).encode()).hexdigest()[:8]}"


def _cmd_train(args) -> int:
    from prores.config import load_config
    from prores.parallel.rendezvous import launched_alone
    from prores.run.lock import refuse_a_live_holder_here

    if args.overwrite and not args.no_resume:
        raise UsageError("--overwrite goes with --no-resume (start afresh, deleting the old checkpoints);"
                         " without --no-resume `prores train` resumes.")
    cfg = load_config(args.config, tuple(args.set))
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(args.config, cfg)
    if launched_alone(os.environ):  # under a launcher every rank would say it: preflight says it once
        refuse_a_live_holder_here(run_dir)
    _quiet_dependencies(args.verbose)  # torch and DeepSpeed load only once the config is known to be good
    from prores.launcher.train import train
    from prores.run.callbacks import EXIT_DIVERGED, EXIT_LOST_LOCK

    summary = train(cfg, run_dir, resume=not args.no_resume, overwrite=args.overwrite)
    status = {"diverged": EXIT_DIVERGED, "lost_lock": EXIT_LOST_LOCK}.get(summary.status if summary else None, 0)
    if status:
        _end_torchrun_agent()
    return status


def _cmd_sweep(args) -> int:
    from prores.study.runners import run_local, run_slurm, to_start
    from prores.study.state import status_table
    from prores.study.sweep import check_unchanged, expand, select, write_cells

    if args.target[0] == "status":
        if len(args.target) != 2:
            raise UsageError("usage: prores sweep status SWEEP_DIR")
        print(status_table(Path(args.target[1])))
        return 0
    if len(args.target) != 1:
        raise UsageError("usage: prores sweep SPEC.yaml [--runner local|slurm] ... or prores sweep status SWEEP_DIR")
    sweep_dir, cells = expand(args.target[0], args.root, processes=1 if args.runner == "local" else None,
                              name=args.name, overrides=args.set)
    check_unchanged(sweep_dir, cells, args.target[0])
    chosen = select(cells, args.only)
    _warn_cells(chosen)
    cells_file = sweep_dir / "cells.jsonl"
    part = f" ({len(chosen)} chosen by --only)" if args.only else ""
    if args.dry_run:  # writes nothing
        print(f"prores sweep: {len(cells)} cells in {sweep_dir}{part} (dry run)", flush=True)
        if args.runner == "slurm":
            return run_slurm(sweep_dir, chosen, cells_file, dry_run=True)
        for cell in to_start(sweep_dir, chosen):
            print(" ".join(["prores", "train", *cell.train_args()]))
        return 0
    write_cells(sweep_dir, cells)
    print(f"prores sweep: {len(cells)} cells in {sweep_dir}{part} ({cells_file})", flush=True)
    if args.runner == "slurm":
        return run_slurm(sweep_dir, chosen, cells_file)
    return run_local(sweep_dir, chosen, jobs=args.jobs)


def _warn_cells(cells) -> None:
    """Each distinct config warning once, with the cells it concerns."""
    from prores.config import load_config, warnings_of

    concerns: dict[str, list[str]] = {}
    for cell in cells:
        for w in warnings_of(load_config(cell.base, tuple(cell.overrides))):
            concerns.setdefault(w, []).append(cell.name)
    for w, names in concerns.items():
        print(f"prores: warning: {len(names)} of {len(cells)} cells ({', '.join(names[:3])}"
              f"{', ...' if len(names) > 3 else ''}): {w}", flush=True)


def _cmd_compare(args) -> int:
    from prores.study.compare import compare

    print(compare(Path(args.short), Path(args.long), args.reference, args.treatment), end="")
    return 0


def _cmd_report(args) -> int:
    from prores.study.report import report

    out = report([Path(t) for t in args.targets], Path(args.out) if args.out else None)
    print(f"wrote {out / 'report.md'}, {out / 'results.csv'} and the plots in {out}")
    return 0


def _cmd_analyze(args) -> int:
    _quiet_dependencies(False)
    from prores.study.analyze import analyze

    out = analyze(Path(args.run_dir))
    print(f"wrote {out / 'cosine.csv'}, {out / 'cosine.png'} and the TensorBoard image analysis/cosine")
    return 0


def _cmd_eval(args) -> int:
    _quiet_dependencies(False)
    from prores.eval.harness import evaluate

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise UsageError("--tasks: give one or more task names, e.g. --tasks prores_lastword,prores_rolling_ppl")
    out = evaluate(Path(args.run_dir), tasks, step=args.step, limit=args.limit, batch_size=args.batch_size)
    print(f"wrote {out} and the scalars eval/<task>/<metric> in {args.run_dir}")
    return 0


def _cmd_export(args) -> int:
    _quiet_dependencies(False)
    from prores.eval.export import export_hf

    out = export_hf(Path(args.run_dir), Path(args.out), step=args.step)
    print(f"wrote a Hugging Face LlamaForCausalLM to {out}")
    return 0


def _cmd_config(args) -> int:
    from prores.config import key_docs, keys_markdown, load_config, methods_markdown
    from prores.model.layouts import LAYOUTS

    if args.markdown:
        print(methods_markdown() if args.methods else keys_markdown())
        return 0
    if args.methods:
        for m in LAYOUTS.values():
            print(f"{m.name:<11} {m.doc}\n{'':<11} {m.source}")
        return 0
    values = load_config(args.config, tuple(args.set)).flat()
    for doc in key_docs():
        value, default = json.dumps(values[doc.key]), json.dumps(doc.default)
        note = "" if value == default else f" [default {default}]"
        choices = f" ({', '.join(map(str, doc.choices))})" if doc.choices else ""
        print(f"{doc.key:<25} {value:<14} {doc.help}{choices}{note}")
    return 0


def _cmd_plan(args) -> int:
    from prores.config import load_config
    from prores.data.tokenizers import load_tokenizer
    from prores.parallel.plan import describe_plan, parse_memory

    cfg = load_config(args.config, tuple(args.set))
    if args.gpus < 1:
        raise UsageError(f"--gpus {args.gpus}: expected a positive number of GPUs")
    try:
        memory = parse_memory(args.gpu_memory)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(describe_plan(cfg, load_tokenizer(cfg.data.tokenizer).vocab_size, args.gpus, memory))
    return 0


def _cmd_doctor(args) -> int:
    from prores.launcher.doctor import doctor  # imports each dependency itself: a broken one is a finding

    return doctor(Path(args.run_root))


def _cmd_preprocess(args) -> int:
    from prores.data.preprocess import preprocess

    preprocess(args.inputs, args.output_prefix, json_key=args.json_key, tokenizer=args.tokenizer,
               workers=args.workers, on_bad_line=args.on_bad_line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prores", description="Train very deep transformers with Progressive Residual Warmup.",
        epilog="Run `prores COMMAND --help` for the options of one command.")
    # the deepspeed launcher passes --local_rank=N before the subcommand; LOCAL_RANK says the same
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    config = argparse.ArgumentParser(add_help=False)  # how train and config name a configuration
    config.add_argument("config", nargs="?", default=None, help="YAML config (default: packaged configs/tiny.yaml)")
    config.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key, e.g. --set model.num_layers=48, or apply a preset of"
                             " them, e.g. --set @paper-setup (the ProRes paper's training setup; repeatable, in order)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", parents=[config], help="train a model (default: the packaged tiny config)")
    p.add_argument("--run-dir", default=None, help="where events, config.yaml and checkpoints go (default:"
                                                   " runs/<config name>, plus -<hash> of what --set changes);"
                                                   " a run directory with checkpoints is resumed from the"
                                                   " newest good one")
    p.add_argument("--no-resume", action="store_true",
                   help="start fresh; refused if the run directory has checkpoints, unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="with --no-resume: delete the run directory's checkpoints and events first")
    p.add_argument("--verbose", action="store_true", help="show DeepSpeed's start-up messages (its INFO log)")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("preprocess", help="jsonl or text files -> Megatron PREFIX.bin / PREFIX.idx")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help=".jsonl (one JSON object per line) or text files")
    p.add_argument("--output-prefix", required=True, metavar="PREFIX")
    p.add_argument("--json-key", default="text", help="the text field of each jsonl object (default: text)")
    p.add_argument("--tokenizer", default="byte", help="'byte' or a local tokenizer.json (default: byte)")
    p.add_argument("--workers", type=int, default=1, help="tokenizer processes (default: 1)")
    p.add_argument("--on-bad-line", choices=("skip", "fail"), default="skip",
                   help="a malformed jsonl line is reported and skipped (default) or stops the run")
    p.set_defaults(func=_cmd_preprocess)

    p = sub.add_parser("sweep", help="run a sweep spec's cells, or `prores sweep status DIR`",
                       description="prores sweep SPEC.yaml [--runner local|slurm]: every cell of the spec's grid"
                                   " as its own `prores train`; prores sweep status SWEEP_DIR: a table of the cells.")
    p.add_argument("target", nargs="+", metavar="SPEC.yaml | status SWEEP_DIR")
    p.add_argument("--runner", choices=("local", "slurm"), default="local",
                   help="local: on this machine, --jobs at a time (default); slurm: sbatch job arrays")
    p.add_argument("--jobs", type=int, default=1, help="local runner: cells at a time (default 1)")
    p.add_argument("--root", default="runs", help="the sweep directory is ROOT/<sweep name> (default: runs)")
    p.add_argument("--name", default=None, help="the sweep's name (default: the spec's `name`, or its file name):"
                                                " a new name starts a new sweep directory beside the others")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key in every cell, after the spec's own settings (repeatable), e.g."
                        " --set kernels.backend=eager; part of the cells, so a sweep started without it refuses it")
    p.add_argument("--only", action="append", default=[], metavar="KEY=VALUE[,VALUE...]",
                   help="run only the cells with these grid values (repeat: all must match), e.g. --only train.seed=3")
    p.add_argument("--dry-run", action="store_true", help="print what would run or be submitted; write and run"
                                                          " nothing")
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser("report", help="a sweep's (or run directories') results: report.md, results.csv, plots")
    p.add_argument("targets", nargs="+", metavar="SWEEP_DIR | RUN_DIR...")
    p.add_argument("--out", default=None, help="where to write (default: the sweep directory, or ./report)")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("compare", help="two studies of the same cells (two training lengths, or two setups):"
                                       " losses, rankings with Kendall's tau, the paired ProRes - Pre-LN difference")
    p.add_argument("short", metavar="FIRST", help="a study's results.csv (`prores report`), or its sweep directory")
    p.add_argument("long", metavar="SECOND", help="the same methods trained longer, or under another setup")
    p.add_argument("--reference", default="Pre-LN", help="the method the treatment is paired with (default Pre-LN)")
    p.add_argument("--treatment", default="Pre-LN + ProRes", help="default: Pre-LN + ProRes")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("analyze", help="each layer's output over the kept checkpoints vs the final one (cosine)")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with checkpoints kept along the run")
    p.set_defaults(func=_cmd_analyze)

    p = sub.add_parser("eval", help="lm-evaluation-harness tasks on a run's checkpoint (pip install -e '.[eval]')",
                       description="Runs lm-evaluation-harness on a checkpoint of RUN_DIR through prores's own forward"
                                   " (any tp/pp, any method); writes RUN_DIR/eval/<step>/results.json and"
                                   " eval/<task>/<metric> scalars. Offline tasks: prores_lastword, prores_rolling_ppl.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--tasks", required=True, help="comma-separated harness task names")
    p.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the newest)")
    p.add_argument("--limit", type=int, default=None, help="at most this many documents per task")
    p.add_argument("--batch-size", type=int, default=1, help="sequences per forward pass (default 1)")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("export", help="a run's checkpoint as a Hugging Face model (LlamaForCausalLM)")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("out", metavar="OUT", help="the directory to write")
    p.add_argument("--format", choices=("hf",), default="hf", help="hf: config.json, safetensors, tokenizer")
    p.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the newest)")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("plan", parents=[config], help="memory per pipeline stage, and a layout that fits your GPUs")
    p.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    p.add_argument("--gpu-memory", required=True, metavar="SIZE", help="memory of one GPU, e.g. 80GB (GiB)")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("doctor", help="what this machine has for a run: versions, devices, launchers, Slurm,"
                       " kernel backends, disk; each ✓ or ✗ with its fix (run it first on a new machine)")
    p.add_argument("--run-root", default="runs", help="where runs will write (default: runs)")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("config", parents=[config], help="every config key with its value, default and meaning")
    p.add_argument("--markdown", action="store_true", help="the defaults as the manual's Markdown table (docs/reference/config-keys.md)")
    p.add_argument("--methods", action="store_true",
                   help="the residual methods (model.norm_layout) with their blocks and sources")
    p.set_defaults(func=_cmd_config)
    return parser


def _end_torchrun_agent() -> None:
    """torchrun answers a worker's failure with a ChildFailedError traceback of some 40 lines that buries
    the one-line message. A usage error or a divergence ends every worker alike, so each ends its
    torchrun agent instead (torchrun's exit status is then 137); under deepspeed and srun the
    launcher's own one-line report follows the message."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    agent = os.getppid()
    try:
        argv = Path(f"/proc/{agent}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if any(arg.endswith((b"torchrun", b"torch.distributed.run")) for arg in argv[:3]):
        os.kill(agent, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_warnings()
    try:
        return args.func(args)
    except UsageError as exc:
        # Every rank fails alike; rank 0 says it once. The others linger a moment so that a
        # launcher tearing the job down on the first exit does not kill rank 0 mid-message.
        if os.environ.get("RANK", "0") == "0":
            print(f"prores: error: {exc}", file=sys.stderr, flush=True)
        else:
            time.sleep(3)
        _end_torchrun_agent()
        return 2


if __name__ == "__main__":
    sys.exit(main())
