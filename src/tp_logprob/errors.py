"""The two errors every caller of tp-logprob can catch."""

from __future__ import annotations


class LogprobContractError(ValueError):
    """Invalid metadata or inputs for a logprob invocation, raised before any work is done."""


class LogprobDispatchError(RuntimeError):
    """A valid contract that no registered backend can serve (or ranks that disagree)."""
