"""GRPO's prompts data side (issue 33 part 3): text and conversational prompts rendered as SFT renders the prompt of
a row it trains on, the other columns kept for the rewards and collated as lists, left padding, long prompts keep
their end, bad rows named by file and line, prompt-only data detected for model.task=auto and refused by SFT."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from leantrain.config import resolve
from leantrain.data.lm import arithmetic
from leantrain.data.lm import rendering as rd
from leantrain.data.modalities import for_modality
from leantrain.errors import DataError
from tests.helpers import CHATML, CHATML_GENERATION, make_tiny_chat_tokenizer, write_jsonl

pytestmark = pytest.mark.usefixtures("own_datasets_cache")
Q, A = "What is 2 + 2?", "The answer is 4."
SIDE = for_modality("prompts")


def write(path, rows, array: bool = False) -> str:
    if array:  # a JSON array
        path.write_text(json.dumps(rows))
    return str(path if array else write_jsonl(path, rows))


def cfg(**data):
    """data.* as key=value overrides."""
    overrides = [f"data.{k}={v}" for k, v in data.items()]
    return resolve(None, overrides).data


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    def make(template):
        return AutoTokenizer.from_pretrained(make_tiny_chat_tokenizer(tmp_path_factory.mktemp("tok"),
                                                                      chat_template=template))
    return {"chat": make(CHATML), "generation": make(CHATML_GENERATION), "plain": make(None)}


def processed(tmp_path, tok, rows, array=False, **data):
    c = cfg(train=write(tmp_path / ("train.json" if array else "train.jsonl"), rows, array),
            eval=write(tmp_path / "eval.jsonl", rows[:1]), **data)
    prepared = SIDE.load_and_validate(c, seed=0, batch_size=1)
    return prepared, SIDE.process(prepared.train, tok, c, desc="Processing train")


def sft_prompt_ids(tok, messages, template="auto") -> list[int]:
    """The ids SFT renders before the response of the conversation answered by A."""
    rendering = rd.choose_rendering(tok, template, "messages")
    ids, mask = rd.render([*messages, {"role": "assistant", "content": A}], tok, rendering)
    return ids[:mask.index(True)]


@pytest.mark.parametrize("kind", ["chat", "generation", "plain"])
def test_a_conversational_prompt_is_what_sft_renders_before_the_answer(tmp_path, tokenizers, kind):
    tok = tokenizers[kind]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": Q}]
    _, out = processed(tmp_path, tok, [{"prompt": messages, "answer": 4}], array=True)
    ids = out[0]["prompt_input_ids"]
    assert ids == sft_prompt_ids(tok, messages) and out[0]["length"] == len(ids)
    if kind != "plain":  # the chat template with the assistant's turn opened: what generation is prompted with
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ids == tok(text, add_special_tokens=False)["input_ids"]
    else:
        assert tok.decode(ids).endswith("### Response:\n")


def test_data_system_prompt_opens_a_conversation_without_one(tmp_path, tokenizers):
    tok = tokenizers["chat"]
    _, out = processed(tmp_path, tok, [{"prompt": [{"role": "user", "content": Q}]}], system_prompt="'Be brief.'")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": Q}]
    assert out[0]["prompt_input_ids"] == sft_prompt_ids(tok, messages)


def test_a_text_prompt_is_not_templated_and_other_columns_are_kept(tmp_path, tokenizers):
    tok = tokenizers["chat"]
    rows = [{"prompt": Q, "answer": 4, "meta": {"level": 1}}, {"prompt": "Hello world.", "answer": 0,
                                                               "meta": {"level": 2}}]
    prepared, out = processed(tmp_path, tok, rows, eval_fraction=0.5)
    first = prepared.columns.pop("first_rows")  # the rewards' dry call before the model loads (Grpo.check_data)
    assert prepared.columns == {"format": "prompts", "prompt": "text"}
    assert first == prepared.train.to_list()[:2]
    by_prompt = {r["prompt"]: r for r in out}
    assert by_prompt[Q]["prompt_input_ids"] == tok(Q, add_special_tokens=True)["input_ids"]
    assert by_prompt[Q]["answer"] == 4 and by_prompt[Q]["meta"] == {"level": 1}


def test_the_collator_left_pads_and_passes_prompts_and_columns_as_lists(tmp_path, tokenizers):
    tok = tokenizers["generation"]
    rows = [{"prompt": [{"role": "user", "content": Q}], "answer": 4},
            {"prompt": [{"role": "user", "content": "Hello world. " * 3}], "answer": 7}]
    _, out = processed(tmp_path, tok, rows, array=True)
    features = [dict(out[i]) for i in range(2)]
    features[0]["loss_weight"] = 0.0  # a padding row that keeps the ranks in step
    batch = SIDE.collator(tok, cfg(), train=True)(features)
    short, long = (len(f["prompt_input_ids"]) for f in features)
    assert short < long and batch["prompt_input_ids"].shape == (2, long)
    assert batch["prompt_input_ids"][0, long - short:].tolist() == features[0]["prompt_input_ids"]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    assert batch["prompt_input_ids"][0, :long - short].tolist() == [pad] * (long - short)
    assert batch["prompt_attention_mask"].tolist() == [[0] * (long - short) + [1] * short, [1] * long]
    assert batch["loss_weight"].tolist() == [0.0, 1.0] and batch["loss_weight"].dtype == torch.float32
    assert batch["prompt"] == [r["prompt"] for r in rows] and batch["columns"] == {"answer": [4, 7]}


def test_a_long_prompt_keeps_its_end(tmp_path, tokenizers):
    tok = tokenizers["chat"]
    text = "Once upon a time there was a small model. " * 6 + Q
    _, out = processed(tmp_path, tok, [{"prompt": text}], max_prompt_length=8)
    assert out[0]["prompt_input_ids"] == tok(text)["input_ids"][-8:] and out[0]["length"] == 8
    _, out = processed(tmp_path, tok, [{"prompt": text}], block_size=20)  # unset: half of data.block_size
    assert out[0]["prompt_input_ids"] == tok(text)["input_ids"][-10:]


def test_a_prompt_with_no_room_for_the_new_tokens_is_named_by_file_line_and_numbers(tmp_path, tokenizers):
    """GRPO generates grpo.max_new_tokens after each prompt as cut (data.max_prompt_length keeps its end): a row
    whose prompt leaves no room for them in the model's positions is named before any model loads; the tokenizer is
    not even loaded when the prompt budget and the new tokens fit together."""
    tok = tokenizers["chat"]
    long = "one two three four five six seven eight nine ten " * 4 + Q
    rows = [{"prompt": Q}, {"prompt": Q}, {"prompt": long}, {"prompt": Q}]
    prepared, _ = processed(tmp_path, tok, rows, max_prompt_length=30)
    kept = min(len(tok(long)["input_ids"]), 30)
    short = len(tok(Q)["input_ids"])
    assert kept > short + 4
    limit = (kept + 8, "max_position_embeddings=%d" % (kept + 8))
    never = lambda: pytest.fail("the tokenizer is loaded although the budget and the new tokens fit")  # noqa: E731
    assert prepared.room(never, kept + 8 - 30, limit, "grpo.max_new_tokens") == []  # 30 + new <= positions
    assert prepared.room(lambda: tok, 8, limit, "grpo.max_new_tokens") == []  # the longest prompt + 8 fits exactly
    problems = prepared.room(lambda: tok, 9, limit, "grpo.max_new_tokens")
    assert len(problems) == 1, problems
    assert problems[0].startswith("data.train: train.jsonl: line 3: the prompt is %d tokens as cut" % kept)
    for says in ("grpo.max_new_tokens=9 new tokens", f"the model's {kept + 8} positions (max_position_embeddings",
                 "set grpo.max_new_tokens=8 or less, or data.max_prompt_length=%d or less" % (kept - 1)):
        assert says in problems[0], problems[0]
    every = prepared.room(lambda: tok, kept + 8 - short + 1, limit, "grpo.max_new_tokens")  # no room for any
    assert "lines 1, 2, 3, 4: " in every[0] and f"the longest {kept}" in every[0]


@pytest.mark.parametrize("rows,says", [
    ([{"question": Q, "answer": 4}], "no 'prompt' column; columns found: question, answer"),
    ([{"prompt": Q}, {"prompt": "  "}], r"train.jsonl: line 2: 'prompt' is empty"),
    ([{"prompt": Q}, {"prompt": 3}], "line 2: 'prompt' is int, not a text or a list of messages"),
    ([{"prompt": [{"role": "user", "content": Q}, {"role": "assistant", "content": A}]}],
     "line 1: 'prompt' ends with an assistant turn"),
    ([{"prompt": [{"role": "robot", "content": Q}]}], "line 1: .*robot"),
    ([{"prompt": Q, "completion": A}], "a 'completion' column: that is instruction data"),
    ([{"prompt": Q, "chosen": A, "rejected": "no"}], "a 'chosen' column: that is preference data"),
])
def test_bad_rows_are_named_by_file_and_line(tmp_path, rows, says):
    c = cfg(train=write(tmp_path / "train.jsonl", rows))
    with pytest.raises(DataError, match=says):
        SIDE.load_and_validate(c, seed=0, batch_size=1)


def test_too_few_prompts_to_hold_out_eval_ones_say_so(tmp_path):
    with pytest.raises(DataError, match="cannot hold out eval prompts from 1 training prompts"):
        SIDE.load_and_validate(cfg(train=write(tmp_path / "one.jsonl", [{"prompt": Q}])), seed=0, batch_size=1)


def test_prompt_only_data_is_grpo_data_for_auto_and_refused_by_sft(tmp_path):
    tokens = for_modality("tokens")
    prompts = cfg(train=write(tmp_path / "p.jsonl", [{"prompt": Q, "answer": 4}] * 4))
    assert tokens.label_kind(prompts) == "prompts"
    with pytest.raises(DataError, match="GRPO data, .* model.task=grpo and reward functions"):
        tokens.load_and_validate(prompts, seed=0, batch_size=1)
    for other in ({"prompt": Q, "completion": A}, {"prompt": Q, "completion": A, "label": True},
                  {"prompt": Q, "label": "yes"}):
        assert tokens.label_kind(cfg(train=write(tmp_path / "o.jsonl", [other] * 4))) != "prompts", other


def test_data_train_unset_is_the_built_in_arithmetic(tmp_path, monkeypatch):
    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path))
    prepared = SIDE.load_and_validate(cfg(), seed=0, batch_size=8)
    assert (len(prepared.train), len(prepared.eval)) == (arithmetic.N_TRAIN, arithmetic.N_EVAL)
    row = prepared.train[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and isinstance(row["answer"], int)
    assert any("built-in arithmetic" in n for n in prepared.notes)
    assert arithmetic.build() == arithmetic.build() and arithmetic.build(seed=1) != arithmetic.build()


def test_data_train_names_a_built_in_prompt_set(tmp_path, monkeypatch):
    """``builtin:word-problems``: the GSM8K-style problems with their own eval prompts, written once into the cache;
    an unknown name exits 2 naming the key and the choices."""
    from leantrain.data.lm import word_problems

    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path))
    prepared = SIDE.load_and_validate(cfg(train="builtin:word-problems"), seed=0, batch_size=8)
    assert (len(prepared.train), len(prepared.eval)) == (word_problems.N_TRAIN, word_problems.N_EVAL)
    assert {"answer", "solution"} <= set(prepared.train.column_names)
    assert any("word problems" in n for n in prepared.notes)
    assert (tmp_path / f"word-problems-v{word_problems.VERSION}" / "train.jsonl").is_file()
    with pytest.raises(DataError, match=r"data.train=builtin:gsm8k: no such built-in prompt set; built in: "
                                        r"builtin:arithmetic, builtin:word-problems, builtin:calculator") as e:
        SIDE.load_and_validate(cfg(train="builtin:gsm8k"), seed=0, batch_size=8)
    assert e.value.exit_code == 2


def test_the_calculator_problems_need_a_calculator(tmp_path, monkeypatch):
    """``builtin:calculator``: one-step problems whose answers are products of two-digit numbers or three-digit sums
    and differences, each row's answer the arithmetic of the numbers in its question."""
    import re

    from leantrain.data.lm import calculator_problems

    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path))
    prepared = SIDE.load_and_validate(cfg(train="builtin:calculator"), seed=0, batch_size=8)
    assert (len(prepared.train), len(prepared.eval)) == (calculator_problems.N_TRAIN, calculator_problems.N_EVAL)
    for row in prepared.train.select(range(50)):
        a, b = (int(x) for x in re.findall(r"\d+", row["question"]))
        assert row["answer"] in (a * b, a + b, a - b) and min(a, b) >= 12
        assert row["prompt"][-1] == {"role": "user", "content": row["question"]}
    assert calculator_problems.build() == calculator_problems.build()


# ------------------------------------------------------------------------------------------------ answered prompts
# (distillation: model.task=distill reads a completion beside each prompt; GRPO's side refuses one, tested above)


def answered(tmp_path, tok, rows, **data):
    c = cfg(train=write(tmp_path / "train.jsonl", rows), eval=write(tmp_path / "eval.jsonl", rows[:1]), **data)
    prepared = SIDE.load_and_validate(c, seed=0, batch_size=1, answers=True)
    return prepared, SIDE.process(prepared.train, tok, c, desc="Processing train")


@pytest.mark.parametrize("kind", ["chat", "generation", "plain"])
def test_a_prompt_and_its_completion_are_the_tokens_sft_renders_and_trains_on(tmp_path, tokenizers, kind):
    """Messages + completion, TRL's conversational prompt + completion (the completion as one assistant message) and
    a messages conversation give the same ids: the prompt SFT renders before the answer, then the answer's tokens
    with what the template closes the turn with (SFT's response mask)."""
    tok = tokenizers[kind]
    messages = [{"role": "user", "content": Q}]
    rendering = rd.choose_rendering(tok, "auto", "messages")
    ids, mask = rd.render([*messages, {"role": "assistant", "content": A}], tok, rendering)
    want = [ids[i] for i, m in enumerate(mask) if m]
    for row in ({"prompt": messages, "completion": A}, {"prompt": messages, "completion": [{"role": "assistant",
                                                                                           "content": A}]},
                {"messages": [*messages, {"role": "assistant", "content": A}]}):
        prepared, out = answered(tmp_path, tok, [row])
        assert out[0]["prompt_input_ids"] == sft_prompt_ids(tok, messages)
        assert out[0]["completion_input_ids"] == want and prepared.columns["answered"] is True
    if kind == "chat":
        assert tok.decode(want).endswith("<|im_end|>\n")


def test_a_text_prompt_and_completion_are_joined_as_they_are_with_the_eos(tmp_path, tokenizers):
    tok = tokenizers["chat"]
    _, out = answered(tmp_path, tok, [{"prompt": Q, "completion": " 4"}])
    assert tok.decode(out[0]["prompt_input_ids"]) == Q
    assert tok.decode(out[0]["completion_input_ids"]) == " 4<|endoftext|>"
    batch = SIDE.collator(tok, cfg(), train=True)([out[0], {**out[0], "completion_input_ids": [5]}])
    assert batch["completion_mask"].tolist() == [[1] * len(out[0]["completion_input_ids"]),
                                                 [1] + [0] * (len(out[0]["completion_input_ids"]) - 1)]
    assert batch["completion_ids"][1, 1:].eq(tok.pad_token_id or tok.eos_token_id).all()


def test_prompts_alone_are_read_and_say_they_have_no_completion(tmp_path, tokenizers):
    prepared, out = answered(tmp_path, tokenizers["chat"], [{"prompt": Q}])
    assert prepared.columns["answered"] is False and "completion_input_ids" not in out.column_names


@pytest.mark.parametrize("rows,says", [
    ([{"prompt": Q, "completion": "  "}], r"train.jsonl: line 1: 'completion' is empty"),
    ([{"prompt": Q, "completion": 4}], r"line 1: 'completion' is int, not a text or one assistant message"),
    ([{"messages": [{"role": "user", "content": Q}]}], r"line 1: the conversation does not end with an assistant turn"),
])
def test_a_bad_completion_is_named_by_file_and_line(tmp_path, tokenizers, rows, says):
    with pytest.raises(DataError, match=says):
        answered(tmp_path, tokenizers["chat"], rows)
