"""On-demand benchmarks (`make bench`), never part of `make test`.

Each benchmark runs a baseline and Prewarm's way side by side, prints a human summary with its
targets (met / NOT met), and ends with one JSON object on its last line. Results and the machine
they were measured on are recorded in docs/performance.md.

Run from the repository root: `.venv/bin/python benchmarks/select_nodes.py --nodes 5000` (or
`python -m benchmarks.select_nodes ...`).
"""
