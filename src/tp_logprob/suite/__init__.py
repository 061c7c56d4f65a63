"""The suite's engine: what runs the properties, apart from the properties themselves.

The session (:mod:`.session`, the public :class:`~tp_logprob.suite.session.Suite`), the
catalogue of properties (:mod:`.catalogue`), the backends under test (:mod:`.backends`),
what a property draws (:mod:`.draws`, :mod:`.params`) and where it applies
(:mod:`.applicability`), the case kind as a parameter (:mod:`.case_kinds`), running a
case (:mod:`.running`), the profiles and example databases (:mod:`.profiles`,
:mod:`.databases`), allocation tracking (:mod:`.allocations`), what a failing property
raises (:mod:`.violation`) and the session summary's numbers (:mod:`.summary`). The
properties live in :mod:`tp_logprob.properties`; judging a run against the oracle in
:mod:`tp_logprob.judging`.
"""
