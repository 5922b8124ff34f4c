#!/usr/bin/env bash
# H200 run 1: GPU tests (foundation + inference), kernel benchmark, quick model benchmark (8K/32K).
# Run from the repository root on the GPU machine, with the fla wheels in .whl/ and $OUT set.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee -a $OUT/run1.log
python3 -m pytest tests/ops/test_lightning_gpu.py tests/models/test_hypenet_gpu.py -q -m gpu 2>&1 | tee $OUT/foundation-gpu-tests.txt
python3 -m pytest tests/inference/test_inference_gpu.py -q -m gpu 2>&1 | tee -a $OUT/run1.log
python3 -m hyla.cli bench kernels --out $OUT/kernels 2>&1 | tee -a $OUT/run1.log
python3 -m hyla.cli bench model --contexts 8K,32K --hf-graph-contexts 32K --large-batch-contexts 8K \
  --out $OUT/model-quick 2>&1 | tee -a $OUT/run1.log
