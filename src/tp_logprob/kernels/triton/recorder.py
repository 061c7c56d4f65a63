"""Every Triton launch the backends make, recorded from their real launch path without a GPU.

:func:`record` runs each Triton backend's public op (forward, and the backward for
the ``train`` role) on tiny CPU tensors with the module-level ``launch`` of every
launcher module replaced by a recorder, and ``platform_of`` forced to ``cuda`` or
``rocm``: the launch table (:func:`~tp_logprob.kernels.triton.launch.launch_config`)
chooses the configs exactly as it would on that GPU, and nothing runs. Contract
variants are enumerated from the contract's own fields (every enum member, both
values of every flag, a non-default value of every float), so a new option that
changes which kernels or constexprs are launched is picked up without naming it.

Each launch is recorded as a :class:`KernelLaunch`: the kernel, its arguments
(tensors reduced to what the JIT specializes on: element type, 16-byte
alignment, whether the buffer fits a 32-bit offset), constexprs and warps. The
shapes are chosen per :class:`Layout` so that the JIT's alignment specialization
matches production shapes: ``aligned`` (every width, stride and pointer
divisible by 16), ``aligned-2gib`` (the same with logits-sized buffers over
2 GiB, as at N=8192, V=152064, which only AMD's buffer-op specialization
distinguishes), ``padded`` (aligned shards of a padded vocabulary whose real size
is not a multiple of 16) and ``unaligned`` (odd shard widths and offsets).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib
import itertools
import pkgutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import tp_logprob as tpl
from tp_logprob.contract import LogprobContract, LogprobRole
from tp_logprob.errors import LogprobContractError
from tp_logprob.kernels.checks import TORCH_DTYPES
from tp_logprob.kernels.triton import launch as launch_module

__all__ = [
    "LAYOUTS",
    "PLATFORMS",
    "KernelLaunch",
    "Layout",
    "TensorArg",
    "contract_variants",
    "record",
    "triton_backends",
]

PLATFORMS = ("cuda", "rocm")
_CROSSED = ("role", "dtype")  # which kernels run, and the logits dtype: always crossed
_PACKAGE = "tp_logprob.kernels.triton"
_BEYOND_2GIB = 2**32  # bytes: past the 32-bit offsets of AMD buffer ops


@dataclass(frozen=True)
class Layout:
    """Shapes for one JIT specialization: rows, shard bounds per TP degree, real vocabulary."""

    name: str
    rows: int
    bounds: tuple[tuple[tuple[int, int], ...], ...]  # one shard layout per TP degree
    real_vocab_size: int
    offset: int = 0  # elements before each rank's logits in their buffer
    beyond_2gib: bool = False  # logits-shaped buffers counted as larger than 2 GiB
    description: str = ""


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        Layout(
            "aligned",
            32,
            (((0, 128),), ((0, 64), (64, 128))),
            128,
            description="pointers 16-byte aligned; rows, widths and strides divisible by 16",
        ),
        Layout(
            "aligned-2gib",
            32,
            (((0, 128),), ((0, 64), (64, 128))),
            128,
            beyond_2gib=True,
            description="aligned, with logits-sized buffers over 2 GiB (N=8192, V=152064)",
        ),
        Layout(
            "padded",
            32,
            (((0, 128),), ((0, 64), (64, 128))),
            121,
            description="aligned shards of a padded vocabulary: live width not divisible by 16",
        ),
        Layout(
            "unaligned",
            5,
            (((0, 61),), ((0, 31), (31, 61))),
            61,
            offset=1,
            description="odd rows, shard widths, strides and offsets; unaligned pointers",
        ),
    )
}


@dataclass(frozen=True)
class TensorArg:
    """What the JIT specializes a tensor argument on (and whether it is the logits)."""

    dtype: torch.dtype
    data_ptr_mod_16: int
    nbytes: int
    is_logits: bool


@dataclass(frozen=True)
class KernelLaunch:
    """One recorded launch, reduced to what decides the compiled kernel, plus its context."""

    kernel: Any  # the @triton.jit function (a JITFunction outside the interpreter)
    args: tuple[Any, ...]  # TensorArg for tensors, the Python value otherwise
    constexprs: tuple[tuple[str, Any], ...]
    num_warps: int
    grid: tuple[int, ...]
    backend: str
    platform: str
    layout: str
    dtype: str  # the logits dtype
    contract: str  # the contract options that differ from the defaults

    @property
    def name(self) -> str:
        return str(self.kernel.__name__)

    @property
    def reads_logits(self) -> bool:
        return any(isinstance(arg, TensorArg) and arg.is_logits for arg in self.args)

    def compile_key(self) -> tuple[Any, ...]:
        """Launches with equal keys compile to the same binary for a given target."""
        return (self.name, self.platform, self.args, self.constexprs, self.num_warps)


class _ReplicaGroup:
    """A stand-in TP group: every rank's tensor is this rank's (nothing runs anyway)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return [tensor.clone() for _ in range(self.world_size)]


def triton_backends(platform: str) -> tuple[str, ...]:
    """The ids of the backends registered on ``platform`` whose ops live in the Triton package."""
    found = []
    for capability in tpl.registry.backends(platform):
        contract = _base_contract(LAYOUTS["aligned"], 0, 0)
        try:
            op = tpl.registry.get_logprob_op(contract, capability.backend_id, platform=platform).op
        except tpl.LogprobDispatchError:
            continue
        if getattr(op, "__module__", "").startswith(_PACKAGE + "."):
            found.append(capability.backend_id)
    return tuple(found)


def contract_variants(
    base: LogprobContract, *, exhaustive: bool = True
) -> Iterator[LogprobContract]:
    """``base`` with its enum, flag and float options varied (invalid combinations skipped).

    ``exhaustive``: every combination. Otherwise every role x input dtype, each with
    the other options changed one at a time (every kernel and constexpr, fewer pairs).
    """
    choices = _field_choices(base)
    if exhaustive:
        combos = [
            dict(zip(choices, values, strict=True))
            for values in itertools.product(*choices.values())
        ]
    else:
        crossed = {key: choices[key] for key in _CROSSED if key in choices}
        others = {key: values for key, values in choices.items() if key not in crossed}
        singles: list[dict[str, Any]] = [{}] + [
            {key: value} for key, values in others.items() for value in values[1:]
        ]
        combos = [
            {**dict(zip(crossed, values, strict=True)), **single}
            for values in itertools.product(*crossed.values())
            for single in singles
        ]
    for changes in combos:
        try:
            yield _replace(base, changes)
        except LogprobContractError:
            continue


def record(
    platforms: Sequence[str] = PLATFORMS,
    layouts: Sequence[str] = tuple(LAYOUTS),
    target_dtypes: Sequence[torch.dtype] = (torch.int64, torch.int32),
    *,
    exhaustive: bool = True,
) -> list[KernelLaunch]:
    """Every launch of every Triton backend, per contract variant, platform and layout.

    ``exhaustive`` is passed to :func:`contract_variants`.
    """
    launches: list[KernelLaunch] = []
    for platform in platforms:
        for backend in triton_backends(platform):
            for name in layouts:
                layout = LAYOUTS[name]
                for tp_index, bounds in enumerate(layout.bounds):
                    for rank in range(len(bounds)):
                        base = _base_contract(layout, tp_index, rank)
                        for contract in contract_variants(base, exhaustive=exhaustive):
                            for target_dtype in target_dtypes:
                                launches += _record_one(
                                    backend, platform, layout, contract, target_dtype
                                )
    return launches


def _record_one(
    backend: str,
    platform: str,
    layout: Layout,
    contract: LogprobContract,
    target_dtype: torch.dtype,
) -> list[KernelLaunch]:
    try:
        op = tpl.registry.get_logprob_op(contract, backend, platform=platform).op
    except tpl.LogprobDispatchError:
        return []  # the backend does not serve this variant (its capability says why)
    logits = _logits(layout, contract)
    targets = (torch.arange(layout.rows) % layout.real_vocab_size).to(target_dtype)
    world = contract.sharding.tp_world_size
    group = _ReplicaGroup(contract.sharding.tp_rank, world) if world > 1 else None
    raw: list[tuple[Any, ...]] = []
    with _recording(platform, raw):
        result = op(logits, targets, contract, group)
        outputs = [out for out in result if isinstance(out, torch.Tensor) and out.requires_grad]
        if outputs:
            sum(out.float().sum() for out in outputs).backward()  # type: ignore[union-attr]
    return [
        _describe(entry, logits, layout, backend, platform, contract, target_dtype) for entry in raw
    ]


@contextlib.contextmanager
def _recording(platform: str, into: list[tuple[Any, ...]]) -> Iterator[None]:
    """Swap ``launch`` and ``platform_of`` in every launcher module of the Triton package."""

    def recorder(kernel: Any, grid: Any, config: Any, device_tensor: Any, *args: Any, **kw: Any):
        into.append((kernel, tuple(grid), args, {"BLOCK": config.block, **kw}, config))

    swaps = {launch_module.launch: recorder, launch_module.platform_of: lambda _: platform}
    patched: list[tuple[Any, str, Any]] = []
    for module in _launcher_modules():
        for attr, value in vars(module).items():
            if any(value is original for original in swaps):
                patched.append((module, attr, value))
    try:
        for module, attr, value in patched:
            setattr(module, attr, next(new for old, new in swaps.items() if old is value))
        yield
    finally:
        for module, attr, value in patched:
            setattr(module, attr, value)


def _launcher_modules() -> list[Any]:
    package = importlib.import_module(_PACKAGE)
    names = [info.name for info in pkgutil.iter_modules(package.__path__, _PACKAGE + ".")]
    return [importlib.import_module(name) for name in names if name != launch_module.__name__]


def _describe(
    entry: tuple[Any, ...],
    logits: torch.Tensor,
    layout: Layout,
    backend: str,
    platform: str,
    contract: LogprobContract,
    target_dtype: torch.dtype,
) -> KernelLaunch:
    kernel, grid, args, constexprs, config = entry
    options = _options(contract)
    if contract.sharding.tp_world_size > 1:
        options.insert(0, f"tp={contract.sharding.tp_world_size}")
    if target_dtype != torch.int64:
        options.append(f"targets={str(target_dtype).removeprefix('torch.')}")
    return KernelLaunch(
        kernel=kernel,
        args=tuple(_arg(value, logits, layout) for value in args),
        constexprs=tuple(sorted(constexprs.items())),
        num_warps=config.num_warps,
        grid=grid,
        backend=backend,
        platform=platform,
        layout=layout.name,
        dtype=contract.dtype.value,
        contract=", ".join(options) or "defaults",
    )


def _arg(value: Any, logits: torch.Tensor, layout: Layout) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    is_logits = value.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr()
    nbytes = value.untyped_storage().nbytes()
    if layout.beyond_2gib and tuple(value.shape) == tuple(logits.shape):
        nbytes = _BEYOND_2GIB
    return TensorArg(value.dtype, value.data_ptr() % 16, nbytes, is_logits)


def _logits(layout: Layout, contract: LogprobContract) -> torch.Tensor:
    start, end = contract.sharding.local_bounds
    width = end - start
    dtype = TORCH_DTYPES[contract.dtype]
    buffer = torch.zeros(layout.offset + layout.rows * width, dtype=dtype)
    logits = buffer[layout.offset :].view(layout.rows, width).detach()
    return logits.requires_grad_(contract.role is LogprobRole.TRAIN)


def _base_contract(layout: Layout, tp_index: int, rank: int) -> LogprobContract:
    bounds = layout.bounds[tp_index]
    return tpl.LogprobContract(
        role=LogprobRole.INFER,
        dtype=tpl.LogprobDType.BF16,
        mask=tpl.MaskSpec(layout.rows),
        sharding=tpl.ShardingSpec(rank, len(bounds), bounds, layout.real_vocab_size, bounds[-1][1]),
        reduction=tpl.ReductionSpec(tpl.DeterminismScope.FIXED_TOPOLOGY),
    )


# The Triton kernels read logits: the fused (hidden-input) options are not theirs to vary.
_LOGITS_ONLY = frozenset({"input_kind", "hidden_size", "has_bias", "allow_tf32"})


def _field_choices(value: Any) -> dict[str, tuple[Any, ...]]:
    """Per dataclass field (dotted into nested specs): the values to try, default first."""
    choices: dict[str, tuple[Any, ...]] = {}
    for field in dataclasses.fields(value):
        if not field.init or field.name in _LOGITS_ONLY:
            continue
        current = getattr(value, field.name)
        if isinstance(current, bool):
            choices[field.name] = (current, not current)
        elif isinstance(current, enum.Enum):
            choices[field.name] = (current, *(m for m in type(current) if m is not current))
        elif isinstance(current, float):
            choices[field.name] = (current, current / 2 if current else 0.5)
        elif dataclasses.is_dataclass(current):
            nested = _field_choices(current)
            choices.update({f"{field.name}.{key}": options for key, options in nested.items()})
    return choices


def _replace(value: Any, changes: dict[str, Any]) -> Any:
    """``dataclasses.replace`` with dotted names reaching into nested specs."""
    direct = {key: new for key, new in changes.items() if "." not in key}
    nested: dict[str, dict[str, Any]] = {}
    for key, new in changes.items():
        if "." in key:
            head, rest = key.split(".", 1)
            nested.setdefault(head, {})[rest] = new
    for head, inner in nested.items():
        direct[head] = _replace(getattr(value, head), inner)
    return dataclasses.replace(value, **direct)


def _options(contract: LogprobContract) -> list[str]:
    """The contract options that differ from the base contract's (input dtype aside)."""
    base = _base_contract(LAYOUTS["aligned"], 0, 0)
    found = _field_choices(base)
    options = []
    for key in found:
        if key == "dtype":
            continue
        got, default = _lookup(contract, key), _lookup(base, key)
        if got != default:
            shown = got.value if isinstance(got, enum.Enum) else got
            options.append(f"{key}={shown}")
    return options


def _lookup(value: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        value = getattr(value, part)
    return value
