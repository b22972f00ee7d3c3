#!/bin/bash
# p10: the front door (CPU) with a forward blocked past the request and batch timeouts: does the door's client get its
# 504 at the deadline, as the HTTP port's does?
P=/tmp/rev62-probes; port=18713; door=18714; name=door
rm -f /tmp/rev62-stuck.flag
pid=$($P/serve.sh $name $port $P/models/stuck CGSERVE_FRONT_DOOR_PORT=$door)
$P/wait_ready.sh $port 180 || { tail -20 /tmp/rev62-$name/log; kill $pid; exit 1; }
req() { curl -s -m 60 -w " [$1: %{http_code} after %{time_total}s]\n" -X POST 127.0.0.1:$2/predict -H 'content-type: application/octet-stream' --data-binary @$P/img16.u8 | cut -c1-200; }
req door-before $door
echo block > /tmp/rev62-stuck.flag
req door-during $door &
sleep 0.5
req port-during $port &
sleep 25; rm -f /tmp/rev62-stuck.flag; echo "released at 25 s"
wait
kill -TERM $pid; for i in $(seq 80); do [ -s /tmp/rev62-$name/rc ] && break; sleep 0.5; done; echo "rc=$(cat /tmp/rev62-$name/rc)"
