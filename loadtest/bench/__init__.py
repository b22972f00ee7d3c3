"""The server benchmark's parts; loadtest/bench_server.py is its command line.

servers (what is compared) · measure (one server: start, closed and open loop, hey) · machine
(what it ran on) · pinning (which cores) · report (the markdown table and the ratios).
"""
