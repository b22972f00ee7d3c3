"""Benchmark scripts behind bench/results/; harness/ holds the parts they share."""
