"""Preference data: each format detected and rendered as SFT renders it (the response mask covers exactly the
response, both sequences share the prompt's tokens), bad pairs named by file and line, ties dropped and long
prompts / responses counted, the collators' layouts, JSON arrays, KTO's KL rows, a reward model's rows, and
preference data refused by supervised fine-tuning with what it is."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from transformers import AutoTokenizer

from leantrain.config import resolve
from leantrain.data.lm import rendering as rd
from leantrain.data.lm import sft
from leantrain.data.text import padded_width
from leantrain.data.lm.collate import pad_id_of
from leantrain.data.modalities import for_modality
from leantrain.data.lm.preference import detect_format
from leantrain.errors import DataError
from tests.helpers import CHATML, make_tiny_chat_tokenizer

pytestmark = pytest.mark.usefixtures("own_datasets_cache")
IGNORE = -100
Q, GOOD, BAD = "What is 2 + 2?", "The answer is 4.", "Hello world."


def write(path, rows, array: bool = False) -> str:
    path.write_text(json.dumps(rows) if array else "".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def cfg(**data):
    return resolve(overrides=[f"data.{k}={v}" for k, v in data.items()]).data


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(make_tiny_chat_tokenizer(tmp_path_factory.mktemp("tok"), chat_template=CHATML))


def processed(tmp_path, tok, rows, side="pairs", array=False, **data):
    name = "train.json" if array else "train.jsonl"
    c = cfg(train=write(tmp_path / name, rows, array), eval=write(tmp_path / "eval.jsonl", rows[:1]), **data)
    data_side = for_modality(side)
    prepared = data_side.load_and_validate(c, seed=0, batch_size=1)
    return prepared, data_side.process(prepared.train, tok, c, desc="Processing train"), c


def response_text(tok, ids, labels) -> str:
    return tok.decode([t for t, y in zip(ids, labels) if y != IGNORE])


MSG = [{"role": "user", "content": Q}]
FORMATS = {  # format -> (a row, the SFT conversation it renders as, chosen's trained text)
    "explicit": ({"prompt": Q, "chosen": GOOD, "rejected": BAD}, None, GOOD + "<|endoftext|>"),
    "explicit-chat": ({"prompt": MSG, "chosen": [{"role": "assistant", "content": GOOD}],
                       "rejected": [{"role": "assistant", "content": BAD}]}, MSG, GOOD + "<|im_end|>\n"),
    "explicit-full": ({"prompt": Q, "chosen": [*MSG, {"role": "assistant", "content": GOOD}],  # UltraFeedback's layout
                       "rejected": [*MSG, {"role": "assistant", "content": BAD}]}, MSG, GOOD + "<|im_end|>\n"),
    "implicit": ({"chosen": f"\n\nHuman: {Q}\n\nAssistant: {GOOD}", "rejected": f"\n\nHuman: {Q}\n\nAssistant: {BAD}"},
                 None, f" {GOOD}<|endoftext|>"),
    "implicit-chat": ({"chosen": [*MSG, {"role": "assistant", "content": GOOD}],
                       "rejected": [*MSG, {"role": "assistant", "content": BAD}]}, MSG, GOOD + "<|im_end|>\n"),
    "sharegpt": ({"conversations": [{"from": "human", "value": Q}], "chosen": {"from": "gpt", "value": GOOD},
                  "rejected": {"from": "gpt", "value": BAD}}, MSG, GOOD + "<|im_end|>\n"),
    "alpaca": ({"instruction": Q, "input": "", "chosen": GOOD, "rejected": BAD}, MSG, GOOD + "<|im_end|>\n"),
}


def test_formats_are_detected_from_columns_and_the_label_columns_values():
    for name, (row, *_) in FORMATS.items():
        assert detect_format(list(row)) == name.split("-")[0]
    assert detect_format(["prompt", "completion", "label"], [True, False]) == "feedback"
    assert detect_format(["messages", "label"], [0, 1]) == "feedback"
    assert detect_format(["messages", "label"], ["sports", "news"]) is None  # a class label: not feedback
    assert detect_format(["messages", "label"], ["1", "sports"]) is None  # every value decides, not the first
    assert detect_format(["messages"]) is None and detect_format(["text", "label"], [1]) is None


@pytest.mark.parametrize("labels", [["1", "0"], ["true", "false"], ["True", "False"]])
def test_feedback_labels_written_as_text_are_kto_data_not_instruction_data(tmp_path, tok, labels):
    """Issue 35 item 15: a KTO file whose labels are the strings "1" / "0" was taken for instruction data with a
    class column, and supervised fine-tuning was proposed."""
    rows = [{"prompt": Q, "completion": GOOD, "label": labels[0]}, {"prompt": "Hello", "completion": BAD,
                                                                    "label": labels[1]}]
    prepared, out, _ = processed(tmp_path, tok, rows * 2, side="feedback")
    assert prepared.columns["format"] == "feedback" and out["desirable"] == [1, 0, 1, 0]
    with pytest.raises(DataError, match="unpaired feedback data"):  # not "a 'label' column beside instruction data"
        for_modality("tokens").load_and_validate(cfg(train=write(tmp_path / "sft.jsonl", rows * 2)), seed=0,
                                                 batch_size=1)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_renders_as_sft_with_the_response_masked_and_the_prompt_shared(tmp_path, tok, fmt, caplog):
    row, conversation, trained = FORMATS[fmt]
    with caplog.at_level(logging.INFO, logger="leantrain"):
        prepared, out, _ = processed(tmp_path, tok, [row] * 3, block_size=256)
    assert prepared.columns == {"format": fmt.split("-")[0], "prompt": "messages" if conversation else "text"}
    assert len(out) == 3
    assert "rendered example" in caplog.text and "[[" in caplog.text
    r = out[0]
    assert response_text(tok, r["chosen_input_ids"], r["chosen_labels"]) == trained
    assert response_text(tok, r["rejected_input_ids"], r["rejected_labels"]) == trained.replace(GOOD, BAD)
    p = r["chosen_labels"].index(next(y for y in r["chosen_labels"] if y != IGNORE))
    assert r["chosen_input_ids"][:p] == r["rejected_input_ids"][:p]  # the same prompt tokens
    assert all(y == IGNORE for y in r["rejected_labels"][:p]) and r["rejected_labels"][p] != IGNORE
    assert all(y in (IGNORE, t) for y, t in zip(r["chosen_labels"], r["chosen_input_ids"]))  # unshifted
    assert r["length"] == max(len(r["chosen_input_ids"]), len(r["rejected_input_ids"]))
    if conversation is not None:  # the policy sees what SFT renders (its tail after the turn is not needed)
        ids, mask = rd.render([*conversation, {"role": "assistant", "content": GOOD}], tok,
                               rd.choose_rendering(tok, "auto", "messages"))
        assert r["chosen_input_ids"] == ids[:len(r["chosen_input_ids"])] and not any(mask[len(r["chosen_input_ids"]):])


def test_hh_transcripts_take_the_chat_template_as_turns_on_request(tmp_path, tok):
    _, out, _ = processed(tmp_path, tok, [FORMATS["implicit"][0]] * 2, template="chat")
    ids, labels = out[0]["chosen_input_ids"], out[0]["chosen_labels"]
    k = labels.index(next(y for y in labels if y != IGNORE))
    assert tok.decode(ids[:k]) == f"<|im_start|>user\n{Q}<|im_end|>\n<|im_start|>assistant\n"
    assert response_text(tok, ids, labels) == GOOD + "<|im_end|>\n"


def test_message_prompts_take_the_plain_template_on_request(tmp_path, tok):
    _, out, _ = processed(tmp_path, tok, [FORMATS["explicit-chat"][0]] * 2, template="plain")
    ids, labels = out[0]["chosen_input_ids"], out[0]["chosen_labels"]
    k = labels.index(next(y for y in labels if y != IGNORE))
    assert tok.decode(ids[:k]) == f"### Instruction:\n{Q}\n\n### Response:\n"
    assert response_text(tok, ids, labels) == GOOD + "<|endoftext|>"


def test_sample_prompts_are_rendered_as_the_preference_prompts_were(tok):
    assert sft.sample_inputs(["Hi"], tok, cfg(), {"format": "implicit", "prompt": "text"}) == sft.Prompts(["Hi"], False)
    assert sft.sample_inputs(["Hi"], tok, cfg(), {"format": "explicit", "prompt": "messages"}) == sft.Prompts(["Hi"],
                                                                                                              True)


def test_prompt_tokens_merged_into_an_answer_go_with_it_unlearnt(tmp_path, tok):
    _, out, _ = processed(tmp_path, tok, [{"prompt": "The ans", "chosen": "wer", "rejected": "k"}] * 2)
    r = out[0]  # "The ans" + "wer" tokenises as "The", " answer"; "The ans" + "k" as "The", " ans", "k"
    assert r["chosen_input_ids"] == tok("The answer<|endoftext|>")["input_ids"]  # SFT's tokens
    assert r["chosen_input_ids"][0] == r["rejected_input_ids"][0] and r["rejected_labels"][1] == IGNORE
    assert response_text(tok, r["chosen_input_ids"], r["chosen_labels"]) == " answer<|endoftext|>"
    assert response_text(tok, r["rejected_input_ids"], r["rejected_labels"]) == "k<|endoftext|>"


def test_json_arrays_are_read_as_json_lines(tmp_path, tok):
    rows = [FORMATS["explicit"][0]] * 3
    _, from_array, _ = processed(tmp_path, tok, rows, array=True)
    _, from_lines, _ = processed(tmp_path / "..", tok, rows)
    assert from_array[:] == from_lines[:]


def test_a_pair_without_a_prompt_is_named_by_file_and_line(tmp_path):
    good = FORMATS["implicit"][0]
    rows = [good, {"chosen": "Just some text.", "rejected": "Other text."}, good]
    with pytest.raises(DataError, match=r"train.jsonl: line 2: chosen and rejected share no prompt") as e:
        for_modality("pairs").load_and_validate(cfg(train=write(tmp_path / "train.jsonl", rows)), seed=0,
                                                batch_size=1)
    assert e.value.exit_code == 2
    chat = FORMATS["implicit-chat"][0]
    other = {**chat, "rejected": [{"role": "user", "content": "Something else"}, chat["rejected"][1]]}
    with pytest.raises(DataError, match=r"line 3: no common prompt: chosen differs from the other at turn 1"):
        for_modality("pairs").load_and_validate(cfg(train=write(tmp_path / "chat.jsonl", [chat, chat, other])),
                                                seed=0, batch_size=1)


@pytest.mark.parametrize("fmt,blank", [
    ("explicit", {"chosen": ""}),
    ("explicit-chat", {"chosen": [{"role": "assistant", "content": " \n "}]}),
    ("implicit", {"chosen": f"\n\nHuman: {Q}\n\nAssistant:  "}),
    ("feedback", {"completion": "   "}),
])
def test_a_blank_chosen_answer_or_completion_is_refused_naming_file_and_line(tmp_path, fmt, blank):
    """Issue 35 item 17: it trained as an answer of one end-of-sequence token, uncounted (a blank prompt is
    refused). A blank rejected answer stays (HH-RLHF has some: the chosen is preferred to saying nothing)."""
    good = {"prompt": Q, "completion": GOOD, "label": True} if fmt == "feedback" else FORMATS[fmt][0]
    side = "feedback" if fmt == "feedback" else "pairs"
    with pytest.raises(DataError, match=r"train.jsonl: line 2: the (chosen answer|completion) is blank") as e:
        for_modality(side).load_and_validate(cfg(train=write(tmp_path / "train.jsonl", [good, {**good, **blank}])),
                                             seed=0, batch_size=1)
    assert e.value.exit_code == 2
    if side == "pairs":
        kept = {**FORMATS["explicit"][0], "rejected": " "}
        for_modality(side).load_and_validate(cfg(train=write(tmp_path / "ok.jsonl", [kept] * 2)), seed=0,
                                             batch_size=1)


def test_ties_are_dropped_and_long_prompts_and_responses_counted(tmp_path, tok, caplog):
    long_prompt = " ".join(["Once upon a time"] * 30) + " the end"
    rows = [{"prompt": Q, "chosen": GOOD, "rejected": GOOD},  # a tie
            {"prompt": long_prompt, "chosen": GOOD, "rejected": BAD},
            {"prompt": Q, "chosen": " ".join([GOOD] * 40), "rejected": BAD},
            {"prompt": Q, "chosen": GOOD, "rejected": BAD}]
    with caplog.at_level(logging.INFO, logger="leantrain"):
        _, out, c = processed(tmp_path, tok, rows, block_size=48, max_prompt_length=16)
    assert len(out) == 3
    assert "1 pairs with chosen == rejected" in caplog.text
    assert "1 pairs with a prompt over data.max_prompt_length=16 tokens" in caplog.text
    assert "1 pairs with a response cut to fit data.block_size=48" in caplog.text
    trimmed = out[0]
    prompt = trimmed["chosen_input_ids"][:16]
    assert tok.decode(prompt).endswith("the end") and trimmed["chosen_labels"][16] != IGNORE
    assert max(out["length"]) <= 48 and len(out[1]["chosen_input_ids"]) == 48
    with pytest.raises(DataError, match=r"data.max_prompt_length=48 leaves no room"):
        for_modality("pairs").load_and_validate(cfg(train=c.train, block_size=48, max_prompt_length=48), seed=0,
                                                batch_size=1)


def test_pair_collator_puts_chosen_then_rejected_padded(tmp_path, tok):
    rows = [{"prompt": Q, "chosen": GOOD, "rejected": BAD}, {"prompt": "Hello", "chosen": "Hello world. " * 3,
                                                             "rejected": "Hi"}]
    _, out, c = processed(tmp_path, tok, rows)
    out = out.add_column("ref_chosen_logps", [-1.0, -2.0]).add_column("ref_rejected_logps", [-3.0, -4.0])
    batch = for_modality("pairs").collator(tok, c, train=True)([out[0], out[1]])
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    assert ids.shape == mask.shape == labels.shape == (4, padded_width(max(out["length"])))  # few widths on a CPU
    for i, (name, row) in enumerate([("chosen", 0), ("chosen", 1), ("rejected", 0), ("rejected", 1)]):
        seq = out[row][f"{name}_input_ids"]
        assert ids[i, :len(seq)].tolist() == seq and int(mask[i].sum()) == len(seq)
        assert labels[i, :len(seq)].tolist() == out[row][f"{name}_labels"]
        assert (ids[i, len(seq):] == pad_id_of(tok)).all()
        assert (labels[i, len(seq):] == IGNORE).all()
    assert torch.equal(batch["ref_logps"], torch.tensor([[-1.0, -3.0], [-2.0, -4.0]]))
    assert batch["ref_logps"].dtype == torch.float32 and batch["loss_weight"].tolist() == [1.0, 1.0]
    assert "ref_logps" not in for_modality("pairs").collator(tok, c, train=True)([dict(r) for r in out.remove_columns(
        ["ref_chosen_logps", "ref_rejected_logps"])])


def test_feedback_rows_carry_their_label_and_a_kl_row_of_the_next_completion(tmp_path, tok):
    rows = [{"prompt": Q, "completion": GOOD, "label": True}, {"prompt": "Hello", "completion": BAD, "label": False},
            {"prompt": "Once upon a time", "completion": "there was a model.", "label": True}]
    prepared, out, c = processed(tmp_path, tok, rows, side="feedback")
    assert prepared.columns["format"] == "feedback" and out["desirable"] == [1, 0, 1]
    for i in range(3):
        nxt = rows[(i + 1) % 3]["completion"]
        assert response_text(tok, out[i]["input_ids"], out[i]["labels"]) == rows[i]["completion"] + "<|endoftext|>"
        assert response_text(tok, out[i]["kl_input_ids"], out[i]["kl_labels"]) == nxt + "<|endoftext|>"
        assert tok.decode(out[i]["kl_input_ids"]).startswith(rows[i]["prompt"])
    batch = for_modality("feedback").collator(tok, c, train=True)([out[0], out[1]])
    assert batch["input_ids"].shape[0] == 4 and batch["desirable"].tolist() == [1, 0]
    assert batch["input_ids"][2, :len(out[0]["kl_input_ids"])].tolist() == out[0]["kl_input_ids"]
    chat = [{"messages": [*MSG, {"role": "assistant", "content": GOOD}], "label": 0}] * 2
    _, out, _ = processed(tmp_path / "..", tok, chat, side="feedback")
    assert out["desirable"] == [0, 0] and response_text(tok, out[0]["input_ids"], out[0]["labels"]) == \
        GOOD + "<|im_end|>\n"
    with pytest.raises(DataError, match="unpaired feedback .* but this task reads chosen / rejected pairs"):
        processed(tmp_path, tok, rows, side="pairs")


def test_feedback_with_one_label_only_is_counted_and_warned(tmp_path, tok, caplog):
    rows = [{"prompt": Q, "completion": GOOD, "label": True}, {"prompt": "Hello", "completion": BAD, "label": True}]
    with caplog.at_level(logging.INFO, logger="leantrain"):
        processed(tmp_path, tok, rows, side="feedback")
    assert "data.train: 2 desirable, 0 undesirable rows" in caplog.text
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "data.train: no undesirable rows (every label is true)" in warned[0]
    assert "eval.rejected_reward" in warned[0] and "learns from one kind" in warned[0]
    caplog.clear()
    (tmp_path / "both").mkdir()
    with caplog.at_level(logging.INFO, logger="leantrain"):
        processed(tmp_path / "both", tok, [rows[0], {**rows[1], "label": False}], side="feedback")
    assert "1 desirable, 1 undesirable rows" in caplog.text
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_reward_model_rows_are_the_plain_text_with_the_tokenizers_special_tokens(tmp_path, caplog):
    from leantrain.modeling import packaged_model_path

    bert = AutoTokenizer.from_pretrained(packaged_model_path())  # no chat template: the plain text
    with caplog.at_level(logging.INFO, logger="leantrain"):
        _, out, c = processed(tmp_path, bert, [FORMATS["implicit"][0]] * 2, side="scored-pairs", block_size=1024)
    assert "cut to the tokenizer's model_max_length=512" in caplog.text
    assert out.column_names == ["chosen_input_ids", "rejected_input_ids", "length"]
    assert bert.decode(out[0]["chosen_input_ids"]) == bert.decode(bert(FORMATS["implicit"][0]["chosen"])["input_ids"])
    batch = for_modality("scored-pairs").collator(bert, c, train=True)([out[0], out[1]])
    assert set(batch) == {"input_ids", "attention_mask", "loss_weight"} and batch["input_ids"].shape[0] == 4



def test_reward_model_rows_go_through_the_chat_template_when_there_is_one(tmp_path, tok):
    _, out, _ = processed(tmp_path, tok, [FORMATS["explicit-chat"][0]] * 2, side="scored-pairs")
    assert tok.decode(out[0]["rejected_input_ids"]) == (f"<|im_start|>user\n{Q}<|im_end|>\n<|im_start|>assistant\n"
                                                        f"{BAD}<|im_end|>\n")


@pytest.mark.parametrize("rows, says", [
    ([FORMATS["sharegpt"][0]], "preference data (format conversations"),
    ([{"messages": [*MSG, {"role": "assistant", "content": GOOD}], "label": False}], "unpaired feedback data"),
    ([{"instruction": Q, "output": GOOD, "label": "maths"}], "a 'label' column beside instruction data"),
])
def test_supervised_fine_tuning_refuses_preference_data_saying_what_it_is(tmp_path, rows, says):
    with pytest.raises(DataError, match=r"train.jsonl: ") as e:
        for_modality("tokens").load_and_validate(cfg(train=write(tmp_path / "train.jsonl", rows * 4)), seed=0,
                                                 batch_size=1)
    assert says in str(e.value) and "no assistant turn" not in str(e.value) and e.value.exit_code == 2
