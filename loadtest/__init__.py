"""Load generator and benchmark drivers for cudagraph-serve.

    python -m loadtest ...               one bounded run (open or closed loop) → JSON record
    python -m loadtest sweep ...         capacity under a p99 SLO → JSON + latency/throughput PNG
    python -m loadtest.bench_server ...  noop ceiling vs naive vs our service → JSON + markdown

spec (what a run is, its bounds) · payloads (bodies and reference labels) · worker (one
process's httpx client) · runner (processes, progress) · stats (percentiles, windows, merging)
· record (a run's JSON and summary) · sweep · server_process (start, probe and stop a server:
the one harness of the tests and the benchmark) · hey (hey's CSV) · bench_server and bench/
(the server benchmark) · servers/ (the no-op and naive reference servers).
"""
