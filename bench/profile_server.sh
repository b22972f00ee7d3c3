#!/usr/bin/env bash
# Profile the service under closed-loop load on the GPU machine: where does a request's CPU go?
#   bench/profile_server.sh OUT_DIR [server flags...]
# Server on cores 0-7, hey (16 connections, JSON body) on 8-15, py-spy sampling the server.
set -uo pipefail
out=$1; shift
port=18123
taskset -c 0-7 python3 -m app.cli serve --host 127.0.0.1 --port $port --log-level warning "$@" > "$out/profile-server.log" 2>&1 &
server=$!
for _ in $(seq 100); do curl -sf "127.0.0.1:$port/readyz" > /dev/null && break; sleep 0.2; done
python3 -c "import json; print(json.dumps({'instances': [[0.5] * 784]}))" > "$out/body.json"
taskset -c 8-15 "${HEY:-.gpu/bin/hey}" -z 12s -c 16 -m POST -T application/json -D "$out/body.json" \
  "http://127.0.0.1:$port/predict" > "$out/profile-hey.txt" 2>&1 &
load=$!
sleep 3
"${PYSPY:-py-spy}" record --gil --pid $server --duration 6 --rate 500 --format raw --output "$out/profile-raw.txt" > /dev/null 2>&1
wait $load
kill $server; wait $server 2>/dev/null
grep -E "Requests/sec|Average|99%" "$out/profile-hey.txt"
