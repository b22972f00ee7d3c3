#!/usr/bin/env bash
# One call of the device tool on the H200: the GPU tests, then the protocol benchmark; every output
# under $OUT. Started after the wheel install line of bench/results/README.md, from the repo root.
set -u
export CGSERVE_COMPILE_CACHE_DIR=/tmp/inductor-cache  # shared: what the tests compile, the benchmark reuses
{
  nvidia-smi -L
  python3 -c "import torch, torchvision, triton, grpc, google.protobuf as pb; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'triton', triton.__version__, 'grpcio', grpc.__version__, 'protobuf', pb.__version__)"
  git log -1 --format='commit %H %s' 2>/dev/null || true
} > "$OUT/env.txt" 2>&1
# tests/gpu only: the CPU suite's protocol tests need tritonclient and grpcio-tools, which that machine lacks.
timeout "${GPU_TESTS_S:-290}" python3 -m pytest -m gpu -v -p no:cacheprovider --durations=20 tests/gpu > "$OUT/pytest-gpu.log" 2>&1
echo "pytest -m gpu: rc=$?"
timeout 60 python3 -m pytest -v -p no:cacheprovider \
  tests/integration/test_model_formats.py::test_torchvision_resnet18_equals_torchvision_eager_or_names_the_fix \
  > "$OUT/pytest-torchvision.log" 2>&1
echo "torchvision test: rc=$?"
timeout "${BENCH_S:-200}" python3 bench/protocol_bench.py --concurrencies "${CONCURRENCIES:-1,16,64}" \
  --out "$OUT/protocols.json" > "$OUT/protocols.log" 2>&1
echo "protocol bench: rc=$?"
tail -5 "$OUT/pytest-gpu.log"
