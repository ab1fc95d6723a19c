"""Preference rows -> token rows of the data contract (``leantrain.data.lm.preference``).

Each prompt + response is rendered and tokenised by SFT's own ``instructions.render`` (the policy sees exactly what
SFT renders): a prompt of messages through the chat template (or the plain template when the tokenizer has none), a
text prompt joined to its response as it is (SFT's prompt / completion rows). The response is the final assistant
turn with what the template closes it with (its end-of-turn, or EOS): the last run of SFT's response mask; what the
template writes after it is left out. The prompt is the tokens the chosen and rejected renderings share before
their responses, so both sequences start with exactly the same prompt tokens (where a tokenizer merges across the
prompt's end differently for the two, those prompt tokens go with each response, unlabelled).

Lengths: a prompt longer than ``max_prompt`` tokens keeps its end; a sequence longer than ``cap`` tokens is cut at
the end of its response. Labels are the input ids on response tokens and -100 elsewhere (the prompt, the template's
text before the reply, and always the first token, which nothing predicts).
"""

from __future__ import annotations

import os
from typing import Any

from leantrain.data.lm import masks
from leantrain.data.lm import rendering as rd
from leantrain.data.lm import preference_formats as pf
from leantrain.errors import DataError

IGNORE = -100
Response = tuple[list[int], int]  # a response's tokens after the shared prompt, how many of them lead unlabelled


def affixes(tokenizer) -> tuple[list[int], list[int]]:  # noqa: ANN001
    """The special tokens the tokenizer adds before and after a text (BOS; a classifier's [CLS] and [SEP])."""
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(bare) + 1):
        if full[i:i + len(bare)] == bare:
            return list(full[:i]), list(full[i + len(bare):])
    return [], []


def policy_rendering(tokenizer, template: str, textual: bool) -> rd.Rendering:  # noqa: ANN001
    """SFT's rendering choice for these rows: text prompts as prompt / completion rows, messages as chat rows."""
    return rd.choose_rendering(tokenizer, template, "prompt_completion" if textual else "messages")


def as_messages(prompt: str | list[dict[str, str]]) -> list[dict[str, str]]:
    """A prompt as messages: an HH-RLHF transcript as its turns, another text as one user turn."""
    if not isinstance(prompt, str):
        return list(prompt)
    return pf.hh_messages(prompt) or [{"role": "user", "content": prompt}]


def conversation(prompt, response: str, rendering: rd.Rendering) -> list[dict[str, str]]:  # noqa: ANN001
    """The conversation SFT renders for a prompt and its reply (raw: the two texts as they are)."""
    if rendering.mode == "raw":
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    hh = isinstance(prompt, str) and pf.hh_messages(prompt) is not None
    reply = response.strip() if hh else response  # an HH reply starts with the space after "Assistant:"
    return [*as_messages(prompt), {"role": "assistant", "content": reply}]


def last_run(mask: list[bool]) -> tuple[int, int]:
    """(start, end) of the last run of True in ``mask`` (the final response); (n, n) when there is none."""
    end = len(mask)
    while end and not mask[end - 1]:
        end -= 1
    start = end
    while start and mask[start - 1]:
        start -= 1
    return (start, end) if end else (len(mask), len(mask))


def render_reply(prompt, response: str, tokenizer, rendering: rd.Rendering,  # noqa: ANN001
                 keep_empty_think: bool = False) -> tuple[list[int], list[bool]]:
    """(ids, SFT's response mask) of a prompt and its reply, without the empty think blocks unless
    ``keep_empty_think`` (data.train_on_empty_think)."""
    ids, mask = rd.render(conversation(prompt, response, rendering), tokenizer, rendering)
    return ids, mask if keep_empty_think else masks.without_empty_think(ids, mask, tokenizer)


def encode(example: pf.Example, tokenizer, rendering: rd.Rendering,  # noqa: ANN001
           responses: tuple[str, ...], keep_empty_think: bool = False) -> tuple[list[int], list[Response]]:
    """(the shared prompt's ids, each response's) of one prompt and its responses, as SFT renders them."""
    rendered = []
    for response in responses:
        ids, mask = render_reply(example.prompt, response, tokenizer, rendering, keep_empty_think)
        rendered.append((ids, *last_run(mask)))
    first = rendered[0][0]
    shared = len(os.path.commonprefix([ids[:start] for ids, start, _ in rendered]))
    return first[:shared], [(ids[shared:end], start - shared) for ids, start, end in rendered]


def fit(prompt: list[int], response: list[int], max_prompt: int, cap: int) -> tuple[list[int], list[int], bool, bool]:
    """(prompt, response, prompt trimmed, response cut): the prompt keeps its last ``max_prompt`` tokens, the
    response its first tokens up to ``cap`` in all."""
    trimmed = len(prompt) > max_prompt
    prompt = prompt[len(prompt) - max_prompt:] if trimmed else prompt
    room = cap - len(prompt)
    return prompt, response[:room], trimmed, len(response) > room


def labelled(prompt: list[int], response: list[int], lead: int = 0) -> tuple[list[int], list[int]]:
    """(input ids, labels): the response's tokens past ``lead`` are their own labels, the rest -100, the first
    token always."""
    ids = prompt + response
    labels = [IGNORE] * (len(prompt) + min(lead, len(response))) + list(response[lead:])
    if labels:
        labels[0] = IGNORE
    return ids, labels


def _rows(batch: dict[str, list]) -> list[dict[str, Any]]:
    n = len(next(iter(batch.values())))
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]


def _appended(out: dict[str, list], values) -> None:  # noqa: ANN001
    for k, v in zip(out, values):
        out[k].append(v)


# ------------------------------------------------------------------------------------------ batched map functions


def encode_pairs(batch, tokenizer, fmt: str, template: str, max_prompt: int,  # noqa: ANN001
                 cap: int, keep_empty_think: bool = False) -> dict[str, list]:
    """Pair rows -> chosen/rejected input ids and labels, length; flags trimmed / cut / tie / empty for the counts."""
    out: dict[str, list] = {k: [] for k in ("chosen_input_ids", "chosen_labels", "rejected_input_ids",
                                            "rejected_labels", "length", "trimmed", "cut", "tie", "empty")}
    for row in _rows(batch):
        ex = pf.to_pair(row, fmt)
        prompt, [(chosen, c_lead), (rejected, r_lead)] = encode(
            ex, tokenizer, policy_rendering(tokenizer, template, ex.textual), (ex.chosen, ex.rejected),
            keep_empty_think)
        p, c, trimmed, cut_c = fit(prompt, chosen, max_prompt, cap)
        _, r, _, cut_r = fit(prompt, rejected, max_prompt, cap)
        c_ids, c_labels = labelled(p, c, c_lead)
        r_ids, r_labels = labelled(p, r, r_lead)
        empty = not (any(y != IGNORE for y in c_labels) and any(y != IGNORE for y in r_labels))
        _appended(out, (c_ids, c_labels, r_ids, r_labels, max(len(c_ids), len(r_ids)), trimmed, cut_c or cut_r,
                        c_ids == r_ids, empty))
    return out


def encode_feedback(batch, tokenizer, template: str, keep_empty_think: bool = False) -> dict[str, list]:  # noqa: ANN001
    """Feedback rows -> prompt ids, completion ids, desirable (the KL rows are paired after, across rows)."""
    out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "desirable": []}
    for row in _rows(batch):
        ex = pf.to_feedback(row)
        prompt, [(completion, _)] = encode(ex, tokenizer, policy_rendering(tokenizer, template, ex.textual),
                                           (ex.chosen,), keep_empty_think)  # one response: no lead
        _appended(out, (prompt, completion, int(ex.desirable)))
    return out


def scored_tokens(prompt, response: str, tokenizer  # noqa: ANN001
                  ) -> tuple[list[int], list[int], list[int], list[int]]:
    """A reward model's (specials before, prompt, response, specials after): through the chat template when the
    tokenizer has one (its own special tokens), else the plain text (a text prompt and its reply as they are,
    messages' contents one per paragraph) between the tokenizer's special tokens ([CLS] ... [SEP])."""
    if getattr(tokenizer, "chat_template", None):
        rendering = rd.Rendering("chat")
        ids, mask = rd.render(conversation(prompt, response, rendering), tokenizer, rendering)
        start, end = last_run(mask)
        return [], ids[:start], ids[start:end], []
    if not isinstance(prompt, str):
        prompt, response = "\n\n".join(m["content"] for m in prompt), "\n\n" + response
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] if t else [] for t in (prompt, response)]
    before, after = affixes(tokenizer)
    return before, list(ids[0]), list(ids[1]), after


def encode_scored(batch, tokenizer, fmt: str, max_prompt: int, cap: int) -> dict[str, list]:  # noqa: ANN001
    """Pair rows -> a reward model's chosen/rejected input ids, length; flags as ``encode_pairs``."""
    out: dict[str, list] = {k: [] for k in ("chosen_input_ids", "rejected_input_ids", "length", "trimmed", "cut",
                                            "tie", "empty")}
    for row in _rows(batch):
        ex = pf.to_pair(row, fmt)
        seqs, trimmed, cut = [], False, False
        for response in (ex.chosen, ex.rejected):
            before, prompt, reply, after = scored_tokens(ex.prompt, response, tokenizer)
            room = cap - len(before) - len(after)
            p, r, t, c = fit(prompt, reply, min(max_prompt, room - 1), room)
            seqs.append(before + p + r + after)
            trimmed, cut = trimmed or t, cut or c
        _appended(out, (seqs[0], seqs[1], max(map(len, seqs)), trimmed, cut, seqs[0] == seqs[1], False))
    return out


def feedback_rows(prompts: list[list[int]], completions: list[list[int]], desirable: list[int], max_prompt: int,
                  cap: int) -> tuple[dict[str, list], dict[str, int]]:
    """The feedback side's rows: each row's prompt + completion, and its KL row (its prompt + the next row's
    completion, wrapping: TRL's KL estimate); counts of trimmed prompts, cut responses, rows with no target."""
    out: dict[str, list] = {k: [] for k in ("input_ids", "labels", "desirable", "kl_input_ids", "kl_labels",
                                            "length")}
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
        _appended(out, (ids, labels, desirable[i], kl_ids, kl_labels, max(len(ids), len(kl_ids))))
    return out, counts


# ------------------------------------------------------------------------------------------ the first rows, shown


def rendered_rows(part, fmt: str, template: str, keep_empty_think: bool, tokenizer,  # noqa: ANN001 - a sources.Part
                  n: int) -> list[masks.RenderedRow]:
    """The first ``n`` rows of ``part`` as the policy sees them: each response (chosen and rejected, or a feedback
    row's completion) with the tokens the preference loss covers, the final reply, named by file and line."""
    from jinja2 import TemplateError

    out = []
    for i in range(min(n, len(part.ds))):
        where = (part.where, part.rows([i]))
        row = part.ds[i]
        ex = pf.to_feedback(row) if fmt == "feedback" else pf.to_pair(row, fmt)
        rendering = policy_rendering(tokenizer, template, ex.textual)
        replies = [(("desirable" if ex.desirable else "undesirable"), ex.chosen)] if fmt == "feedback" else \
            [("chosen", ex.chosen), ("rejected", ex.rejected)]
        for title, response in replies:
            try:
                ids, mask = render_reply(ex.prompt, response, tokenizer, rendering, keep_empty_think)
            except (TemplateError, DataError) as e:
                out.append(masks.unrendered(*where, rendering, e, title))
                continue
            start, end = last_run(mask)
            out.append(masks.RenderedRow(*where, rendering, ids, [start <= k < end for k in range(len(ids))], title))
    return out
