#!/usr/bin/env bash
# One call of the device tool on the two-GPU machine (nvidia-h200-x2, 32 cores): two lanes side by
# side, each one GPU (CUDA_VISIBLE_DEVICES) and 16 cores (taskset; the benchmarks split a lane's
# cores in halves, servers low, load generator high). Started after the wheel install line of
# bench/results/README.md, from the repo root. Run 13's two calls (runs 12a/b ran this file as it
# was at their commits):
#   CALL=c  lane 0: GPU tests (engine, faults, compiled graphs, tuner), then bench/whole_machine.py
#           lane 1: GPU tests (formats, JPEG), then bench/side_by_side.py, all six servers (resnet50)
#   CALL=d  lane 0: bench/resnet50_e2e.py (1, 2, 4 workers), then bench/engine_bench.py
#           lane 1: bench/lone_requests.py, bench/jpeg_decode_bench.py, then bench/tune_bench.py
#   CALL=e  both GPUs: the two-GPU tests; then
#           lane 0: the tuner's GPU tests, bench/whole_machine.py at 4 workers, bench/lone_requests.py
#           lane 1: bench/resnet50_e2e.py at 4 workers (cut from call d by its time limit)
# Everything is written under $WORK and packed into $OUT/run13<call>.tgz at the end (the device
# tool brings back 8 files at most); $OUT/summary.txt holds each step's exit status and tail.
set -u
CALL=${CALL:-c}
WORK=${WORK:-/tmp/run13$CALL}
mkdir -p "$WORK"
export CGSERVE_COMPILE_CACHE_DIR=/tmp/inductor-cache
started=$SECONDS
lane() {  # lane GPU CORES NAME LIMIT_S COMMAND…: run COMMAND on one GPU and 16 cores, log to $WORK/NAME.log
  local gpu=$1 cores=$2 name=$3 limit=$4; shift 4
  CUDA_VISIBLE_DEVICES=$gpu timeout -s TERM -k 10 "$limit" taskset -c "$cores" "$@" > "$WORK/$name.log" 2>&1
  echo "$name: rc=$? at $((SECONDS - started)) s (limit $limit s)" >> "$WORK/steps.txt"
}
until_s() { local left=$(($1 - (SECONDS - started))); echo $((left > 30 ? left : 30)); }  # seconds left until $1 s into the call (≥ 30)
PYTEST=(python3 -m pytest -m gpu -v -p no:cacheprovider --durations=15)
{
  nvidia-smi -L
  python3 -c "import torch, torchvision, httpx, httpcore; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'httpx', httpx.__version__, 'httpcore', httpcore.__version__)"
  git log -1 --format='commit %H %s' 2>/dev/null
  echo "CALL=$CALL"
} > "$WORK/env.txt" 2>&1
if [ "$CALL" = c ]; then
  {
    lane 0 0-15 pytest-gpu-lane0 200 "${PYTEST[@]}" tests/gpu/test_cuda_engine.py tests/gpu/test_device_faults.py \
      tests/gpu/test_compiled_graphs.py tests/gpu/test_tune_gpu.py
    lane 0 0-15 whole-machine "$(until_s 555)" python3 bench/whole_machine.py --out "$WORK/whole-machine" \
      --hey .gpu/bin/hey --budget-s $(($(until_s 555) - 80))
  } &
  {
    lane 1 16-31 pytest-gpu-lane1 150 "${PYTEST[@]}" tests/gpu/test_model_formats_gpu.py tests/gpu/test_gpu_jpeg.py
    lane 1 16-31 side-by-side "$(until_s 560)" python3 bench/side_by_side.py --out "$WORK/sbs" --model resnet50 \
      --compile-cache-dir "$CGSERVE_COMPILE_CACHE_DIR" --step-duration 3 --warmup 1 --concurrencies 16,64
  } &
  wait
elif [ "$CALL" = e ]; then
  lane 0,1 0-31 pytest-multi-gpu 90 "${PYTEST[@]}" tests/gpu/test_multi_gpu.py
  {
    lane 0 0-15 pytest-tune-gpu 80 "${PYTEST[@]}" tests/gpu/test_tune_gpu.py
    lane 0 0-15 whole-machine 150 python3 bench/whole_machine.py --out "$WORK/whole-machine" \
      --hey .gpu/bin/hey --workers 4 --budget-s 110
    lane 0 0-15 lone-requests "$(until_s 385)" python3 bench/lone_requests.py --out "$WORK/lone" --requests 300 \
      --waits poll --host-io-copy
  } &
  lane 1 16-31 resnet50-e2e "$(until_s 385)" python3 bench/resnet50_e2e.py --seconds 3 --workers 4 \
    --server-cores 16-23 --loadgen-cores 24-31 --out "$WORK/resnet50-e2e.json" &
  wait
else
  {
    lane 0 0-15 resnet50-e2e 330 python3 bench/resnet50_e2e.py --seconds 3 --workers 1,2,4 \
      --server-cores 0-7 --loadgen-cores 8-15 --out "$WORK/resnet50-e2e.json"
    lane 0 0-15 engine "$(until_s 570)" python3 bench/engine_bench.py --iterations 500 --out "$WORK/engine.json"
  } &
  {
    lane 1 16-31 lone-requests 100 python3 bench/lone_requests.py --out "$WORK/lone"
    lane 1 16-31 jpeg 250 python3 bench/jpeg_decode_bench.py --compile none --out "$WORK/jpeg"
    lane 1 16-31 tune-bench "$(until_s 570)" python3 bench/tune_bench.py --out "$WORK/tune" --slo-p99-ms 25 \
      --model resnet50 --model-repository models/examples/repository --compile none --runs 50 --bisect-steps 2
  } &
  wait
fi
{
  cat "$WORK/steps.txt"
  for log in "$WORK"/*.log; do echo "== $log"; tail -n 6 "$log" | cut -c1-400; done
  cat "$WORK"/sbs/*.md "$WORK"/whole-machine/*.md 2>/dev/null
} > "$OUT/summary.txt"
tar czf "$OUT/run13$CALL.tgz" -C "$(dirname "$WORK")" "$(basename "$WORK")"
cat "$OUT/summary.txt"
