"""Judging a run: the exact values a case is held to, the bounds, and the violation they
raise (logits, fused LM-head and processed cases, forward and backward).

Above the engine (:mod:`tp_logprob.suite`), below the properties that call it.
"""
