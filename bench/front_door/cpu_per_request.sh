#!/usr/bin/env bash
# Where a request's server CPU goes, on the simulated device (bench/sim_gpu/timed: a ResNet-50 batch's H200 time ×10,
# slept), on any machine: one server (app.cli serve, 1 worker) with the front door; hey at 256 connections, 8 s, to
#   http   the service's HTTP port, POST /predict raw          (before the door)
#   raw    the front door, POST /predict raw
#   v2     the front door, the v2 infer with one UINT8 binary tensor (a fixed JSON header, as Triton's clients send)
# For each: the server process's CPU seconds (utime + stime, every thread: uvicorn's, the loop's, the door's C
# threads) over the requests answered, and py-spy's samples of the same 8 s (Python's frames, idle ones left out,
# without pausing the process) summed by function, the most first.
#   bash bench/front_door/cpu_per_request.sh HEY PY_SPY OUT    (writes OUT/<target>.txt and prints a line each)
set -u
hey_bin=${1:-hey} py_spy=${2:-py-spy} out=${3:-/tmp/cpu-per-request}
mkdir -p "$out"
rm -rf /tmp/simrepo && mkdir -p /tmp/simrepo && cp -r bench/sim_gpu/timed /tmp/simrepo/
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 256, 784, np.uint8).tofile('/tmp/raw.bin')"
python3 -c "import orjson, pathlib; h = orjson.dumps({'inputs': [{'name': 'input', 'shape': [1, 1, 28, 28], \
'datatype': 'UINT8', 'parameters': {'binary_data_size': 784}}], 'outputs': [{'name': 'probabilities', \
'parameters': {'binary_data': True}}]}); pathlib.Path('/tmp/v2.len').write_text(str(len(h))); \
pathlib.Path('/tmp/v2.body').write_bytes(h + pathlib.Path('/tmp/raw.bin').read_bytes())"
python3 -m app.cli serve --port 8432 --grpc-port 0 --device cpu --model-repository /tmp/simrepo --workers 1 \
  --front-door-port 8431 --front-door-threads 2 --log-level warning > "$out/server.log" 2>&1 &
server=$!
for _ in $(seq 60); do curl -sf "localhost:8432/readyz" > /dev/null && break; sleep 1; done
cpu_s() { awk '{print ($14 + $15) / 100}' "/proc/$server/stat"; }  # utime + stime, clock ticks (100 a second)
for target in http raw v2; do
  case $target in
    http) args=(-T application/octet-stream -D /tmp/raw.bin http://127.0.0.1:8432/predict) ;;
    raw) args=(-T application/octet-stream -D /tmp/raw.bin http://127.0.0.1:8431/predict) ;;
    v2) args=(-H "Inference-Header-Content-Length: $(cat /tmp/v2.len)" -D /tmp/v2.body
              http://127.0.0.1:8431/v2/models/timed/infer) ;;
  esac
  $hey_bin -z 2s -c 256 -m POST "${args[@]}" > /dev/null
  before=$(cpu_s)
  $py_spy record --pid $server --format raw --rate 200 --duration 7 --nonblocking \
    --output "/tmp/spy-$target.txt" > /dev/null 2>&1 &
  spy=$!
  $hey_bin -z 8s -c 256 -m POST "${args[@]}" > "$out/$target-hey.txt"
  after=$(cpu_s)
  wait $spy
  answered=$(grep -E '^\s+\[200\]' "$out/$target-hey.txt" | awk '{print $2}')
  {
    echo "target $target: $(grep -E 'Requests/sec' "$out/$target-hey.txt" | tr -s ' \t')," \
      "$answered answered, server CPU $(echo "$before $after" | awk '{print $2 - $1}') s:" \
      "$(echo "$before $after ${answered:-0}" | awk '$3 > 0 {printf "%.1f", ($2 - $1) / $3 * 1e6}') us a request"
    echo "py-spy, samples by function (leaf frame), the most first:"
    # raw format: "frame;frame;...;leaf count"; the leaf's function, summed
    awk '{n = $NF; $NF = ""; k = split($0, f, ";"); leaf = f[k]; sub(/ \(.*/, "", leaf); s[leaf] += n; t += n}
         END {for (l in s) printf "%6.1f%%  %s\n", 100 * s[l] / t, l}' "/tmp/spy-$target.txt" | sort -rn | head -25
  } > "$out/$target.txt"
  head -1 "$out/$target.txt"
done
kill -TERM $server; wait $server
