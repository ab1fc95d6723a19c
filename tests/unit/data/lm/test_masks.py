"""What the loss covers, checked before training (issue 51 part 3): a rendered row whose assistant mask is empty, whose
trained tokens miss the end-of-turn, or whose template rewrites earlier turns exits 2 naming the file, the line and
the template, for SFT, preference and GRPO data alike, before any model loads; the empty think blocks a Qwen3-style
template inserts are not learnt unless data.train_on_empty_think."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from leantrain.config import resolve
from leantrain.data.lm import instructions as ins
from leantrain.data.lm import masks
from leantrain.data.lm import preference_render as pr
from leantrain.data.lm import rendering as rd
from leantrain.engine.setup.training_data import validate_data
from leantrain.errors import DataError
from tests.helpers import CHATML, CHATML_GENERATION, TINY_LLAMA, make_tiny_chat_tokenizer, write_jsonl

pytestmark = pytest.mark.usefixtures("own_datasets_cache")

_TURN = "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
_OPEN = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
TEMPLATES = {
    # {% generation %} marks around the content only: <|im_end|> is left out of the loss (TRL #5988)
    "no_end": ("{% for m in messages %}{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
               "{% generation %}{{ m['content'] }}{% endgeneration %}{{ '<|im_end|>\n' }}{% else %}" + _TURN
               + "{% endif %}{% endfor %}" + _OPEN),
    # {% generation %} marks in a branch no turn takes: an all-zero assistant mask (marin #7237)
    "empty": CHATML_GENERATION.replace("m['role'] == 'assistant'", "m['role'] == 'bot'"),
    # earlier replies rewritten (as templates that drop past reasoning do): no prefix is the conversation's beginning
    "rewrites": ("{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
                 "{{ '<|im_start|>assistant\n...<|im_end|>\n' }}{% else %}" + _TURN + "{% endif %}{% endfor %}"
                 + _OPEN),
    # nothing after a reply: no end-of-turn to learn
    "no_close": ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + ' ' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"),
    # the generation block opens before the assistant's header: a prompt cut where the mask starts lacks it
    "header_inside": ("{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}"
                      "{{ '<|im_start|>assistant\n' + m['content'] + '<|im_end|>\n' }}{% endgeneration %}{% else %}"
                      + _TURN + "{% endif %}{% endfor %}" + _OPEN),
    # Qwen3-style: an empty think block before every reply, with and without generation marks
    "think": CHATML.replace("'\n' + m['content']", "'\n' + ('<think>\n\n</think>\n\n' if m['role'] == 'assistant' "
                            "else '') + m['content']"),
    "think_generation": CHATML_GENERATION.replace("{% generation %}{{ m['content']",
                                                  "{% generation %}{{ '<think>\n\n</think>\n\n' + m['content']"),
    "chat": CHATML, "generation": CHATML_GENERATION, "plain": None,
}
Q, A = "What is 2 + 2?", "The answer is 4."
MULTI = [{"role": "user", "content": Q}, {"role": "assistant", "content": A},
         {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "6."}]


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("toks")
    return {name: make_tiny_chat_tokenizer(root / name, chat_template=t) for name, t in TEMPLATES.items()}


@pytest.fixture(scope="module")
def toks(tok_dirs):
    return {name: AutoTokenizer.from_pretrained(path) for name, path in tok_dirs.items()}


def checked(tmp_path, tok_dir, rows, *keys):
    """validate_data of a tiny Llama from a config with this tokenizer on ``rows`` (what `leantrain train` checks
    before any model loads)."""
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    return validate_data(resolve(None, [*TINY_LLAMA, f"model.tokenizer={tok_dir}", f"data.train={train}",
                                        f"data.eval={train}", *keys]))


def refusal(tmp_path, tok_dir, rows, *keys) -> str:
    with pytest.raises(DataError) as e:
        checked(tmp_path, tok_dir, rows, *keys)
    assert e.value.exit_code == 2
    return str(e.value)


def trained(ids, mask, tok) -> list[str]:
    """The decoded runs of trained tokens."""
    return [tok.decode(ids[a:b]) for a, b in masks.runs(mask)]


# ------------------------------------------------------------------------------------------ the checks


def test_an_empty_assistant_mask_exits_2_naming_file_line_and_template(tmp_path, tok_dirs):
    text = refusal(tmp_path, tok_dirs["empty"], [{"messages": MULTI}] * 3)
    assert "data.train: train.jsonl: lines 1, 2, 3: the assistant mask is empty" in text
    assert f"chat template of {tok_dirs['empty']} (its {{% generation %}} marks)" in text
    assert "data.template=plain" in text and "leantrain inspect" in text
    checked(tmp_path, tok_dirs["empty"], [{"messages": MULTI}] * 3, "data.template=plain")  # the fix it names


def test_a_mask_that_misses_the_end_of_turn_exits_2(tmp_path, tok_dirs):
    text = refusal(tmp_path, tok_dirs["no_end"], [{"messages": MULTI}])
    assert "line 1: the trained tokens end with '6.', not with '<|im_end|>'" in text
    assert "inside the template's {% generation %} block" in text


def test_a_template_that_closes_a_reply_with_nothing_exits_2(tmp_path, tok_dirs):
    text = refusal(tmp_path, tok_dirs["no_close"], [{"messages": MULTI}])
    assert "writes nothing after an assistant reply" in text and "line 1" in text


def test_a_template_that_rewrites_earlier_turns_exits_2_naming_the_row(tmp_path, tok_dirs):
    rows = [{"messages": MULTI[:2]}, {"messages": MULTI}]  # one turn renders; two turns rewrite the first
    text = refusal(tmp_path, tok_dirs["rewrites"], rows)
    assert "train.jsonl: line 2: the tokenizer's chat template does not render a conversation" in text
    assert "line 1" not in text and f"rendered with the tokenizer's chat template of {tok_dirs['rewrites']}" in text


@pytest.mark.parametrize("name", ["chat", "generation", "plain", "think", "think_generation"])
def test_templates_that_train_the_reply_and_its_end_pass(tmp_path, tok_dirs, name):
    checked(tmp_path, tok_dirs[name], [{"messages": MULTI}])
    checked(tmp_path, tok_dirs[name], [{"prompt": Q, "completion": A}])  # raw: prompt + completion + EOS


def test_train_on_prompt_learns_every_token_so_nothing_is_checked(tmp_path, tok_dirs):
    checked(tmp_path, tok_dirs["empty"], [{"messages": MULTI}], "data.train_on_prompt=true")


def test_only_the_first_rows_are_rendered_before_training(tmp_path, tok_dirs):
    rows = [{"messages": MULTI[:2]}] * masks.FIRST_ROWS + [{"messages": MULTI}]  # the rewritten row comes later
    checked(tmp_path, tok_dirs["rewrites"], rows)


def test_preference_pairs_are_checked_chosen_and_rejected(tmp_path, tok_dirs):
    rows = [{"prompt": [{"role": "user", "content": Q}], "chosen": [{"role": "assistant", "content": A}],
             "rejected": [{"role": "assistant", "content": "5."}]}]
    text = refusal(tmp_path, tok_dirs["no_end"], rows, "model.task=preference")
    assert "line 1 (chosen): the trained tokens end with" in text
    assert "line 1 (rejected): the trained tokens end with '5.'" in text
    checked(tmp_path, tok_dirs["chat"], rows, "model.task=preference")


def test_grpo_prompts_must_end_with_the_opening_of_the_assistants_turn(tmp_path, tok_dirs):
    rows = [{"prompt": [{"role": "user", "content": Q}], "answer": "4"}]
    keys = ["model.task=grpo", "grpo.rewards=[numeric:answer]"]
    text = refusal(tmp_path, tok_dirs["header_inside"], rows, *keys)
    assert "line 1 (prompt): the prompt ends with" in text and "'<|im_start|>assistant\\n'" in text
    text = refusal(tmp_path, tok_dirs["empty"], rows, *keys)
    assert "line 1 (prompt): the assistant mask is empty" in text and "cannot be cut where the answer" in text
    checked(tmp_path, tok_dirs["generation"], rows, *keys)
    checked(tmp_path, tok_dirs["think"], rows, *keys)


def test_the_end_of_turn_and_the_opening_come_from_rendering_a_tiny_conversation(toks):
    chat = rd.Rendering("chat")
    assert masks.closing(toks["chat"], chat) == "<|im_end|>"
    assert masks.closing(toks["no_close"], chat) == ""
    assert masks.closing(toks["chat"], rd.Rendering("plain")) == "<|endoftext|>"  # the EOS
    assert masks.opening(toks["chat"]) == "<|im_start|>assistant\n"
    assert masks.opening(toks["no_close"]) == "assistant: "


# ------------------------------------------------------------------------------------------ empty think blocks


@pytest.mark.parametrize("name, mode", [("think", "chat"), ("think_generation", "generation")])
def test_an_empty_think_block_is_not_learnt_unless_kept(toks, name, mode):
    tok = toks[name]
    rendering = rd.choose_rendering(tok, "auto", "messages")
    assert rendering.mode == mode
    ids, mask = ins.render_row({"messages": MULTI}, "messages", tok, rendering)
    assert trained(ids, mask, tok) == [f"{A}<|im_end|>\n", "6.<|im_end|>\n"]
    assert "<think>\n\n</think>\n\n" + A in tok.decode(ids)  # still in the input: only the loss leaves it out
    ids, kept = ins.render_row({"messages": MULTI}, "messages", tok, rendering, keep_empty_think=True)
    think = "<think>\n\n</think>\n\n"
    assert trained(ids, kept, tok) == [f"{think}{A}<|im_end|>\n", f"{think}6.<|im_end|>\n"]


def test_a_think_block_with_reasoning_is_learnt(toks):
    tok = toks["chat"]
    reply = "<think>\n2 and 2 make 4.\n</think>\n\n" + A
    ids, mask = ins.render_row({"messages": [MULTI[0], {"role": "assistant", "content": reply}]}, "messages", tok,
                               rd.Rendering("chat"))
    assert trained(ids, mask, tok) == [reply + "<|im_end|>\n"]
    empty = "<think> </think>" + A  # an empty block of the data's own: not learnt either
    ids, mask = ins.render_row({"messages": [MULTI[0], {"role": "assistant", "content": empty}]}, "messages", tok,
                               rd.Rendering("chat"))
    assert trained(ids, mask, tok) == [A + "<|im_end|>\n"]


def test_sft_rows_and_preference_pairs_leave_the_empty_think_out_of_the_labels(toks):
    import datasets

    tok = toks["think"]
    row = ins.process(datasets.Dataset.from_list([{"messages": MULTI[:2]}]), tok, block_size=256).dataset[0]
    assert ins.show_example(row, tok).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n[[" + A
                                               + "<|im_end|>\n]]")
    kept = ins.process(datasets.Dataset.from_list([{"messages": MULTI[:2]}]), tok, block_size=256,
                       keep_empty_think=True).dataset[0]
    assert kept["targets"] > row["targets"]
    out = pr.encode_pairs({"prompt": [[MULTI[0]]], "chosen": [[{"role": "assistant", "content": A}]],
                           "rejected": [[{"role": "assistant", "content": "5."}]]}, tok, "explicit", "auto", 64, 128)
    labelled = [t for t, y in zip(out["chosen_input_ids"][0], out["chosen_labels"][0]) if y != -100]
    assert tok.decode(labelled) == A + "<|im_end|>\n"


def test_the_key_reaches_the_processed_rows(tmp_path, tok_dirs):
    rows = [{"messages": MULTI[:2]}] * 2
    kept = checked(tmp_path, tok_dirs["think"], rows, "data.train_on_empty_think=true")
    tok = AutoTokenizer.from_pretrained(tok_dirs["think"])
    shown = kept.rendered(tok, 1)[0]
    assert trained(shown.ids, shown.trained, tok) == [f"<think>\n\n</think>\n\n{A}<|im_end|>\n"]
