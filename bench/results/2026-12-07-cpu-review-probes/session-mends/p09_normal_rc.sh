#!/bin/bash
# p09: exit status of a normal SIGTERM stop (nothing stuck), for comparison with p02's.
P=/tmp/rev62-probes; port=18712
for variant in "single" "CGSERVE_WORKERS=2" "CGSERVE_ENGINE_PROCESS=true"; do
  extra=(); [ "$variant" != single ] && extra=("$variant")
  pid=$($P/serve.sh nrc $port $P/models/stuck "${extra[@]}")
  $P/wait_ready.sh $port 60 >/dev/null
  curl -s -o /dev/null -X POST 127.0.0.1:$port/v1/models/stuck/predict -H 'content-type: application/octet-stream' --data-binary @$P/img16.u8
  kill -TERM $pid; for i in $(seq 80); do [ -s /tmp/rev62-nrc/rc ] && break; sleep 0.5; done
  echo "$variant: SIGTERM rc=$(cat /tmp/rev62-nrc/rc)"
done
