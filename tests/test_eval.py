"""`prores eval` through lm-evaluation-harness and `prores export` to Hugging Face: the offline tasks end to end,
a pp=2 run evaluated through prores against its export evaluated through the harness's own `hf` backend,
export logits against prores's forward, refusals, and a task that needs a download without network."""

import json
import math

import pytest
import torch
from tensorboard.backend.event_processing import event_accumulator

from conftest import run_cli, torchrun, train_args

pytestmark = pytest.mark.slow

STEPS = 12
TRAIN = ("model.num_layers=2", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_heads=4",
         "model.seq_length=64", "train.micro_batch_size=8", f"train.steps={STEPS}", "data.eval_samples=16",
         "train.eval_interval=12", "train.log_interval=12", "kernels.backend=eager", "optim.lr=3e-3",
         "optim.warmup_steps=2", "prores.T=0.5", "logging.progress_bar=false")
TASKS = "prores_lastword,prores_rolling_ppl"
LIMIT = 20


@pytest.fixture(scope="module")
def pp2_run(tmp_path_factory):
    """Trained over two pipeline stages; ProRes (T = 0.5) saturated long before the end, so a Llama."""
    run_dir = tmp_path_factory.mktemp("pp2") / "run"
    proc = run_cli(*train_args(run_dir, TRAIN + ("parallel.pp=2",)), launcher=torchrun(2), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def metrics(results_json) -> dict:
    return {f"{task}/{k}": v for task, values in json.loads(results_json.read_text())["results"].items()
            for k, v in values.items() if isinstance(v, float)}


def test_eval_writes_the_harness_results_and_scalars(pp2_run):
    proc = run_cli("eval", str(pp2_run), "--tasks", TASKS, "--limit", str(LIMIT), "--batch-size", "4", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = pp2_run / "eval" / str(STEPS) / "results.json"
    got = metrics(results)
    assert set(got) == {"prores_lastword/perplexity,none", "prores_lastword/acc,none",
                        "prores_rolling_ppl/word_perplexity,none", "prores_rolling_ppl/byte_perplexity,none",
                        "prores_rolling_ppl/bits_per_byte,none"}
    # bits per byte and byte perplexity are one number two ways: log2(byte ppl)
    assert got["prores_rolling_ppl/bits_per_byte,none"] == pytest.approx(
        math.log2(got["prores_rolling_ppl/byte_perplexity,none"]), rel=1e-12)
    assert json.loads(results.read_text())["n-samples"]["prores_lastword"]["effective"] == LIMIT
    acc = event_accumulator.EventAccumulator(str(pp2_run), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    for tag, value in got.items():
        events = acc.Scalars(f"eval/{tag.split(',')[0]}")
        assert [e.step for e in events] == [STEPS] and events[0].value == pytest.approx(value, rel=1e-6)


def test_the_export_is_the_run_as_a_llama(pp2_run, tmp_path):
    """transformers' LlamaForCausalLM on the export against prores's own forward, fp32: two implementations of
    the same fp32 arithmetic, the logits equal within rtol 1e-5 (measured ~2e-7)."""
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    from prores.launcher.restore import OneProcessModel

    proc = run_cli("export", str(pp2_run), str(tmp_path / "hf"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tok = PreTrainedTokenizerFast.from_pretrained(tmp_path / "hf")
    text = "What's in a name? That which we call a rose\nBy any other name would smell as sweet."
    assert tok(text)["input_ids"] == list(text.encode()) and tok.decode(tok(text)["input_ids"]) == text
    ours = OneProcessModel.of(pp2_run).load(pp2_run, STEPS)
    tokens = torch.tensor([list(text.encode())[:64]])
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, ours.logits(tokens), rtol=1e-5, atol=1e-5)


def test_prores_eval_of_the_run_equals_the_harness_hf_backend_on_its_export(pp2_run, tmp_path):
    """The same checkpoint, read two ways: prores's backend consolidating the two stages, and lm-eval's own
    `hf` backend on the export. Each score is a sum of fp32 log-probabilities that agree to ~1e-7 relative,
    so the metrics agree to 1e-6."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    assert run_cli("export", str(pp2_run), str(tmp_path / "hf"), timeout=600).returncode == 0
    ours = pp2_run / "eval" / str(STEPS) / "results.json"
    if not ours.is_file():
        assert run_cli("eval", str(pp2_run), "--tasks", TASKS, "--limit", str(LIMIT), timeout=900).returncode == 0
    lm = HFLM(pretrained=str(tmp_path / "hf"), batch_size=4, device="cpu", max_length=64)
    theirs = simple_evaluate(model=lm, tasks=TASKS.split(","), limit=LIMIT, bootstrap_iters=0,
                             task_manager=TaskManager(include_path=str(pp2_run / "eval" / "tasks")))
    (tmp_path / "hf.json").write_text(json.dumps({"results": theirs["results"]}, default=str))
    got, want = metrics(ours), metrics(tmp_path / "hf.json")
    assert got.keys() == want.keys()
    for key in got:
        assert got[key] == pytest.approx(want[key], rel=1e-6), key


def test_greedy_generation_stops_where_it_should(pp2_run):
    from lm_eval.api.instance import Instance

    from prores.eval.harness import ProresLM

    lm = ProresLM(run_dir=str(pp2_run))
    context = "ROMEO.\nO, she doth teach the torches to burn bright"
    tokens, made = list(context.encode()), []
    for _ in range(30):  # the greedy continuation, by hand
        nxt = int(lm.model.logits(torch.tensor([tokens[-64:]]))[0, -1].argmax())
        if nxt == lm.eot_token_id:
            break
        tokens.append(nxt)
        made.append(nxt)
    greedy = bytes(t for t in made if t < 256).decode("utf-8", errors="replace")
    out = lm.generate_until([Instance("generate_until", {}, (context, {"until": [], "max_gen_toks": 30}), 0)])
    assert out == [greedy]
    stop = greedy[3:5]
    cut = lm.generate_until([Instance("generate_until", {}, (context, {"until": [stop], "max_gen_toks": 30}), 0)])
    assert cut == [greedy.split(stop)[0]]


def test_a_post_ln_run_is_refused_with_its_reason(tmp_path):
    run_dir = tmp_path / "post"
    assert run_cli(*train_args(run_dir, TRAIN + ("model.norm_layout=post", "train.steps=2")), timeout=600).returncode == 0
    proc = run_cli("export", str(run_dir), str(tmp_path / "hf"), timeout=600)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"prores: error: {run_dir} (step 2) cannot be exported as a Hugging Face Llama: model.norm_layout=post:"
        " Llama's blocks are Pre-LN."]
    assert not (tmp_path / "hf").exists()


def test_a_task_that_needs_a_download_fails_in_one_line_offline(pp2_run):
    proc = run_cli("eval", str(pp2_run), "--tasks", "lambada_openai", "--limit", "1", timeout=600,
                   HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("prores: error: task lambada_openai needs the dataset EleutherAI/lambada_openai"), last


def test_a_local_tokenizer_json_run_evaluates_and_exports(tmp_path):
    """A word-level tokenizer.json (an <|endoftext|> for documents, and a post-processor that puts a BOS before
    each text, as Llama's do): eval runs through it, and the export encodes text exactly as training did."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import AutoTokenizer

    words = sorted({w for line in open(__file__) for w in line.split()})[:2000]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", "<|endoftext|>", "<s>", *words])},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    tok.save(str(tmp_path / "tokenizer.json"))
    run_dir = tmp_path / "run"
    proc = run_cli(*train_args(run_dir, TRAIN + (f"data.tokenizer={tmp_path / 'tokenizer.json'}", "train.steps=2")),
                   timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert run_cli("eval", str(run_dir), "--tasks", "prores_lastword", "--limit", "5", timeout=900).returncode == 0
    assert (run_dir / "eval" / "2" / "results.json").is_file()
    assert run_cli("export", str(run_dir), str(tmp_path / "hf"), timeout=600).returncode == 0
    text = "def test the export is the run"
    trained = tok.encode(text, add_special_tokens=False).ids  # what prores.data.tokenizers feeds the model
    assert tok.encode(text).ids == [2, *trained]  # the post-processor is there, and adds a BOS
    assert AutoTokenizer.from_pretrained(str(tmp_path / "hf"))(text)["input_ids"] == trained
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|endoftext|>"
