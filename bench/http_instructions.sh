#!/bin/bash
# Instructions a request of a real server over real HTTP, counted by valgrind (callgrind), with its
# protocol, sockets and event loop included (bench/instructions_per_request.py counts the ASGI app
# alone, in-process). The server runs under callgrind with instrumentation off; once it is ready
# and has answered a warm-up, instrumentation is switched on for exactly N requests from hey at
# concurrency C, and off again. Prints the total; divide by N.
#
#   bash bench/http_instructions.sh NAME PORT FORM C N SERVER-COMMAND…
#   export PYTHONPATH=. PYTHON=.venv/bin/python
#   bash bench/http_instructions.sh inline 8102 raw 16 2000 $PYTHON bench/proxy_server.py --port 8102
#   CGSERVE_INLINE_PREDICT=false bash bench/http_instructions.sh asgi 8103 raw 16 2000 $PYTHON bench/proxy_server.py --port 8103
#   bash bench/http_instructions.sh noop 8101 raw 16 2000 $PYTHON -m loadtest.servers.noop --port 8101 --lean
# FORM: json or raw (POST /predict), v2-json or v2-binary (the Open Inference Protocol's infer of
# fashion-cnn: UINT8 data as a JSON list, or the binary tensor extension), upload (a 28×28 JPEG as a
# multipart field) or jpeg (the same JPEG as the whole body, Content-Type image/jpeg).
# Needs valgrind and hey (HEY=…, default .gpu/bin/hey); bodies: one image (loadtest/payloads.py),
# written by PYTHON (default python3; the project's venv where python3 lacks its packages).
# IMAGE_SHAPE=C,H,W: the raw and v2-binary forms' body is one uint8 image of that shape instead
# (random pixels), for a server whose default model takes it (bench/grpc_cost.py's stand-in
# repository, say); V2_MODEL names the model the v2 forms call (default fashion-cnn).
set -u
name=$1; port=$2; form=$3; conc=$4; n=$5; shift 5
hey=${HEY:-.gpu/bin/hey}
work=$(mktemp -d)
"${PYTHON:-python3}" -c "
import orjson
from loadtest.payloads import load_images, encode_json, encode_raw
images = load_images(1)
raw = encode_raw(images[:1], 'uint8')
open('$work/body.json', 'wb').write(encode_json(images[:1]))
open('$work/body.raw', 'wb').write(raw)
tensor = {'name': 'input', 'datatype': 'UINT8', 'shape': [1, 1, 28, 28]}
open('$work/body.v2-json', 'wb').write(orjson.dumps({'inputs': [{**tensor, 'data': list(raw)}]}))
header = orjson.dumps({'inputs': [{**tensor, 'parameters': {'binary_data_size': len(raw)}}]})
open('$work/body.v2-binary', 'wb').write(header + raw)
open('$work/header-length', 'w').write(str(len(header)))
# upload: one 28×28 JPEG of that image as a multipart/form-data field `file` (the browser's and curl -F's
# way), what the framework costs around an upload's decode (a photo's decode would dwarf it)
import io
from PIL import Image
jpeg = io.BytesIO()
Image.fromarray(images[0].reshape(28, 28).astype('uint8')).save(jpeg, 'JPEG', quality=90)
part = b'--cgserve\r\nContent-Disposition: form-data; name="file"; filename="x.jpg"\r\nContent-Type: image/jpeg\r\n\r\n'
open('$work/body.upload', 'wb').write(part + jpeg.getvalue() + b'\r\n--cgserve--\r\n')
open('$work/body.jpeg', 'wb').write(jpeg.getvalue())
shape = '${IMAGE_SHAPE:-}'
if shape:
    import numpy as np
    dims = [1, *map(int, shape.split(','))]
    raw = np.random.default_rng(0).integers(0, 256, dims, dtype=np.uint8).tobytes()
    open('$work/body.raw', 'wb').write(raw)
    tensor = {'name': 'input', 'datatype': 'UINT8', 'shape': dims, 'parameters': {'binary_data_size': len(raw)}}
    header = orjson.dumps({'inputs': [tensor]})
    open('$work/body.v2-binary', 'wb').write(header + raw)
    open('$work/header-length', 'w').write(str(len(header)))" || exit 1
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/cg.out" -q "$@" > "$work/server.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/readyz" > /dev/null && break; sleep 0.5; done
sleep 20  # whatever the server starts in the background after it is ready (the JPEG decoder's imports)
type=application/json; path=/predict; extra=()
case $form in
  raw) type=application/octet-stream ;;
  upload) type='multipart/form-data; boundary=cgserve' ;;
  jpeg) type=image/jpeg ;;
  v2-json) path=/v2/models/${V2_MODEL:-fashion-cnn}/infer ;;
  v2-binary) path=/v2/models/${V2_MODEL:-fashion-cnn}/infer; type=application/octet-stream
    extra=(-H "Inference-Header-Content-Length: $(cat "$work/header-length")") ;;
esac
send() { "$hey" -n "$1" -c "$conc" -m POST -T "$type" "${extra[@]}" -D "$work/body.$form" "http://127.0.0.1:$port$path"; }
send 1000 > /dev/null
callgrind_control -i on "$pid" > /dev/null 2>&1
send "$n" | grep -E "\[200\]"
callgrind_control -i off "$pid" > /dev/null 2>&1
callgrind_control -d "$pid" > /dev/null 2>&1
kill "$pid"; wait "$pid" 2> /dev/null
echo "$name $form c$conc n=$n $(grep -h '^totals' "$work"/cg.out.1)"
rm -rf "$work"
