"""Backend unit tests."""
