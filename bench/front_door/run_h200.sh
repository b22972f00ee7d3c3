#!/usr/bin/env bash
# The front door (app/front_door, CGSERVE_FRONT_DOOR_PORT) on the H200, after the install line of bench/run_h200.sh's
# header; writes under $OUT:
#   bash bench/front_door/run_h200.sh seed       the seed CNN, 8 server cores: the raw no-op, `app.cli serve` (inline)
#                                                and the service's front door, 1 and 8 workers (threads), 8 and 32
#                                                connections each (issue 26 items 4 and 5), by bench/front_ends.py
#   bash bench/front_door/run_h200.sh resnet50   ResNet-50, one raw 3×224×224 image a request, --compile none: the
#                                                engine's own peak and the service (8 workers, engine process) by
#                                                bench/one_image.py's hey kind, then the front door (one process,
#                                                8 threads) by hey alike, at 256 and 1024 connections
#   bash bench/front_door/run_h200.sh v2         ResNet-50 (CGSERVE_COMPILE, default none): the engine's own peak,
#                                                then one front door server (one process, 8 threads) driven by hey
#                                                (POST /predict, raw) and by perf_analyzer (v2 HTTP, binary UINT8,
#                                                one image a request, as the metadata declares) at 64 and 256
#                                                (PA_CONCURRENCIES="64 256"), then two side by side at 128 each
#                                                (PA_PAIR=0: not); PA_RATE=R: then an open loop at R requests/s
#                                                (--request-rate-range), for the p99 at a share of the peak
#   bash bench/front_door/run_h200.sh launcher   the door's launcher against the batcher's path (launcher off),
#                                                alternated, by bench/front_door/sweep.py: the seed CNN at 64 and 256
#                                                connections beside the 8-worker raw no-op, then ResNet-50 at 256
#                                                and the engine's own peak, all at --compile none (~7 minutes);
#                                                JSON under $OUT, each point's line printed
#   bash bench/front_door/run_h200.sh jpeg       JPEG bodies through the door at 1024 connections, the shipped
#                                                decoder (direct, 3 launches) and torchvision's, open loops at 70 %,
#                                                nvidia-smi's utilisation each second beside (run 60's command,
#                                                ~3.5 minutes)
#   bash bench/front_door/run_h200.sh nvjpeg-handles  the direct decoder's states alone, 1 to 4 threads, idle and
#                                                beside a device kept 0.6 busy: from one shared handle (as served) and
#                                                from a handle each (~1 minute; run 61)
#   bash bench/front_door/run_h200.sh jpeg-engine  JPEG photos as multipart uploads through 8 workers and the engine
#                                                process at 1024 connections, the shipped decoder and three direct
#                                                launches, open loops at 70 % (run 52 had three direct launches win
#                                                there by 7-10 % with a p99 of 66-67 ms against 39-41); ResNet-50
#                                                compiled into CGSERVE_COMPILE_CACHE_DIR first, so that neither server
#                                                spends its budget compiling (run 51f did) (~6 minutes)
set -u
case "${1:-}" in
seed)
  for c in 8 32; do
    timeout 280 python3 bench/front_ends.py --out "$OUT/seed-c$c" --hey .gpu/bin/hey --workers 1,8 \
      --designs raw-noop,inline,front-door --forms raw --per-worker $c --seconds 4 > "$OUT/seed-c$c.log" 2>&1
    grep -E "^## |^\| (raw-noop|inline|front-door)" "$OUT/seed-c$c.log"
  done
  ;;
resnet50)
  export CGSERVE_COMPILE=none
  timeout 220 python3 bench/one_image.py --out "$OUT/resnet50-ours" --designs engine-process --kinds hey \
    --concurrencies 256,1024 --p99-fraction 0 --budget-s 150 > "$OUT/resnet50-ours.log" 2>&1
  grep -E "engine peak|c256|c1024" "$OUT/resnet50-ours.log"
  python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 256, 150528, np.uint8).tofile('/tmp/image.u8')"
  mkdir -p /tmp/resnet50-only && cp -r models/examples/repository/resnet50 /tmp/resnet50-only/  # its one model
  CGSERVE_BUCKETS=1,8,32,64,128 taskset -c 0-7 python3 -m app.cli serve --port 8122 --grpc-port 0 --workers 1 \
    --front-door-port 8123 --front-door-threads 8 --model-repository /tmp/resnet50-only --log-level warning \
    --drain-seconds 0 > "$OUT/resnet50-door-server.log" 2>&1 &
  door=$!
  for _ in $(seq 150); do curl -sf localhost:8122/readyz > /dev/null && break; sleep 1; done
  for c in 256 1024; do
    hey() { taskset -c 8-15 .gpu/bin/hey -z "$1" -c $c -m POST -T application/octet-stream -D /tmp/image.u8 \
      http://127.0.0.1:8123/predict; }
    hey 1s > /dev/null
    hey 4s > "$OUT/resnet50-door-c$c.txt"
    echo "front door c$c: $(grep -E 'Requests/sec|99% in' "$OUT/resnet50-door-c$c.txt" | tr -s ' \t\n' ' ')" \
      "$(grep -E '^\s+\[[0-9]+\]' "$OUT/resnet50-door-c$c.txt" | tr -s ' \t\n' ' ')"
  done
  curl -s localhost:8122/metrics | grep -E '^cgserve_(requests_total|batch_rows_(sum|count))' > "$OUT/resnet50-door-metrics.txt"
  kill -TERM $door; wait $door; tail -3 "$OUT/resnet50-door-server.log"
  ;;
v2)
  export CGSERVE_COMPILE=${CGSERVE_COMPILE:-none} CGSERVE_COMPILE_CACHE_DIR=/tmp/ic
  mkdir -p /tmp/resnet50-only && cp -r models/examples/repository/resnet50 /tmp/resnet50-only/  # its one model
  timeout 170 taskset -c 0-7 python3 -c "import json; from pathlib import Path; from bench.resnet50_e2e import \
engine_peak; print(json.dumps(engine_peak(Path('/tmp/resnet50-only'), '1,8,32,64,128', 4.0)))" \
    > "$OUT/resnet50-engine-peak.json" 2> /tmp/resnet50-engine-peak.log
  echo "engine peak: $(tail -c 300 "$OUT/resnet50-engine-peak.json")"
  python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 256, 150528, np.uint8).tofile('/tmp/image.u8')"
  CGSERVE_BUCKETS=1,8,32,64,128 taskset -c 0-7 python3 -m app.cli serve --port 8122 --grpc-port 0 --workers 1 \
    --front-door-port 8123 --front-door-threads 8 --model-repository /tmp/resnet50-only --log-level warning \
    --drain-seconds 0 > "$OUT/resnet50-door-server.log" 2>&1 &
  door=$!
  for _ in $(seq 150); do curl -sf localhost:8122/readyz > /dev/null && break; sleep 1; done
  taskset -c 8-15 .gpu/bin/hey -z 1s -c 256 -m POST -T application/octet-stream -D /tmp/image.u8 \
    http://127.0.0.1:8123/predict > /dev/null
  taskset -c 8-15 .gpu/bin/hey -z 4s -c 256 -m POST -T application/octet-stream -D /tmp/image.u8 \
    http://127.0.0.1:8123/predict > "$OUT/resnet50-door-hey-c256.txt"
  echo "hey raw c256: $(grep -E 'Requests/sec|99% in' "$OUT/resnet50-door-hey-c256.txt" | tr -s ' \t\n' ' ')"
  # The same image as a v2 binary request (JSON header, then the pixels), from hey: the door's v2 path without
  # perf_analyzer's own cost.
  python3 -c "import orjson, pathlib; h = orjson.dumps({'inputs': [{'name': 'input', 'shape': [1, 3, 224, 224], \
'datatype': 'UINT8', 'parameters': {'binary_data_size': 150528}}], 'outputs': [{'name': 'probabilities', \
'parameters': {'binary_data': True}}]}); pathlib.Path('/tmp/v2.len').write_text(str(len(h))); \
pathlib.Path('/tmp/v2.body').write_bytes(h + pathlib.Path('/tmp/image.u8').read_bytes())"
  taskset -c 8-15 .gpu/bin/hey -z 4s -c 256 -m POST -H "Inference-Header-Content-Length: $(cat /tmp/v2.len)" \
    -D /tmp/v2.body http://127.0.0.1:8123/v2/models/resnet50/infer > "$OUT/resnet50-door-hey-v2-c256.txt"
  echo "hey v2 binary c256: $(grep -E 'Requests/sec|99% in|\[200\]' "$OUT/resnet50-door-hey-v2-c256.txt" | tr -s ' \t\n' ' ')"
  served() {  # the server's own count of v2 answers, their summed latency, and the batches' rows
    curl -s localhost:8122/metrics | grep -E '^cgserve_(request_duration_seconds_(sum|count)\{format="v2-binary"|batch_rows_(sum|count))'
  }
  pa() {  # perf_analyzer at concurrency $1, its output to $2, with the server's figures before and after
    local mode=""; [ "$1" -gt 64 ] && mode="--async --max-threads 16"
    served > "$2.before"
    # shellcheck disable=SC2086
    timeout 120 taskset -c 8-15 /tmp/site/perf_analyzer/bin/perf_analyzer -m resnet50 -u 127.0.0.1:8123 -i http \
      -b 1 --shape input:3,224,224 --concurrency-range "$1:$1" --measurement-interval 4000 \
      --stability-percentage 100 --max-trials 4 -f "/tmp/$(basename "$2").csv" $mode > "$2" 2>&1
    { echo "server before:"; cat "$2.before"; echo "server after:"; served; } >> "$2"
    echo "perf_analyzer v2 http c$1 (rc $?): $(grep -E 'Throughput|p99 latency|Avg HTTP' "$2" | tr -s ' \n' ' ')"
  }
  for c in ${PA_CONCURRENCIES:-64 256}; do pa "$c" "$OUT/resnet50-door-pa-c$c.txt"; done
  if [ -n "${PA_RATE:-}" ]; then  # an open loop: requests sent on a schedule, answered or not
    served > "$OUT/resnet50-door-pa-rate.txt.before"
    timeout 120 taskset -c 8-15 /tmp/site/perf_analyzer/bin/perf_analyzer -m resnet50 -u 127.0.0.1:8123 -i http \
      -b 1 --shape input:3,224,224 --request-rate-range "$PA_RATE:$PA_RATE" --measurement-interval 4000 \
      --stability-percentage 100 --max-trials 4 --async --max-threads 16 -f /tmp/pa-rate.csv \
      > "$OUT/resnet50-door-pa-rate.txt" 2>&1
    { echo "server before:"; cat "$OUT/resnet50-door-pa-rate.txt.before"; echo "server after:"; served; } \
      >> "$OUT/resnet50-door-pa-rate.txt"
    echo "perf_analyzer v2 http at $PA_RATE/s: $(grep -E 'Throughput|p99 latency' "$OUT/resnet50-door-pa-rate.txt" | tr -s ' \n' ' ')"
  fi
  if [ "${PA_PAIR:-1}" = 1 ]; then
    # Two perf_analyzers at 128 each, side by side: their sum against one at 256 says whether one client is the limit.
    pa 128 /tmp/pa-a.txt & first=$!; pa 128 /tmp/pa-b.txt; wait $first
    cat /tmp/pa-a.txt /tmp/pa-b.txt > "$OUT/resnet50-door-pa-2x128.txt"
  fi
  curl -s localhost:8122/metrics | grep -E '^cgserve_(requests_total|batch_rows_(sum|count))' > "$OUT/resnet50-door-metrics.txt"
  kill -TERM $door; wait $door; tail -3 "$OUT/resnet50-door-server.log"
  ;;
launcher)
  off=CGSERVE_FRONT_DOOR_LAUNCHER=false
  sweep() { timeout "$1" python3 bench/front_door/sweep.py --hey .gpu/bin/hey "${@:2}"; }
  for c in 64 256; do
    sweep 200 --concurrency $c --out /tmp/seed-c$c --noop-workers 8 --label "seed-c$c-" \
      --variants "launcher=;batcher=$off;launcher2=;batcher2=$off" > "/tmp/seed-c$c.log" 2>&1
    cp "/tmp/seed-c$c/seed-c$c-sweep.json" "$OUT/"; grep "req/s" "/tmp/seed-c$c.log" | cut -c1-170
  done
  export CGSERVE_COMPILE=none CGSERVE_BUCKETS=1,8,32,64,128
  mkdir -p /tmp/resnet50-only && cp -r models/examples/repository/resnet50 /tmp/resnet50-only/  # its one model
  sweep 170 --concurrency 256 --out /tmp/r50 --noop-workers 0 --repository /tmp/resnet50-only \
    --image-shape 3,224,224 --label r50-c256- --variants "launcher=;batcher=$off" > /tmp/r50.log 2>&1
  cp /tmp/r50/r50-c256-sweep.json "$OUT/"; grep "req/s" /tmp/r50.log | cut -c1-170
  timeout 120 taskset -c 0-7 python3 -c "import json; from pathlib import Path; from bench.resnet50_e2e import \
engine_peak; print(json.dumps(engine_peak(Path('/tmp/resnet50-only'), '1,8,32,64,128', 4.0)))" \
    > "$OUT/resnet50-engine-peak.json" 2> /tmp/resnet50-engine-peak.log
  echo "engine peak: $(tail -c 300 "$OUT/resnet50-engine-peak.json")"
  ;;
jpeg-engine)
  export CGSERVE_COMPILE_CACHE_DIR=/tmp/ic
  mkdir -p /tmp/resnet50-only && cp -r models/examples/repository/resnet50 /tmp/resnet50-only/  # its one model
  timeout 200 python3 -c "import json; from pathlib import Path; from bench.resnet50_e2e import \
engine_peak; print(json.dumps(engine_peak(Path('/tmp/resnet50-only'), '1,8,32,64,128', 2.0)))" \
    > "$OUT/resnet50-compile-warm.json" 2> /tmp/resnet50-compile-warm.log
  D=CGSERVE_JPEG_NVJPEG=direct,CGSERVE_JPEG_STREAM_PRIORITY=high,CGSERVE_JPEG_LAUNCHES=3
  timeout 330 python3 bench/one_image.py --out /tmp/one-image --budget-s 280 --designs engine-process --kinds jpeg \
    --variant-kinds jpeg --concurrencies 1024 --p99-fraction 0.7 --variants "direct3=$D" \
    > "$OUT/one-image-engine-process-jpeg.log" 2>&1
  cp /tmp/one-image/one-image.json "$OUT/one-image-engine-process-jpeg.json"
  grep -E "engine peak|c1024|open loop" "$OUT/one-image-engine-process-jpeg.log" | cut -c1-300
  ;;
jpeg)
  nvidia-smi dmon -s u -o T -d 1 > "$OUT/dmon.txt" 2>&1 &
  dmon=$!
  timeout 500 python3 bench/one_image.py --out /tmp/one-image --budget-s 390 --designs front-door --kinds jpeg-body \
    --variant-kinds jpeg-body --concurrencies 1024 --p99-fraction 0.7 \
    --variants "torchvision=CGSERVE_JPEG_NVJPEG=torchvision" \
    2>&1 | while IFS= read -r line; do echo "$(date +%T) $line"; done > "$OUT/one-image-door-jpeg.log"
  kill $dmon
  cp /tmp/one-image/one-image.json "$OUT/one-image-door-jpeg.json"
  grep -E "engine peak|c1024|open loop" "$OUT/one-image-door-jpeg.log" | cut -c1-300
  ;;
nvjpeg-handles)
  timeout 200 python3 bench/nvjpeg_states.py --out "$OUT/nvjpeg-handles" --threads 1,2,3,4 --batch 121 --seconds 2 \
    --busy-gpu 0,0.6 --kinds direct,direct-handles > "$OUT/nvjpeg-handles.log" 2>&1
  grep -E "^direct" "$OUT/nvjpeg-handles.log"
  ;;
*) echo "usage: $0 seed|resnet50|v2|launcher|jpeg|jpeg-engine|nvjpeg-handles" >&2; exit 2 ;;
esac
