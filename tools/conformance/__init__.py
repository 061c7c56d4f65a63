"""The conformance report: the property suite against every peer adapter (``nox -s conformance``).

:mod:`.catalog` lists the peers, their variants and the findings that explain their
failures; :mod:`.collect` is the pytest plugin that records each property's outcome,
:mod:`.records` reads those records; :mod:`.processed_section` writes the section on
processed-logprob peers; :mod:`.runner` runs it all and writes ``docs/conformance.md``.
The adapters themselves are backends of the package (:mod:`tp_logprob.peers`).
"""
