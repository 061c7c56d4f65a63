"""Hypothesis example databases: the local one, plus an opt-in shared one for a team.

* ``TP_LOGPROB_HYPOTHESIS_DB=DIR`` (default ``.tp_logprob/hypothesis``): the local
  directory database, read and written;
* ``TP_LOGPROB_SHARED_DB=DIR``: a shared directory (e.g. CI's, synced or on a
  network mount), read only, so everyone replays failures CI found first;
* ``TP_LOGPROB_HYPOTHESIS_REDIS=redis://host:port/db``: a Redis server, read and
  written by everyone (needs ``pip install 'tp-logprob[redis]'``).

With any shared source the profiles use a ``MultiplexedDatabase``: saves go to
the local database (and Redis), fetches come from all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)

__all__ = ["DEFAULT_DATABASE_DIR", "REDIS_KEY_PREFIX", "example_database", "redis_database"]

DEFAULT_DATABASE_DIR = ".tp_logprob/hypothesis"
REDIS_KEY_PREFIX = b"tp-logprob-example:"


def redis_database(url: str) -> ExampleDatabase:
    """A ``RedisExampleDatabase`` on the server ``url`` names (``redis://host:port/db``)."""
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise RuntimeError(
            f"TP_LOGPROB_HYPOTHESIS_REDIS={url!r} needs the redis client: "
            "pip install 'tp-logprob[redis]'"
        ) from None
    return RedisExampleDatabase(redis.Redis.from_url(url), key_prefix=REDIS_KEY_PREFIX)


def example_database(environ: Mapping[str, str] | None = None) -> ExampleDatabase:
    """The database the profiles use, from ``environ`` (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    local = DirectoryBasedExampleDatabase(
        Path(env.get("TP_LOGPROB_HYPOTHESIS_DB", DEFAULT_DATABASE_DIR))
    )
    shared: list[ExampleDatabase] = []
    if env.get("TP_LOGPROB_HYPOTHESIS_REDIS"):
        shared.append(redis_database(env["TP_LOGPROB_HYPOTHESIS_REDIS"]))
    if env.get("TP_LOGPROB_SHARED_DB"):
        shared_dir = DirectoryBasedExampleDatabase(Path(env["TP_LOGPROB_SHARED_DB"]))
        shared.append(ReadOnlyDatabase(shared_dir))
    return MultiplexedDatabase(local, *shared) if shared else local
