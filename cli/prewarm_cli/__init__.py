"""The `prewarm` command line: apply, read, delete and watch jobs and rules on a local or deployed stack."""
