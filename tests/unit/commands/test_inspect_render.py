"""``leantrain inspect data.train=FILE --render N`` (issue 51 part 3): the first N rows as training renders them, the
trained tokens in [[...]], for SFT, preference (chosen and rejected) and GRPO prompts (nothing trained); --json with
ids, tokens and the trained mask; the checks training makes, exit 2 after the rows. The tokenizer loads, no model."""

from __future__ import annotations

import json

import pytest

from leantrain.cli import main
from tests.helpers import CHATML, CHATML_GENERATION, TINY_LLAMA, make_tiny_chat_tokenizer, write_jsonl

pytestmark = pytest.mark.usefixtures("own_datasets_cache")
Q, A = "What is 2 + 2?", "The answer is 4."
NO_END = CHATML_GENERATION.replace("{{ m['content'] + '<|im_end|>' + '\n' }}{% endgeneration %}",
                                   "{{ m['content'] }}{% endgeneration %}{{ '<|im_end|>\n' }}")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect")
    make_tiny_chat_tokenizer(root / "tok", chat_template=CHATML)
    make_tiny_chat_tokenizer(root / "no_end", chat_template=NO_END)
    write_jsonl(root / "chat.jsonl", [{"messages": [{"role": "user", "content": Q},
                                                    {"role": "assistant", "content": A}]}] * 4)
    write_jsonl(root / "pairs.jsonl", [{"prompt": Q, "chosen": A, "rejected": "5."}] * 4)
    write_jsonl(root / "prompts.jsonl", [{"prompt": [{"role": "user", "content": Q}], "answer": "4"}] * 4)
    return root


def inspect(capsys, files, data, *extra, tok="tok"):
    rc = main(["inspect", *TINY_LLAMA, f"model.tokenizer={files / tok}", f"data.train={files / data}", *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_sft_rows_show_the_trained_reply_and_its_end_of_turn(capsys, files):
    rc, out, _ = inspect(capsys, files, "chat.jsonl", "--render", "2")
    assert rc == 0
    assert out.count("=== data.train: chat.jsonl: line") == 2 and "line 3" not in out
    assert f"<|im_start|>assistant\n[[{A}<|im_end|>\n]]" in out
    assert "the tokenizer's chat template of" in out


def test_preference_rows_show_chosen_and_rejected(capsys, files):
    rc, out, _ = inspect(capsys, files, "pairs.jsonl", "--render", "1")
    assert rc == 0
    assert "line 1 (chosen)" in out and "line 1 (rejected)" in out
    assert f"{Q}[[{A}<|endoftext|>]]" in out and f"{Q}[[5.<|endoftext|>]]" in out  # raw: prompt + completion + EOS


def test_grpo_prompts_show_the_prompt_as_the_model_sees_it_nothing_trained(capsys, files):
    rc, out, _ = inspect(capsys, files, "prompts.jsonl", "--render", "1", "model.task=grpo")
    assert rc == 0
    assert "line 1 (prompt)" in out and "nothing trained" in out and "[[" not in out.split("\n", 1)[1]
    assert f"<|im_start|>user\n{Q}<|im_end|>\n<|im_start|>assistant\n" in out


def test_json_gives_ids_tokens_and_the_trained_mask(capsys, files):
    rc, out, _ = inspect(capsys, files, "chat.jsonl", "--render", "1", "--json")
    assert rc == 0
    shown = json.loads(out)
    assert shown["problems"] == [] and len(shown["rows"]) == 1
    row = shown["rows"][0]
    assert len(row["ids"]) == len(row["tokens"]) == len(row["trained"])
    assert row["tokens"][-2:] == ["<|im_end|>", "Ċ"] and row["trained"][-2:] == [True, True]
    assert row["row"] == "line 1" and row["rendering"] == "chat" and row["kind"] == "response"


def test_a_row_training_would_refuse_is_shown_then_exits_2(capsys, files):
    rc, out, err = inspect(capsys, files, "chat.jsonl", "--render", "1", tok="no_end")
    assert rc == 2
    assert f"[[{A}]]<|im_end|>" in out  # what the loss covers: the reply without its end-of-turn
    assert "line 1: the trained tokens end with" in err and "'<|im_end|>'" in err


def test_plain_text_and_overrides_without_render_are_refused(capsys, files, tmp_path):
    (tmp_path / "corpus.txt").write_text("plain text to learn whole.\n" * 4)
    rc, _, err = inspect(capsys, files, tmp_path / "corpus.txt", "--render", "1")
    assert rc == 2 and "renders no such rows" in err
    assert main(["inspect", "data.train=x.jsonl"]) == 2
    assert "go with --render N" in capsys.readouterr().err
