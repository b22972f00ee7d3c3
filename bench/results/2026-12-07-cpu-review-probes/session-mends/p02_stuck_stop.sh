#!/bin/bash
# p02: a forward stuck forever in model code, then a stop signal. usage: p02_stuck_stop.sh NAME PORT SIGNAL [env...]
name=$1; port=$2; sig=$3; shift 3
P=/tmp/rev62-probes
rm -f /tmp/rev62-stuck.flag
pid=$($P/serve.sh $name $port $P/models/stuck "$@")
$P/wait_ready.sh $port 120 || { tail -30 /tmp/rev62-$name/log; kill $pid; exit 1; }
echo forever > /tmp/rev62-stuck.flag
head -c 16 /dev/zero > /tmp/rev62-probes/img16.u8
t0=$(date +%s.%N)
curl -s -m 30 -o /tmp/rev62-$name/resp -w 'predict status %{http_code} after %{time_total}s\n' -X POST 127.0.0.1:$port/v1/models/stuck/predict -H 'content-type: application/octet-stream' --data-binary @/tmp/rev62-probes/img16.u8 &
sleep 2
echo "sending SIG$sig to $pid"
sid=$(ps -o sid= $pid | tr -d " ")
ts=$(date +%s.%N)
kill -$sig $pid
for i in $(seq 1 120); do kill -0 $pid 2>/dev/null || break; sleep 0.5; done
if kill -0 $pid 2>/dev/null; then echo "STILL RUNNING after 60 s"; ps -o pid,stat,cmd -s $sid; else sleep 0.3; echo "exited rc=$(cat /tmp/rev62-$name/rc) after $(echo "$(date +%s.%N) - $ts" | bc) s"; fi
wait
cat /tmp/rev62-$name/resp; echo
sleep 0.5; echo "leftover processes of session $sid:"; ps -o pid,stat,cmd -s $sid | tail -n +2; pk=$(ps -o pid= -s $sid); [ -n "$pk" ] && kill -KILL $pk
rm -f /tmp/rev62-stuck.flag
