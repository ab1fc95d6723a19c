"""Progress on the main process only: a tqdm bar on a terminal, plain log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time

from leantrain.units import format_duration

log = logging.getLogger("leantrain")


def _fmt(metrics: dict[str, float]) -> str:
    parts = []
    for k, v in metrics.items():
        if k == "lr":
            parts.append(f"lr={v:.2e}")
        elif k == "tokens_per_second" and isinstance(v, float):
            parts.append(f"tokens/s={v:,.0f}")
        elif isinstance(v, float):
            parts.append(f"{k}={v:.4g}")
        else:
            parts.append(f"{k}={v}")
    return " ".join(parts)


class Progress:
    def __init__(self, total: int, *, enabled: bool, mode: str = "auto", initial: int = 0):
        self.total = total
        self.enabled = enabled and mode != "none"
        use_bar = mode == "bar" or (mode == "auto" and sys.stderr.isatty())
        self.bar = None
        self.t0 = time.perf_counter()
        self.initial = initial
        if self.enabled and use_bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)

    def update(self, step: int, metrics: dict[str, float] | None = None) -> None:
        """Called once per optimizer step; ``metrics`` only on logging steps."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            if metrics:
                self.bar.set_postfix_str(_fmt(metrics), refresh=False)
        elif metrics:
            done = step - self.initial
            elapsed = time.perf_counter() - self.t0
            eta = elapsed / max(done, 1) * (self.total - step)
            log.info("step %d/%d %s eta=%s", step, self.total, _fmt(metrics), format_duration(eta))

    def write(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            log.info(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
