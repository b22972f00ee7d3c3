#!/bin/bash
# p04: the model's forward raises SystemExit / KeyboardInterrupt / GeneratorExit / returns a bad shape, then ok again.
name=${1:-moody}; port=${2:-18706}; shift 2
P=/tmp/rev62-probes
echo ok > /tmp/rev62-moody.mode
pid=$($P/serve.sh $name $port $P/models/moody "$@")
$P/wait_ready.sh $port 120 || exit 1
head -c 32 /dev/urandom > $P/img32.u8   # two images
for mode in ok exit ok kbd ok gen ok squeeze rows ok; do
  echo $mode > /tmp/rev62-moody.mode
  printf "%-8s " $mode; curl -s -m 20 -w ' [%{http_code}]\n' -X POST 127.0.0.1:$port/v1/models/moody/predict -H 'content-type: application/octet-stream' --data-binary @$P/img32.u8 | cut -c1-230
done
echo "alive: $(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:$port/healthz)"
kill -TERM $pid; for i in $(seq 40); do [ -s /tmp/rev62-$name/rc ] && break; sleep 0.5; done; echo "rc=$(cat /tmp/rev62-$name/rc)"
echo ok > /tmp/rev62-moody.mode
