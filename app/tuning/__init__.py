"""The SLO tuner: `cudagraph-serve tune --slo-p99-ms X` writes the buckets and max delay that
sustain the highest request rate with p99 within X milliseconds on this machine.

measure.py   each bucket's batch time through the engine, built as the service builds it
overhead.py  the service's per-request overhead, from the real server at low load
choose.py    the queueing model and the choice (pure: unit-tested on synthetic tables)
settings_file.py  the env file, the model.toml lines, the JSON report
command.py   the subcommand: those steps in order; flags.py its flags
"""
