"""Judging a run: the exact values a case is held to (:mod:`.expected`), the bounds and
the comparisons that raise a violation (:mod:`.bounds`, :mod:`.measuring`, :mod:`.gradients`), for
fused LM-head (:mod:`.fused`) and processed (:mod:`.processed`) cases too.

Below the harness (:mod:`tp_logprob.suite`, which runs a case and hands the outputs
here) and below the asserts of :mod:`tp_logprob.testing` (which are handed a kernel's
outputs): judging runs nothing, and a failure is a
:class:`~tp_logprob.judging.violation.PropertyViolation` (:mod:`.violation`) whoever
asked. What a run returned is :class:`~tp_logprob.judging.outputs.Outputs`.
"""
