#!/usr/bin/env bash
# Two builds of app/front_door/door.c side by side on any machine (CGSERVE_FRONT_DOOR_LIBRARY), alternating, two
# rounds: the service with one door thread, a stand-in model whose batch sleeps 0.1 ms (so that the door, not the
# model, is what is measured), hey at 64 connections for 6 s after 1 s. Expects /tmp/fd-old.so, /tmp/fd-new.so and
# /tmp/fastsim (bench/sim_gpu/timed with FIXED_S, PER_ROW_S = 0.1e-3, 0.0) and /tmp/raw.bin (784 bytes).
#   bash bench/front_door/ab_library.sh
for round in 1 2; do for v in old new; do
  CGSERVE_FRONT_DOOR_LIBRARY=/tmp/fd-$v.so .venv/bin/python -m app.cli serve --port 8532 --grpc-port 0 --device cpu --model-repository /tmp/fastsim --front-door-port 8531 --front-door-threads 1 --log-level warning > /tmp/ab-$v.log 2>&1 &
  s=$!
  for _ in $(seq 60); do curl -sf localhost:8532/readyz >/dev/null && break; sleep 0.5; done
  .gpu/bin/hey -z 1s -c 64 -m POST -T application/octet-stream -D /tmp/raw.bin http://127.0.0.1:8531/predict > /dev/null
  .gpu/bin/hey -z 6s -c 64 -m POST -T application/octet-stream -D /tmp/raw.bin http://127.0.0.1:8531/predict > /tmp/ab-$v-$round.txt
  echo "$v $round: $(grep -E 'Requests/sec|99% in' /tmp/ab-$v-$round.txt | tr -s ' \t\n' ' ') $(grep -E '^\s+\[[0-9]+\]' /tmp/ab-$v-$round.txt | tr -s ' \t\n' ' ')"
  kill -TERM $s; wait $s
done; done
