"""The suite on a real process group: each ``torchrun`` process one rank.

:mod:`.group` joins the group and runs this rank's share of a case; :mod:`.lockstep` and
:mod:`.verdicts` keep the ranks drawing, judging and shrinking the same examples;
:mod:`.plugin` is the pytest plugin that starts it all and hands the group to the
session (:meth:`tp_logprob.suite.session.Suite.join`).
"""
