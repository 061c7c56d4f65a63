"""What the harness raises for a property that does not apply here.

The harness knows nothing of pytest (as Hypothesis' engine knows nothing of it): a
property that cannot run on a backend here raises :class:`NotApplicable`, and the
pytest plugin reports it as a skip. A bad backend spec raises
:class:`~tp_logprob.suite.backends.BackendSpecError`, which the plugin reports as a
usage error.
"""

from __future__ import annotations

import unittest

__all__ = ["NotApplicable"]


class NotApplicable(unittest.SkipTest):
    """The property does not apply to this backend here; the message says why.

    A :class:`unittest.SkipTest`, the standard library's own "skip": Hypothesis re-raises
    it at once instead of shrinking it as a failure, and a runner that knows the
    standard library's skip reports it as one.
    """
