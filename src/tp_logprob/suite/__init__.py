"""The suite's harness: what runs the properties, apart from the properties themselves.

The session (:mod:`.session`, the public :class:`~tp_logprob.suite.session.Suite`), a
property as its test declares and calls it (:mod:`.property`), the backends under test
(:mod:`.backends`),
what a property draws (:mod:`.draws`, :mod:`.params`) and where it applies
(:mod:`.applicability`), the case kind as a parameter (:mod:`.case_kinds`), running a
case (:mod:`.running`) and judging what came back (:mod:`.expect`), what does not apply
here (:mod:`.outcomes`), the profiles and example databases (:mod:`.profiles`,
:mod:`.databases`), allocation tracking (:mod:`.allocations`) and the session summary's
numbers (:mod:`.summary`). The properties live in :mod:`tp_logprob.properties`, above it;
judging outputs against the oracle, and the violation a failure raises, in
:mod:`tp_logprob.judging`, below it. The harness imports no pytest: the plugin
(:mod:`tp_logprob.pytest_plugin`) adapts it, as Hypothesis' pytest plugin adapts its
engine. ("Engine", in this package, is a rollout engine.)
"""
