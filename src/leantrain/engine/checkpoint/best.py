"""The best model by ``checkpoint.best_metric`` (kept in output_dir/best/) and early stopping.

best/ is a save_pretrained folder (with tokenizer and best.json: metric, value, step), replaced atomically on each
improvement. ``train.early_stopping_patience`` = N stops training after N evaluations without improvement. The
record (value, step, evaluations since) travels in every checkpoint, so a resumed run decides exactly as the
uninterrupted one would.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from pathlib import Path

from accelerate import Accelerator
from torch import nn

from leantrain.config import Config
from leantrain.config.metric_names import lower_is_better
from leantrain.engine.training.loop_state import BestRecord
from leantrain.errors import UserError
from leantrain.modeling.lora import is_peft_model, load_adapter_state
from leantrain.report.logs import write_json

log = logging.getLogger("leantrain")


class BestModel:
    def __init__(self, cfg: Config, accelerator: Accelerator, out: Path, processor, record: BestRecord):
        ck = cfg.checkpoint
        self.metric = ck.best_metric
        self.key = self.metric.removeprefix("eval.") if self.metric else None
        self.mode = ck.best_mode if ck.best_mode != "auto" else ("min" if lower_is_better(self.key) else "max")
        self.patience = cfg.train.early_stopping_patience
        self.accelerator, self.out, self.processor = accelerator, Path(out), processor
        self.record = record  # the loop state's: saved and restored with it

    @property
    def should_stop(self) -> bool:
        return bool(self.patience) and self.record.evals_since >= self.patience

    def _better(self, v: float) -> bool:
        if not math.isfinite(v):
            return False
        best = self.record.value
        if best is None:
            return True
        return v > best if self.mode == "max" else v < best

    def update(self, metrics: dict, step: int, model) -> None:
        """After each evaluation (every process calls it)."""
        if self.key is None or not metrics:
            return
        if self.key not in metrics:
            raise UserError(f"checkpoint.best_metric={self.metric} is not computed for this run; "
                            f"available: {', '.join('eval.' + k for k in metrics if k != 'samples')}")
        v, r = float(metrics[self.key]), self.record
        if self._better(v):
            r.value, r.step, r.metrics, r.evals_since = v, step, dict(metrics), 0
            self._save(model)
        else:
            r.evals_since += 1
            if self.should_stop:
                log.info("early stopping at step %d: %s has not improved for %d evaluations (best %.4f at step %d)",
                         step, self.metric, r.evals_since, r.value, r.step)

    def _save(self, model) -> None:
        acc = self.accelerator
        if acc.is_main_process:
            final, tmp, old = self.out / "best", self.out / ".best.tmp", self.out / ".best.old"
            shutil.rmtree(tmp, ignore_errors=True)
            acc.unwrap_model(model).save_pretrained(tmp, safe_serialization=True)
            self.processor.save_pretrained(tmp)
            r = self.record
            write_json(tmp / "best.json", {"metric": self.metric, "mode": self.mode, "value": r.value,
                                           "step": r.step, "metrics": r.metrics})
            shutil.rmtree(old, ignore_errors=True)
            if final.exists():
                os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
            log.info("best %s=%.4f at step %d -> %s", self.metric, r.value, r.step, final)
        acc.wait_for_everyone()

    def load_into(self, model: nn.Module) -> dict | None:
        """checkpoint.save_model=best: put the best weights into ``model``; returns their eval metrics."""
        from safetensors.torch import load_model

        if self.key is None or self.record.step is None:
            return None
        unwrapped = self.accelerator.unwrap_model(model)
        if is_peft_model(unwrapped):  # best/ is an adapter folder (peft's save_pretrained)
            load_adapter_state(unwrapped, self.out / "best")
        else:
            load_model(unwrapped, str(self.out / "best" / "model.safetensors"), strict=False)
        return self.record.metrics

    def summary(self) -> dict | None:
        if self.key is None:
            return None
        return {"metric": self.metric, "mode": self.mode, "value": self.record.value, "step": self.record.step}
