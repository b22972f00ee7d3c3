#!/usr/bin/env bash
# When the front door takes a bulk, on the simulated device (bench/sim_gpu/timed: a ResNet-50 batch's H200 time
# ×10, slept), on any machine: --take answered and --take clock, two rounds alternating, then the service itself
# (app.cli serve, 1 worker) on the same device as the reference. hey at 256 and 512 connections, 8 s each.
#   bash bench/front_door/sim_take.sh HEY      (HEY: hey's binary; writes /tmp/sim-*.txt and prints a line a point)
set -u
hey_bin=${1:-hey}
cc -O2 -shared -fPIC -pthread -o /tmp/libfrontdoor.so bench/front_door/front_door.c || exit 1
rm -rf /tmp/simrepo && mkdir -p /tmp/simrepo && cp -r bench/sim_gpu/timed /tmp/simrepo/
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 256, 784, np.uint8).tofile('/tmp/raw.bin')"
load() {  # $1: name, $2: port
  for _ in $(seq 60); do curl -sf "localhost:$2/readyz" > /dev/null && break; sleep 1; done
  for c in 256 512; do
    $hey_bin -z 1s -c $c -m POST -T application/octet-stream -D /tmp/raw.bin "http://127.0.0.1:$2/predict" > /dev/null
    $hey_bin -z 8s -c $c -m POST -T application/octet-stream -D /tmp/raw.bin "http://127.0.0.1:$2/predict" \
      > "/tmp/sim-$1-c$c.txt"
    echo "$1 c$c: $(grep -E 'Requests/sec|50% in|99% in' "/tmp/sim-$1-c$c.txt" | tr -s ' \t\n' ' ')" \
      "$(grep -E '^\s+\[[0-9]+\]' "/tmp/sim-$1-c$c.txt" | tr -s ' \t\n' ' ')"
  done
}
for round in 1 2; do
  for take in answered clock; do
    python3 -m bench.front_door.serve --library /tmp/libfrontdoor.so --port 8431 --threads 2 --device cpu \
      --repository /tmp/simrepo --take $take > "/tmp/sim-$take-$round.log" 2>&1 &
    server=$!
    load "$take-$round" 8431
    kill -TERM $server; wait $server; tail -1 "/tmp/sim-$take-$round.log"
  done
done
for round in 1 2; do
  python3 -m app.cli serve --port 8432 --grpc-port 0 --device cpu --model-repository /tmp/simrepo --workers 1 \
    --log-level warning > "/tmp/sim-service-$round.log" 2>&1 &
  server=$!
  load "service-$round" 8432
  kill -TERM $server; wait $server
done
