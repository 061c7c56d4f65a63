"""Example databases: local, plus a read-only shared folder or a Redis server, opt in."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    InMemoryExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
    choices_to_bytes,
)

from tp_logprob.suite.databases import REDIS_KEY_PREFIX, example_database


def test_local_database_by_default(tmp_path: Path) -> None:
    database = example_database({"TP_LOGPROB_HYPOTHESIS_DB": str(tmp_path)})
    assert isinstance(database, DirectoryBasedExampleDatabase)
    database.save(b"key", b"value")
    assert list(DirectoryBasedExampleDatabase(tmp_path).fetch(b"key")) == [b"value"]


def test_shared_folder_is_read_but_never_written(tmp_path: Path) -> None:
    local, shared = tmp_path / "local", tmp_path / "shared"
    DirectoryBasedExampleDatabase(shared).save(b"key", b"found by ci")
    database = example_database(
        {"TP_LOGPROB_HYPOTHESIS_DB": str(local), "TP_LOGPROB_SHARED_DB": str(shared)}
    )
    assert isinstance(database, MultiplexedDatabase)
    assert any(isinstance(db, ReadOnlyDatabase) for db in database._wrapped)
    assert list(database.fetch(b"key")) == [b"found by ci"]
    database.save(b"key", b"found here")
    assert list(DirectoryBasedExampleDatabase(shared).fetch(b"key")) == [b"found by ci"]
    assert list(DirectoryBasedExampleDatabase(local).fetch(b"key")) == [b"found here"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server not installed (Debian: apt-get install -y redis-server)")
    pytest.importorskip("redis")
    port = _free_port()
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import redis

        client = redis.Redis(host="127.0.0.1", port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail("redis-server did not answer within 5 s")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(timeout=10)


_REPLAYING = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)


def _above_ten(database: ExampleDatabase, seen: list[int]) -> Callable[[], None]:
    """The same property each time, so both databases key its examples alike; replaying
    them whatever profile is loaded (the ``ci`` profile never replays)."""

    @settings(database=database, max_examples=50, phases=_REPLAYING)
    @given(st.integers())
    def fails_above_ten(value: int) -> None:
        seen.append(value)
        assert value <= 10

    return fails_above_ten


def test_redis_database_shares_failures(tmp_path: Path, redis_url: str) -> None:
    import redis

    env = {"TP_LOGPROB_HYPOTHESIS_DB": str(tmp_path), "TP_LOGPROB_HYPOTHESIS_REDIS": redis_url}
    database = example_database(env)
    assert isinstance(database, MultiplexedDatabase)
    with pytest.raises(AssertionError):
        _above_ten(database, [])()
    keys = redis.Redis.from_url(redis_url).keys(REDIS_KEY_PREFIX + b"*")
    assert keys, "the failing example was not saved to Redis"
    # A teammate with an empty local database replays the shrunk failure first, from Redis.
    teammate = example_database({**env, "TP_LOGPROB_HYPOTHESIS_DB": str(tmp_path / "other")})
    seen: list[int] = []
    with pytest.raises(AssertionError):
        _above_ten(teammate, seen)()
    assert seen[0] == 11


def test_redis_without_the_client_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(RuntimeError, match=r"tp-logprob\[redis\]"):
        example_database({"TP_LOGPROB_HYPOTHESIS_REDIS": "redis://127.0.0.1:1/0"})


def _ci_draws(database: ExampleDatabase, profile: str = "ci") -> list[int]:
    """What a property under ``profile`` draws at the ci seed, with ``database`` behind it."""
    from tp_logprob.suite.profiles import CI_SEED, profile_name, register_profiles

    register_profiles()
    drawn: list[int] = []

    @settings(settings.get_profile(profile_name(profile)), database=database, max_examples=10)
    @given(st.integers(0, 2**30))
    def record(value: int) -> None:
        drawn.append(value)

    record._hypothesis_internal_use_seed = CI_SEED  # type: ignore[attr-defined]
    record()
    return drawn


class _Stocked(InMemoryExampleDatabase):
    """A database another run has filled: five saved examples under every key."""

    def fetch(self, key: bytes) -> Iterator[bytes]:
        yield from (choices_to_bytes([value]) for value in range(5))


def test_ci_draws_are_the_seeds_alone_whatever_the_database_holds() -> None:
    fresh = _ci_draws(InMemoryExampleDatabase())
    assert _ci_draws(_Stocked()) == fresh
    # Control: with the database replayed first (dev), the same seed draws otherwise.
    assert _ci_draws(_Stocked(), profile="dev")[:5] == [0, 1, 2, 3, 4]
