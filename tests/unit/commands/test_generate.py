"""Continuations (leantrain.modeling.generation.continuations) and ``leantrain generate`` on a tiny random Llama
with a ~90-word tokenizer: greedy is the argmax chain and repeatable, batching (left padding) changes nothing, sampling is seeded
and leaves the caller's RNG alone, the chat template wraps prompts when present, eval mode is restored; a run's
prompts are rendered as it trained (system prompt, template)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from leantrain.cli import main
from leantrain.errors import UserError
from leantrain.modeling.generation.continuations import continuations
from leantrain.modeling.generation.prompts import prompt_texts
from leantrain.methods import get_task
from tests.helpers import CHATML, make_tiny_chat_tokenizer, make_tiny_llama, make_tiny_lm_tokenizer

TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}assistant :{% endif %}")


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-lm")
    return make_tiny_llama(root / "model", make_tiny_lm_tokenizer(root / "tokenizer"))


@pytest.fixture
def loaded(tiny_lm):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_lm), AutoTokenizer.from_pretrained(tiny_lm)


def greedy_by_hand(model, tokenizer, prompt: str, n: int) -> str:
    """The argmax chain, one full forward per token, no padding, no cache."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    start = ids.shape[1]
    with torch.no_grad():
        for _ in range(n):
            nxt = model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            if nxt.item() == tokenizer.eos_token_id:
                break
    return tokenizer.decode(ids[0, start:], skip_special_tokens=True)


def test_greedy_is_the_argmax_chain_and_batching_changes_nothing(loaded):
    model, tok = loaded
    prompts = ["hello world", "once upon a time there lived a king", "the red cat"]  # different lengths: padding
    batched = continuations(model, tok, prompts, max_new_tokens=6)
    assert batched == continuations(model, tok, prompts, max_new_tokens=6)  # repeatable
    assert batched == [greedy_by_hand(model, tok, p, 6) for p in prompts]
    assert batched == [continuations(model, tok, [p], max_new_tokens=6)[0] for p in prompts]
    assert all(b and not b.startswith(p) for b, p in zip(batched, prompts))  # only the new text
    assert tok.padding_side == "right" and tok.pad_token is None  # the tokenizer is left as it was


def test_sampling_is_seeded_and_leaves_the_callers_rng_alone(loaded):
    model, tok = loaded
    prompts = ["hello world", "the red cat"]
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = continuations(model, tok, prompts, max_new_tokens=8, temperature=1.0, seed=1)
    assert torch.equal(torch.get_rng_state(), before)
    assert a == continuations(model, tok, prompts, max_new_tokens=8, temperature=1.0, seed=1)
    b = continuations(model, tok, prompts, max_new_tokens=8, temperature=1.0, seed=2)
    assert a != b
    assert a != continuations(model, tok, prompts, max_new_tokens=8)  # sampling is not the greedy text
    assert continuations(model, tok, prompts, max_new_tokens=8, temperature=1.0, top_p=1e-6, seed=3) == \
        continuations(model, tok, prompts, max_new_tokens=8)  # a tiny nucleus keeps the top token only


def test_chat_template_applied_when_present(loaded, monkeypatch):
    model, tok = loaded
    with pytest.raises(UserError, match="no chat template"):
        continuations(model, tok, ["hello"], max_new_tokens=2, chat=True)
    assert prompt_texts(tok, ["hello world"]) == (["hello world"], False)
    tok.chat_template = TEMPLATE
    texts, templated = prompt_texts(tok, ["hello world"])
    assert templated and texts == ["user : hello world assistant :"]
    seen = []
    from leantrain.modeling.generation import continuations as module

    def spy(model, ids, mask, **kwargs):
        seen.append(tok.batch_decode(ids, skip_special_tokens=True))
        return generate(model, ids, mask, **kwargs)

    generate = module.generate
    monkeypatch.setattr(module, "generate", spy)
    auto = continuations(model, tok, ["hello world"], max_new_tokens=4)
    plain = continuations(model, tok, ["hello world"], max_new_tokens=4, chat=False)
    assert seen == [["user : hello world assistant :"], ["hello world"]]
    assert auto == continuations(model, tok, ["user : hello world assistant :"], max_new_tokens=4, chat=False)
    assert plain == continuations(model, tok, ["hello world"], max_new_tokens=4, chat=False)


def test_eval_mode_restored_and_arguments_checked(loaded):
    model, tok = loaded
    model.train()
    continuations(model, tok, ["hello"], max_new_tokens=2)
    assert model.training
    model.eval()
    continuations(model, tok, ["hello"], max_new_tokens=2)
    assert not model.training
    for bad in ({"max_new_tokens": 0}, {"max_new_tokens": 2, "temperature": -1}, {"max_new_tokens": 2, "top_p": 0}):
        with pytest.raises(UserError):
            continuations(model, tok, ["hello"], **bad)


def test_generate_command_json_and_run_folder(tiny_lm, tmp_path, capsys, loaded):
    model, tok = loaded
    run = tmp_path / "run"
    shutil.copytree(tiny_lm, run / "model")
    expected = continuations(model, tok, ["hello world", "the cat"], max_new_tokens=5)
    assert main(["generate", str(run), "--prompt", "hello world", "--prompt", "the cat", "--max-new-tokens", "5",
                 "--json"]) == 0  # a run folder stands for its model/
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == str(run / "model") and out["chat"] is False and out["temperature"] == 0.0
    assert [c["text"] for c in out["continuations"]] == expected
    assert [c["prompt"] for c in out["continuations"]] == ["hello world", "the cat"]
    assert main(["generate", str(run / "model"), "--prompt", "hello world", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out == expected[0] + "\n"
    args = ["--prompt", "hello world", "--max-new-tokens", "5", "--temperature", "1", "--seed", "7", "--json"]
    assert main(["generate", str(run), *args]) == 0
    first = json.loads(capsys.readouterr().out)["continuations"]
    assert main(["generate", str(run), *args]) == 0
    assert json.loads(capsys.readouterr().out)["continuations"] == first


def test_generate_command_errors(tmp_path, capsys, tiny_bert):
    assert main(["generate", str(tmp_path / "nope") + "/", "--prompt", "x"]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["generate", str(tiny_bert), "--prompt", "x"]) == 2  # a BertModel: no language-model head
    assert "not a causal language model" in capsys.readouterr().err
    assert main(["generate", str(tmp_path), "--prompt", "x", "--max-new-tokens", "0"]) == 2


def test_generate_renders_the_prompt_as_the_run_trained(tmp_path, capsys):
    """A run on instruction data keeps its template, system prompt and format in model/leantrain.json; generate
    renders each prompt as that run's training did (system prompt included), --system replaces the run's, and a
    system prompt or tools with nowhere to go exit 2."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leantrain.config import resolve
    from leantrain.engine.setup.run_settings import write_run_settings

    model_dir = make_tiny_llama(tmp_path / "run" / "model",
                                make_tiny_chat_tokenizer(tmp_path / "tok", chat_template=CHATML))
    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)

    def trained_with(*keys):
        cfg = resolve(None, ["model.task=causal-lm", "data.system_prompt=Answer briefly.", *keys])
        write_run_settings(model_dir, cfg, get_task("causal-lm"), {"format": "alpaca"})

    def run(*extra):
        code = main(["generate", str(model_dir), "--prompt", "Hi", "--max-new-tokens", "3", "--json", *extra])
        return code, (json.loads(capsys.readouterr().out) if code == 0 else capsys.readouterr().err)

    def expected(prompts, **kw):
        return [continuations(model, tok, prompts, max_new_tokens=3, **kw)[0]]

    trained_with()
    _, out = run()
    assert out["chat"] is True and out["system"] == "Answer briefly."
    assert [c["text"] for c in out["continuations"]] == expected(["Hi"], system="Answer briefly.")
    _, out = run("--system", "Be a pirate.")
    assert out["system"] == "Be a pirate." and [c["text"] for c in out["continuations"]] == expected(
        ["Hi"], system="Be a pirate.")
    assert run("--system", "")[1]["system"] is None
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"name": "add", "parameters": {"type": "object"}}]))
    assert run("--tools", str(tools))[0] == 0
    (tmp_path / "bad.json").write_text("{not json")
    code, err = run("--tools", str(tmp_path / "bad.json"))
    assert code == 2 and "--tools" in err and "not valid JSON" in err
    code, err = run("--no-chat", "--system", "Be a pirate.")
    assert code == 2 and "no place for them" in err
    trained_with("data.template=plain")  # the plain template, the system text before the turn
    _, out = run()
    assert out["chat"] is False and [c["text"] for c in out["continuations"]] == expected(
        ["Answer briefly.\n\n### Instruction:\nHi\n\n### Response:\n"], chat=False)
