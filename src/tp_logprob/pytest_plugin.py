"""pytest plugin (entry point ``pytest11``): runs the property suite against chosen backends.

``pytest --pyargs tp_logprob.properties [--tp-logprob-backend=ID|module:attr ...]``

The plugin chooses the backends once (default: every backend registered on the
platform), prints them with the platform, profile and seed in the report
header, parametrizes every property over them, deselects the properties a backend
does not claim (:mod:`tp_logprob.suite.applicability`), turns a failing
property into a short report ending with the command that replays it, and prints a
per-backend summary table at the end of the session (merged across pytest-xdist
workers), with what each backend does not claim under it.

The plugin is inert unless the suite is requested: ``--tp-logprob-backend`` (or
another ``--tp-logprob-*`` option) given, the suite's modules named on the command
line or collected, or ``tp_logprob_suite = true`` in the project's pytest
configuration. Until then it loads no Hypothesis profile, sets no database or
seed, writes no file and prints nothing, so a project that merely has
tp-logprob installed runs its own Hypothesis tests exactly as before. When the
suite is requested, only the properties get the suite's settings and seed; the
``tp_logprob_suite`` opt-in makes them the session's default for every
Hypothesis test (this repository's own tests run that way).

Under ``torchrun`` (``torchrun --standalone --nproc-per-node N -m pytest --pyargs
tp_logprob.properties ...``) each process is one rank of a real process group:
the suite then runs every property on that group in lockstep, and rank 0 reports
(see :mod:`tp_logprob.real_group.plugin`). Without ``torchrun``, nothing of that
runs.

Importing it imports neither torch nor triton; nothing is resolved until a
session asks for the suite.
"""

from __future__ import annotations

import math
import os
import random
import shlex
import weakref
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tp_logprob.judging.violation import LABEL_WIDTH, PropertyViolation
from tp_logprob.suite.outcomes import NotApplicable
from tp_logprob.suite.profiles import (
    CI_SEED,
    DEFAULT_PROFILE,
    PROFILES,
    name_suite_profile,
)
from tp_logprob.suite.session import DEFAULT_ARTIFACTS_DIR, Suite
from tp_logprob.suite.summary import NotClaimed, SuiteStats
from tp_logprob.suite.variants import declared_variants

PROPERTIES_DIR = Path(__file__).resolve().parent / "properties"
BACKEND_FIXTURE = "tp_logprob_backend"
_STATS_OUTPUT = "tp_logprob_stats"
_NOT_CLAIMED_OUTPUT = "tp_logprob_not_claimed"
_SEED_INPUT = "tp_logprob_seed"
DEFAULT_RANK_LOGS = ".tp_logprob/ranks"
DEFAULT_GROUP_TIMEOUT_S = 60.0
OPT_IN_INI = "tp_logprob_suite"


_SUITE = pytest.StashKey[Suite]()


class _SuiteProfileNames:
    """``--hypothesis-profile=dev`` (or ``ci``, ``thorough``) names the suite's profile:
    registered under that name before Hypothesis' own plugin loads it."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        chosen = config.getoption("hypothesis_profile", None)
        if chosen is not None:
            name_suite_profile(str(chosen))


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.register(_SuiteProfileNames(), "tp_logprob_profile_names")
    group = parser.getgroup("tp-logprob")
    group.addoption(
        "--tp-logprob-backend",
        action="append",
        default=[],
        metavar="ID|MODULE:ATTR",
        help="backend to check (repeatable): a registered id, or module:attr naming "
        "register(registry) or a (factory_or_op, capability) pair "
        "(default: every backend registered on the platform)",
    )
    group.addoption(
        "--tp-logprob-platform",
        default=None,
        choices=("cuda", "rocm", "cpu"),
        help="platform whose backends to check (default: detected)",
    )
    group.addoption(
        "--tp-logprob-artifacts",
        default=os.environ.get("TP_LOGPROB_ARTIFACTS", DEFAULT_ARTIFACTS_DIR),
        metavar="DIR",
        help="where a failing property writes its replayable artifacts "
        f"(default: $TP_LOGPROB_ARTIFACTS or {DEFAULT_ARTIFACTS_DIR})",
    )
    group.addoption(
        "--tp-logprob-wide-max-vocab",
        type=int,
        default=int(os.environ.get("TP_LOGPROB_WIDE_MAX_VOCAB", 1 << 18)),
        metavar="COLUMNS",
        help="widest vocabulary the wide sweep draws (default: 262144, or "
        "$TP_LOGPROB_WIDE_MAX_VOCAB; at least 1024)",
    )
    group.addoption(
        "--tp-logprob-profile",
        default=os.environ.get("TP_LOGPROB_PROFILE", DEFAULT_PROFILE),
        choices=("dev", "ci", "thorough"),
        help="Hypothesis profile for tp-logprob tests (default: dev, or $TP_LOGPROB_PROFILE)",
    )
    group.addoption(
        "--tp-logprob-group-timeout",
        type=float,
        default=float(os.environ.get("TP_LOGPROB_GROUP_TIMEOUT", DEFAULT_GROUP_TIMEOUT_S)),
        metavar="SECONDS",
        help="under torchrun: how long a collective of the real process group waits for its "
        f"peers (default: {DEFAULT_GROUP_TIMEOUT_S:g}, or $TP_LOGPROB_GROUP_TIMEOUT)",
    )
    group.addoption(
        "--tp-logprob-rank-logs",
        default=os.environ.get("TP_LOGPROB_RANK_LOGS", DEFAULT_RANK_LOGS),
        metavar="DIR",
        help="under torchrun: where each rank writes its log, rank<r>.log, and ranks "
        f"other than 0 their output, rank<r>.out (default: $TP_LOGPROB_RANK_LOGS or "
        f"{DEFAULT_RANK_LOGS})",
    )
    parser.addini(
        OPT_IN_INI,
        type="bool",
        default=False,
        help="tp-logprob: request the property suite's settings for the whole session "
        "(its Hypothesis profile, example database and, under ci, its seed for every test)",
    )


def pytest_configure(config: pytest.Config) -> None:
    profile = _chosen_profile(config)
    suite = Suite(
        specs=list(config.getoption("--tp-logprob-backend")),
        platform_option=config.getoption("--tp-logprob-platform"),
        profile=profile,
        seed=_session_seed(config, profile),
        stats=SuiteStats(),
        artifacts=config.getoption("--tp-logprob-artifacts"),
        wide_max_vocab=config.getoption("--tp-logprob-wide-max-vocab"),
        everywhere=bool(config.getini(OPT_IN_INI)),
    )
    config.stash[_SUITE] = suite
    requested = _suite_requested(config)
    if suite.everywhere or requested:
        suite.activate()
    if suite.specs:
        backends_of(suite)  # a bad --tp-logprob-backend is a usage error, once
    if requested and _under_torchrun():
        from tp_logprob.real_group.plugin import start

        start(config, suite, is_property)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> Generator[None, None, None]:
    """Under torchrun, a rank other than 0 sends its output to its log, before pytest
    starts capturing (so that what pytest restores between tests is the log too)."""
    namespace = early_config.known_args_namespace
    requested = _requests_suite(namespace.tp_logprob_backend, args, namespace.file_or_dir)
    if requested and _under_torchrun():
        from tp_logprob.real_group.group import Launch
        from tp_logprob.real_group.plugin import redirect_output

        rank = Launch.from_environ().rank
        if rank > 0:
            redirect_output(rank, namespace.tp_logprob_rank_logs)
    return (yield)


def backends_of(suite: Suite) -> list[Any]:
    """The session's backends; a ``--tp-logprob-backend`` that names none is a usage error."""
    from tp_logprob.suite.backends import BackendSpecError

    try:
        return suite.backends()
    except BackendSpecError as error:
        raise pytest.UsageError(str(error)) from None


def _under_torchrun() -> bool:
    """Whether torchrun started this process (its variables are set); reads nothing else."""
    from tp_logprob.real_group.group import TORCHRUN_VARIABLES

    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> None:
    """Collecting one of the suite's modules requests the suite (before it is imported)."""
    if PROPERTIES_DIR in file_path.resolve().parents:
        parent.config.stash[_SUITE].activate()


def _chosen_profile(config: pytest.Config) -> str:
    """``--tp-logprob-profile``, or ``--hypothesis-profile`` when only that one was given.

    A Hypothesis profile of the user's own is honoured as it is (its examples, its
    seed policy); naming both options with different profiles is a usage error.
    """
    ours = config.getoption("--tp-logprob-profile")
    theirs = config.getoption("hypothesis_profile", None)
    if theirs is None:
        return str(ours)
    explicit = "TP_LOGPROB_PROFILE" in os.environ or any(
        str(arg).startswith("--tp-logprob-profile") for arg in config.invocation_params.args
    )
    if explicit and theirs != ours:
        raise pytest.UsageError(
            f"--hypothesis-profile={theirs} and --tp-logprob-profile={ours} disagree: pass "
            "one of them (the tp-logprob profiles are dev, ci and thorough)"
        )
    return str(theirs)


def _session_seed(config: pytest.Config, profile: str) -> int | str:
    """``--hypothesis-seed`` if given, :data:`CI_SEED` under ci, else a fresh random seed.

    xdist workers take the controller's (see :func:`pytest_configure_node`).
    """
    given = config.getoption("hypothesis_seed", None)
    worker_input = getattr(config, "workerinput", {})
    if given is not None:
        return int(given) if str(given).lstrip("-").isdigit() else str(given)
    if _SEED_INPUT in worker_input:
        return worker_input[_SEED_INPUT]  # type: ignore[no-any-return]
    if profile == "ci":
        return CI_SEED
    return random.SystemRandom().randrange(2**32)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: every worker draws from the session's seed."""
    node.workerinput[_SEED_INPUT] = node.config.stash[_SUITE].seed


def _suite_requested(config: pytest.Config) -> bool:
    """A ``--tp-logprob-*`` option on the command line, or the suite's modules named."""
    return _requests_suite(
        config.getoption("--tp-logprob-backend"), config.invocation_params.args, config.args
    )


def _requests_suite(backends: Any, arguments: Any, paths: Any) -> bool:
    """Backends chosen, a ``--tp-logprob-*`` argument, or a path or module of the suite."""
    if backends or any(str(arg).startswith("--tp-logprob-") for arg in arguments):
        return True
    for arg in paths or ():
        name = arg.split("::", 1)[0]
        if name.startswith("tp_logprob.properties"):
            return True
        path = Path(name).resolve()
        if (
            path == PROPERTIES_DIR
            or PROPERTIES_DIR in path.parents
            or path in PROPERTIES_DIR.parents
        ):
            return True
    return False


def pytest_report_header(config: pytest.Config) -> list[str]:
    suite = config.stash[_SUITE]
    if not suite.active:
        return []
    if not _suite_requested(config):
        return [f"tp-logprob: hypothesis profile {suite.profile}, seed {suite.seed}"]
    names = ", ".join(
        backend.backend_id
        if backend.spec == backend.backend_id
        else f"{backend.backend_id} ({backend.spec})"
        for backend in backends_of(suite)
    )
    return [
        f"tp-logprob: backends {names or 'none'}; platform {suite.platform}; "
        f"profile {suite.profile}; seed {suite.seed}"
    ]


def is_property(item: pytest.Item) -> bool:
    """Whether ``item`` is one of the suite's property tests."""
    return PROPERTIES_DIR in Path(str(item.path)).resolve().parents


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A property test runs on every backend under test, then on each of its variants
    (:func:`~tp_logprob.suite.variants.variants`)."""
    if BACKEND_FIXTURE not in metafunc.fixturenames:
        return
    backends = backends_of(metafunc.config.stash[_SUITE])
    metafunc.parametrize(
        BACKEND_FIXTURE,
        backends,
        ids=[backend.backend_id for backend in backends],
        indirect=True,
        scope="session",
    )
    for declared in reversed(declared_variants(metafunc.function)):  # innermost first
        metafunc.parametrize(declared.name, declared.values, ids=declared.ids)


@pytest.hookimpl(trylast=True)  # after -k and -m: what it deselects is what was selected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give the properties the suite's settings and seed (with the project's opt-in, under
    ci, every Hypothesis test gets the seed too); nothing unless the suite is requested.

    The settings are applied as ``@settings`` applies them, on the test alone, so no
    other test sees the profile (:func:`_give_settings`). ``hypothesis.seed()`` and
    ``--hypothesis-seed`` would also switch the example database off; setting the
    attribute ``seed()`` sets keeps it on, so a failure found once is still saved (and,
    outside ``ci``, replayed first on the next run; ``ci``'s draws are its seed's alone,
    see :mod:`tp_logprob.suite.profiles`).
    """
    suite = config.stash[_SUITE]
    if not suite.active:
        return
    if any(is_property(item) for item in items):
        from tp_logprob.replay.catalogue import suite_properties

        suite_properties()  # every property module, imported before a test runs
    _deselect_unclaimed(config, suite, items)
    for item in items:
        test: Any = getattr(item, "obj", None)
        if getattr(getattr(test, "hypothesis", None), "inner_test", None) is None:
            continue  # not a Hypothesis test
        if is_property(item):
            _give_settings(test, suite.settings_for(test))
        if is_property(item) or (suite.everywhere and suite.profile == "ci"):
            # Hypothesis' public seed() also turns the example database off; the suite
            # keeps the database, so it sets the attribute seed() would set.
            test._hypothesis_internal_use_seed = suite.seed


_GIVEN: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
"""The settings (their repr) each property test was given in this process."""


def _give_settings(test: Any, chosen: settings) -> None:
    """Apply ``chosen`` to ``test`` as ``@settings`` does, once.

    The items of one property (one per backend) share its function, and ``@settings``
    refuses to decorate a test twice; a later session in the same process that
    chooses the same settings finds them applied already.
    """
    given = _GIVEN.get(test)
    if given == repr(chosen):
        return
    if given is not None:
        raise pytest.UsageError(
            f"{test.__qualname__} already runs under {given} in this process and cannot be "
            f"given {chosen!r}: run the suite with other settings in a new process"
        )
    chosen(test)
    _GIVEN[test] = repr(chosen)


def _deselect_unclaimed(config: pytest.Config, suite: Suite, items: list[pytest.Item]) -> None:
    """Deselect every property a backend does not claim (see
    :mod:`tp_logprob.suite.applicability`), counting why, per backend.

    The decision reads only the capability and the test's parameters, so every
    xdist worker deselects the same items and runs the same collection.
    """
    from tp_logprob.suite.applicability import unclaimed

    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        params = dict(getattr(getattr(item, "callspec", None), "params", {}))
        backend = params.pop(BACKEND_FIXTURE, None)
        reason = None
        if backend is not None and is_property(item):
            reason = unclaimed(getattr(item, "obj", None), backend, params)
        if reason is None:
            kept.append(item)
            continue
        dropped.append(item)
        suite.not_claimed.add(backend.backend_id, reason, item.nodeid)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def tp_logprob_backend(request: pytest.FixtureRequest) -> Any:
    """The backend under test (parametrized over ``--tp-logprob-backend``)."""
    backend = request.param
    failure = backend.load_failure()
    if failure is not None:
        pytest.fail(f"backend {backend.backend_id!r} could not be loaded: {failure}", pytrace=False)
    return backend


def suite_stats(config: pytest.Config) -> SuiteStats:
    """This session's per-backend counters (for tools such as benchmarks/bench_suite.py)."""
    return config.stash[_SUITE].stats


@pytest.fixture(scope="session")
def tp_logprob_suite(request: pytest.FixtureRequest) -> Suite:
    """The session's choices: every backend under test, the platform, and the stats."""
    return request.config.stash[_SUITE]


def replay_command(item: pytest.Item, suite: Suite, spec: str | None) -> str:
    """The pytest command that reruns ``item`` the way it just ran (under torchrun, if it did)."""
    parts = [*suite.launcher, "pytest", f"{item.path}::{item.name}"]
    if spec is not None:
        parts.append(f"--tp-logprob-backend={spec}")
    parts += [
        f"--tp-logprob-platform={suite.platform}",
        (
            f"--tp-logprob-profile={suite.profile}"
            if suite.profile in PROFILES
            else f"--hypothesis-profile={suite.profile}"
        ),
        f"--hypothesis-seed={suite.seed}",
    ]
    return shlex.join(parts)


def _violations(error: BaseException | None) -> list[PropertyViolation]:
    if isinstance(error, PropertyViolation):
        return [error]
    inner_errors = getattr(error, "exceptions", None)  # an exception group (3.11+ or backport)
    if isinstance(inner_errors, (list, tuple)):
        return [found for inner in inner_errors for found in _violations(inner)]
    return []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """A property that does not apply here (the harness's :class:`NotApplicable`) is a
    skip, with the harness's reason."""
    try:
        return (yield)
    except NotApplicable as error:
        pytest.skip(str(error))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    params = getattr(item, "callspec", None)
    backend = params.params.get(BACKEND_FIXTURE) if params is not None else None
    if backend is None or report.when != "call":
        return report
    suite = item.config.stash[_SUITE]
    suite.stats.outcome(backend.backend_id, report.passed, skipped=report.skipped)
    if report.passed or report.skipped:
        return report
    error = call.excinfo.value if call.excinfo else None
    replay = f"  {'replay'.ljust(LABEL_WIDTH)}  {replay_command(item, suite, backend.spec)}"
    replay += _write_artifacts(item, suite, error)
    violations = _violations(error)
    _count_failure(suite.stats, backend.backend_id, item, error, violations)
    if violations:
        reports = [f"{found.prop}\n{found.report}" for found in violations]
        report.longrepr = "\n\n".join(reports) + "\n" + replay
    elif call.excinfo is not None and not isinstance(call.excinfo.value, Exception):
        report.longrepr = f"{call.excinfo.value}\n{replay}"  # a real process group aborted
    else:
        report.sections.append(("tp-logprob replay", replay))
    return report


def _count_failure(
    stats: SuiteStats,
    backend_id: str,
    item: pytest.Item,
    error: BaseException | None,
    violations: list[PropertyViolation],
) -> None:
    """The failing example counts in the closing table, measured or not along the way: a
    violation's worst row as it measured it; a failure that measured nothing (a kernel that
    raised, a count that differs) as unbounded, so the table never reads lower than it."""
    measured = [(found.prop, found.measured) for found in violations if found.measured]
    for prop, (ulps, used) in measured:
        stats.failure(backend_id, prop.split(":")[0], ulps, used)
    if measured:
        return
    from tp_logprob.suite.property import failure_record

    if violations:
        prop = violations[0].prop.split(":")[0]
    else:
        records = failure_record(error)
        prop = records[0].prop if records else getattr(item, "originalname", item.name)
    stats.failure(backend_id, prop, math.nan, math.nan)


def _write_artifacts(item: pytest.Item, suite: Suite, error: BaseException | None) -> str:
    """Write the failing examples tagged on ``error``; the report lines that name them.

    Only the exceptions of Hypothesis' final runs reach here, so each artifact is
    a minimal (shrunk) example, not an intermediate failure.
    """
    from tp_logprob.replay.artifacts import command_to_replay, write_artifact
    from tp_logprob.replay.catalogue import suite_properties
    from tp_logprob.suite.property import failure_record

    lines = ""
    if not suite.writes_artifacts:  # a rank other than 0 of a real process group
        return lines
    where = "  (replays on the emulated group, in one process)" if suite.launcher else ""
    for record in failure_record(error):
        try:
            path = write_artifact(
                suite.artifacts,
                suite_properties(),
                prop=record.prop,
                backend=record.backend,
                case=record.case,
                params=record.params,
                failure=record.error,
                seed=suite.seed,
                test=item.nodeid,
            )
        except (OSError, ValueError) as write_error:
            lines += f"\n  {'artifact'.ljust(LABEL_WIDTH)}  not written: {write_error}"
            continue
        command = command_to_replay(path, record.backend.spec)
        lines += f"\n  {'artifact'.ljust(LABEL_WIDTH)}  {command}{where}"
    return lines


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)
    if output is not None and session.config.stash[_SUITE].active:
        output[_STATS_OUTPUT] = session.config.stash[_SUITE].stats.to_json()
        output[_NOT_CLAIMED_OUTPUT] = session.config.stash[_SUITE].not_claimed.to_json()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: fold a finished worker's example counts and worst errors in."""
    output = getattr(node, "workeroutput", {})
    suite = node.config.stash[_SUITE]
    if output.get(_STATS_OUTPUT):
        suite.stats.merge_json(output[_STATS_OUTPUT])
    if output.get(_NOT_CLAIMED_OUTPUT) and not suite.not_claimed.nodeids:
        suite.not_claimed = NotClaimed.from_json(output[_NOT_CLAIMED_OUTPUT])  # one worker's:
        # every worker collected and deselected the same items


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    suite = config.stash[_SUITE]
    stats, not_claimed = suite.stats, suite.not_claimed
    if hasattr(config, "workerinput") or not (stats.backends or not_claimed.nodeids):
        return
    if config.pluginmanager.has_plugin("dsession"):  # the xdist controller
        # The controller collects nothing: the workers deselected, and the summary line
        # counts them only if the controller hears of them.
        terminalreporter.stats.setdefault("deselected", []).extend(not_claimed.nodeids)
    terminalreporter.section("tp-logprob property suite")
    for line in stats.table():
        terminalreporter.write_line(line)
    for line in not_claimed.lines():
        terminalreporter.write_line(line)
