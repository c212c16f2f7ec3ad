"""Local mode and test infrastructure: the whole system on one machine."""
