"""Every Triton launch the backends make, recorded from their real launch path without a GPU.

:func:`record` runs each Triton backend's public op (forward, and the backward for
the ``train`` role) on tiny CPU tensors (logits; hidden states, weight rows and
bias for a backend whose capability takes ``input_kind="hidden"``, the fused LM
head) inside :func:`~tp_logprob.kernels.triton.launch.recording_launches`, the
launch layer's seam: every launch is handed to the recorder instead of running,
and ``platform_of`` answers ``cuda`` or ``rocm``, so the launch table
(:func:`~tp_logprob.kernels.triton.launch.launch_config`) chooses the configs
exactly as it would on that GPU, and nothing runs (the torch code around the
launches does: a recomputed support's threshold runs its collectives on the
stand-in group). Contract variants are enumerated from the contract's own fields
(every enum member, both values of every flag, a non-default value of every float,
and a sampling support of each kind: sampling parameters, whose kernels take a
per-row threshold, and a replayed mask, whose kernels take packed bits), so a new
option that changes which kernels or constexprs are launched is picked up without
naming it.

Each launch is recorded as a :class:`KernelLaunch`: the kernel, its arguments
(tensors reduced to what the JIT specializes on: element type, 16-byte
alignment, whether the buffer fits a 32-bit offset), constexprs and warps. The
shapes are chosen per :class:`Layout` so that the JIT's alignment specialization
matches production shapes: ``aligned`` (every width, stride, hidden size and
pointer divisible by 16), ``aligned-2gib`` (the same with logits-sized buffers and
the LM-head weight over 2 GiB, as at N=8192, V=152064, H=8192, which only AMD's
buffer-op specialization distinguishes), ``padded`` (aligned shards of a padded
vocabulary whose real size is not a multiple of 16) and ``unaligned`` (odd shard
widths, hidden size and offsets).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import tp_logprob as tpl
from tools.gpu_readiness.covering import pairwise
from tp_logprob.contract import LogprobContract, LogprobInputKind, LogprobRole
from tp_logprob.errors import LogprobContractError
from tp_logprob.kernels.dtypes import TORCH_DTYPES
from tp_logprob.kernels.triton.launch import RecordedLaunch, recording_launches
from tp_logprob.support import SupportSpec

__all__ = [
    "LAYOUTS",
    "Coverage",
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
_TARGETS = "target dtype"  # the targets' element type, varied beside the contract's options
_PACKAGE = "tp_logprob.kernels.triton"
_BEYOND_2GIB = 2**32  # bytes: past the 32-bit offsets of AMD buffer ops


@dataclass(frozen=True)
class Layout:
    """Shapes for one JIT specialization: rows, shard bounds per TP degree, real vocabulary."""

    name: str
    rows: int
    bounds: tuple[tuple[tuple[int, int], ...], ...]  # one shard layout per TP degree
    real_vocab_size: int
    hidden_size: int = 64  # the fused LM head's H: two of the GPU's 32-deep K chunks
    offset: int = 0  # elements before each of a rank's inputs in its buffer
    beyond_2gib: bool = False  # logits- and weight-shaped buffers counted as over 2 GiB
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
            description="aligned, with logits-sized buffers and the LM-head weight over 2 GiB "
            "(N=8192, V=152064, H=8192)",
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
            hidden_size=61,
            offset=1,
            description="odd rows, shard widths, hidden size, strides and offsets; unaligned "
            "pointers",
        ),
    )
}


@dataclass(frozen=True)
class TensorArg:
    """What the JIT specializes a tensor argument on (and which input of the op it is)."""

    dtype: torch.dtype
    data_ptr_mod_16: int
    nbytes: int
    operand: str | None  # "logits", "hidden" or "weight" (a view of that input), else None

    @property
    def is_logits(self) -> bool:
        return self.operand == "logits"


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
    dtype: str  # the contract's input dtype (logits, or hidden states and weight)
    contract: str  # the contract options that differ from the defaults
    promises_bits: bool = False  # launched for a cross_platform_bitwise contract

    @property
    def name(self) -> str:
        return str(self.kernel.__name__)

    @property
    def reads_logits(self) -> bool:
        return any(isinstance(arg, TensorArg) and arg.is_logits for arg in self.args)

    @property
    def forms_logits(self) -> bool:
        """Reads the hidden states or weight: forms logits tiles in registers (fused LM head)."""
        return any(
            isinstance(arg, TensorArg) and arg.operand in ("hidden", "weight") for arg in self.args
        )

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
    return tuple(dict.fromkeys(backend for backend, _ in _triton_ops(platform)))


def _triton_ops(platform: str) -> Iterator[tuple[str, LogprobInputKind]]:
    """``(backend id, input kind)`` for each input kind a Triton backend on ``platform`` takes."""
    for capability in tpl.registry.backends(platform):
        for kind in sorted(capability.input_kinds):
            contract = _base_contract(LAYOUTS["aligned"], 0, 0, kind)
            try:
                op = tpl.registry.get_logprob_op(contract, capability.backend_id, platform=platform)
            except tpl.LogprobDispatchError:
                continue
            if getattr(op.op, "__module__", "").startswith(_PACKAGE + "."):
                yield capability.backend_id, kind


class Coverage(enum.Enum):
    """Which combinations of a contract's options (besides role x input dtype) are recorded."""

    EXHAUSTIVE = "every combination"
    PAIRS = "every pair of option values together"
    SINGLES = "each option changed alone"


def contract_variants(
    base: LogprobContract,
    coverage: Coverage = Coverage.EXHAUSTIVE,
    target_dtypes: Sequence[torch.dtype] = (torch.int64,),
    dtypes: Sequence[str] | None = None,
) -> Iterator[tuple[LogprobContract, torch.dtype]]:
    """``base`` with its enum, flag and float options varied, with a target dtype each.

    Every role x input dtype is recorded (the input dtypes named in ``dtypes``, all when
    None). ``coverage`` says how the other options and the
    target dtype combine: every combination, every pair of values of any two of them in
    at least one variant (:func:`.covering.pairwise`), or each changed
    alone from the default.
    """
    choices = _field_choices(base)
    crossed = {key: choices[key] for key in _CROSSED if key in choices}
    if dtypes is not None:
        crossed["dtype"] = tuple(dtype for dtype in crossed["dtype"] if dtype.value in dtypes)
    others = {key: values for key, values in choices.items() if key not in crossed}
    others[_TARGETS] = tuple(target_dtypes)
    if coverage is Coverage.EXHAUSTIVE:
        rows = [
            dict(zip(others, values, strict=True)) for values in itertools.product(*others.values())
        ]
    elif coverage is Coverage.PAIRS:
        rows = pairwise(others)
    else:
        rows = [{}] + [{key: value} for key, values in others.items() for value in values[1:]]
    for values in itertools.product(*crossed.values()):
        for row in rows:
            changes = {**dict(zip(crossed, values, strict=True)), **row}
            target_dtype = changes.pop(_TARGETS, target_dtypes[0])
            try:
                yield _replace(base, changes), target_dtype
            except LogprobContractError:
                continue


def record(
    platforms: Sequence[str] = PLATFORMS,
    layouts: Sequence[str] = tuple(LAYOUTS),
    target_dtypes: Sequence[torch.dtype] = (torch.int64, torch.int32),
    coverage: Coverage = Coverage.EXHAUSTIVE,
    dtypes: Sequence[str] | None = None,
) -> list[KernelLaunch]:
    """Every launch of every Triton backend, per contract variant, platform and layout.

    A backend is recorded on each input kind its capability lists (logits, hidden).
    ``coverage`` and ``dtypes`` (input dtype names, all when None) are passed to
    :func:`contract_variants`.
    """
    launches: list[KernelLaunch] = []
    with _one_thread():
        for platform in platforms:
            for backend, kind in _triton_ops(platform):
                for name in layouts:
                    layout = LAYOUTS[name]
                    for tp_index, bounds in enumerate(layout.bounds):
                        for rank in range(len(bounds)):
                            base = _base_contract(layout, tp_index, rank, kind)
                            for contract, target_dtype in contract_variants(
                                base, coverage, target_dtypes, dtypes
                            ):
                                launches += _record_one(
                                    backend, platform, layout, contract, target_dtype
                                )
    return launches


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one thread while recording: the torch code around the launches works on
    tiny tensors, where a thread pool's start-up costs more than the work (a fused
    backward's 4096-row chunk matmul took 21 ms on 2 threads, 0.7 ms on one, on 2 busy
    cores), and the compile workers run beside it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


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
    inputs = _inputs(layout, contract)
    targets = _targets(layout.rows, layout.real_vocab_size).to(target_dtype)
    world = contract.sharding.tp_world_size
    group = _ReplicaGroup(contract.sharding.tp_rank, world) if world > 1 else None
    raw: list[tuple[Any, ...]] = []

    def sink(seen: RecordedLaunch) -> None:
        constexprs = {"BLOCK": seen.config.block, **seen.constexprs}
        if not seen.config.fp_fusion:  # a launch option: the JIT's binder takes it from here
            constexprs["enable_fp_fusion"] = False
        raw.append((seen.kernel, seen.grid, seen.args, constexprs, seen.config))

    with recording_launches(platform, sink):
        if contract.input_kind is LogprobInputKind.HIDDEN:
            hidden, weight, bias = inputs["hidden"], inputs["weight"], inputs.get("bias")
            result = op(hidden, targets, contract, group, weight=weight, bias=bias)
        else:
            result = op(inputs["logits"], targets, contract, group)
        outputs = [out for out in result if isinstance(out, torch.Tensor) and out.requires_grad]
        if outputs:
            sum(out.float().sum() for out in outputs).backward()  # type: ignore[union-attr]
    options = _options(contract)
    if contract.sharding.tp_world_size > 1:
        options.insert(0, f"tp={contract.sharding.tp_world_size}")
    if target_dtype != torch.int64:
        options.append(f"targets={str(target_dtype).removeprefix('torch.')}")
    described = ", ".join(options) or "defaults"
    return [
        _describe(entry, inputs, layout, backend, platform, contract, described) for entry in raw
    ]


def _describe(
    entry: tuple[Any, ...],
    inputs: dict[str, torch.Tensor],
    layout: Layout,
    backend: str,
    platform: str,
    contract: LogprobContract,
    described: str,
) -> KernelLaunch:
    kernel, grid, args, constexprs, config = entry
    return KernelLaunch(
        kernel=kernel,
        args=tuple(_arg(value, inputs, layout) for value in args),
        constexprs=tuple(sorted(constexprs.items())),
        num_warps=config.num_warps,
        grid=grid,
        backend=backend,
        platform=platform,
        layout=layout.name,
        dtype=contract.dtype.value,
        contract=described,
        promises_bits=contract.reduction.determinism_scope
        is tpl.DeterminismScope.CROSS_PLATFORM_BITWISE,
    )


def _arg(value: Any, inputs: dict[str, torch.Tensor], layout: Layout) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    storage = value.untyped_storage().data_ptr()
    operand = next(
        (
            name
            for name, tensor in inputs.items()
            if name != "bias" and tensor.untyped_storage().data_ptr() == storage
        ),
        None,
    )
    nbytes = value.untyped_storage().nbytes()
    logits = inputs.get("logits")
    large = operand == "weight" or (logits is not None and value.shape == logits.shape)
    if layout.beyond_2gib and large:
        nbytes = _BEYOND_2GIB
    return TensorArg(value.dtype, value.data_ptr() % 16, nbytes, operand)


def _inputs(layout: Layout, contract: LogprobContract) -> dict[str, torch.Tensor]:
    """The op's tensors (``logits``, or ``hidden``, ``weight`` and ``bias``) after ``offset``."""
    start, end = contract.sharding.local_bounds
    width = end - start
    shapes: dict[str, tuple[int, ...]]
    if contract.input_kind is LogprobInputKind.HIDDEN:
        size = layout.hidden_size
        shapes = {"hidden": (layout.rows, size), "weight": (width, size)}
        if contract.has_bias:
            shapes["bias"] = (width,)
    else:
        shapes = {"logits": (layout.rows, width)}
    dtype = TORCH_DTYPES[contract.dtype]
    train = contract.role is LogprobRole.TRAIN
    inputs = {}
    for name, shape in shapes.items():
        buffer = torch.zeros(layout.offset + math.prod(shape), dtype=dtype)
        inputs[name] = buffer[layout.offset :].view(shape).detach().requires_grad_(train)
    return inputs


def _base_contract(
    layout: Layout,
    tp_index: int,
    rank: int,
    input_kind: LogprobInputKind = LogprobInputKind.LOGITS,
) -> LogprobContract:
    bounds = layout.bounds[tp_index]
    hidden = input_kind is LogprobInputKind.HIDDEN
    return tpl.LogprobContract(
        role=LogprobRole.INFER,
        dtype=tpl.LogprobDType.BF16,
        mask=tpl.MaskSpec(layout.rows),
        sharding=tpl.ShardingSpec(rank, len(bounds), bounds, layout.real_vocab_size, bounds[-1][1]),
        # The weakest scope, which every backend serves; the variants try the others.
        reduction=tpl.ReductionSpec(tpl.DeterminismScope.RUN_TO_RUN),
        input_kind=input_kind,
        hidden_size=layout.hidden_size if hidden else None,
    )


# The base contract's input kind and the layout's hidden size are fixed, not varied;
# the bias and TF32 options exist only with hidden input.
_INPUT_OPTIONS = frozenset({"input_kind", "hidden_size"})
_HIDDEN_ONLY = frozenset({"has_bias", "allow_tf32"})


def _targets(rows: int, real_vocab_size: int) -> torch.Tensor:
    """The recorded ops' targets (int64): row ``t`` targets column ``t % real_vocab_size``."""
    return torch.arange(rows) % real_vocab_size


def _supports(contract: LogprobContract) -> tuple[SupportSpec, ...]:
    """A support of each kind for ``contract``'s rows: sampling parameters with every rule
    on (the threshold kernels), and a replayed mask keeping each row's target and the next
    column (the packed-mask kernels)."""
    real = contract.sharding.real_vocab_size
    targets = _targets(contract.num_tokens, real).tolist()
    kept = [sorted({target, (target + 1) % real}) for target in targets]
    return SupportSpec(min_p=0.05, top_k=2, top_p=0.9), SupportSpec.from_kept_lists(kept)


def _field_choices(value: Any) -> dict[str, tuple[Any, ...]]:
    """Per dataclass field (dotted into nested specs): the values to try, default first.

    A contract's ``support`` (default None) tries :func:`_supports`."""
    fixed: frozenset[str] = frozenset()
    if isinstance(value, LogprobContract):
        fixed = _INPUT_OPTIONS
        if value.input_kind is not LogprobInputKind.HIDDEN:
            fixed |= _HIDDEN_ONLY
    choices: dict[str, tuple[Any, ...]] = {}
    for field in dataclasses.fields(value):
        if not field.init or field.name in fixed:
            continue
        current = getattr(value, field.name)
        if field.name == "support" and isinstance(value, LogprobContract) and current is None:
            choices[field.name] = (current, *_supports(value))
        elif isinstance(current, bool):
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
    base = _base_contract(LAYOUTS["aligned"], 0, 0, contract.input_kind)
    found = _field_choices(base)
    options = []
    for key in found:
        if key == "dtype":
            continue
        got, default = _lookup(contract, key), _lookup(base, key)
        if got != default:
            shown = got.value if isinstance(got, enum.Enum) else got
            if isinstance(got, SupportSpec):
                shown = got.mode.value
            options.append(f"{key}={shown}")
    return options


def _lookup(value: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        value = getattr(value, part)
    return value
