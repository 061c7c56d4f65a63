"""Meta-tests of tp_logprob.strategies against the capability rules."""
