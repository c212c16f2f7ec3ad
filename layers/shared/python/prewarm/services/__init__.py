"""Use cases. Each takes its ports (adapters) as arguments."""
