#!/usr/bin/env bash
# One call on nvidia-h200-x2 (carry .whl): (1) the same small conversion on 1 GPU and under torchrun on 2 GPUs,
# stage-2 loss curves and throughput compared; (2) the GPU tests not yet run, split over the two GPUs.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
nvidia-smi --query-gpu=name,memory.total --format=csv | tee $OUT/gpus.txt
python3 bench/multigpu/make_teacher.py /tmp/teacher 2>&1 | tail -1
plan="--preset smoke --device cuda --select uniform --until-stage distill
 --set align.tokens=262144 --set align.seq_len=512 --set align.batch_size=32 --set align.checkpoint_every=100
 --set distill.tokens=1310720 --set distill.seq_len=512 --set distill.batch_size=32 --set distill.checkpoint_every=100
 --set distill.warmup_steps=5 --set scaling.length=1024 --set scaling.num_docs=1"
start=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m hyla.cli convert --teacher /tmp/teacher --out /tmp/one $plan \
  > $OUT/convert-1gpu.log 2>&1; echo "1-GPU exit $? after $(( $(date +%s) - start )) s"
start=$(date +%s)
timeout 170 torchrun --nproc-per-node 2 -m hyla.cli convert --teacher /tmp/teacher --out /tmp/two \
  --data /tmp/one/00-data/corpus $plan > $OUT/convert-2gpu.log 2>&1; echo "2-GPU exit $? after $(( $(date +%s) - start )) s"
python3 bench/multigpu/compare.py /tmp/one /tmp/two > $OUT/multigpu.json 2>&1; tail -n 8 $OUT/multigpu.json
left=$(( 560 - SECONDS )); echo "tests get ${left} s"
CUDA_VISIBLE_DEVICES=0 timeout $left python3 -m pytest -q -m gpu -rA -p no:cacheprovider \
  tests/ops/test_lightning_gpu.py::test_fla_packed_sequences_match_reference \
  tests/ops/test_lightning_gpu.py::test_single_token_decode_uses_recurrent_kernel_and_matches \
  tests/models/test_hypenet_gpu.py \
  tests/ops/test_gla_gdn_swa_gpu.py > $OUT/gpu-tests-0.txt 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout $left python3 -m pytest -q -m gpu -rA -p no:cacheprovider \
  tests/models/test_family_gpu.py tests/analysis/test_analysis_gpu.py tests/inference/test_inference_gpu.py \
  > $OUT/gpu-tests-1.txt 2>&1 &
wait
tail -n 25 $OUT/gpu-tests-0.txt $OUT/gpu-tests-1.txt
