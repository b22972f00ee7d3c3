#!/bin/bash
# wait_ready.sh PORT [timeout]
for i in $(seq 1 ${2:-120}); do
  code=$(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:$1/readyz)
  [ "$code" = 200 ] && { echo ready after ${i}s; exit 0; }
  sleep 1
done
echo NOT READY; exit 1
