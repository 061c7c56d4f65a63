"""This process's rank of a real process group, and one rank's share of a case run on it.

Under ``torchrun`` every process is one TP rank. :meth:`RealGroup.start` joins the
default process group (gloo on CPU; NCCL on CUDA or ROCm, one device per rank,
``LOCAL_RANK``'s) and a separate gloo *control* group, on which the ranks keep in
lockstep (:mod:`tp_logprob.real_group.lockstep`). A case whose TP degree is the
group's runs here (:func:`~tp_logprob.suite.running.execute` sends it): each
rank calls ``op(local_shard, targets, contract.with_rank(rank), group=TorchGroup())``
on its own shard only, and every rank's outputs come back over the control group,
where each rank checks them bit for bit as ``run_tp`` checks its threads'.

Gradients follow: each rank's backward fills its own shard of the logits (or its
rows of the LM-head weight); :meth:`RealGroup.assemble` puts every rank's shard
in place, and :meth:`RealGroup.sum_partials` adds the ranks' partial ``d hidden``
in rank order, the all-reduce a TP trainer makes.

A rank that raises while its peers wait in a collective leaves them to the
group's timeout; the ranks then report to each other, and every rank aborts with
the same message, which names the rank that raised and the property.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from tp_logprob.comm import TorchGroup
from tp_logprob.contract import LogprobContract
from tp_logprob.emulate import as_result, check_replicated
from tp_logprob.real_group.lockstep import Lockstep, error_fields, lockstep_settings, log_file
from tp_logprob.real_group.verdicts import Phase, Report
from tp_logprob.result import LogprobResult

if TYPE_CHECKING:
    from hypothesis import settings

__all__ = [
    "CONTROL_TIMEOUT_FACTOR",
    "TORCHRUN_VARIABLES",
    "Launch",
    "RealGroup",
    "RealGroupError",
    "launched_by_torchrun",
]

TORCHRUN_VARIABLES = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK")
"""What ``torchrun`` sets in every process it starts (the plugin's sign that it did)."""

CONTROL_TIMEOUT_FACTOR = 4
"""The control group waits this many times the group timeout: long enough for a rank
whose peer raised to give up on the op's collective first and report it."""


class RealGroupError(RuntimeError):
    """The process group cannot be started as asked (the message says which setting)."""


def launched_by_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started by ``torchrun`` (every variable it sets is there)."""
    environ = os.environ if environ is None else environ
    return all(name in environ for name in TORCHRUN_VARIABLES)


@dataclass(frozen=True)
class Launch:
    """Where ``torchrun`` put this process: its global rank, the world and its local rank."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Launch:
        """Read ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; a bad value names itself."""
        environ = os.environ if environ is None else environ
        values = {}
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            text = environ.get(name)
            if text is None or not text.strip().isdigit():
                raise RealGroupError(f"{name}={text!r}: expected a non-negative integer")
            values[name] = int(text)
        launch = cls(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"])
        if launch.world_size < 1 or launch.rank >= launch.world_size:
            raise RealGroupError(
                f"RANK={launch.rank}, WORLD_SIZE={launch.world_size}: the rank must be "
                "below the world size"
            )
        return launch


class RealGroup:
    """This rank of the real group: its TP handle, its lockstep, and the runs on it."""

    def __init__(
        self,
        tp: TorchGroup,
        lockstep: Lockstep,
        control: Any,
        log: TextIO,
        *,
        backend: str,
    ) -> None:
        self.tp, self.lockstep, self.backend = tp, lockstep, backend
        self.rank, self.world_size = tp.rank, tp.world_size
        self._control, self._log = control, log

    @classmethod
    def start(
        cls, launch: Launch, *, platform: str, timeout: float, log_dir: str | Path
    ) -> RealGroup:
        """Join the default group and a gloo control group; open this rank's log.

        NCCL on ``cuda``/``rocm`` (device ``LOCAL_RANK``), gloo on ``cpu``; the
        group's collectives give up after ``timeout`` seconds, the control group's
        after :data:`CONTROL_TIMEOUT_FACTOR` times that.
        """
        import torch
        import torch.distributed as dist

        if not timeout > 0:
            raise RealGroupError(f"timeout={timeout!r}: expected a positive number of seconds")
        backend = "nccl" if platform in ("cuda", "rocm") else "gloo"
        if backend == "nccl":
            count = torch.cuda.device_count()
            if launch.local_rank >= count:
                raise RealGroupError(
                    f"LOCAL_RANK={launch.local_rank}: {count} GPU(s) visible; start at most "
                    f"{count} processes per node (--nproc-per-node)"
                )
            torch.cuda.set_device(launch.local_rank)
        if not dist.is_initialized():
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
        if dist.get_world_size() != launch.world_size:
            raise RealGroupError(
                f"WORLD_SIZE={launch.world_size}: the default process group already has "
                f"{dist.get_world_size()} ranks"
            )
        control_timeout = CONTROL_TIMEOUT_FACTOR * timeout
        control = dist.new_group(
            backend="gloo", timeout=datetime.timedelta(seconds=control_timeout)
        )
        tp = TorchGroup(timeout=timeout)
        path = log_file(log_dir, tp.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        log = path.open("w", encoding="utf-8")

        def all_gather(report: Report) -> list[Report]:
            reports: list[Any] = [None] * tp.world_size
            dist.all_gather_object(reports, report, group=control)
            return reports

        describe = f"{tp.world_size} ranks, {dist.get_backend()!s}"
        lockstep = Lockstep(
            all_gather,
            tp.rank,
            tp.world_size,
            log,
            group=describe,
            logs=str(Path(log_dir) / "rank*.log"),
            timeout=control_timeout,
        )
        return cls(tp, lockstep, control, log, backend=str(dist.get_backend()))

    def settings_for(self, base: settings) -> settings:
        """``base`` with nothing left to the clock or the process, so every rank runs the
        same examples (:func:`~tp_logprob.real_group.lockstep.lockstep_settings`)."""
        return lockstep_settings(base)

    def describe(self) -> str:
        """``3 ranks, gloo``."""
        return self.lockstep.group

    def gather_object(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order, over the control group."""
        import torch.distributed as dist

        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value, group=self._control)
        return values

    def close(self) -> None:
        """Wait (at most the group timeout) for every rank to get here, then leave the
        process groups and close the log.

        The wait keeps the ranks' reports whole: ``torchrun`` stops every process as
        soon as one exits with an error.
        """
        import torch.distributed as dist

        if dist.is_initialized():
            try:
                dist.monitored_barrier(
                    group=self._control, timeout=datetime.timedelta(seconds=self.tp.timeout)
                )
            except RuntimeError as error:  # a rank is stuck or gone: leave without it
                self.lockstep.log(f"END rank {self.rank}: not every rank came to the end: {error}")
            dist.destroy_process_group()
        self._log.close()

    def run(
        self,
        call: Callable[[int, LogprobContract, Any], Any],
        contract: LogprobContract,
        device: Any,
    ) -> list[LogprobResult]:
        """``call(rank, rank_contract, group)`` on this rank; every rank's results, checked.

        The results are in rank order: this rank's own (with its autograd graph) and
        copies of the others'. Raises :class:`~tp_logprob.emulate.ReplicationError`
        when they differ in any bit, this rank's own exception when every rank raised
        one of that type, and aborts (every rank) when only some ranks raised.
        """
        self.lockstep.agree(Phase.EXECUTE)
        mine: LogprobResult | None = None
        error: Exception | None = None
        try:
            mine = as_result(self.rank, call(self.rank, contract.with_rank(self.rank), self.tp))
            fields: dict[str, Any] = {"payload": _portable(mine)}
        except Exception as raised:  # reported to every rank before anyone acts on it
            error = raised
        if error is not None:
            self.lockstep.log_local(error)
            fields = error_fields(error)
        _, reports = self.lockstep.agree(Phase.EXECUTED, **fields)
        if error is not None:  # every rank raised this type (else the exchange aborted)
            raise error
        assert mine is not None
        results = [
            mine if report.rank == self.rank else _placed(report.payload, device)
            for report in reports
        ]
        check_replicated(results)
        return results

    def assemble(self, leaf: Any, bounds: Sequence[tuple[int, int]], dim: int) -> Any:
        """``leaf.grad`` with every rank's ``bounds`` slice along ``dim`` taken from that rank
        (None where no rank has a gradient)."""
        import torch

        grad = leaf.grad
        start, end = bounds[self.rank]
        piece = None if grad is None else grad.detach().narrow(dim, start, end - start).cpu()
        _, reports = self.lockstep.agree(Phase.GATHER, payload=piece)
        pieces = [report.payload for report in reports]
        dtypes = [piece.dtype for piece in pieces if piece is not None]
        if not dtypes:
            return None
        whole = torch.zeros(leaf.shape, dtype=dtypes[0])
        for piece, (start, end) in zip(pieces, bounds, strict=True):
            if piece is not None:
                whole.narrow(dim, start, end - start).copy_(piece)
        return whole.to(leaf.device)

    def sum_partials(self, leaf: Any) -> Any:
        """The sum, in rank order, of every rank's ``leaf.grad`` (None where no rank has one)."""
        grad = leaf.grad
        piece = None if grad is None else grad.detach().cpu()
        _, reports = self.lockstep.agree(Phase.GATHER, payload=piece)
        parts = [report.payload for report in reports if report.payload is not None]
        if not parts:
            return None
        total = parts[0].clone()
        for part in parts[1:]:
            total = total + part
        return total.to(leaf.device)


def _portable(result: LogprobResult) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The result's outputs (support ones too) as CPU tensors, to send to the peers."""
    support = {name: getattr(result, name) for name in LogprobResult.SUPPORT_FIELDS}
    return tuple(map(_to_cpu, result)), {name: _to_cpu(value) for name, value in support.items()}


def _to_cpu(value: Any) -> Any:
    return value.detach().cpu() if hasattr(value, "detach") else value


def _placed(payload: tuple[tuple[Any, ...], dict[str, Any]], device: Any) -> LogprobResult:
    """A peer's result, back on this rank's device."""
    fields, support = payload

    def place(value: Any) -> Any:
        return value.to(device) if hasattr(value, "to") else value

    return LogprobResult(*map(place, fields), **{k: place(v) for k, v in support.items()})
