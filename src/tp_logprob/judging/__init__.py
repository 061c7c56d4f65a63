"""Judging a run: the exact values a case is held to (:mod:`.expected`), the bounds and
the comparisons that raise a violation (:mod:`.measuring`, :mod:`.gradients`), for
fused LM-head (:mod:`.fused`) and processed (:mod:`.processed`) cases too.

Above the engine (:mod:`tp_logprob.suite`), below the properties that call it.
"""
