#!/usr/bin/env bash
# The review probes behind the figures in README.md here, on the tree at $ROOT (a checkout: the one before the
# mends, 4fc6cae, or after them), the CPU, 127.0.0.1 only; logs to $OUT.
#   ROOT=/tmp/before OUT=/tmp/probes-before bash bench/results/2026-12-06-cpu-review-probes/run.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-python3}
export ROOT PYTHONPATH=$ROOT
mkdir -p "$OUT"
serve() {  # PORT LOG [flags]: HTTP on PORT, gRPC on PORT+1, the probes' repository, model control explicit
  # (CONTROL=none: off)
  local port=$1 log=$2; shift 2
  (cd "$ROOT" && CGSERVE_MODEL_CONTROL=${CONTROL:-explicit} exec $PY -m app.cli serve --host 127.0.0.1 --port "$port" \
    --grpc-port $((port + 1)) --device cpu --model-repository "$HERE/repo" --default-model alpha "$@" > "$log" 2>&1) &
  SERVER=$!
  for _ in $(seq 90); do curl -sf "127.0.0.1:$port/readyz" > /dev/null && return; sleep 1; done
}
# 1. Twelve gRPC loads named /usr, /usr/, …: the folder walked before the 404?
serve 27620 "$OUT/traverse-server.log"
timeout 200 $PY "$HERE/traverse_load.py" 27621 27620 12 /usr > "$OUT/traverse.log" 2>&1
echo "rss MB after: $(( $(grep VmRSS /proc/$SERVER/status | awk '{print $2}') / 1024 ))" >> "$OUT/traverse.log"
kill -TERM $SERVER; wait $SERVER
# 2. 4000 loads of names of 30 KB the repository does not hold: the memory they leave
serve 27630 "$OUT/failures-server.log"
timeout 300 $PY "$HERE/failures_leak.py" $SERVER 27630 4000 30000 > "$OUT/failures.log" 2>&1
kill -TERM $SERVER; wait $SERVER
# 3. Two workers: one SIGKILLed under load; the queue and in-flight gauges once the server is idle again
CONTROL=none serve 27640 "$OUT/gauges-server.log" --workers 2
timeout 120 $PY "$HERE/dead_worker_gauges.py" 27640 $SERVER > "$OUT/gauges.log" 2>&1
kill -TERM $SERVER; wait $SERVER
