"""Logprob backends. Importing this package imports neither torch nor triton."""
