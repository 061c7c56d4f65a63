"""How a caller lays out the tensors it hands an op: the 2-D views trainers and engines pass.

The op takes ``local_logits`` as *any* 2-D view (``docs/semantics.md``, "The
backward"): a rank's shard is already a column slice of the full logits, with a
row stride wider than its width. Trainers hand over more than that. Their
activations are slices of bigger buffers: the positions of a ``[1, T + 1, V]``
tensor past its first (a data pointer off the allocation's alignment), a
vocabulary slice of a wider head, every other position, a tensor stored the other
way round and transposed back (``weight.t()`` of a tied or ``[H, V]`` head), or a
column step. Their targets are ``input_ids[:, 1:]`` or a column of a wider table.

An :class:`InputForm` names one layout per tensor role, and :func:`laid_out` builds
it in torch: a fresh buffer filled with poison (NaN for values, an id past every
vocabulary for targets) wherever the view does not look, the values copied into
the view. A kernel that ignores a stride or an offset then reads poison, and the
outputs show it. The form is part of a case (``LogprobCase.form``), so an artifact
stores it and replay rebuilds the same strides.

Every form shrinks toward ``contiguous``. Importing this module does not import
torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

__all__ = [
    "CONTIGUOUS",
    "TARGET_FORMS",
    "VALUE_FORMS",
    "InputForm",
    "input_forms",
    "laid_out",
    "laid_out_leaf",
]

CONTIGUOUS = "contiguous"

VALUE_FORMS = (CONTIGUOUS, "offset", "row gap", "every other row", "column major", "column step")
"""Layouts of a 2-D float operand ``[R, C]`` (logits, hidden states, the fused weight):

- ``contiguous``: a fresh contiguous tensor;
- ``offset``: contiguous strides, one element into a flat buffer (a data pointer
  off the 16-byte alignment, as ``x[0, 1:]`` of a ``[1, T + 1, D]`` tensor is for an
  odd ``D``);
- ``row gap``: columns ``[1, C + 1)`` of a ``[R, C + 3]`` tensor (row stride
  ``C + 3``: the vocabulary slice of a wider head);
- ``every other row``: ``x[::2]`` of a ``[2R, C]`` tensor (row stride ``2C``);
- ``column major``: ``y.t()`` of a contiguous ``[C, R]`` tensor (strides ``(1, R)``);
- ``column step``: ``x[:, ::2]`` of a ``[R, 2C]`` tensor (column stride 2).
"""

TARGET_FORMS = (CONTIGUOUS, "offset", "step")
"""Layouts of the ``[N]`` targets: fresh; ``input_ids[0, 1:]`` of a ``[1, N + 1]`` row
(offset 1); ``table[:, 0]`` of a ``[N, 2]`` table (stride 2)."""

_ROLES = {"values": VALUE_FORMS, "targets": TARGET_FORMS, "weight": VALUE_FORMS}

TARGET_POISON = 2**40 + 2**31 - 1
"""What a targets buffer holds where the view does not look: past every vocabulary, read
as int64 or cut to its low 32 bits (``2**31 - 1``; ``2**40`` alone would cut to 0)."""


@dataclass(frozen=True)
class InputForm:
    """The layout of each tensor an op is handed: ``values`` (the logits, or a fused op's
    hidden states), ``targets``, and a fused op's ``weight`` (its bias stays contiguous).

    Example::

        InputForm(values="column major", targets="step")
    """

    values: str = CONTIGUOUS
    targets: str = CONTIGUOUS
    weight: str = CONTIGUOUS

    def __post_init__(self) -> None:
        for role, allowed in _ROLES.items():
            name = getattr(self, role)
            if name not in allowed:
                raise ValueError(f"{role}={name!r}: expected one of {allowed}")

    @property
    def contiguous(self) -> bool:
        """Whether every tensor is a fresh contiguous one (the form of a case without one)."""
        return self == InputForm()

    def to_dict(self) -> dict[str, str]:
        """The form as JSON data (an artifact's ``input_form``)."""
        return {role: getattr(self, role) for role in _ROLES}

    @classmethod
    def from_dict(cls, data: Any) -> InputForm:
        """The form written by :meth:`to_dict`; ``ValueError`` naming what does not fit."""
        if not isinstance(data, dict) or set(data) != set(_ROLES):
            raise ValueError(f"input_form={data!r}: expected an object with keys {sorted(_ROLES)}")
        return cls(**{role: data[role] for role in _ROLES})

    def describe(self) -> str:
        """The roles that are not contiguous, e.g. ``values column major, targets step``."""
        parts = [
            f"{role} {getattr(self, role)}" for role in _ROLES if getattr(self, role) != CONTIGUOUS
        ]
        return ", ".join(parts) or CONTIGUOUS


def _form(names: tuple[str, ...]) -> st.SearchStrategy[str]:
    """Contiguous twice as often as any other layout (what a failure shrinks to): a fast
    path for contiguous tensors is tested as often as each strided one."""
    return st.sampled_from((CONTIGUOUS, *names))


def input_forms(*, fused: bool = False) -> st.SearchStrategy[InputForm]:
    """:class:`InputForm` values: each role contiguous or another layout (contiguous
    weighted twice); ``weight`` stays contiguous unless ``fused``.

    Example::

        form = data.draw(input_forms(), label="input form")
    """
    weight = _form(VALUE_FORMS) if fused else st.just(CONTIGUOUS)
    return st.builds(
        InputForm, values=_form(VALUE_FORMS), targets=_form(TARGET_FORMS), weight=weight
    )


def laid_out(tensor: Any, name: str) -> Any:
    """A copy of the 2-D float or 1-D integer ``tensor`` in layout ``name`` (one of
    :data:`VALUE_FORMS` or :data:`TARGET_FORMS`, by its rank), poison wherever the view
    does not look; ``tensor`` itself for ``contiguous``."""
    if name == CONTIGUOUS:
        return tensor
    if tensor.dim() == 1:
        return _targets_laid_out(tensor, name)
    view = _buffer_and_view(tensor, name)[1]
    view.copy_(tensor)
    return view


def laid_out_leaf(tensor: Any, name: str) -> tuple[Any, Any]:
    """``(leaf, view)``: the buffer of :func:`laid_out` as a leaf that requires grad, and the
    2-D view of it that holds ``tensor``'s values; a trainer's gradient must reach ``leaf``
    at the view's elements and nowhere else."""
    import torch

    buffer, view = _buffer_and_view(tensor, name)
    with torch.no_grad():
        view.copy_(tensor)
    buffer.requires_grad_(True)
    geometry = (view.shape, view.stride(), view.storage_offset())
    return buffer, buffer.as_strided(*geometry)


def _buffer_and_view(tensor: Any, name: str) -> tuple[Any, Any]:
    if tensor.dim() != 2 or name not in VALUE_FORMS:
        raise ValueError(f"laid_out: form {name!r} for a tensor of shape {tuple(tensor.shape)}")
    rows, cols = tensor.shape
    poison = float("nan")
    if name == CONTIGUOUS:
        buffer = tensor.new_full((rows, cols), poison)
        return buffer, buffer
    if name == "offset":
        buffer = tensor.new_full((rows * cols + 1,), poison)
        return buffer, buffer[1:].view(rows, cols)
    if name == "row gap":
        buffer = tensor.new_full((rows, cols + 3), poison)
        return buffer, buffer[:, 1 : cols + 1]
    if name == "every other row":
        buffer = tensor.new_full((2 * rows, cols), poison)
        return buffer, buffer[::2]
    if name == "column major":
        buffer = tensor.new_full((cols, rows), poison)
        return buffer, buffer.t()
    buffer = tensor.new_full((rows, 2 * cols), poison)  # column step
    return buffer, buffer[:, ::2]


def _targets_laid_out(targets: Any, name: str) -> Any:
    (rows,) = targets.shape
    if name == "offset":
        view = targets.new_full((rows + 1,), TARGET_POISON)[1:]
    elif name == "step":
        view = targets.new_full((rows, 2), TARGET_POISON)[:, 0]
    else:
        raise ValueError(f"laid_out: form {name!r} for targets of shape {tuple(targets.shape)}")
    view.copy_(targets)
    return view
