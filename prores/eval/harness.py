"""`prores eval`: lm-evaluation-harness on a run's model, through a prores backend.

:class:`ProresLM` is an ``lm_eval`` model (registered as ``prores``) around :class:`OneProcessModel`: a run's
checkpoint consolidated into one process, whatever tp and pp it trained with, each block's alpha that of the
checkpoint's step. ``loglikelihood`` scores a continuation from the full logits of context + continuation
(the context cut from the left to fit ``model.seq_length``); ``loglikelihood_rolling`` scores a text in the
harness's disjoint rolling windows of the sequence length; ``generate_until`` decodes greedily, stopping at
the end-of-document token or at the first stop sequence.

Results go to ``RUN/eval/<step>/results.json`` (what the harness's ``simple_evaluate`` returns, as its
own CLI writes it) and ``eval/<task>/<metric>`` scalars to the run's TensorBoard at the checkpoint's step.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Optional

import torch
from lm_eval import simple_evaluate
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.tasks import TaskManager, get_task_dict
from lm_eval.utils import get_rolling_token_windows, handle_non_serializable, make_disjoint_window

from prores.errors import UsageError
from prores.eval.tasks import TASKS, materialize
from prores.launcher.restore import OneProcessModel, pick_step
from prores.run.evals import metrics, results_path


@register_model("prores")
class ProresLM(TemplateLM):
    """``lm_eval --model prores --model_args run_dir=RUN[,step=N]`` or, in Python, ``ProresLM(model)``."""

    def __init__(self, model: Optional[OneProcessModel] = None, batch_size: int = 1, run_dir: Optional[str] = None,
                 step: Optional[int] = None, **_):
        super().__init__()
        if model is None:
            model = OneProcessModel.of(Path(run_dir)).load(Path(run_dir), pick_step(Path(run_dir), step))
        self.model, self.batch_size = model, int(batch_size)
        self.max_length = model.cfg.model.seq_length

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: Optional[dict] = None) -> "ProresLM":
        args = dict(kv.split("=", 1) for kv in arg_string.split(",") if kv)
        return cls(run_dir=args["run_dir"], step=int(args["step"]) if "step" in args else None,
                   batch_size=(additional_config or {}).get("batch_size") or 1)

    @property
    def eot_token_id(self) -> int:
        return self.model.tokenizer.eod

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        return self.model.tokenizer.encode(string).tolist()

    def tok_decode(self, tokens) -> str:
        return self.model.tokenizer.decode(tokens)

    @torch.no_grad()
    def _score(self, windows: list[tuple[list[int], int]]) -> list[tuple[float, bool]]:
        """Per (tokens, n): the log-probability of the last n tokens given those before them, and whether each
        is the greedy choice; in batches of ``batch_size``, right-padded (a causal model's earlier
        positions never see the padding)."""
        out = []
        for i in range(0, len(windows), self.batch_size):
            batch = windows[i:i + self.batch_size]
            width = max(len(t) for t, _ in batch) - 1
            inputs = torch.tensor([t[:-1] + [self.eot_token_id] * (width - len(t) + 1) for t, _ in batch])
            logprobs = torch.log_softmax(self.model.logits(inputs).double(), dim=-1)
            for row, (tokens, n) in zip(logprobs, batch):
                targets = torch.tensor(tokens[-n:])
                scored = row[len(tokens) - 1 - n:len(tokens) - 1]
                out.append((float(scored.gather(1, targets[:, None]).sum()),
                            bool((scored.argmax(-1) == targets).all())))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        windows = []
        for _, context, continuation in requests:
            whole = (context + continuation)[-(self.max_length + 1):]
            windows.append((whole, len(continuation)))
        return self._score(windows)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (text,) in (r.args for r in requests):
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                self.tok_encode(text), prefix_token=self.eot_token_id, max_seq_len=self.max_length, context_len=1)]
            out.append(sum(lp for lp, _ in self._score([(c + p, len(p)) for c, p in windows])))
        return out

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for context, gen in (r.args for r in requests):
            until = gen.get("until") or []
            until = [u for u in ([until] if isinstance(until, str) else until) if u]
            tokens, made = self.tok_encode(context), []
            for _ in range(int(gen.get("max_gen_toks", 256))):
                nxt = int(self.model.logits(torch.tensor([tokens[-self.max_length:]]))[0, -1].argmax())
                if nxt == self.eot_token_id:
                    break
                tokens.append(nxt)
                made.append(nxt)
                text = self.tok_decode(made)
                if any(u in text for u in until):
                    break
            text = self.tok_decode(made)
            for u in until:
                text = text.split(u)[0]
            out.append(text)
        return out


def task_dict(tasks: list[str], manager: TaskManager) -> dict:
    """The harness's tasks, built (and their data fetched if they need it); one error naming what is wrong."""
    known = set(manager.all_tasks)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        hints = {t: difflib.get_close_matches(t, known, n=3) for t in unknown}
        raise UsageError("unknown task " + "; ".join(
            f"{t!r}" + (f" (did you mean {', '.join(h)}?)" if h else "") for t, h in hints.items())
            + ". `lm_eval ls tasks` lists the harness's; prores ships prores_lastword and prores_rolling_ppl.")
    built = {}
    for task in tasks:
        try:
            built |= get_task_dict([task], manager)
        except Exception as exc:  # the datasets library's own errors: offline, not found, gated
            entry = manager.task_index.get(task)
            dataset = ((entry.cfg or {}).get("dataset_path") if entry else None) or "its dataset"
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UsageError(f"task {task} needs the dataset {dataset} (Hugging Face Hub), which could not be"
                             f" loaded: {type(exc).__name__}: {first}") from None
    return built


def evaluate(run_dir: Path, tasks: list[str], step: Optional[int] = None, limit: Optional[int] = None,
             batch_size: int = 1) -> Path:
    """Evaluate checkpoint ``step`` (default: the newest) of ``run_dir`` on the harness's ``tasks``."""
    run_dir = Path(run_dir)
    step = pick_step(run_dir, step)
    # the harness's own index reads its ~14k task YAMLs (a minute): only when a task needs it
    manager = TaskManager(include_path=str(materialize(run_dir / "eval" / "tasks")),
                          include_defaults=not set(tasks) <= set(TASKS))
    tasks_built = task_dict(tasks, manager)
    lm = ProresLM(OneProcessModel.of(run_dir).load(run_dir, step), batch_size=batch_size)
    results = simple_evaluate(model=lm, tasks=list(tasks_built.values()), limit=limit, task_manager=manager,
                              log_samples=False, bootstrap_iters=0)
    out = results_path(run_dir, step)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=handle_non_serializable))
    _log_scalars(run_dir, step, results["results"])
    return out


def _log_scalars(run_dir: Path, step: int, results: dict) -> None:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(run_dir), filename_suffix=".eval") as writer:
        for tag, value in metrics(results).items():
            writer.add_scalar(f"eval/{tag}", value, step)
