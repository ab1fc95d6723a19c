"""The base of every config section (``extra="forbid"``, assignment validated) and the sanity check of its
numbers: finite, within a magnitude no key means, and not so small that float32 holds it as 0."""

from __future__ import annotations

import math
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


MAX_MAGNITUDE = 1e9  # no float key means anything beyond this (train.epochs=1e300 is a typo, not a plan)
MAX_INT = 2**53  # integers beyond exact float range are typos too (and overflow numpy / torch)
MIN_MAGNITUDE = 1.1754944e-38  # float32's least normal number: a non-zero key below it is 0 (or a denormal) there


def check_number(v: Any) -> None:
    if isinstance(v, bool):
        return
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        if abs(v) > MAX_MAGNITUDE:
            raise ValueError(f"{v:g} is out of range: at most {MAX_MAGNITUDE:g} in magnitude")
        if v and abs(v) < MIN_MAGNITUDE:
            raise ValueError(f"{v:g} is 0 in float32, in which training computes (its least normal number is "
                             f"{MIN_MAGNITUDE:.3g})")
    elif isinstance(v, int) and abs(v) > MAX_INT:
        raise ValueError(f"{v} is out of range: at most 2**53 in magnitude")
    elif isinstance(v, (tuple, list)):
        for item in v:
            check_number(item)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _on_off(cls, v: Any, info: ValidationInfo) -> Any:
        """``key=off`` / ``key=on`` on a key whose choices include the word: YAML 1.1 reads the words as booleans
        (``off`` is False), the key means the word."""
        if isinstance(v, bool):
            kind, word = cls.model_fields[info.field_name].annotation, "on" if v else "off"
            if get_origin(kind) is Literal and word in get_args(kind):
                return word
        return v

    @field_validator("*", mode="after")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        """Every number of every section (not the free-form model.config_overrides): finite, sane magnitude."""
        check_number(v)
        return v

    def changed_keys(self) -> list[str]:
        """The keys whose value is not the default, sorted: what a run gave (the workers read the resolved config,
        every key written out, so a key counts as given by its value)."""
        fields = type(self).model_fields
        return sorted(k for k, f in fields.items() if getattr(self, k) != f.get_default(call_default_factory=True))
