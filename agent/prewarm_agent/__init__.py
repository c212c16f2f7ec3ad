"""The Prewarm node agent: consumes per-node pull tasks and pulls through CRI."""
