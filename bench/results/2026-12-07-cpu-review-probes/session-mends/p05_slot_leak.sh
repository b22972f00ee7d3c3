#!/bin/bash
# p05: a BaseException other than SystemExit/KeyboardInterrupt (GeneratorExit, a cancelled inner future's
# CancelledError) escaping the model's forward: each such batch's slot is never reused; after CGSERVE_IN_FLIGHT (2)
# of them the model answers nothing but 504, while /readyz stays 200.
name=${1:-leak}; port=${2:-18707}; mode=${3:-gen}; shift 3
P=/tmp/rev62-probes
echo ok > /tmp/rev62-moody.mode
pid=$($P/serve.sh $name $port $P/models/moody CGSERVE_REQUEST_TIMEOUT_S=3 "$@")
$P/wait_ready.sh $port 120 || exit 1
head -c 16 /dev/urandom > $P/img16r.u8
req() { printf "%-10s " "$1"; curl -s -m 20 -o /dev/null -w '%{http_code} %{time_total}s\n' -X POST 127.0.0.1:$port/v1/models/moody/predict -H 'content-type: application/octet-stream' --data-binary @$P/img16r.u8; }
req ok
for i in 1 2; do echo $mode > /tmp/rev62-moody.mode; req "$mode-$i"; echo ok > /tmp/rev62-moody.mode; req "ok-after-$i"; done
echo "readyz: $(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:$port/readyz)  v2 ready: $(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:$port/v2/models/moody/ready)"
curl -s 127.0.0.1:$port/metrics | grep -E '^cgserve_(in_flight|device_in_flight|batches_in_flight)' 
kill -TERM $pid; for i in $(seq 60); do [ -s /tmp/rev62-$name/rc ] && break; sleep 0.5; done; echo "rc=$(cat /tmp/rev62-$name/rc)"
grep -E "ERROR|CRITICAL|WARNING|Error|Exit|Cancel" /tmp/rev62-$name/log | cut -c1-200 | head -20
