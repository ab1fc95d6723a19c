"""User-facing errors: each one is a clear message and exit status 2, never a traceback."""

from __future__ import annotations


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
