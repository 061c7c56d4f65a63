"""What every backend op returns: :class:`LogprobResult`.

A tuple of the per-token outputs (``selected_logp``, ``lse`` and, when computed,
``entropy``) with the outputs of a processed logprob as attributes beside it. Pure
Python: importing it imports neither numpy nor torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LogprobResult"]


class LogprobResult(tuple):  # type: ignore[type-arg]
    """What every backend op returns: fp32 ``selected_logp[N]``, ``lse[N]`` and ``entropy[N]``.

    It iterates as ``(selected_logp, lse)``, or as ``(selected_logp, lse, entropy)``
    when entropy was computed, so ``selected_logp, lse = op(...)`` keeps working for
    contracts without ``export_entropy``. The attributes are always there: ``lse``
    is None with ``export_lse=False`` and ``entropy`` is None unless the contract
    has ``export_entropy=True``.

    With a sampling support (``contract.support``) three more attributes are set
    (they never change the iteration): ``support_lse`` (fp32 ``LSE_S(z)``),
    ``support_size`` (int64 ``|S|``) and, for a recomputed support,
    ``support_threshold`` (fp32: the support is every live column with
    ``z >= threshold``). See ``docs/semantics.md``, "Processed logprobs".

    >>> LogprobResult(1.0, 2.0)
    LogprobResult(selected_logp=1.0, lse=2.0, entropy=None)
    >>> selected_logp, lse, entropy = LogprobResult(1.0, 2.0, 0.5)
    """

    _fields = ("selected_logp", "lse", "entropy")
    SUPPORT_FIELDS = ("support_lse", "support_size", "support_threshold")
    """The keyword outputs of a processed logprob, in the order a result lists them."""

    def __new__(
        cls,
        selected_logp: Any,
        lse: Any,
        entropy: Any = None,
        *,
        support_lse: Any = None,
        support_size: Any = None,
        support_threshold: Any = None,
    ) -> LogprobResult:
        values = (selected_logp, lse) if entropy is None else (selected_logp, lse, entropy)
        result = super().__new__(cls, values)
        result.__dict__.update(
            support_lse=support_lse,
            support_size=support_size,
            support_threshold=support_threshold,
        )
        return result

    def __getnewargs_ex__(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return tuple(self), self._support_values()

    def _support_values(self) -> dict[str, Any]:
        return {name: self.__dict__.get(name) for name in self.SUPPORT_FIELDS}

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"LogprobResult is immutable: cannot set {name!r}")

    @property
    def selected_logp(self) -> Any:
        """fp32 ``[N]`` log-probability of each token's target; 0.0 on inactive tokens."""
        return self[0]

    @property
    def lse(self) -> Any:
        """fp32 ``[N]`` log-sum-exp of each row, or None (``export_lse=False``)."""
        return self[1]

    @property
    def entropy(self) -> Any:
        """fp32 ``[N]`` entropy of each row's softmax, or None (no ``export_entropy``)."""
        return self[2] if len(self) > 2 else None

    @property
    def support_lse(self) -> Any:
        """fp32 ``[N]`` log-sum-exp over each row's support ``S``, or None (no support)."""
        return self.__dict__.get("support_lse")

    @property
    def support_size(self) -> Any:
        """int64 ``[N]`` ``|S|`` of each row, or None (no support)."""
        return self.__dict__.get("support_size")

    @property
    def support_threshold(self) -> Any:
        """fp32 ``[N]``: a recomputed support is every live column with ``z >= threshold``
        (NaN where the support is undefined); None for a replayed mask or no support."""
        return self.__dict__.get("support_threshold")

    def __repr__(self) -> str:
        extras = "".join(
            f", {name}={value!r}"
            for name, value in self._support_values().items()
            if value is not None
        )
        return (
            f"LogprobResult(selected_logp={self.selected_logp!r}, lse={self.lse!r}, "
            f"entropy={self.entropy!r}{extras})"
        )
