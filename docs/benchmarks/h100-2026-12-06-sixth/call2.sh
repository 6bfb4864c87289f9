#!/usr/bin/env bash
# batch-1 time against input height (ours, fusion on); rect vs square across batches 1-16 (ours, default settings;
# PyTorch eager fp16 both layouts; torch.compile at batch 1) in one call.
set -u
G=.dev/gpu-run
S=$OUT/summary.md
W=$OUT/w; mkdir -p $W/site
BIN=$W/ye; xz -dc $G/dist/yolo-edge-cuda-sm90-cudnn.xz > $BIN; chmod +x $BIN
python3 -m pip install -q --no-index --no-deps --target $W/site $G/whl/*.whl > /dev/null 2>&1
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
echo "## ours, batch 1, f16, graphs on, cudnn fusion on: time against input height" >> $S
for h in 192 256 320 384 448 512 576 640; do
  timeout 90 $BIN bench --device cuda:0 --variants t,c --dtype f16 --batches 1 --mode model --warmup 5 --iters 300 \
    --input 640x$h --cudnn-fusion on --out $W/h$h > $W/h$h.md 2> $W/h$h.log; echo "640x$h rc=$?" >> $S
  grep -E "^\| yolov9" $W/h$h.md >> $S
done
echo "## ours, f16, default settings (graphs on, fusion off): batches 1-16, 640x384 and 640x640" >> $S
for inp in 640x384 640x640; do
  timeout 120 $BIN bench --device cuda:0 --variants t,c --dtype f16 --batches 1,2,4,8,16 --mode model --warmup 5 --iters 300 \
    --input $inp --out $W/b-$inp > $W/b-$inp.md 2> $W/b-$inp.log; echo "$inp rc=$?" >> $S
  grep -E "^\| yolov9" $W/b-$inp.md >> $S
done
echo "## PyTorch eager fp16 (contiguous, channels-last): batches 1-16, 640x384 and 640x640" >> $S
export PYTHONPATH=$W/site YOLO_CONFIG_DIR=/tmp/ultra-cfg
VARIANTS=t,c SHAPES=640x640,640x384 BATCHES=1,2,4,8,16 MODES=fp16,fp16cl ITERS=300 OUT=$W \
  timeout 150 python3 scripts/torch_rect_square.py > $W/torch.jsonl 2> $W/torch.log; echo "torch rc=$?" >> $S
cat $W/torch.jsonl >> $S; tail -3 $W/torch.log >> $S
echo "## torch.compile reduce-overhead, batch 1" >> $S
VARIANTS=t,c SHAPES=640x640,640x384 BATCHES=1 MODES=compile ITERS=300 OUT=$W \
  timeout 200 python3 scripts/torch_rect_square.py > $W/compile.jsonl 2> $W/compile.log; echo "compile rc=$?" >> $S
cat $W/compile.jsonl >> $S; tail -3 $W/compile.log >> $S
rm -f $BIN; rm -rf $W/site
tar czf $OUT/raw.tgz -C $W .
grep -vE "^\s*$" $S | cut -c1-200 | tail -70
