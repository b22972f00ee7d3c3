#!/bin/bash
# p06: ONNX models: default layout on a file of 3 outputs, only some outputs declared, a scalar-per-image output, another order.
port=18709; P=/tmp/rev62-probes
pid=$($P/serve.sh onnx $port "$P/repos/onnx/*" )
$P/wait_ready.sh $port 60 || { tail -20 /tmp/rev62-onnx/log; kill $pid; exit 1; }
head -c 48 /dev/urandom > $P/img48.u8
for m in onnx-default onnx-some onnx-scalar onnx-order; do
  printf "%-13s " $m; curl -s -w ' [%{http_code}]\n' -X POST 127.0.0.1:$port/v1/models/$m/predict -H 'content-type: application/octet-stream' --data-binary @$P/img48.u8 | cut -c1-300
done
kill -TERM $pid; for i in $(seq 60); do [ -s /tmp/rev62-onnx/rc ] && break; sleep 0.5; done; echo "rc=$(cat /tmp/rev62-onnx/rc)"
