"""The historical benchmark: the suite against released versions that shipped bugs.

:mod:`.corpus` lists the historical bugs and their releases; :mod:`.runner` runs one
release's entries and writes ``docs/history.md`` (``nox -s history``).
"""
