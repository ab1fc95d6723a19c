"""One evaluation, in a training run and in ``leantrain eval``: the same batch width (the run's:
``train.eval_batch_size`` or 2 x its micro-batch, recorded with the model), the same output layer on every model the
task runs (the policy's chunked loss on its reference too: no ``tokens x vocabulary`` fp32 logits), and, in
``leantrain eval``, the width planned against the memory budget as the micro-batch is (``efficiency.memory_budget``,
else the device's default), priced by a fake evaluation forward (``perf.estimate.fake_eval_peak``) before any real
one."""

from __future__ import annotations

import logging

from leantrain.modeling.chunked_loss import same_output_layer
from leantrain.methods import Task
from leantrain.perf.auto_micro_batch import MARGIN, default_budget, parse_bytes
from leantrain.perf.estimate import fake_eval_peak
from leantrain.perf.memory_model import resident_bytes
from leantrain.units import format_bytes

log = logging.getLogger("leantrain")

EVAL_WIDTH_FACTOR = 2  # the run's evaluation takes this many micro-batches' rows a batch: no gradients to keep
UNRECORDED_WIDTH = 64  # leantrain eval of a folder that does not record its run's width: the most it tries


def eval_width(eval_batch_size: int | None, micro_batch_size: int) -> int:
    """Rows a process evaluates at once: ``train.eval_batch_size``, else 2 x the micro-batch."""
    return int(eval_batch_size or EVAL_WIDTH_FACTOR * micro_batch_size)


def with_eval_reference(task: Task, policy, reference, autocast=None) -> Task:
    """``task`` evaluating ``policy`` against ``reference`` (``Task.evaluation.with_reference``), the reference given the policy's
    output layer first (a training run's live reference is a copy of the policy, so it has it already)."""
    if same_output_layer(policy, reference):
        log.info("reference: the policy's chunked output layer (no tokens x vocabulary logits)")
    return task.evaluation.with_reference(reference, autocast)


def planned_eval_width(model, task: Task, wanted: int, seq_len: int, precision: str,
                       memory_budget: int | str | None = None) -> tuple[int, str]:
    """(rows a batch, why): ``wanted``, halved until one evaluation forward at that width (priced on fake tensors,
    with the micro-batch planner's margin) fits the budget beside what the process holds now."""
    device = next(model.parameters()).device
    budget, source = ((parse_bytes(memory_budget), "efficiency.memory_budget") if memory_budget is not None
                      else default_budget(device))
    held = resident_bytes(device) or 0
    width = max(1, int(wanted))
    while True:
        try:
            need = held + int(fake_eval_peak(model, task, width, seq_len, precision) * (1 + MARGIN))
        except Exception as e:  # noqa: BLE001 - a model whose forward fake tensors cannot run: said, not planned
            return width, f"not planned: a fake evaluation forward failed ({type(e).__name__}: {e})"
        if need <= budget or width == 1:
            break
        width = max(1, width // 2)
    why = (f"planned peak {format_bytes(need)} at {seq_len} tokens ({format_bytes(held)} held) against the budget "
           f"{format_bytes(budget)} from {source}")
    if need > budget:
        why += "; even one row does not fit: lower data.block_size or raise efficiency.memory_budget"
    return width, why
