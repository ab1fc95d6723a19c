"""Data: sources (files, folders, Hub names) -> validated canonical datasets -> processed -> global batches; the
language-model, instruction and preference data in ``data.lm``. The names below load ``text_loader`` (and with it
``datasets``) on first use, so a process that needs one submodule only (a token-shard worker, ``leantrain.data.demo``)
does not pay for them."""

__all__ = ["PreparedData", "load_and_validate", "load_rows"]


def __getattr__(name: str):
    if name in __all__:
        from leantrain.data import text_loader  # lazy: datasets (and pandas, pyarrow) load on first use

        return getattr(text_loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
