"""Multi-node failure snapshots in the log layouts real clusters use (tests/layouts/generate.py)."""
