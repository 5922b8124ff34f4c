#!/usr/bin/env bash
# GDN's fla gradients on the H200 under Triton 3.7.1.
#
# fla 0.6.0 refuses the backward of chunk_gated_delta_rule on Hopper with 3.4.0 <= Triton < 3.7.1 (fla issue #640,
# mirrored by hyla.ops.gdn.gpu.fla_backward_blocker), and the GPU image ships torch 2.11 with Triton 3.6. This brings
# Triton 3.7.1 in a folder of its own, used only by the GDN tests' process (PYTHONPATH first, its own kernel cache);
# nothing else on the machine changes.
#
#   bash bench/gdn_triton371.sh pack   # here: PyPI's cp312 wheel, without what kernels do not use (CUPTI, proton's
#                                      # test lib, the Blackwell ptxas), xz'd and split into .gpu-inputs/t371/a and
#                                      # .gpu-inputs/t371/b (~47 MB each: one per device call, beside the repository)
#   bash bench/gdn_triton371.sh part   # device call with carry [".whl", ".gpu-inputs/t371/a"] (then another with /b):
#                                      # keeps the part in /root/keep-t371 for the next call
#   bash bench/gdn_triton371.sh test   # device, once both parts were kept: unpack, check the version, then the GDN
#                                      # cases of tests/ops/test_gla_gdn_swa_gpu.py and the family training step,
#                                      # then GDN's strong-gate dg with TRITON_F32_DEFAULT=ieee
# `part` and `test` can precede other work in the same call (`bash bench/gdn_triton371.sh part && bash ...`).
set -uo pipefail
keep=/root/keep-t371
mode=${1:?usage: gdn_triton371.sh pack|part|test}

case $mode in
pack)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  python -m pip download -q triton==3.7.1 --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_27_x86_64 -d "$work" || exit 1
  mkdir -p "$work/x" && (cd "$work/x" && unzip -q "$work"/triton-3.7.1-*.whl) || exit 1
  rm -rf "$work/x/triton/backends/nvidia/lib/cupti" "$work/x/triton/instrumentation" \
    "$work/x/triton/backends/nvidia/bin/ptxas-blackwell"
  (cd "$work/x" && tar -cf - triton triton-3.7.1.dist-info | xz -T0 -9e >"$work/t371.tar.xz") || exit 1
  rm -rf .gpu-inputs/t371 && mkdir -p .gpu-inputs/t371/a .gpu-inputs/t371/b
  (cd "$work" && sha256sum t371.tar.xz >t371.sha256 && split -n 2 -d t371.tar.xz t371.part) || exit 1
  cp "$work/t371.part00" "$work/t371.sha256" .gpu-inputs/t371/a/ && cp "$work/t371.part01" .gpu-inputs/t371/b/
  du -sh .gpu-inputs/t371/*
  ;;
part)
  mkdir -p $keep && cp .gpu-inputs/t371/*/* $keep/ && ls -la $keep
  ;;
test)
  site=$keep/site
  if [ ! -d $site/triton ]; then
    (cd $keep && sha256sum -c t371.sha256 --status) 2>/dev/null || { cat $keep/t371.part0* >$keep/t371.tar.xz; }
    (cd $keep && sha256sum -c t371.sha256) || { echo "error: Triton 3.7.1 parts missing or damaged in $keep"; exit 2; }
    mkdir -p $site && tar -xJf $keep/t371.tar.xz -C $site || exit 1
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $keep/fla .whl/*.whl \
    || exit 1
  export PYTHONPATH=$site:$keep/fla:$PWD/src PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$keep/cache
  python3 -c 'import torch, triton; from hyla.ops.gdn.gpu import fla_backward_blocker as b
print("torch", torch.__version__, "triton", triton.__version__, "from", triton.__file__); print("blocker:", b())' \
    || exit 1
  # The GDN cases by their parameter ids (`-k gdn` would also match the file's name and select every case).
  mapfile -t cases < <(python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/ops/test_gla_gdn_swa_gpu.py \
    | grep -E '[[-]gdn\]$|test_gdn_')
  echo "${#cases[@]} GDN cases, and the family's training step"
  HYLA_TEST_REPORT="$OUT/gdn-t371-report.txt" timeout "${TESTS_TIMEOUT_S:-540}" python3 -m pytest "${cases[@]}" \
    tests/models/test_family_gpu.py::test_training_step_gradients_are_finite \
    -m gpu -n "${TEST_WORKERS:-8}" -v -rA --tb=short -p no:cacheprovider >"$OUT/gdn-t371.txt" 2>&1
  echo "pytest exit $?" | tee -a "$OUT/gdn-t371.txt"
  # GDN's gate gradient under strong gates with fp32 dots in IEEE precision instead of TF32 (expected to pass there;
  # with TF32 it is a strict expected failure): own kernel cache, since the precision is compiled into the kernels.
  TRITON_F32_DEFAULT=ieee TRITON_CACHE_DIR=$keep/cache-ieee HYLA_TEST_REPORT="$OUT/gdn-t371-report.txt" \
    timeout "${IEEE_TIMEOUT_S:-240}" python3 -m pytest -m gpu -v -rA --tb=short -p no:cacheprovider \
    "tests/ops/test_gla_gdn_swa_gpu.py::test_gdn_gate_gradient_under_strong_gates" >>"$OUT/gdn-t371.txt" 2>&1
  echo "pytest (TRITON_F32_DEFAULT=ieee) exit $?" | tee -a "$OUT/gdn-t371.txt"
  grep -E "^(PASSED|FAILED|SKIPPED|ERROR) " "$OUT/gdn-t371-report.txt" | cut -d' ' -f1 | sort | uniq -c
  grep -A30 "^FAILED \|^ERROR " "$OUT/gdn-t371-report.txt" | head -n 80
  ;;
*) echo "usage: gdn_triton371.sh pack|part|test" >&2; exit 2 ;;
esac
