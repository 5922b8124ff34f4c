#!/usr/bin/env bash
# H200 run 2 (what the remaining device budget allowed): engine vs engine and HF graph decode; the benchmark's own
# correctness checks (engine vs model forward, engine vs HF Qwen3, HF graph vs HF eager) gate every number.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
python3 -m hyla.cli bench model --contexts 32K,128K,512K,1M --hypenet-max-prefill 512K \
  --qwen3-engine-max-prefill 128K --systems hypenet,qwen3-engine,qwen3-hf-graph --hf-graph-contexts 32K \
  --large-batch-contexts 32K --no-compile --repeats 2 --decode-steps 10 --out $OUT/model 2>&1 | tee $OUT/run2.log
