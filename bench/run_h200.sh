#!/usr/bin/env bash
# One call of the device tool on the H200: the steps named in STEPS (default: all), every output
# under $OUT. Started after the wheel install line of bench/results/README.md, from the repo root.
#   STEPS="gpu-tests engine e2e stalls" bash bench/run_h200.sh
#   GPU_TESTS="tests/gpu/test_device_faults.py …" narrows the GPU tests (default: all of tests/gpu)
#   STEPS=profile PROFILES="noop-json=--target noop;ours-json=--compile none": py-spy per server (bench/profile_server.py)
#   Issue 26 (ResNet-50, one image a request; py-spy on every server process during the raw points):
#     STEPS="gpu-tests one-image" ONE_IMAGE_ARGS="--profile raw" bash bench/run_h200.sh
#   What run 26 left (issue 26), one call each (~10 minutes with a cold start). Run 26 measured the protocol's clients at
#   1024 in flight (v2 HTTP 0.84-0.96x, gRPC streams 0.62-0.67x: the workers' CPU), the switch interval (no effect on
#   them) and nvImageCodec (no faster than torchvision's nvJPEG). perf_analyzer at 1024 in flight runs out of memory
#   (~120 GB: it keeps a request's input per request; over HTTP at 256 too in 23b and 25b), so its figures stay at 256
#   (run 25a). bench/jpeg_hw_decode.py's CPU and GIL figures: run 27a (41 us of CPU a photo in batches of 32).
#   The whole GPU suite fits one call: bash bench/gpu_suite.sh (four pytest processes side by side, then the two
#   model-control files alone; runs 46b and 46c).
#   JPEG uploads (runs 27, 28: 0.43x with batches of 128; the GIL on the decoder's thread was not the limit, the
#   device it shares with the engine is part of it): the decoder's rate beside a busy device:
#     STEPS=jpeg-stages JPEG_STAGES_ARGS="--batches 32,128 --clients 512 --max-batches 32,128 --busy-gpu 0,0.5,0.9" \
#       bash bench/run_h200.sh
#   Each worker decoding JPEG under CUDA MPS (run 31b: 9,519 img/s at 256, 7,903 at 1024; without MPS 6,532 / 6,271
#   against the engine process's decoder's 8,122 / 10,776; MPS took the per-process seed CNN at 8 a worker from 29,843
#   to 45,907 raw req/s in 24b):
#     export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log; mkdir -p $CUDA_MPS_PIPE_DIRECTORY \
#       $CUDA_MPS_LOG_DIRECTORY; nvidia-cuda-mps-control -d; STEPS=one-image ONE_IMAGE_S=420 ONE_IMAGE_BUDGET_S=380 \
#       ONE_IMAGE_ARGS="--kinds jpeg --variant-kinds jpeg --concurrencies 1024,256 --p99-fraction 0 \
#       --variants workers-decode=CGSERVE_JPEG_DECODE_IN_WORKERS=true" bash bench/run_h200.sh; echo quit | nvidia-cuda-mps-control
#   GPU tests last run: all of tests/gpu on 950eede (runs 33a+33b: 75 passed, 5 skipped; run 30a's two-process command,
#   the tuner's file apart). What holds the seed CNN at 8 a worker (run 33b): per-process engines wait on a GPU eight
#   contexts share (CGSERVE_EVENT_WAIT=block: workers half idle, 28 % less); the engine process did 1.32-1.56x there.
#   The limit of 16 UPLOADS frames a worker: 30b, 30d, 30e, 31a (0.33-0.38x at 256, 0.47-0.52x at 1024); JPEG's p99 at 70 %: 70.6 ms (30d), 86.7 ms (31a). Decoding uploads on the workers' Pillow while
#   the GPU decoder was behind (CGSERVE_JPEG_SPILL_BACKLOG) lost 29-47 % at 1024 (31a) and was removed.
#   py-spy on the engine process alone during the JPEG points (--profile-engine; Python frames do not show uvloop's
#   callbacks, run 27b: add --profile-native, which pauses the process):
#     STEPS=one-image ONE_IMAGE_ARGS="--kinds jpeg --concurrencies 1024 --p99-fraction 0 --profile jpeg --profile-engine" \
#       bash bench/run_h200.sh
#   nvImageCodec beside torchvision (run 26d's command is in bench/results/README.md): STEPS none, bench/jpeg_hw_decode.py
#   The decoder's stages on the device: STEPS=jpeg-stages bash bench/run_h200.sh
#   STEPS=multi-gpu on the two-GPU machine (nvidia-h200-x2): tests/gpu/test_multi_gpu.py, bench/multi_gpu_bench.py
#   What issue 12 still lacks after run 13 (one call, ~8 minutes):
#     STEPS="gpu-tests whole-machine" GPU_TESTS=tests/gpu/test_tune_gpu.py WHOLE_MACHINE_WORKERS=4 bash bench/run_h200.sh
#   The two designs side by side (run 14b): E2E_ARGS and WHOLE_MACHINE_ARGS pass flags through, e.g.
#     STEPS="e2e whole-machine" E2E_ARGS="--workers 4 --designs per-process,engine-process" \
#     WHOLE_MACHINE_WORKERS=4 WHOLE_MACHINE_ARGS="--designs per-process,engine-process" bash bench/run_h200.sh
# Everything is written under $WORK and packed into $OUT/run.tgz at the end (the device tool brings
# back 8 files at most); $OUT/env.txt is copied beside it.
set -u
RESULTS=$OUT
OUT=${WORK:-/tmp/run}  # the steps below write here
mkdir -p "$OUT"
export CGSERVE_COMPILE_CACHE_DIR=/tmp/inductor-cache  # shared: what the tests compile, the benchmarks reuse
STEPS=${STEPS:-"gpu-tests torchvision engine e2e stalls protocols jpeg"}
{
  nvidia-smi -L
  python3 -c "import torch, torchvision, triton, grpc, google.protobuf as pb; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'triton', triton.__version__, 'grpcio', grpc.__version__, 'protobuf', pb.__version__)"
  git log -1 --format='commit %H %s' 2>/dev/null || true
  # The copy of the working tree differs from that commit by what was not yet landed: name it, so that
  # the record's tree is the local commit whose `git diff <landed> <commit> | sha256sum` gives this hash.
  # New files count too (intent-to-add in a throwaway index, the checkout's own untouched): the hash is
  # `git diff <landed> <commit> | sha256sum`.
  index=$(mktemp); cp "$(git rev-parse --git-dir 2>/dev/null)/index" "$index" 2>/dev/null
  GIT_INDEX_FILE=$index git add --intent-to-add . 2>/dev/null
  echo "tree: $(GIT_INDEX_FILE=$index git diff HEAD --shortstat 2>/dev/null), diff sha256 $(GIT_INDEX_FILE=$index git diff HEAD 2>/dev/null | sha256sum | cut -c1-16)"
  rm -f "$index"
  echo "STEPS=$STEPS"
} > "$OUT/env.txt" 2>&1
step() { [[ " $STEPS " == *" $1 "* ]]; }
started=$SECONDS
if step jpeg-stages; then  # issue 26: the GPU JPEG decoder's stages, one batch at a time, then under load
  timeout "${JPEG_STAGES_S:-120}" python3 bench/jpeg_stages.py --out "$OUT/jpeg-stages" ${JPEG_STAGES_ARGS:-} \
    > "$OUT/jpeg-stages.log" 2>&1
  echo "jpeg stages: rc=$? at $((SECONDS - started)) s"; cat "$OUT/jpeg-stages.log" | cut -c1-400
fi
if step gpu-tests; then  # tests/gpu only: the CPU suite's protocol tests need tritonclient, which that machine lacks
  # SIGINT at the limit: pytest stops and still prints which tests failed and why (run 23c lost that to SIGTERM)
  timeout -s INT -k 30 "${GPU_TESTS_S:-290}" python3 -m pytest -m gpu -v -p no:cacheprovider --durations=20 ${GPU_TESTS:-tests/gpu} \
    > "$OUT/pytest-gpu.log" 2>&1
  echo "pytest -m gpu: rc=$? at $((SECONDS - started)) s"; tail -3 "$OUT/pytest-gpu.log"
fi
if step torchvision; then
  timeout 60 python3 -m pytest -v -p no:cacheprovider \
    tests/integration/test_model_formats.py::test_torchvision_resnet18_equals_torchvision_eager_or_names_the_fix \
    > "$OUT/pytest-torchvision.log" 2>&1
  echo "torchvision test: rc=$? at $((SECONDS - started)) s"
fi
if step engine; then
  timeout 150 python3 bench/engine_bench.py --iterations "${ENGINE_ITERATIONS:-1000}" --out "$OUT/engine.json" \
    > "$OUT/engine.log" 2>&1
  echo "engine bench: rc=$? at $((SECONDS - started)) s"; tail -12 "$OUT/engine.log" | cut -c1-400
fi
if step e2e; then
  timeout "${E2E_S:-240}" python3 bench/resnet50_e2e.py --seconds "${E2E_SECONDS:-4}" --out "$OUT/resnet50-e2e.json" ${E2E_ARGS:-} \
    > "$OUT/resnet50-e2e.log" 2>&1
  echo "resnet50 e2e: rc=$? at $((SECONDS - started)) s"; tail -2 "$OUT/resnet50-e2e.log" | cut -c1-600
fi
if step stalls; then
  timeout 170 python3 bench/stall_ab.py --device cuda --seconds "${STALL_SECONDS:-12}" --concurrency 64 \
    --processes 4 --server-cores 0-3 --loadgen-cores 8-15 --out "$OUT/stalls.json" > "$OUT/stalls.log" 2>&1
  echo "stall A/B: rc=$? at $((SECONDS - started)) s"; cat "$OUT/stalls.log" | cut -c1-300
fi
if step protocols; then
  timeout "${BENCH_S:-200}" python3 bench/protocol_bench.py --concurrencies "${CONCURRENCIES:-1,16,64}" \
    --out "$OUT/protocols.json" > "$OUT/protocols.log" 2>&1
  echo "protocol bench: rc=$? at $((SECONDS - started)) s"
fi
if step multi-gpu; then  # two GPUs: one model on both, in one service (not among the default steps)
  timeout "${MULTI_GPU_TESTS_S:-240}" python3 -m pytest -m gpu -v -p no:cacheprovider --durations=10 \
    tests/gpu/test_multi_gpu.py > "$OUT/pytest-multi-gpu.log" 2>&1
  echo "pytest multi-gpu: rc=$? at $((SECONDS - started)) s"; tail -3 "$OUT/pytest-multi-gpu.log"
  timeout "${MULTI_GPU_BENCH_S:-300}" python3 bench/multi_gpu_bench.py --compile-cache-dir "$CGSERVE_COMPILE_CACHE_DIR" \
    --seconds "${MULTI_GPU_SECONDS:-15}" --out "$OUT/multi-gpu" > "$OUT/multi-gpu.log" 2>&1
  echo "multi-gpu bench: rc=$? at $((SECONDS - started)) s"; tail -6 "$OUT/multi-gpu.log" | cut -c1-400
fi
if step jpeg; then  # Pillow vs the batched nvJPEG decoder, decode-only and over HTTP (resnet50)
  timeout "${JPEG_S:-280}" python3 bench/jpeg_decode_bench.py --compile "${JPEG_COMPILE:-inductor}" --out "$OUT/jpeg" \
    > "$OUT/jpeg.log" 2>&1
  echo "jpeg bench: rc=$? at $((SECONDS - started)) s"; grep -E '^(decode|http)' "$OUT/jpeg.log" | cut -c1-400
fi
if step whole-machine; then  # issue 12 (1, 2): N workers against the N-worker no-op; hey beside the generator
  timeout "${WHOLE_MACHINE_S:-420}" python3 bench/whole_machine.py --out "$OUT/whole-machine" --hey .gpu/bin/hey \
    ${WHOLE_MACHINE_WORKERS:+--workers "$WHOLE_MACHINE_WORKERS"} ${WHOLE_MACHINE_ARGS:-} > "$OUT/whole-machine.log" 2>&1
  echo "whole machine: rc=$? at $((SECONDS - started)) s"; tail -20 "$OUT/whole-machine.log" | cut -c1-300
fi
if step side-by-side; then  # issue 12 (4): every server, resnet50 (SBS_SERVERS narrows it)
  timeout -s TERM "${SBS_S:-480}" python3 bench/side_by_side.py --out "$OUT/sbs" --model resnet50 \
    --compile-cache-dir "$CGSERVE_COMPILE_CACHE_DIR" ${SBS_SERVERS:+--servers "$SBS_SERVERS"} > "$OUT/sbs.log" 2>&1
  echo "side by side: rc=$? at $((SECONDS - started)) s"; cat "$OUT/sbs/"*.md 2>/dev/null | head -30
fi
if step tune; then  # issue 12 (7): the tuner's settings against the defaults at the same p99 bound
  timeout "${TUNE_S:-420}" python3 bench/tune_bench.py --out "$OUT/tune" --slo-p99-ms "${TUNE_SLO_MS:-25}" \
    --model resnet50 --model-repository models/examples/repository --compile none --runs 50 --bisect-steps 2 \
    > "$OUT/tune-bench.log" 2>&1
  echo "tune bench: rc=$? at $((SECONDS - started)) s"; tail -8 "$OUT/tune-bench.log" | cut -c1-300
fi
if step one-image; then  # issue 26: ResNet-50, one image a request, every protocol, against the engine's peak
  timeout "${ONE_IMAGE_S:-480}" python3 bench/one_image.py --out "$OUT/one-image" --budget-s "${ONE_IMAGE_BUDGET_S:-400}" \
    --designs "${ONE_IMAGE_DESIGNS:-engine-process}" ${ONE_IMAGE_ARGS:-} > "$OUT/one-image.log" 2>&1
  echo "one image: rc=$? at $((SECONDS - started)) s"; grep -vE '^\s' "$OUT/one-image.log" | tail -25 | cut -c1-300
fi
if step profile; then  # where a request's CPU goes: py-spy on one server under hey, one profile per entry
  # PROFILES: "tag=flags;tag=flags", flags for bench/profile_server.py (server flags pass through)
  IFS=';' read -ra entries <<< "${PROFILES:-noop-json=--target noop;ours-json=--compile none}"
  for entry in "${entries[@]}"; do
    timeout 120 python3 bench/profile_server.py "$OUT/profile" --py-spy /tmp/site/bin/py-spy --tag "${entry%%=*}" \
      ${entry#*=} >> "$OUT/profile.log" 2>&1
    echo "profile ${entry%%=*}: rc=$? at $((SECONDS - started)) s"
  done
  cat "$OUT/profile.log" | cut -c1-300
fi
cp "$OUT/env.txt" "$RESULTS/env.txt"
tar czf "$RESULTS/run.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
