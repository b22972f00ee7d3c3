#!/usr/bin/env bash
# The front door against the service's own port on the simulated device (bench/sim_gpu/timed: a ResNet-50 batch's
# H200 time ×10, slept), on any machine: one server (app.cli serve, 1 worker) with CGSERVE_FRONT_DOOR_PORT, hey at 256
# and 512 connections, 8 s each, to each port in turn, two rounds.
#   bash bench/front_door/sim_device.sh HEY      (HEY: hey's binary; writes /tmp/sim-*.txt and prints a line a point)
set -u
hey_bin=${1:-hey}
rm -rf /tmp/simrepo && mkdir -p /tmp/simrepo && cp -r bench/sim_gpu/timed /tmp/simrepo/
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 256, 784, np.uint8).tofile('/tmp/raw.bin')"
python3 -m app.cli serve --port 8432 --grpc-port 0 --device cpu --model-repository /tmp/simrepo --workers 1 \
  --front-door-port 8431 --front-door-threads 2 --log-level warning > /tmp/sim-server.log 2>&1 &
server=$!
for _ in $(seq 60); do curl -sf "localhost:8432/readyz" > /dev/null && break; sleep 1; done
for round in 1 2; do
  for target in door:8431 service:8432; do
    name=${target%:*} port=${target#*:}
    for c in 256 512; do
      $hey_bin -z 1s -c $c -m POST -T application/octet-stream -D /tmp/raw.bin "http://127.0.0.1:$port/predict" > /dev/null
      $hey_bin -z 8s -c $c -m POST -T application/octet-stream -D /tmp/raw.bin "http://127.0.0.1:$port/predict" \
        > "/tmp/sim-$name-$round-c$c.txt"
      echo "$name-$round c$c: $(grep -E 'Requests/sec|50% in|99% in' "/tmp/sim-$name-$round-c$c.txt" | tr -s ' \t\n' ' ')" \
        "$(grep -E '^\s+\[[0-9]+\]' "/tmp/sim-$name-$round-c$c.txt" | tr -s ' \t\n' ' ')"
    done
  done
done
kill -TERM $server; wait $server
