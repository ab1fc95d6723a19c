"""``leantrain cache``: list (sizes) or clear what leantrain keeps outside its run folders: the datasets caches it
loaded data into, and its own cache (``$LEANTRAIN_CACHE``). See docs/caches.md."""

from __future__ import annotations

from leantrain.data.caches import clear_caches, list_caches


def cache_command(*, clear: bool = False) -> int:
    """``--list`` (the default) prints each entry with its size; ``--clear`` removes them and prints what it removed."""
    (clear_caches if clear else list_caches)()
    return 0
