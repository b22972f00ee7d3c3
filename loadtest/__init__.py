"""Load generator for cudagraph-serve, and the reference servers the benchmarks compare against.

    python -m loadtest ...               one bounded run (open or closed loop) → JSON record
    python -m loadtest sweep ...         capacity under a p99 SLO → JSON + latency/throughput PNG

spec (what a run is, its bounds) · payloads (bodies and reference labels) · worker (one
process's httpx client) · runner (processes, progress) · stats (percentiles, windows, merging)
· record (a run's JSON and summary) · sweep · server_process (start, probe and stop a server:
the one harness of the tests and the benchmark) · hey (hey's CSV) · servers/ (the reference
servers the benchmarks compare against). The benchmarks themselves are in bench/.
"""
