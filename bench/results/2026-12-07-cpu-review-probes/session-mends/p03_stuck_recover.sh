#!/bin/bash
# p03: a CPU forward blocked for 25 s (past request and batch timeouts), then released: does the model serve again?
name=${1:-rec}; port=${2:-18705}; shift 2
P=/tmp/rev62-probes
rm -f /tmp/rev62-stuck.flag
pid=$($P/serve.sh $name $port $P/models/stuck "$@")
$P/wait_ready.sh $port 120 || exit 1
req() { curl -s -m 40 -o /dev/null -w "$1: %{http_code} %{time_total}s\n" -X POST 127.0.0.1:$port/v1/models/stuck/predict -H 'content-type: application/octet-stream' --data-binary @$P/img16.u8; }
head -c 16 /dev/zero > $P/img16.u8
req before
echo block > /tmp/rev62-stuck.flag
for i in 1 2 3 4; do req "during-$i" & sleep 0.3; done
sleep 12
echo "readyz during: $(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:$port/readyz)  model ready: $(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:$port/v2/models/stuck/ready)"
req "during-late"   # queued behind, no slot
sleep 3
rm -f /tmp/rev62-stuck.flag; echo "released at $(date +%T)"
wait
for i in 1 2 3; do req "after-$i"; done
curl -s 127.0.0.1:$port/metrics | grep -E '^cgserve_(batch_compute_seconds_(sum|count)|in_flight|queue_depth|batches_total)' | head -20
kill -TERM $pid; sleep 8; echo "rc=$(cat /tmp/rev62-$name/rc)"
