#!/usr/bin/env bash
# Ten loads of a model whose forward raises (a 200 MB parameter), through POST /v2/repository/models/boom/load, and
# each server process's RSS before and after; MODE=engine: 2 workers and the engine process. From the tree at $ROOT.
set -u
ROOT=${ROOT:-$PWD}; PORT=${PORT:-8771}; HERE=$(cd "$(dirname "$0")" && pwd)
repo=$(mktemp -d); cp -r "$ROOT/models/repository/fashion-cnn" "$repo/"
extra=(); [ "${MODE:-one}" = engine ] && extra=(--workers 2 --engine-process)
cd "$ROOT"
.venv/bin/python -m app.cli serve --port "$PORT" --grpc-port 0 --model-repository "$repo" --model-control explicit \
  "${extra[@]}" > /tmp/failed-loads-server.log 2>&1 &
main=$!
for _ in $(seq 120); do curl -sf "localhost:$PORT/readyz" > /dev/null && break; sleep 0.5; done
mkdir "$repo/boom" && cp "$HERE/boom_model.py" "$repo/boom/model.py"
printf 'format = "python"\nfactory = "model:build"\ninput_shape = [1, 28, 28]\nlabels = ["a", "b"]\n' > "$repo/boom/model.toml"
rss() { for p in $main $(pgrep -P $main); do echo -n "$p:$(( $(awk '/VmRSS/{print $2}' /proc/$p/status) / 1024 ))MB "; done; echo; }
echo "mode ${MODE:-one}, before: $(rss)"
for _ in $(seq 10); do curl -s -o /dev/null -w "%{http_code} " -X POST "localhost:$PORT/v2/repository/models/boom/load"; done
echo; echo "after 10 failed loads: $(rss)"
kill -TERM $main; wait $main; rm -rf "$repo"
