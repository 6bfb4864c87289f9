#!/usr/bin/env bash
# batch-1 end to end: hardware decoder (batched API) against the decoupled GPU-Huffman decoder, alternating, 3 runs each.
set -u
G=.dev/gpu-run
W=/tmp/w4; mkdir -p $W
xz -dc $G/dist/yolo-edge-single.xz > $W/ye; chmod +x $W/ye
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
for r in 1 2 3; do
  for m in hw gpu; do
    YE_X_SINGLE=$m RUST_LOG=yolo_edge=debug timeout 60 $W/ye bench --device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --batches 1 --mode model,e2e --input 640x384 \
      --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300 --out $W/e2e-$m-$r > $W/e2e-$m-$r.md 2> $W/e2e-$m-$r.log
    echo "### $m run $r (rc=$?)" >> $S; grep -E "^\| yolov9t" $W/e2e-$m-$r.md >> $S; grep -E "nvJPEG batch|e2e batch 1, timed|GPU Huffman" $W/e2e-$m-$r.log | sort | uniq -c | head -5 >> $S
  done
done
for m in hw gpu; do
  YE_X_SINGLE=$m RUST_LOG=yolo_edge=debug timeout 120 $W/ye detect --model $G/dev/yolov9t-ball.pt --device cuda:0 --dtype f16 --jpeg-decoder nvjpeg --conf 0.01 --batch 1 \
    --json $W/jd-$m.jsonl $G/dev/horses.jpg $G/dev/volleyball-court.jpg $G/dev/volleyball-court.jpg > $W/jd-$m.log 2>&1
  echo "detect $m rc=$? lines=$(wc -l < $W/jd-$m.jsonl) gpuhuff-msgs=$(grep -c 'GPU Huffman' $W/jd-$m.log)" >> $S
done
python3 - $W/jd-hw.jsonl $W/jd-gpu.jsonl <<'PY' >> $S 2>&1
import json, sys
a=[json.loads(l) for l in open(sys.argv[1])]; b=[json.loads(l) for l in open(sys.argv[2])]
for x,y in zip(a,b):
    dx=x.get('detections',[]); dy=y.get('detections',[])
    print(x.get('path', x.get('source','?'))[-24:], len(dx), len(dy))
    n=0
    for p,q in zip(sorted(dx,key=lambda d:-d['confidence']), sorted(dy,key=lambda d:-d['confidence'])):
        dc=abs(p['confidence']-q['confidence']); n+=1
        if n<=4 or dc>1e-3: print('  ', p.get('class'), q.get('class'), round(p['confidence'],4), round(q['confidence'],4))
PY
YE_X_SINGLE=gpu timeout 120 $W/ye jpeg-selfcheck --device cuda:0 > $W/self.md 2> $W/self.log; echo "selfcheck gpu rc=$?" >> $S; tail -4 $W/self.md >> $S
tar czf $OUT/raw.tgz -C $W --exclude ye .
grep -vE "^\s*$" $S | cut -c1-300
