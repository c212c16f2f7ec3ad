"""The pure domain core: models, rules and state transitions. No I/O, no environment reads."""
