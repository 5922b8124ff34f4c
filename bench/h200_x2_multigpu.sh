#!/usr/bin/env bash
# One call on nvidia-h200-x2 (carry .whl): the same small conversion on 1 GPU and under torchrun on 2 GPUs;
# stage-2 loss curves and throughput compared by bench/multigpu/compare.py.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
python3 bench/multigpu/make_teacher.py /tmp/teacher 2>&1 | tail -1
plan="--preset smoke --device cuda --select uniform --until-stage distill
 --set align.tokens=131072 --set align.seq_len=512 --set align.batch_size=32 --set align.checkpoint_every=100
 --set distill.tokens=1310720 --set distill.seq_len=512 --set distill.batch_size=32 --set distill.checkpoint_every=100
 --set distill.warmup_steps=5 --set scaling.length=1024 --set scaling.num_docs=1"
start=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 130 python3 -m hyla.cli convert --teacher /tmp/teacher --out /tmp/one $plan \
  > $OUT/convert-1gpu.log 2>&1; echo "1-GPU exit $? after $(( $(date +%s) - start )) s"
start=$(date +%s)
timeout 130 torchrun --nproc-per-node 2 -m hyla.cli convert --teacher /tmp/teacher --out /tmp/two \
  --data /tmp/one/00-data/corpus $plan > $OUT/convert-2gpu.log 2>&1; echo "2-GPU exit $? after $(( $(date +%s) - start )) s"
cp /tmp/one/03-distill/metrics.jsonl $OUT/metrics-1gpu.jsonl; cp /tmp/two/03-distill/metrics.jsonl $OUT/metrics-2gpu.jsonl
python3 bench/multigpu/compare.py /tmp/one /tmp/two > $OUT/multigpu.json 2>&1; cat $OUT/multigpu.json | tail -n 12
