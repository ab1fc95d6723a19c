"""EleutherAI's lm-evaluation-harness on a trained causal LM: ``lm_eval.simple_evaluate`` over its ``HFLM`` wrapping
the model already loaded, on task YAMLs from a local folder (``--harness DIR`` / ``eval.harness_dir``: e.g.
``dataset_path: json`` with local ``data_files``), so it runs offline. The scores are the harness's own numbers
(``{task: {metric: value}}``, the harness's ``acc,none`` written ``acc``).

Relative paths inside a task YAML (its data files) are read from the task folder: the harness runs with that folder as
the working directory. A task the folder does not define, or one the harness cannot load (a Hub data set while
offline, a missing file, a bad YAML), exits 2 naming it with the harness's reason, before any scoring."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from leantrain.errors import UserError
from leantrain.modeling.load import is_adapter_folder, load_adapter_model

log = logging.getLogger("leantrain")


@contextlib.contextmanager
def working_dir(path: Path):
    """Run the block in ``path`` (the harness reads a task's relative data files from there); back afterwards."""
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def import_lm_eval():
    try:
        import lm_eval  # noqa: F401
        from lm_eval.models.huggingface import HFLM  # noqa: F401
    except ImportError:
        raise UserError("the evaluation harness needs lm-eval: pip install 'leantrain[eval]'") from None
    return lm_eval


def task_manager(folder: str | None):
    """The harness's task index: the YAMLs of ``folder`` only (fast, offline), or its built-in tasks without one."""
    from lm_eval.tasks import TaskManager

    if folder is None:
        return TaskManager()
    path = Path(folder).expanduser().resolve()
    if not path.is_dir():
        raise UserError(f"--harness {folder}: no such folder of task YAMLs")
    return TaskManager(include_path=str(path), include_defaults=False)


def check_tasks(tasks: list[str], manager, folder: str | None) -> None:  # noqa: ANN001 - a TaskManager
    """Every task is defined and loads (its data read); exit 2 naming the first that does not, and why."""
    from lm_eval.tasks import get_task_dict

    known = set(manager.all_tasks)
    missing = [t for t in tasks if t not in known]
    if missing:
        where = f"in {folder}" if folder else "among the harness's tasks"
        raise UserError(f"harness task {', '.join(missing)}: not defined {where}; defined: "
                        f"{', '.join(sorted(known)[:20]) or 'none'}")
    for name in tasks:
        try:
            get_task_dict([name], manager)
        except Exception as e:  # noqa: BLE001 - the harness and datasets raise many kinds; each is the user's to fix
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"harness task {name}: the harness cannot load it (offline, local files only): "
                            f"{type(e).__name__}: {reason}") from None


def scores(results: dict) -> dict[str, dict[str, float]]:
    """``{task: {metric: value}}`` from ``simple_evaluate``'s results (the ``,none`` filter suffix dropped)."""
    out = {}
    for task, values in results["results"].items():
        out[task] = {k.removesuffix(",none"): v for k, v in values.items()
                     if k != "alias" and isinstance(v, (int, float)) and not isinstance(v, bool)}
    return out


def run_harness(model, tokenizer, tasks: list[str], folder: str | None, *, batch_size: int = 8,  # noqa: ANN001
                limit: int | None = None) -> tuple[dict, str]:
    """The harness's scores of ``model`` on ``tasks`` and its table (as the harness prints it)."""
    lm_eval = import_lm_eval()
    from lm_eval.models.huggingface import HFLM
    from lm_eval.utils import make_table

    manager = task_manager(folder)
    where = Path(folder).expanduser().resolve() if folder else Path.cwd()
    with working_dir(where):
        check_tasks(tasks, manager, folder)
        lm = HFLM(pretrained=model.eval(), tokenizer=tokenizer, batch_size=batch_size)
        results = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit,
                                          log_samples=False)
    return scores(results), make_table(results)


def check_harness(eval_cfg, task) -> None:  # noqa: ANN001 - an EvalConfig and the run's Task
    """Before training: ``eval.harness_tasks`` needs a causal LM, lm-eval, and tasks that are defined and load."""
    if not eval_cfg.harness_tasks:
        return
    task.evaluation.check_generates("eval.harness_tasks")
    import_lm_eval()
    manager = task_manager(eval_cfg.harness_dir)
    where = Path(eval_cfg.harness_dir).expanduser().resolve() if eval_cfg.harness_dir else Path.cwd()
    with working_dir(where):
        check_tasks(list(eval_cfg.harness_tasks), manager, eval_cfg.harness_dir)


def harness_of_folder(model_dir: Path, tasks: list[str], folder: str | None) -> tuple[dict, str]:
    """The harness's scores of a saved model folder (a LoRA adapter folder: merged over its base), as loaded from
    disk: the model a user gets."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"dtype": torch.float32}
    if is_adapter_folder(str(model_dir)):
        model = load_adapter_model(str(model_dir), AutoModelForCausalLM, kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return run_harness(model, tokenizer, tasks, folder)
