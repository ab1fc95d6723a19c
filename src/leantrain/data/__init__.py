"""Data: sources (files, folders, Hub names) -> validated canonical datasets -> processed -> global batches; the
language-model, instruction and preference data in ``data.lm``."""

from leantrain.data.text_loader import PreparedData, load_and_validate, load_rows

__all__ = ["PreparedData", "load_and_validate", "load_rows"]
