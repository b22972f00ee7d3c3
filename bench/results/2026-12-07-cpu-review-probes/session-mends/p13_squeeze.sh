#!/bin/bash
# p13: a model whose forward ends in .squeeze() (postprocess sigmoid), before (11371bb, /tmp/rev62-old) and after (HEAD):
# one image (bucket 1) and two.
# needs the old tree: git -C /tmp/rev62 worktree add /tmp/rev62-old 11371bb && ln -s /work/main/.venv /tmp/rev62-old/.venv
P=/tmp/rev62-probes
for tree in /tmp/rev62-old /tmp/rev62; do
  name=sq-$(basename $tree); port=$([ $tree = /tmp/rev62 ] && echo 18718 || echo 18717)
  dir=/tmp/rev62-$name; rm -rf $dir; mkdir -p $dir/repo; cp -r $P/models/squeezy $dir/repo/
  (cd $tree && CGSERVE_DEVICE=cpu CGSERVE_HOST=127.0.0.1 CGSERVE_PORT=$port CGSERVE_GRPC_PORT=0 CGSERVE_MODEL_REPOSITORY=$dir/repo \
     exec .venv/bin/python -m app.cli serve > $dir/log 2>&1 < /dev/null) & echo $! > $dir/pid
  $P/wait_ready.sh $port 60 > /dev/null || { tail -5 $dir/log; }
  for n in 1 2; do
    head -c $((16*n)) /dev/urandom > $P/sq$n.u8
    printf "%-12s %d image(s): " $(basename $tree) $n
    curl -s -w ' [%{http_code}]\n' -X POST 127.0.0.1:$port/v1/models/squeezy/predict -H 'content-type: application/octet-stream' --data-binary @$P/sq$n.u8 | cut -c1-200
  done
  kill -TERM $(cat $dir/pid); sleep 7
done
