"""``leantrain inspect data.train=FILE --render N``: the first N training rows as the model sees them, the tokens the
loss covers in [[...]] (instruction/chat and preference data: the replies; prompts to be answered: nothing), then
the checks training makes of them (``data.lm.masks``): exit 2 when one fails. The tokenizer loads, no model."""

from __future__ import annotations

import json

from leantrain.config import Config, resolve
from leantrain.data.lm import masks
from leantrain.data.lm.rendering import describe
from leantrain.engine.setup.training_data import load_data, run_task
from leantrain.errors import UserError, problems_error
from leantrain.modeling import load_processor


def rendered(cfg: Config, n: int) -> tuple[list[masks.RenderedRow], object]:
    """(the first ``n`` training rows rendered, the tokenizer) of the run ``cfg`` describes; a UserError when its
    data is not rendered through a template."""
    task = run_task(cfg)
    data = load_data(cfg, task)
    if data.rendered is None:
        raise UserError(f"--render shows data rendered through a template (instruction/chat, preference and prompt "
                        f"data); the data of data.train={cfg.data.train} trains {task.name}, which renders no such "
                        "rows (plain text is learnt whole)")
    tokenizer = load_processor(cfg.model, task)
    return data.rendered(tokenizer, n), tokenizer


def row_text(row: masks.RenderedRow, tokenizer, block_size: int) -> str:  # noqa: ANN001
    """One rendered row for the terminal: a header (file, row, part, tokens, trained, template), then the text with
    the trained tokens in [[...]]."""
    template = describe(row.rendering, tokenizer)
    if row.problem:
        return f"=== {row.name}: {template}\ncannot be rendered: {row.problem}"
    what = "nothing trained" if row.kind == "prompt" else f"{sum(row.trained)} trained"
    head = f"=== {row.name}: {len(row.ids)} tokens, {what}; {template}"
    if row.kind != "prompt" and len(row.ids) > block_size:
        head += f"; longer than data.block_size={block_size}: training keeps the first {block_size}"
    return f"{head}\n{masks.marked(row.ids, row.trained, tokenizer)}"


def row_json(row: masks.RenderedRow, tokenizer) -> dict:  # noqa: ANN001
    return {"source": row.source, "row": row.row, "part": row.part, "kind": row.kind, "rendering": row.rendering.mode,
            "template": describe(row.rendering, tokenizer), "ids": row.ids,
            "tokens": tokenizer.convert_ids_to_tokens(row.ids), "trained": row.trained, "problem": row.problem}


def render_command(source: str | None, overrides: list[str], n: int, *, as_json: bool = False) -> int:
    """Print the first ``n`` rendered training rows (text, or one JSON object with ``rows`` and ``problems``); exit
    2 after them when the checks training makes find a problem."""
    if n < 1:
        raise UserError(f"--render {n}: give the number of rows to show, 1 or more")
    cfg = resolve(source, overrides)
    rows, tokenizer = rendered(cfg, n)
    found = masks.problems(rows, tokenizer)
    if as_json:
        print(json.dumps({"rows": [row_json(r, tokenizer) for r in rows], "problems": found}))
    else:
        print("trained tokens in [[...]]")
        for row in rows:
            print(row_text(row, tokenizer, cfg.data.block_size))
    if found:
        raise problems_error(found)
    return 0
