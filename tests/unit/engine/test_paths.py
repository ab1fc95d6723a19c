"""One place decides every fast path and says what it chose and why (``engine/devices/connector.py``): the record
(``paths``) in a run's summary.json and log, in ``leantrain eval``, ``generate`` and ``plan``; the converters in their
declared order; the forward paths (the decode step, GRPO's shared-prompt forward, the first-token layer) take the
decision written on the model and no longer choose themselves."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from leantrain.config import EfficiencyConfig, resolve
from leantrain.engine.devices.converters import CONVERTERS, Converter, convert_output_loss, convert_recast, ordered
from leantrain.engine.devices.efficiency import ModelChoices
from leantrain.engine.devices.paths import PathsContext
from leantrain.methods import TEXT, get_task
from leantrain.modeling import fast_paths
from leantrain.modeling.weight_casts import RecastLinear
from tests.helpers import (cli_here, grpo_args, lm_documents, make_tiny_bert, make_tiny_lm_tokenizer, switched,
                           write_grpo_files, write_jsonl)
from tests.tiny_models import loss_llama

COMMON = ["train.max_steps=1", "train.batch_size=4", "train.micro_batch_size=2", "report.plots=false",
          "report.progress=none", "checkpoint.every_steps=0", "efficiency.precision=fp32"]


def ok(*argv: str):
    out = cli_here(*argv)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def paths_of(run) -> dict:
    return json.loads((run / "summary.json").read_text())["paths"]


# ------------------------------------------------------------------------------------- what runs record and say


@pytest.fixture(scope="module")
def grpo(tmp_path_factory):
    root = write_grpo_files(tmp_path_factory.mktemp("grpo"))
    out = root / "run"
    log = ok("train", *grpo_args(root, out, "train.max_steps=1", "checkpoint.every_steps=0")).stderr
    return root, out, log


def test_a_grpo_run_records_the_fused_decode_step_and_the_shared_prompt_forward(grpo):
    _, out, log = grpo
    paths = paths_of(out)
    assert paths["decode_step"] == {"value": "fused", "reason": "llama is Llama-shaped: the fused decode step"}
    assert paths["shared_prompts"]["value"] is True and "first_token" not in paths
    assert list(paths)[:1] == ["attention"] and {"weight_casts", "output_loss", "compile"} <= set(paths)
    for line in ("decode step: fused (llama is Llama-shaped: the fused decode step)", "shared-prompt forward: on (",
                 "chunked loss: off (auto: vocabulary", "attention: ", "torch.compile: off ("):
        assert line in log, line


def test_leantrain_eval_of_a_grpo_model_records_its_decode_step_and_no_training_path(grpo, tmp_path):
    root, out, _ = grpo
    rewards = f"grpo.rewards=[{root / 'rewards.py'}:has_digit,{root / 'rewards.py'}:short]"
    log = ok("eval", str(out / "model"), f"data.eval={root / 'eval.jsonl'}", rewards, "--output",
             str(tmp_path / "m.json")).stderr
    paths = json.loads((tmp_path / "m.json").read_text())["paths"]
    assert paths["decode_step"]["value"] == "fused" and "decode step: fused (" in log
    assert "shared_prompts" not in paths and "dropout" not in paths and "compile" not in paths
    assert paths["output_loss"]["value"] == "off"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A tiny GPT-2 from a config trained one step with a sample prompt (the run generates)."""
    root = tmp_path_factory.mktemp("gpt2")
    tok = make_tiny_lm_tokenizer(root / "tok")
    (root / "lm.txt").write_text("\n\n".join(lm_documents(40, 0)))
    args = ["model.config_type=gpt2", "model.config_overrides.n_embd=32", "model.config_overrides.n_layer=2",
            "model.config_overrides.n_head=2", "model.config_overrides.n_positions=64", f"model.tokenizer={tok}",
            "model.task=causal-lm", f"data.train={root / 'lm.txt'}", "data.block_size=16", "data.eval_fraction=0.1",
            "report.sample_prompts=[hello world]", "report.sample_max_new_tokens=3", *COMMON,
            f"output_dir={root / 'run'}"]
    return root, root / "run", ok("train", *args).stderr


GPT2_WHY = "gpt2 is not Llama-shaped (llama, mistral, qwen2): transformers' forward"


def test_a_gpt2_run_that_generates_records_the_transformers_decode_step_and_why(gpt2):
    _, out, log = gpt2
    paths = paths_of(out)
    assert paths["decode_step"] == {"value": "transformers", "reason": GPT2_WHY}
    assert f"decode step: transformers ({GPT2_WHY})" in log
    assert paths["dropout"]["value"] == "fast" and "dropout: fast (" in log  # GPT-2's dropout 0.1, on the CPU
    assert "shared_prompts" not in paths and "first_token" not in paths


def test_leantrain_generate_says_its_decode_step_and_attention(gpt2, capsys):
    _, out, _ = gpt2
    run = cli_here("generate", str(out), "--prompt", "hello world", "--max-new-tokens", "3", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    paths = json.loads(run.stdout)["paths"]
    assert list(paths) == ["attention", "decode_step"] and paths["decode_step"]["reason"] == GPT2_WHY
    assert f"decode step: transformers ({GPT2_WHY})" in run.stderr and "attention: " in run.stderr


def test_leantrain_eval_of_a_language_model_records_its_output_loss_and_no_decode_step(gpt2, tmp_path):
    root, out, _ = gpt2
    ok("eval", str(out / "model"), f"data.eval={root / 'lm.txt'}", "--output", str(tmp_path / "m.json"))
    paths = json.loads((tmp_path / "m.json").read_text())["paths"]
    assert set(paths) == {"attention", "output_loss"}  # it computes losses, it generates nothing


def pair_rows(n: int) -> list[dict]:
    good, bad = ["Hello world.", "The answer is 4.", "Eat well."], ["Numbers?", "Red weather.", "No."]
    return [{"prompt": f"What is {i % 5} + 1?", "chosen": good[i % 3], "rejected": bad[(i + 1) % 3]} for i in range(n)]


@pytest.fixture(scope="module")
def bert_runs(tmp_path_factory):
    """A BERT reward model and a BERT classifier (dropout 0.1), one step each."""
    root = tmp_path_factory.mktemp("bert")
    bert = make_tiny_bert(root / "bert", layers=1, hidden=16, dropout=0.1)
    pairs = [f"data.train={write_jsonl(root / 'pairs.jsonl', pair_rows(12))}",
             f"data.eval={write_jsonl(root / 'pairs_dev.jsonl', pair_rows(4))}"]
    rm = ok("train", f"model.name={bert}", *pairs, *COMMON, f"output_dir={root / 'rm'}").stderr
    texts = [{"text": "good fine" if i % 2 else "bad poor", "label": i % 2} for i in range(12)]
    data = [f"data.train={write_jsonl(root / 'texts.jsonl', texts)}", "data.eval_fraction=0.25"]
    cls = ok("train", f"model.name={bert}", *data, *COMMON, f"output_dir={root / 'cls'}").stderr
    return root, (root / "rm", rm), (root / "cls", cls)


FIRST_TOKEN_WHY = "the pooler reads the first token alone: the last layer computes that token only"


def test_a_bert_reward_model_records_its_first_token_layer_and_a_classifier_none(bert_runs):
    _, (rm, rm_log), (cls, cls_log) = bert_runs
    paths = paths_of(rm)
    assert paths["first_token"] == {"value": True, "reason": FIRST_TOKEN_WHY}
    assert f"first-token last layer: on ({FIRST_TOKEN_WHY})" in rm_log
    assert paths["dropout"]["value"] == "off" and "dropout: off in " in rm_log
    assert "decode_step" not in paths and "shared_prompts" not in paths
    plain = paths_of(cls)
    assert "first_token" not in plain and plain["dropout"]["value"] == "fast"  # only the reward model takes it
    assert "first-token" not in cls_log


def test_leantrain_eval_records_the_reward_models_first_token_layer_and_the_classifiers_attention(bert_runs, tmp_path):
    root, (rm, _), (cls, _) = bert_runs
    ok("eval", str(rm / "model"), f"data.eval={root / 'pairs_dev.jsonl'}", "--output", str(tmp_path / "rm.json"))
    assert json.loads((tmp_path / "rm.json").read_text())["paths"]["first_token"]["value"] is True
    ok("eval", str(cls / "model"), f"data.eval={root / 'texts.jsonl'}", "--output", str(tmp_path / "cls.json"))
    assert list(json.loads((tmp_path / "cls.json").read_text())["paths"]) == ["attention"]


def test_leantrain_plan_prints_and_returns_what_train_chooses(grpo):
    root, _, _ = grpo
    args = [*grpo_args(root, root / "unused")[:-1], "efficiency.gradient_checkpointing=true"]  # no output_dir
    run = ok("plan", *args, "--json")
    planned = json.loads(run.stdout)
    paths = planned["paths"]
    # the training rows are prompts and their completions; generation holds a KV cache of every row's positions
    gen = planned["grpo_generation"]
    assert planned["seq_len"] > 8 and gen["positions"] >= 8 and gen["rows"] == 4 * 4  # the step's 4 prompts x G
    assert gen["kv_cache_bytes"] > 0 and gen["decode_copies_bytes"] > 0 and gen["logits_bytes"] > 0
    assert paths["decode_step"]["value"] == "fused" and paths["gradient_checkpointing"]["value"] is True
    assert paths["shared_prompts"] == {"value": False, "reason": "gradient checkpointing drops the cache "
                                       "(efficiency.gradient_checkpointing=true)"}
    printed = ok("plan", *args).stdout
    assert "fast paths (as train chooses them):" in printed and "generation peak" in printed
    assert any(line.split()[:2] == ["decode_step", "fused"] for line in printed.splitlines())


# ----------------------------------------------------------------------------------------------------- converters


def test_the_converters_run_in_the_order_they_declare_whatever_order_they_are_listed_in():
    for listed in (CONVERTERS, CONVERTERS[::-1], CONVERTERS[2:] + CONVERTERS[:2]):
        names = [c.name for c in ordered(listed)]
        for c in listed:
            assert all(names.index(a) < names.index(c.name) for a in c.after), (names, c.name)
    assert [c.name for c in ordered()][-1] == "compile"  # after every other: the graph sees each change
    noop = lambda *a: None  # noqa: E731
    with pytest.raises(ValueError, match="a cycle"):
        ordered((Converter("a", noop, noop, after=("b",)), Converter("b", noop, noop, after=("a",))))
    with pytest.raises(ValueError, match="names no converter: c"):
        ordered((Converter("a", noop, noop, after=("c",)),))


def test_the_output_loss_and_the_weight_casts_commute(monkeypatch):
    """The output loss is a mark and a pre-hook on the output layer, and the weight casts change the layer's class in
    place: in either order the layer is a RecastLinear whose plain forward makes its casts again, and the loss is
    installed (no order to declare between them; compile's ``after`` is tested above)."""
    from leantrain.modeling.chunked_loss import is_installed

    calls = []
    recast_forward = RecastLinear.forward
    monkeypatch.setattr(RecastLinear, "forward", lambda self, x: calls.append(1) or recast_forward(self, x))
    choices = ModelChoices(None, "", False, "", True, "as configured")
    eff = EfficiencyConfig(chunked_loss=True)
    declared = loss_llama(tied=False)
    paths = switched(declared, eff, choices=choices)
    assert paths["weight_casts"].value is True and paths["output_loss"].value == "chunked"
    swapped = loss_llama(tied=False)
    context = PathsContext("train", torch.device("cpu"), eff, choices, get_task(TEXT).traits)
    convert_output_loss(swapped, context, None)  # the other order
    convert_recast(swapped, context, paths["weight_casts"])
    hidden = torch.randn(2, 3, 32)
    for model in (declared, swapped):
        assert type(model.lm_head) is RecastLinear and is_installed(model)
        calls.clear()
        model.lm_head(hidden)  # the plain path
        assert len(calls) == 1


# -------------------------------------------------------------------------- the forward paths take the decision


def test_the_shared_prompt_forward_takes_the_decision_on_the_model():
    from leantrain.methods.grpo import forward as F
    from leantrain.modeling.switches import enable_checkpointing

    model = loss_llama()
    assert F.shares_prompts(model)  # no command set it up: its own probe
    fast_paths.decide(model, fast_paths.SHARED_PROMPTS, False)
    assert not F.shares_prompts(model) and not F.shares_prompts(copy.deepcopy(model))  # a copy takes it too
    fast_paths.decide(model, fast_paths.SHARED_PROMPTS, True)
    assert F.shares_prompts(model)
    enable_checkpointing(model)  # the memory planner's calibration passes: never under checkpointing
    assert not F.shares_prompts(model)


def test_generation_takes_the_decode_step_the_run_decided(monkeypatch):
    from leantrain.modeling.generation import fast_decode
    from leantrain.modeling.generation.decode import generate
    from leantrain.modeling.generation.sampling import Sampling

    made = []
    decoder = fast_decode.Decoder
    monkeypatch.setattr(fast_decode, "Decoder", lambda *a: made.append(1) or decoder(*a))
    model = loss_llama().eval()
    ids, mask = torch.tensor([[5, 6, 7], [0, 8, 9]]), torch.tensor([[1, 1, 1], [0, 1, 1]])

    def tokens():
        return generate(model, ids, mask, num_generations=1, sampling=Sampling(4, temperature=0), eos_ids=[2],
                        pad_id=0).completion_ids

    fused = tokens()
    assert len(made) == 1  # a Llama no command set up: fused
    fast_paths.decide(model, fast_paths.DECODE_STEP, "transformers")
    assert torch.equal(tokens(), fused) and len(made) == 1  # the decision: transformers' forward, the same tokens


def test_the_first_token_layer_takes_the_decision_on_the_model():
    from leantrain.modeling.first_token import first_token_last_layer, last_layer
    from tests.tiny_models import tiny_bert_classifier

    model = tiny_bert_classifier()
    layer = last_layer(model)
    with first_token_last_layer(model):
        assert "forward" in vars(layer)  # no command set it up: its own probe
    fast_paths.decide(model, fast_paths.FIRST_TOKEN, False)
    with first_token_last_layer(model):
        assert "forward" not in vars(layer)


def test_strategies_that_shard_or_wrap_the_model_turn_the_forward_paths_off():
    grpo_traits = get_task("grpo").traits
    llama = switched(loss_llama(), traits=grpo_traits, strategy="fsdp", generates=True)
    assert llama["decode_step"].value == "transformers" and "shards the weights" in llama["decode_step"].reason
    assert llama["shared_prompts"].value is False
    ds = switched(loss_llama(), traits=grpo_traits, strategy="deepspeed")
    assert ds["shared_prompts"].value is False and ds["decode_step"].value == "fused"  # ZeRO-3: checked as it runs
    from tests.tiny_models import tiny_bert_classifier

    rm = get_task("reward-model").configured(resolve(None, ["model.task=reward-model"])).traits
    assert switched(tiny_bert_classifier(), traits=rm)["first_token"].value is True
    assert switched(tiny_bert_classifier(), traits=rm, strategy="fsdp")["first_token"].value is False
