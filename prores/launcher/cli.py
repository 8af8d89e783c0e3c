"""The ``prores`` console script: ``prores train`` and ``prores preprocess``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings
from pathlib import Path

from prores.errors import UsageError


def _quiet_dependencies() -> None:
    for message in ("Transformer Engine and Apex are not installed", "full scope is deprecated",
                    ".*tp_group is None"):
        warnings.filterwarnings("ignore", message=message)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    try:
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(logging.WARNING)
    except ImportError:
        pass


def _cmd_train(args) -> int:
    from prores.config import load_config
    from prores.launcher.train import train

    if args.overwrite and not args.no_resume:
        raise UsageError("--overwrite goes with --no-resume (start afresh, deleting the old checkpoints);"
                         " without --no-resume `prores train` resumes.")
    cfg = load_config(args.config, tuple(args.set))
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / Path(args.config or "tiny").stem
    train(cfg, run_dir, resume=not args.no_resume, overwrite=args.overwrite)
    return 0


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
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train a model (default: the packaged tiny config)")
    p.add_argument("config", nargs="?", default=None, help="YAML config (default: packaged configs/tiny.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, e.g. --set model.num_layers=48 (repeatable)")
    p.add_argument("--run-dir", default=None, help="where events, config.yaml and checkpoints go"
                                                   " (default: runs/<config name>); a run directory with"
                                                   " checkpoints is resumed from the newest good one")
    p.add_argument("--no-resume", action="store_true",
                   help="start fresh; refused if the run directory has checkpoints, unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="with --no-resume: delete the run directory's checkpoints and events first")
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_dependencies()
    try:
        return args.func(args)
    except UsageError as exc:
        # Every rank fails alike; rank 0 says it once. The others linger a moment so that a
        # launcher tearing the job down on the first exit does not kill rank 0 mid-message.
        if os.environ.get("RANK", "0") == "0":
            print(f"prores: error: {exc}", file=sys.stderr, flush=True)
        else:
            time.sleep(3)
        return 2


if __name__ == "__main__":
    sys.exit(main())
