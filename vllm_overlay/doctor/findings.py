"""A doctor finding: how bad, what happens, and what to do about it.

A user reads the report instead of vLLM's start-up log, so each finding has
to stand on its own; only information may come without a fix.
"""

import enum
from dataclasses import dataclass


class Severity(enum.IntEnum):
    """ERROR: `vllm serve` stops at start-up, or fails every request (found
    only once requests flow). WARNING: it starts, but something silently does
    not work as the flags suggest. INFO: context."""

    INFO = 0
    WARNING = 1
    ERROR = 2


@dataclass(frozen=True)
class Finding:
    severity: Severity
    what: str
    fix: str | None = None
