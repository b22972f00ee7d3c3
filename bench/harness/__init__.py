"""What the server benchmarks (bench/whole_machine.py, bench/side_by_side.py, bench/tune_bench.py) share.

measure (one load step with the run's settings, and their flags) · pinning (which cores) · machine
(what it ran on) · server_histograms (ours' own histograms over a step) · report (markdown pieces) ·
whole_machine_report and side_by_side_report (each benchmark's table and checks). The load itself
is loadtest's (runner, payloads, hey, server_process).
"""
