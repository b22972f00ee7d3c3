#!/bin/bash
# p07: engine=compile on the CPU: start-up time, the description and cgserve_compile_fallback, with a working C++
# compiler and with a broken one (CXX=/bin/false).
name=$1; port=$2; shift 2
P=/tmp/rev62-probes
t0=$(date +%s)
pid=$($P/serve.sh $name $port /tmp/rev62/models/repository/fashion-cnn CGSERVE_ENGINE=compile "$@")
$P/wait_ready.sh $port 600 || { tail -20 /tmp/rev62-$name/log; }
echo "ready $(( $(date +%s) - t0 )) s after launch"
curl -s 127.0.0.1:$port/v1/models/fashion-cnn | python3 -c 'import json,sys; d=json.load(sys.stdin); print({k: d.get(k) for k in ("engine","compile","startup_seconds","failure")}); print({k:v for k,v in d.items() if "compile" in k})'
curl -s 127.0.0.1:$port/metrics | grep -E 'compile_fallback|cgserve_engine_info' 
curl -s -o /dev/null -w 'predict %{http_code} %{time_total}s\n' -X POST 127.0.0.1:$port/predict -H 'content-type: application/octet-stream' --data-binary @/tmp/rev62/models/examples/ankle-boot.u8
kill -TERM $pid; for i in $(seq 60); do [ -s /tmp/rev62-$name/rc ] && break; sleep 0.5; done; echo "rc=$(cat /tmp/rev62-$name/rc)"
grep -E "WARNING|ERROR|CRITICAL" /tmp/rev62-$name/log | cut -c1-400 | head
