"""The one line a finished run prints last: the eval headline, what it was measured on (examples, or packed blocks
of examples) and in which precision, the steps and the speed in the task's unit (tokens/s for a language model, samples/s otherwise)."""

from __future__ import annotations


def speed_text(train: dict) -> str:
    """``train`` (summary.json's section) -> "1,234 tokens/s" when the run counts its speed in tokens (a language
    model: ``speed_unit`` tokens), else "12.3 samples/s"."""
    tokens = train.get("tokens_per_second")
    if train.get("speed_unit") == "tokens" and tokens is not None:
        return f"{tokens:,.0f} tokens/s"
    return f"{train.get('samples_per_second') or 0.0:.1f} samples/s"


def rows_text(ev: dict, data: dict) -> str:
    """What the eval ran on: "40 examples", "9 blocks" (a language model's token blocks) or "9 blocks (of 20
    examples)" (instruction data packed several examples to a block)."""
    n = int(ev.get("samples", 0))
    kind = data.get("eval_row_kind", "examples")
    examples = data.get("eval_examples")
    return f"{n} {kind}" + (f" (of {examples} examples)" if examples is not None and kind == "blocks" else "")


def final_line(headline: str, summary: dict, with_loss: bool) -> str:
    """``<headline>[, loss L] on <rows>  (<steps> steps, <speed>) -> <output_dir>``; ``with_loss``: the headline
    does not already hold the loss."""
    ev, train = summary.get("eval") or {}, summary.get("train") or {}
    loss = f", loss {ev['loss']:.4f}" if with_loss and ev.get("loss") is not None else ""
    precision = (summary.get("efficiency") or {}).get("precision")  # what `leantrain eval` computes in by default
    return (f"{headline}{loss} on {rows_text(ev, summary.get('data') or {})}{f' in {precision}' if precision else ''}"
            f"  ({train.get('steps', 0)} steps, {speed_text(train)}) -> {summary.get('output_dir', '')}")
