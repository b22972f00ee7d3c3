#!/bin/bash
# p11: the front door (CPU), a forward stuck for ever with a door request in it, then SIGTERM: how long the stop takes,
# what the door's client gets.
P=/tmp/rev62-probes; port=18715; door=18716; name=door2
rm -f /tmp/rev62-stuck.flag
pid=$($P/serve.sh $name $port $P/models/stuck CGSERVE_FRONT_DOOR_PORT=$door)
$P/wait_ready.sh $port 180 || { tail -20 /tmp/rev62-$name/log; kill $pid; exit 1; }
echo forever > /tmp/rev62-stuck.flag
curl -s -m 120 -w " [door: %{http_code} after %{time_total}s]\n" -X POST 127.0.0.1:$door/predict -H 'content-type: application/octet-stream' --data-binary @$P/img16.u8 | cut -c1-200 &
sleep 2; ts=$(date +%s.%N); kill -TERM $pid
for i in $(seq 240); do [ -s /tmp/rev62-$name/rc ] && break; sleep 0.5; done
echo "rc=$(cat /tmp/rev62-$name/rc 2>/dev/null || echo still-running) after $(echo "$(date +%s.%N) - $ts" | bc) s"
wait; rm -f /tmp/rev62-stuck.flag
[ -s /tmp/rev62-$name/rc ] || kill -KILL $(cat /tmp/rev62-$name/pid)
