"""Optional parts of Tether and the `pip install` that brings each one.

`tether serve` needs only the dependencies in pyproject.toml's `dependencies`; a PostgreSQL or
Redis store, OpenTelemetry tracing and the development tools (`tether bench`, `tether fuzz`,
tether_lab/) are extras. Code that needs one imports it through `require`, so a missing extra
stops with the command that installs it instead of a bare ModuleNotFoundError.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# extra name -> what it is for (the error's first words)
EXTRAS = {
    "postgres": "a PostgreSQL store",
    "redis": "a Redis store",
    "tracing": "OpenTelemetry tracing",
    "lab": "the development tools (tether_lab)",
    "mcp": "remote MCP servers (the `mcp` tool)",
}


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the `pip install` to run."""

    def __init__(self, extra: str, missing: str) -> None:
        self.extra = extra
        super().__init__(
            f"{EXTRAS[extra]} needs the {extra!r} extra (missing module {missing!r}): "
            f"pip install 'tether[{extra}]' (from a checkout: pip install -e '.[{extra}]')"
        )


def require(module: str, extra: str) -> ModuleType:
    """Import `module`, which the extra `extra` installs."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        # Only a missing optional package is the extra's fault; a missing module inside Tether is a bug.
        if exc.name and exc.name != "tether" and not exc.name.startswith("tether."):
            raise MissingExtra(extra, exc.name) from exc
        raise
