"""How a backend sums a shard's terms: the declared accumulation order.

The tolerance table (``docs/tolerances.md``) bounds the rounding of ``S = sum exp(x - M)``
through the number of fp32 additions on one column's path to ``S``. Without a
declaration that path may be every other column of the shard (``w - 1`` additions: any
order, sequential included); a backend that promises a tree, blocks or an exact
fixed-point sum is held to a shorter path, hence a tighter bound:

* ``any`` and ``sequential``: ``w - 1`` additions;
* ``tree`` (fan-in ``f``, each node summing its children in any order):
  ``(f - 1) ceil(log_f w)``; ``f = 2`` is a pairwise sum;
* ``blocked`` (blocks of ``B`` columns): ``p_within(B) + p_across(ceil(w / B))``, at most
  ``w - 1``, where ``p`` is the path of the order inside a block (or across the lanes of a
  block-wide accumulator) and across the blocks;
* ``online`` (an online softmax over blocks of ``B`` columns, per-lane accumulators
  rescaled at every block and summed at the end): the path of ``blocked`` with the
  blocks in sequence, and ``ceil(w / B) + 1`` rescalings (one per later block, one for
  lanes with maxima of their own, one at the shard merge);
* ``fixed_point`` (``bits`` fractional bits, summed exactly in integers): no addition
  rounds; ``bits`` None is ``docs/semantics.md``'s rule, ``62 - bitlength(V - 1)``.

``block`` may name several widths (a Triton kernel's ``BLOCK`` depends on its launch): the
bound takes the longest path among them. Every order sums a shard; the partials of the
``R`` shards are merged in any order (``R - 1`` more additions, one rescaling each).

>>> AccumulationOrder.tree().additions(19008)
15
>>> AccumulationOrder.online(block=16).additions(64), AccumulationOrder.online(16).rescales(64)
(18, 5)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tp_logprob._validation import check_enum, check_int
from tp_logprob.errors import LogprobContractError

__all__ = ["ANY_ORDER", "AccumulationOrder", "OrderKind", "fraction_bits"]


class OrderKind(str, Enum):
    """The kinds of accumulation order a backend may declare."""

    ANY = "any"
    SEQUENTIAL = "sequential"
    TREE = "tree"
    BLOCKED = "blocked"
    ONLINE = "online"
    FIXED_POINT = "fixed_point"


_FLAT = (OrderKind.ANY, OrderKind.SEQUENTIAL, OrderKind.TREE)
"""The kinds that may sum a block's width or the blocks themselves."""
_BLOCKS = (OrderKind.BLOCKED, OrderKind.ONLINE)


def fraction_bits(padded_vocab_size: int) -> int:
    """``K = 62 - bitlength(V - 1)``: fractional bits of ``docs/semantics.md``'s fixed-point
    sums over a padded vocabulary of ``V`` columns (a whole row sums below ``2^62``).

    >>> fraction_bits(152064)
    44
    """
    padded = check_int("padded_vocab_size", padded_vocab_size, min_value=1)
    return 62 - max(1, (padded - 1).bit_length())


@dataclass(frozen=True)
class AccumulationOrder:
    """How a backend sums the ``exp(x - m)`` of a shard's columns (module docstring).

    Build one with :meth:`any`, :meth:`sequential`, :meth:`tree`, :meth:`blocked`,
    :meth:`online` or :meth:`fixed_point`. ``within`` and ``across`` (``any``,
    ``sequential`` or ``tree``, ``fan_in`` for a tree) say how a block's width and the
    blocks are summed; ``block`` holds the widths a launch may choose.
    """

    kind: OrderKind = OrderKind.ANY
    fan_in: int = 2
    block: tuple[int, ...] = ()
    within: OrderKind = OrderKind.ANY
    across: OrderKind = OrderKind.SEQUENTIAL
    bits: int | None = None

    def __post_init__(self) -> None:
        kind = check_enum("kind", self.kind, OrderKind)
        check_int("fan_in", self.fan_in, min_value=2)
        blocks = self.block
        if not isinstance(blocks, tuple):
            raise LogprobContractError(f"block={blocks!r}: expected a tuple of ints")
        for width in blocks:
            check_int("block", width, min_value=1)
        if (kind in _BLOCKS) != bool(blocks):
            need = "needs" if kind in _BLOCKS else "takes no"
            raise LogprobContractError(f"block={blocks!r}: kind={kind.value!r} {need} block width")
        parts = {"within": self.within, "across": self.across}
        for label, part in parts.items():
            parts[label] = _flat(part, label)
        if kind is OrderKind.ONLINE and parts["across"] is not OrderKind.SEQUENTIAL:
            raise LogprobContractError(
                f"across={parts['across'].value!r}: an online softmax walks its blocks in sequence"
            )
        if self.bits is not None:
            if kind is not OrderKind.FIXED_POINT:
                raise LogprobContractError(f"bits={self.bits!r}: only a fixed_point order has bits")
            check_int("bits", self.bits, min_value=1)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "within", parts["within"])
        object.__setattr__(self, "across", parts["across"])

    @classmethod
    def any(cls) -> AccumulationOrder:
        """Any summation order: the default, and what an undeclared backend is held to."""
        return cls()

    @classmethod
    def sequential(cls) -> AccumulationOrder:
        """One running sum, column after column."""
        return cls(OrderKind.SEQUENTIAL)

    @classmethod
    def tree(cls, fan_in: int = 2) -> AccumulationOrder:
        """A tree whose nodes sum at most ``fan_in`` children (2: pairwise)."""
        return cls(OrderKind.TREE, fan_in=fan_in)

    @classmethod
    def blocked(
        cls,
        block: int | Iterable[int],
        *,
        within: str | OrderKind = OrderKind.ANY,
        across: str | OrderKind = OrderKind.SEQUENTIAL,
        fan_in: int = 2,
    ) -> AccumulationOrder:
        """Blocks of ``block`` columns (or a block-wide accumulator of that many lanes):
        ``within`` sums a block's width, ``across`` the blocks."""
        return cls(
            OrderKind.BLOCKED,
            fan_in=fan_in,
            block=_widths(block),
            within=_flat(within, "within"),
            across=_flat(across, "across"),
        )

    @classmethod
    def online(
        cls, block: int | Iterable[int], *, within: str | OrderKind = OrderKind.ANY, fan_in: int = 2
    ) -> AccumulationOrder:
        """An online softmax over blocks of ``block`` columns: per-lane sums rescaled at
        every block, the lanes summed once at the end (``within``)."""
        return cls(
            OrderKind.ONLINE, fan_in=fan_in, block=_widths(block), within=_flat(within, "within")
        )

    @classmethod
    def fixed_point(cls, bits: int | None = None) -> AccumulationOrder:
        """Terms truncated to ``bits`` fractional bits and summed exactly (``docs/semantics.md``,
        ``cross_tp_bitwise``); None: ``62 - bitlength(V - 1)`` for ``V`` padded columns."""
        return cls(OrderKind.FIXED_POINT, bits=bits)

    @property
    def is_any(self) -> bool:
        """Whether this is the any-order default (nothing declared)."""
        return self.kind is OrderKind.ANY

    def additions(self, width: int) -> int:
        """The most fp32 additions on one column's path to a shard's sum of ``width`` columns."""
        w = check_int("width", width, min_value=0)
        if w <= 1 or self.kind is OrderKind.FIXED_POINT:
            return 0
        if self.kind in _FLAT:
            return _path(self.kind, w, self.fan_in)
        return max(
            min(
                w - 1,
                _path(self.within, b, self.fan_in) + _path(self.across, -(-w // b), self.fan_in),
            )
            for b in self.block
        )

    def rescales(self, width: int) -> int:
        """The most ``exp(m_old - m_new)`` rescalings on a column's path, the merge's included."""
        w = check_int("width", width, min_value=0)
        if self.kind is OrderKind.FIXED_POINT:
            return 0
        if self.kind is OrderKind.ONLINE:
            # A column's later blocks, a merge of per-lane maxima, and the shard merge.
            return max(-(-w // b) for b in self.block) + 1
        return 1

    def fraction_bits(self, padded_vocab_size: int) -> int | None:
        """The fixed-point bits for ``padded_vocab_size`` columns; None unless ``fixed_point``."""
        if self.kind is not OrderKind.FIXED_POINT:
            return None
        return self.bits if self.bits is not None else fraction_bits(padded_vocab_size)

    def describe(self) -> str:
        """The order in words, as a bound that assumed it names it.

        >>> AccumulationOrder.blocked(1024, within="tree").describe()
        'blocked: blocks of 1024 columns, summed pairwise, blocks in sequence'
        """
        if self.kind is OrderKind.FIXED_POINT:
            bits = "62 - bitlength(V - 1)" if self.bits is None else str(self.bits)
            return f"fixed point (exact integer sums, {bits} fractional bits)"
        if self.kind in _FLAT:
            return _flat_words(self.kind, self.fan_in)
        widths = " or ".join(str(b) for b in self.block)
        inside = _flat_words(self.within, self.fan_in)
        if self.kind is OrderKind.ONLINE:
            return f"online softmax over blocks of {widths} columns, lanes summed {inside}"
        across = _flat_words(self.across, self.fan_in)
        return f"blocked: blocks of {widths} columns, summed {inside}, blocks {across}"

    @classmethod
    def from_dict(cls, data: Any) -> AccumulationOrder:
        """The order :meth:`to_dict` described; every field checked as by the constructor.

        >>> AccumulationOrder.from_dict({"kind": "online", "block": [16]}).describe()
        'online softmax over blocks of 16 columns, lanes summed in any order'
        """
        if not isinstance(data, dict) or "kind" not in data:
            raise LogprobContractError(f"accumulation_order={data!r}: expected a dict with 'kind'")
        unknown = sorted(set(data) - {"kind", "fan_in", "block", "within", "across", "bits"})
        if unknown:
            raise LogprobContractError(f"accumulation_order={data!r}: unknown fields {unknown}")
        block = data.get("block", ())
        return cls(
            kind=data["kind"],
            fan_in=data.get("fan_in", 2),
            block=tuple(block) if isinstance(block, list) else block,
            within=data.get("within", OrderKind.ANY),
            across=data.get("across", OrderKind.SEQUENTIAL),
            bits=data.get("bits"),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible description (the fields this kind uses)."""
        out: dict[str, Any] = {"kind": self.kind.value}
        if self.kind is OrderKind.TREE:
            out["fan_in"] = self.fan_in
        if self.kind in _BLOCKS:
            out.update(block=list(self.block), within=self.within.value, across=self.across.value)
            if OrderKind.TREE in (self.within, self.across):
                out["fan_in"] = self.fan_in
        if self.kind is OrderKind.FIXED_POINT:
            out["bits"] = self.bits
        return out


def _path(kind: OrderKind, count: int, fan_in: int) -> int:
    """Additions on one term's path when ``count`` terms are summed in ``kind``'s order."""
    if count <= 1:
        return 0
    if kind is not OrderKind.TREE:
        return count - 1
    levels, reach = 0, 1
    while reach < count:
        reach *= fan_in
        levels += 1
    return min(count - 1, (fan_in - 1) * levels)


def _flat_words(kind: OrderKind, fan_in: int) -> str:
    if kind is OrderKind.TREE:
        return "pairwise" if fan_in == 2 else f"by a tree of fan-in {fan_in}"
    return "in any order" if kind is OrderKind.ANY else "in sequence"


def _flat(value: object, label: str) -> OrderKind:
    kind = check_enum(label, value, OrderKind)
    if kind not in _FLAT:
        allowed = ", ".join(repr(k.value) for k in _FLAT)
        raise LogprobContractError(f"{label}={value!r}: expected one of {allowed}")
    return kind


def _widths(block: object) -> tuple[int, ...]:
    if isinstance(block, (str, bytes)) or not isinstance(block, Iterable):
        return (check_int("block", block, min_value=1),)
    widths = tuple(sorted({check_int("block", width, min_value=1) for width in block}))
    if not widths:
        raise LogprobContractError(f"block={block!r}: expected at least one block width")
    return widths


ANY_ORDER = AccumulationOrder()
"""The any-order default: what the tolerance table assumes when nothing is declared."""
