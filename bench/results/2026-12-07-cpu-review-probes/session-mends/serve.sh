#!/bin/bash
# usage: serve.sh NAME PORT REPO_SRC [extra env assignments...]  -> starts server in background, prints its pid
# the server's exit status lands in /tmp/rev62-NAME/rc
name=$1; port=$2; src=$3; shift 3
dir=/tmp/rev62-$name
rm -rf $dir; mkdir -p $dir/repo
cp -r $src $dir/repo/
cd /tmp/rev62
export CGSERVE_DEVICE=cpu CGSERVE_HOST=127.0.0.1 CGSERVE_PORT=$port CGSERVE_GRPC_PORT=0 CGSERVE_MODEL_REPOSITORY=$dir/repo
for kv in "$@"; do export "$kv"; done
setsid bash -c ".venv/bin/python -m app.cli serve > $dir/log 2>&1 & echo \$! > $dir/pid; wait \$!; echo \$? > $dir/rc" < /dev/null > /dev/null 2>&1 &
for i in $(seq 50); do [ -s $dir/pid ] && break; sleep 0.1; done
cat $dir/pid
