#!/usr/bin/env bash
# Run 12 on the two-GPU machine (nvidia-h200-x2, 32 cores), in two calls of the device tool. Each
# call runs two lanes side by side, each lane one GPU (CUDA_VISIBLE_DEVICES) and 16 cores (taskset;
# the benchmarks split their lane's cores in halves, servers low, load generator high).
#   CALL=a  lane 0: GPU tests (engine, faults, compiled graphs), then the stall A/B
#           lane 1: GPU tests (formats, JPEG, tuner), then the side-by-side (resnet50)
#   CALL=b  both GPUs: the two-GPU tests (and lane 1: call a's two failures, fixed); then
#           bench/multi_gpu_bench.py; then lane 0: bench/whole_machine.py   lane 1: bench/resnet50_e2e.py
# Started after the wheel install line of bench/results/README.md, from the repo root; outputs in $OUT.
set -u
export CGSERVE_COMPILE_CACHE_DIR=/tmp/inductor-cache
started=$SECONDS
lane() {  # lane GPU CORES NAME LIMIT_S COMMAND…: run COMMAND on one GPU and 16 cores, log to $OUT/NAME.log
  local gpu=$1 cores=$2 name=$3 limit=$4; shift 4
  CUDA_VISIBLE_DEVICES=$gpu timeout -s TERM "$limit" taskset -c "$cores" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? at $((SECONDS - started)) s"
}
PYTEST=(python3 -m pytest -m gpu -v -p no:cacheprovider --durations=15)
{ nvidia-smi -L; git log -1 --format='commit %H %s' 2>/dev/null; echo "CALL=${CALL:-a}"; } > "$OUT/env.txt" 2>&1
if [ "${CALL:-a}" = a ]; then
  {
    lane 0 0-15 pytest-gpu-lane0 300 "${PYTEST[@]}" tests/gpu/test_cuda_engine.py tests/gpu/test_device_faults.py \
      tests/gpu/test_compiled_graphs.py
    lane 0 0-15 stalls 170 python3 bench/stall_ab.py --device cuda --seconds 12 --concurrency 64 --processes 4 \
      --server-cores 0-3 --loadgen-cores 8-15 --out "$OUT/stalls.json"
  } &
  {
    lane 1 16-31 pytest-gpu-lane1 240 "${PYTEST[@]}" tests/gpu/test_model_formats_gpu.py tests/gpu/test_gpu_jpeg.py \
      tests/gpu/test_tune_gpu.py
    lane 1 16-31 side-by-side $((500 - (SECONDS - started))) python3 bench/side_by_side.py --out "$OUT/sbs" \
      --model resnet50 --compile-cache-dir "$CGSERVE_COMPILE_CACHE_DIR" --step-duration 3 --warmup 1 \
      --concurrencies 16,64
  } &
  wait
  tail -n 3 "$OUT"/pytest-gpu-lane*.log; cat "$OUT/stalls.log" | cut -c1-300; cat "$OUT/sbs/"*.md 2>/dev/null
else
  lane 0,1 0-15 pytest-multi-gpu 150 "${PYTEST[@]}" tests/gpu/test_multi_gpu.py &
  lane 1 16-31 pytest-gpu-rerun 150 "${PYTEST[@]}" tests/gpu/test_cuda_engine.py::test_debug_dump_writes_the_graph_with_its_kernels \
    tests/gpu/test_tune_gpu.py &
  wait
  lane 0,1 0-31 multi-gpu 120 python3 bench/multi_gpu_bench.py --compile none --seconds 6 --warmup-s 2 \
    --out "$OUT/multi-gpu"
  lane 0 0-15 whole-machine 200 python3 bench/whole_machine.py --out "$OUT/whole-machine" \
    --hey .gpu/bin/hey --budget-s 110 --step-duration 2 &
  lane 1 16-31 resnet50-e2e 200 python3 bench/resnet50_e2e.py --seconds 3 --workers 2,4 \
    --server-cores 16-23 --loadgen-cores 24-31 --out "$OUT/resnet50-e2e.json" &
  wait
  tail -n 3 "$OUT"/pytest-multi-gpu.log "$OUT"/pytest-gpu-rerun.log; tail -4 "$OUT/multi-gpu.log" | cut -c1-400
  tail -30 "$OUT/whole-machine.log" | cut -c1-300; tail -3 "$OUT/resnet50-e2e.log" | cut -c1-500
fi
