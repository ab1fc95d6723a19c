"""Preference rows -> token rows of the data contract (``leantrain.data.preference``).

The text is SFT's rendering (``leantrain.data.instructions``): a prompt of messages goes through the chat template
(or the plain template when the tokenizer has none), a text prompt is joined to its response as it is (SFT's
prompt / completion rows); the response is the final assistant turn with what the template closes it with (its
end-of-turn, or EOS). The prompt and the response are tokenised apart (as TRL does), so the chosen and rejected
sequences of a pair start with exactly the same prompt tokens.

Lengths: a prompt longer than ``max_prompt`` tokens keeps its end; a sequence longer than ``cap`` tokens is cut at
the end of its response. Labels are the input ids on response tokens and -100 elsewhere (the prompt, the template's
text before the reply, and always the first token, which nothing predicts).
"""

from __future__ import annotations

from typing import Any

from leantrain.data import instructions as ins
from leantrain.data import preference_formats as pf
from leantrain.errors import DataError

IGNORE = -100


def affixes(tokenizer) -> tuple[list[int], list[int]]:  # noqa: ANN001
    """The special tokens the tokenizer adds before and after a text (BOS; a classifier's [CLS] and [SEP])."""
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(bare) + 1):
        if full[i:i + len(bare)] == bare:
            return list(full[:i]), list(full[i + len(bare):])
    return [], []


def policy_rendering(tokenizer, template: str, textual: bool) -> ins.Rendering:  # noqa: ANN001
    """SFT's rendering choice for these rows (text prompts: as prompt / completion rows; messages: as chat rows).
    A template with {% generation %} marks renders the same text; its spans come from the text here."""
    rendering = ins.choose_rendering(tokenizer, template, "prompt_completion" if textual else "messages")
    return ins.Rendering("chat") if rendering.mode == "generation" else rendering


def as_messages(prompt: str | list[dict[str, str]]) -> list[dict[str, str]]:
    """A prompt as messages: an HH-RLHF transcript as its turns, another text as one user turn."""
    if not isinstance(prompt, str):
        return list(prompt)
    return pf.hh_messages(prompt) or [{"role": "user", "content": prompt}]


def texts(prompt, response: str, tokenizer, rendering: ins.Rendering) -> tuple[str, str, bool]:  # noqa: ANN001
    """(prompt text, response text, whether the tokenizer's special tokens go first) of one prompt and reply."""
    if rendering.mode == "raw":
        return prompt, response + (tokenizer.eos_token or ""), True
    reply = response.strip() if isinstance(prompt, str) else response  # HH replies start with a space
    messages = [*as_messages(prompt), {"role": "assistant", "content": reply}]
    text, spans, special = ins._text_spans(messages, tokenizer, rendering)
    a, b = spans[-1]
    return text[:a], text[a:b], special


def _ids(tokenizer, text: str) -> list[int]:  # noqa: ANN001
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def encode(example: pf.Example, tokenizer, rendering: ins.Rendering,  # noqa: ANN001
           responses: tuple[str, ...]) -> tuple[list[int], list[list[int]]]:
    """(prompt ids, the ids of each response) for the policy; the prompt is rendered once for all responses."""
    prompt_text, outs, special = None, [], True
    for response in responses:
        head, tail, special = texts(example.prompt, response, tokenizer, rendering)
        if prompt_text is not None and head != prompt_text:
            raise DataError("the chat template renders a prompt differently depending on its reply, so the chosen "
                            "and rejected sequences cannot share their prompt; set data.template=plain")
        prompt_text = head
        outs.append(_ids(tokenizer, tail))
    prefix = affixes(tokenizer)[0] if special else []
    return prefix + _ids(tokenizer, prompt_text or ""), outs


def fit(prompt: list[int], response: list[int], max_prompt: int, cap: int) -> tuple[list[int], list[int], bool, bool]:
    """(prompt, response, prompt trimmed, response cut): the prompt keeps its last ``max_prompt`` tokens, the
    response its first tokens up to ``cap`` in all."""
    trimmed = len(prompt) > max_prompt
    prompt = prompt[len(prompt) - max_prompt:] if trimmed else prompt
    room = cap - len(prompt)
    return prompt, response[:room], trimmed, len(response) > room


def labelled(prompt: list[int], response: list[int]) -> tuple[list[int], list[int]]:
    """(input ids, labels): the response's tokens are their own labels, the rest -100, the first token always."""
    ids = prompt + response
    labels = [IGNORE] * len(prompt) + list(response)
    if labels:
        labels[0] = IGNORE
    return ids, labels


def _rows(batch: dict[str, list]) -> list[dict[str, Any]]:
    n = len(next(iter(batch.values())))
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]


# ------------------------------------------------------------------------------------------ batched map functions


def encode_pairs(batch, tokenizer, fmt: str, template: str, max_prompt: int, cap: int) -> dict[str, list]:  # noqa: ANN001
    """Pair rows -> chosen/rejected input ids and labels, length; flags trimmed / cut / tie / empty for the counts."""
    keys = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels", "length", "trimmed", "cut",
            "tie", "empty")
    out: dict[str, list] = {k: [] for k in keys}
    for row in _rows(batch):
        ex = pf.to_pair(row, fmt)
        prompt, (chosen, rejected) = encode(ex, tokenizer, policy_rendering(tokenizer, template, ex.textual),
                                            (ex.chosen, ex.rejected))
        p, c, trimmed, cut_c = fit(prompt, chosen, max_prompt, cap)
        _, r, _, cut_r = fit(prompt, rejected, max_prompt, cap)
        c_ids, c_labels = labelled(p, c)
        r_ids, r_labels = labelled(p, r)
        values = (c_ids, c_labels, r_ids, r_labels, max(len(c_ids), len(r_ids)), trimmed, cut_c or cut_r,
                  c_ids == r_ids, not (any(y != IGNORE for y in c_labels) and any(y != IGNORE for y in r_labels)))
        for k, v in zip(keys, values):
            out[k].append(v)
    return out


def encode_feedback(batch, tokenizer, template: str) -> dict[str, list]:  # noqa: ANN001
    """Feedback rows -> prompt ids, completion ids, desirable (the KL rows are paired after, across rows)."""
    out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "desirable": []}
    for row in _rows(batch):
        ex = pf.to_feedback(row)
        prompt, (completion,) = encode(ex, tokenizer, policy_rendering(tokenizer, template, ex.textual), (ex.chosen,))
        out["prompt_ids"].append(prompt)
        out["completion_ids"].append(completion)
        out["desirable"].append(int(ex.desirable))
    return out


def scored_texts(prompt, response: str, tokenizer) -> tuple[str, str]:  # noqa: ANN001
    """A reward model's text of one prompt and reply: the chat template when the tokenizer has one, else the plain
    text (a text prompt and its reply as they are; messages' contents one per paragraph)."""
    if getattr(tokenizer, "chat_template", None):
        head, tail, _ = texts(prompt, response, tokenizer, ins.Rendering("chat"))
        return head, tail
    if isinstance(prompt, str):
        return prompt, response
    return "\n\n".join(m["content"] for m in prompt), "\n\n" + response


def encode_scored(batch, tokenizer, fmt: str, max_prompt: int, cap: int) -> dict[str, list]:  # noqa: ANN001
    """Pair rows -> a reward model's chosen/rejected input ids (the tokenizer's special tokens around each), length."""
    keys = ("chosen_input_ids", "rejected_input_ids", "length", "trimmed", "cut", "tie", "empty")
    out: dict[str, list] = {k: [] for k in keys}
    prefix, suffix = affixes(tokenizer)
    room = cap - len(prefix) - len(suffix)
    for row in _rows(batch):
        ex = pf.to_pair(row, fmt)
        seqs, trimmed, cut = [], False, False
        for response in (ex.chosen, ex.rejected):
            head, tail = scored_texts(ex.prompt, response, tokenizer)
            p, r, t, c = fit(_ids(tokenizer, head), _ids(tokenizer, tail), min(max_prompt, room - 1), room)
            seqs.append(prefix + p + r + suffix)
            trimmed, cut = trimmed or t, cut or c
        values = (seqs[0], seqs[1], max(map(len, seqs)), trimmed, cut, seqs[0] == seqs[1], False)
        for k, v in zip(keys, values):
            out[k].append(v)
    return out


def feedback_rows(prompts: list[list[int]], completions: list[list[int]], desirable: list[int], max_prompt: int,
                  cap: int) -> tuple[dict[str, list], dict[str, int]]:
    """The feedback side's rows: each row's prompt + completion, and its KL row (its prompt + the next row's
    completion, wrapping: TRL's KL estimate); counts of trimmed prompts, cut responses, rows with no target."""
    keys = ("input_ids", "labels", "desirable", "kl_input_ids", "kl_labels", "length")
    out: dict[str, list] = {k: [] for k in keys}
    counts = {"trimmed": 0, "cut": 0, "empty": 0}
    n = len(prompts)
    for i in range(n):
        p, c, trimmed, cut = fit(prompts[i], completions[i], max_prompt, cap)
        kp, kc, _, _ = fit(prompts[i], completions[(i + 1) % n], max_prompt, cap)
        ids, labels = labelled(p, c)
        kl_ids, kl_labels = labelled(kp, kc)
        if all(y == IGNORE for y in labels):
            counts["empty"] += 1
            continue
        counts["trimmed"] += trimmed
        counts["cut"] += cut
        for k, v in zip(keys, (ids, labels, desirable[i], kl_ids, kl_labels, max(len(ids), len(kl_ids)))):
            out[k].append(v)
    return out, counts
