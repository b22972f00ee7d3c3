"""Reference servers for the benchmark: the HTTP stack's ceiling (noop) and the baseline (naive)."""
