"""One module per `prewarm` verb; `prewarm_cli.app` adds each to the root group."""
