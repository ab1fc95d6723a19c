"""Data: sources (files, saved folders, Hub names) -> validated, canonical ``datasets.Dataset``s."""

from leantrain.data.validate import PreparedData, load_and_validate, load_rows

__all__ = ["PreparedData", "load_and_validate", "load_rows"]
