"""Failing examples as small, safe artifacts: write, load, replay, pin, and drift reports.

``python -m tp_logprob replay PATH`` reruns a recorded property on its backend
(or another); ``pin`` keeps an artifact under ``tests/regressions``; ``report``
measures a backend's error against the exact oracle.
"""
