"""User-facing errors: each one is a clear message and exit status 2, never a traceback."""

from __future__ import annotations

import re

_MORE_ROWS = re.compile(r": (\d+) more rows with problems$")


class UserError(Exception):
    """A problem with the user's config, data or command line. The CLI prints it and exits with status 2."""

    exit_code = 2

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = list(problems or [])
        super().__init__(message)

    def __str__(self) -> str:
        head = super().__str__()
        if not self.problems:
            return head
        return head + "\n" + "\n".join(f"  - {p}" for p in self.problems)


class ConfigError(UserError):
    """A bad key or value in the config (YAML file or key=value override)."""


class DataError(UserError):
    """A problem in the user's data: missing file, malformed row, missing column, bad labels, ..."""


def more_rows(where: str, n: int) -> str:
    """The line that stands for the ``n`` bad rows of ``where`` not listed one by one."""
    return f"{where}: {n} more rows with problems"


def problem_count(problems: list[str]) -> int:
    """How many problems the lines describe: one per line, a ``more_rows`` line counting as its rows."""
    return sum(int(m.group(1)) if (m := _MORE_ROWS.search(p)) else 1 for p in problems)


def problems_error(problems: list[str], hints: list[str] | None = None) -> DataError:
    """One DataError listing every problem (counted as ``problem_count`` does), then ``hints`` (not counted)."""
    n = problem_count(problems)
    return DataError(f"the data has {n} problem{'s' if n != 1 else ''}:", [*problems, *(hints or [])])


class SourceError(Exception):
    """One problem that stops a data source from being read; the message names key, file and line
    (``leantrain.data.sources``; here, beneath every layer, for the token-shard workers that raise it without
    importing datasets)."""
