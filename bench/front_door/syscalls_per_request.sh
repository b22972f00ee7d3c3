#!/usr/bin/env bash
# System calls a request of the front door, by kind, for two builds of app/front_door/door.c (as ab_library.sh:
# CGSERVE_FRONT_DOOR_LIBRARY), counted by strace on every thread of the server: a figure that holds still where
# the development machine's rates do not. The service with one door thread and the stand-in model whose batch sleeps
# 0.1 ms (/tmp/fastsim), hey at C connections for exactly N requests (keep-alive) after a warm-up; strace is
# attached for those N only. The server's own threads (the event loop, the batch thread) are counted too: their
# calls a request are what the door's changes leave them. Expects /tmp/fd-old.so, /tmp/fd-new.so, /tmp/fastsim,
# /tmp/raw.bin (784 bytes), as ab_library.sh; needs strace.
#   bash bench/front_door/syscalls_per_request.sh [C] [N]      (writes /tmp/sc-<build>.txt, prints a line a build)
conns=${1:-64} n=${2:-20000}
for v in old new; do
  CGSERVE_FRONT_DOOR_LIBRARY=/tmp/fd-$v.so .venv/bin/python -m app.cli serve --port 8632 --grpc-port 0 --device cpu \
    --model-repository /tmp/fastsim --front-door-port 8631 --front-door-threads 1 --log-level warning \
    > /tmp/sc-$v.log 2>&1 &
  s=$!
  for _ in $(seq 60); do curl -sf localhost:8632/readyz >/dev/null && break; sleep 0.5; done
  .gpu/bin/hey -z 2s -c "$conns" -m POST -T application/octet-stream -D /tmp/raw.bin http://127.0.0.1:8631/predict \
    > /dev/null
  strace -c -f -q -p "$s" -o /tmp/sc-$v.txt &
  tracer=$!
  sleep 1 # attached to every thread before the first request
  .gpu/bin/hey -n "$n" -c "$conns" -m POST -T application/octet-stream -D /tmp/raw.bin \
    http://127.0.0.1:8631/predict > /tmp/sc-$v-hey.txt
  kill -INT $tracer; wait $tracer
  ok=$(grep -E '^\s+\[200\]' /tmp/sc-$v-hey.txt | awk '{print $2}')
  # strace -c's rows: "% time  seconds  usecs/call  calls  [errors]  syscall"; each kind's calls over the requests
  echo "$v: $ok answered; a request: $(awk -v n="${ok:-1}" '$1 ~ /^[0-9.]+$/ && $NF != "total" {
      all += $4; line = line sprintf("%s %.2f%s, ", $NF, $4 / n, NF == 6 ? sprintf(" (%.2f failed)", $5 / n) : "")}
      END {printf "%.2f system calls: %s", all / n, line}' /tmp/sc-$v.txt)"
  kill -TERM $s; wait $s
done
