"""The optional peft package, imported only when a run asks for LoRA / QLoRA (one place: lora, qlora and the
loaders of adapter folders call it)."""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager

from leantrain.errors import UserError

PEFT_INSTALL = "pip install 'leantrain[peft]' (or pip install peft)"


def import_peft(method: str = "lora"):
    """The peft package, or exit 2 naming the install."""
    quiet = logging.getLogger("bitsandbytes")  # peft imports it; its CPU 4-bit kernel probe logs an unrelated error
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import peft  # lazy: optional extra, imported only when a run asks for LoRA
    except ImportError:
        raise UserError(f"peft.method={method} needs the peft library, which is not installed: {PEFT_INSTALL}") \
            from None
    finally:
        quiet.setLevel(level)
    return peft


@contextmanager
def peft_quiet():
    """Around peft's model wrapping and loading: peft reads transformers' deprecated ``is_gradient_checkpointing``,
    whose FutureWarning is not about the user's run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield
