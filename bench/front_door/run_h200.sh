#!/usr/bin/env bash
# The front-door prototype on the H200, as run 34 ran it (after the install line of bench/run_h200.sh's header):
#   bash bench/front_door/run_h200.sh            (writes under $OUT)
# 1. seed CNN, 8 server cores: the raw no-op, `app.cli serve` (inline) and the front door, 8 and 32 connections
#    a worker or thread (issue 26 items 4 and 5), by bench/front_ends.py;
# 2. ResNet-50, one raw 3×224×224 image a request, every engine at --compile none (graphs of the eager module,
#    seconds to capture): the engine's own peak and `app.cli serve` (8 workers, engine process) by
#    bench/one_image.py's hey kind, then the front door (8 threads) by hey alike, at 256 and 1024 connections.
set -u
cc -O2 -shared -fPIC -pthread -o /tmp/libfrontdoor.so bench/front_door/front_door.c || exit 1
for c in 8 32; do
  timeout 150 python3 bench/front_ends.py --out "$OUT/seed-c$c" --hey .gpu/bin/hey --workers 8 \
    --designs raw-noop,inline,front-door --forms raw --per-worker $c --seconds 4 \
    --front-door-library /tmp/libfrontdoor.so > "$OUT/seed-c$c.log" 2>&1
  tail -7 "$OUT/seed-c$c.log"; grep -h "cores busy" "$OUT/seed-c$c/front-door-8.log"
done
export CGSERVE_COMPILE=none
timeout 200 python3 bench/one_image.py --out "$OUT/resnet50-ours" --designs engine-process --kinds hey \
  --concurrencies 256,1024 --p99-fraction 0 --budget-s 150 > "$OUT/resnet50-ours.log" 2>&1
grep -E "engine peak|c256|c1024" "$OUT/resnet50-ours.log"
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 256, 150528, np.uint8).tofile('/tmp/image.u8')"
mkdir -p /tmp/resnet50-only && cp -r models/examples/repository/resnet50 /tmp/resnet50-only/  # its one model
CGSERVE_BUCKETS=1,8,32,64,128 taskset -c 0-7 python3 -m bench.front_door.serve --library /tmp/libfrontdoor.so \
  --port 8123 --threads 8 --repository /tmp/resnet50-only > "$OUT/resnet50-door-server.log" 2>&1 &
door=$!
for _ in $(seq 120); do curl -sf localhost:8123/readyz > /dev/null && break; sleep 1; done
for c in 256 1024; do
  hey() { taskset -c 8-15 .gpu/bin/hey -z "$1" -c $c -m POST -T application/octet-stream -D /tmp/image.u8 \
    http://127.0.0.1:8123/predict; }
  hey 1s > /dev/null
  hey 4s > "$OUT/resnet50-door-c$c.txt"
  echo "front door c$c: $(grep -E 'Requests/sec|99% in' "$OUT/resnet50-door-c$c.txt" | tr -s ' \t\n' ' ')" \
    "$(grep -E '^\s+\[[0-9]+\]' "$OUT/resnet50-door-c$c.txt" | tr -s ' \t\n' ' ')"
done
kill -TERM $door; wait $door; tail -2 "$OUT/resnet50-door-server.log"
