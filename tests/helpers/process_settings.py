"""What the process-settings tests read: every process-global setting a call might change.

Each reader returns a string, the same for the same setting, so that a snapshot taken in
another process (the import test's) compares as JSON. The readers only read: none of
them switches a backend, resolves a lazy default or draws a random number.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import random
import signal
import sys
import threading
import warnings
from collections.abc import Callable

import hypothesis
import numpy as np
import torch


def _digest(value: object) -> str:
    return hashlib.sha256(pickle.dumps(value)).hexdigest()


def _torch_backends() -> str:
    backends = torch.backends
    return repr(
        (
            backends.cudnn.enabled,
            backends.cudnn.benchmark,
            backends.cudnn.deterministic,
            backends.cudnn.allow_tf32,
            backends.cuda.matmul.allow_tf32,
            backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
            backends.mkldnn.enabled,
            backends.mkldnn.matmul.fp32_precision,
        )
    )


def _signal_handlers() -> str:
    names = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGCHLD", "SIGALRM")
    found = (getattr(signal, name) for name in names if hasattr(signal, name))
    return repr({number: signal.getsignal(number) for number in found})


GLOBAL_SETTINGS: dict[str, Callable[[], str]] = {
    "torch fp32 matmul precision": torch.get_float32_matmul_precision,
    "torch deterministic algorithms": lambda: repr(
        (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
    ),
    "torch default dtype": lambda: str(torch.get_default_dtype()),
    "torch threads": lambda: repr((torch.get_num_threads(), torch.get_num_interop_threads())),
    "torch backends": _torch_backends,
    "torch print options": lambda: repr(torch.tensor([1 / 3, 1e-9, 12345.678])),
    "torch global RNG": lambda: _digest(torch.random.get_rng_state().numpy().tobytes()),
    "numpy global RNG": lambda: _digest(np.random.get_state()),
    "python global RNG": lambda: _digest(random.getstate()),
    "numpy print options": lambda: repr(sorted(np.get_printoptions().items())),
    "environment": lambda: repr(sorted(os.environ.items())),
    "sys.path": lambda: repr(sys.path),
    "working directory": os.getcwd,
    "warnings filters": lambda: repr(warnings.filters),
    "logging": lambda: repr(
        (logging.root.level, logging.root.handlers, logging.root.manager.disable)
    ),
    "signal handlers": _signal_handlers,
    "exception hooks": lambda: repr((sys.excepthook, threading.excepthook)),
    "recursion limit and switch interval": lambda: repr(
        (sys.getrecursionlimit(), sys.getswitchinterval())
    ),
    "Hypothesis default settings": lambda: repr(hypothesis.settings.default),
}
"""Settings of the whole process: no thread may see one of ours."""

THREAD_SETTINGS: dict[str, Callable[[], str]] = {
    "numpy error state": lambda: repr(sorted(np.geterr().items())),
    "torch grad mode": lambda: repr(torch.is_grad_enabled()),
}
"""Settings of the calling thread: a call hands them back as it found them."""


def snapshot(readers: dict[str, Callable[[], str]]) -> dict[str, str]:
    return {name: read() for name, read in readers.items()}
