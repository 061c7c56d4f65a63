"""The property suite: run it against any backend with ``pytest --pyargs tp_logprob.properties``."""
