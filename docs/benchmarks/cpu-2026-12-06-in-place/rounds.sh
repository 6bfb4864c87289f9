#!/bin/bash
# N interleaved rounds, each main's release binary ("base" in rounds.log) then this branch's
# ("indirect"), bench output under /tmp/bench/OUT-{base,indirect}-ROUND/ (OUT: final for the
# loaded/ rounds, quiet for quiet/).
# Usage: MAIN=/path/to/main-worktree BRANCH=/path/to/branch-worktree rounds.sh 6
N=$1
for r in $(seq 1 $N); do
  for b in base indirect; do
    echo "== round $r $b $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    /usr/bin/time -f "user %U s elapsed %e s" $([ $b = base ] && echo $MAIN || echo $BRANCH)/target/release/yolo-edge bench --device cpu --variants t,s --dtype f32 --batches 1,4 --mode model --warmup 2 --iters 10 --out /tmp/bench/OUT-$b-$r 2>&1 | grep -E "model batch|user"
  done
done
