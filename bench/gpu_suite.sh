#!/usr/bin/env bash
# The whole one-GPU test suite within one device call (~8.5 minutes on an H100: runs 46b and 46c), logs under $OUT.
# Run from the repository root, after the wheel line (bench/results/README.md):  bash bench/gpu_suite.sh
#
# Four pytest processes run side by side on the one GPU. Run 46b's groups took 335, 170, 268 and 168 s; in run 57c
# the engine and JPEG files together outgrew 369 s and the other three took 41, 318 and 173 s, so the JPEG file
# joins the short group.
# Then the two model-control files run alone. They check the device memory a reload leaves by the whole device's
# used bytes, and beside the other groups those bytes move with the other processes' models (run 46b's two failures;
# alone, 46c: 2 passed). A test file under tests/gpu that no group names runs in a fifth process.
set -u
export CGSERVE_COMPILE_CACHE_DIR=${CGSERVE_COMPILE_CACHE_DIR:-/tmp/inductor-cache}  # what one group compiles, all reuse
LIMIT_S=${GPU_SUITE_GROUP_S:-380}
ALONE_LIMIT_S=${GPU_SUITE_ALONE_S:-200}
ALONE="tests/gpu/test_model_control_gpu.py tests/gpu/test_model_control_engine_process_gpu.py"
GROUPS_=(
  "tests/gpu/test_cuda_engine.py"
  "tests/gpu/test_gpu_jpeg.py tests/gpu/test_device_faults.py tests/gpu/test_gpu_metrics_nvml.py tests/gpu/test_multi_gpu.py"
  "tests/gpu/test_compiled_graphs.py tests/gpu/test_capture_while_serving.py tests/gpu/test_front_door_gpu.py"
  "tests/gpu/test_model_formats_gpu.py tests/gpu/test_named_outputs_gpu.py tests/gpu/test_tune_gpu.py"
)
named=" $ALONE ${GROUPS_[*]} "
rest=""
for file in tests/gpu/test_*.py; do
  [[ "$named" == *" $file "* ]] || rest="$rest $file"
done
[[ -n "$rest" ]] && GROUPS_+=("$rest")

# SIGINT at the limit: pytest stops and still prints which tests failed and why.
pytest_gpu() { timeout -s INT -k 15 "$1" python3 -m pytest -m gpu -v -p no:cacheprovider -p no:randomly --durations=10 "${@:2}"; }
started=$SECONDS
for i in "${!GROUPS_[@]}"; do
  # shellcheck disable=SC2086  # each group is a list of files
  (pytest_gpu "$LIMIT_S" ${GROUPS_[$i]} > "$OUT/pytest-gpu-group$i.log" 2>&1; echo "rc=$?" >> "$OUT/pytest-gpu-group$i.log") &
done
wait
# shellcheck disable=SC2086
pytest_gpu "$ALONE_LIMIT_S" $ALONE > "$OUT/pytest-gpu-alone.log" 2>&1
echo "rc=$?" >> "$OUT/pytest-gpu-alone.log"
echo "GPU suite: $((SECONDS - started)) s"
for log in "$OUT"/pytest-gpu-group*.log "$OUT/pytest-gpu-alone.log"; do
  echo "== $(basename "$log"): $(grep -E '^=+ .*(passed|failed|error|skipped).* =+$' "$log" | tail -1) $(tail -1 "$log")"
  grep -E '^(FAILED|ERROR) ' "$log" | head -5
done
