#!/usr/bin/env bash
# The server benchmark (loadtest/bench_server.py) on the GPU machine, which has python3 with
# torch but no console scripts, no FastAPI and no network: installs the carried wheels
# (.gpu/wheels) into $SITE where FastAPI is missing, then runs from the repository root.
#
#   bench/run_server_bench.sh                        # all four servers → bench/results/<date>-server.{json,md}
#   bench/run_server_bench.sh --servers noop,naive   # any loadtest.bench_server flag passes through
#
# Environment: PYTHON (python3), SITE (/tmp/site), WHEELS (.gpu/wheels), HEY (.gpu/bin/hey).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
if ! "$PYTHON" -c 'import fastapi, uvicorn, pydantic_settings, orjson, multipart' 2>/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "${WHEELS:-.gpu/wheels}"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "$PYTHON" -m loadtest.bench_server --out-dir bench/results --hey "${HEY:-.gpu/bin/hey}" "$@"
