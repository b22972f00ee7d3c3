"""Load generator and benchmark drivers for cudagraph-serve.

    python -m loadtest ...               one bounded run (open or closed loop) → JSON record
    python -m loadtest sweep ...         capacity under a p99 SLO → JSON + latency/throughput PNG
    python -m loadtest.bench_server ...  noop ceiling vs naive vs our service → JSON + markdown

stats (percentiles, windows, merging) · payloads (bodies and reference labels) · worker (one
process's httpx client) · runner (processes, progress, record) · sweep · bench_server,
bench_report, pinning · servers/ (the no-op and naive reference servers).
"""
