"""The SmolLM2-135M -> HypeNet conversion and its evaluation, as one dependency graph of `hyla` commands that share
one GPU (docs/results/smollm2-135m.md). Started by bench/smollm2/h200.sh; `--smoke` runs the same graph on CPU with
a tiny teacher and toy sizes, to check the plumbing.

    python bench/smollm2/driver.py --teacher /root/keep/smol.gguf --text /root/keep/text --run /root/keep/run

Jobs run as subprocesses (at most --parallel at once), in priority order, once their dependencies have finished;
a failed job skips the jobs that need it. Each job logs to RUN/logs/NAME.log; RUN/status.json is rewritten at every
change. Rerunning the driver skips the jobs that finished (conversions resume from their checkpoints).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hyla.outputs import write_json

HYLA = [sys.executable, "-m", "hyla.cli"]
# Corpus jobs tokenize with the Rust batch path on all cores (h200.sh turns it off for everything else); measured
# here on 2 cores for 8M tokens of text + recall documents: 21.3 s off, 15.5 s on.
TOKENIZE_ENV = {"TOKENIZERS_PARALLELISM": "true"}
TASKS = ["SK1", "SK2", "SK3"]
# What stages 00-02 depend on: --main-set items of these sections reach the ablations too; --ablation-set may not
# change them (nor the held-out tail's size, scaling.length and scaling.num_docs, which the data stage holds out).
SHARED_SECTIONS = ("align", "selection")
SHARED_SETTINGS = ("scaling.length", "scaling.num_docs")


@dataclass
class Sizes:
    """Everything that differs between the GPU run and the CPU smoke run."""

    device: str
    preset: str
    main: list[str]  # --set overrides of the main conversion
    ablation: list[str]  # --set overrides of every ablation (same budget for all of them)
    short: list[str]  # NIAH lengths run 4 at a time
    long: list[str]  # NIAH lengths run 1 at a time
    samples: int  # NIAH samples per task and length (teacher, main hybrid)
    ablation_samples: int
    csr_limit: int
    ppl_len: str
    ppl_sequences: int
    ablation_lengths: list[str] = field(default_factory=list)  # NIAH lengths of the ablations (default: `long`)
    max_new_tokens: int = 40
    corpus_tokens: str = "200000000"
    parallel: int = 14
    train_slots: int = 4  # conversions at once (each holds ~20-30 GB of GPU memory while distilling)


GPU = Sizes(
    device="cuda", preset="quick",
    # What one 30-minute H200 session allowed (docs/results/smollm2-135m.md): less than the quick preset's distill.
    main=["distill.tokens=8e6", "finetune.tokens=1e6"],
    ablation=["distill.tokens=2e6", "finetune.tokens=5e5"],
    short=["4K", "8K", "16K"], long=["32K", "64K"], samples=25, ablation_samples=10, csr_limit=500,
    ppl_len="64K", ppl_sequences=4,
)
SMOKE_PLAN = ["align.tokens=2048", "align.seq_len=64", "align.batch_size=4", "align.checkpoint_every=4",
              "align.warmup_steps=1", "distill.tokens=2048", "distill.seq_len=64", "distill.batch_size=4",
              "distill.checkpoint_every=4", "distill.warmup_steps=1", "finetune.tokens=1024", "finetune.seq_len=256",
              "finetune.batch_size=2", "finetune.checkpoint_every=2", "scaling.length=512", "scaling.num_docs=1",
              "scaling.candidates=none,20,500", "selection.niah_lengths=512", "selection.niah_samples=1",
              "selection.csr_tasks=arc_easy", "selection.csr_limit=4"]
SMOKE = Sizes(
    device="cpu", preset="smoke", main=SMOKE_PLAN, ablation=SMOKE_PLAN + ["distill.tokens=1024"],
    short=["512"], long=["1K"], samples=1, ablation_samples=1, csr_limit=3, ppl_len="1K", ppl_sequences=1,
    max_new_tokens=8, corpus_tokens="300000", parallel=3, train_slots=2,
)

FAMILY_GPU_TESTS = ["tests/ops/test_gla_gdn_swa_gpu.py", "tests/models/test_family_gpu.py"]

# name -> (conversion overrides beyond the ablation budget, how its stages 00-02 are obtained)
ABLATIONS = {
    "abl-halo": ([], "copy-select"),
    "abl-uniform": (["selection.method=uniform"], "copy-align"),
    "abl-attn-rope": (["model.attention_rope=true"], "copy-select"),
    "abl-no-rnn-rope": (["model.lightning_rope=false"], "own-align"),
    "abl-no-rnn-qknorm": (["model.lightning_qk_norm=false"], "own-align"),
}


@dataclass
class Job:
    name: str
    command: Callable[[], list[str] | None]  # built when the job starts (it may read earlier results)
    needs: list[str] = field(default_factory=list)
    kind: str = "eval"  # "train" jobs have their own limit (GPU memory)
    after: list[str] = field(default_factory=list)  # jobs that must have ended, whether or not they succeeded
    env: dict[str, str] = field(default_factory=dict)  # environment variables set for this job only
    state: str = "waiting"  # waiting, running, done, failed, skipped
    alone: bool = False  # retried after running out of GPU memory: starts only when no other training runs
    started: float | None = None
    ended: float | None = None
    returncode: int | None = None
    process: subprocess.Popen | None = None


class Graph:
    def __init__(self, run: Path, parallel: int, train_slots: int):
        self.run, self.parallel, self.train_slots, self.jobs = run, parallel, train_slots, {}
        (run / "logs").mkdir(parents=True, exist_ok=True)
        self.started = time.time()

    def add(self, name: str, command, needs=(), kind: str = "eval", env: dict[str, str] | None = None) -> None:
        missing = [need for need in needs if need not in self.jobs]
        if missing:
            raise ValueError(f"job {name} needs unknown jobs {missing}")
        self.jobs[name] = Job(name, command, list(needs), kind, env=dict(env or {}))
        if (self.run / "logs" / f"{name}.done").exists():
            self.jobs[name].state = "done"

    def log(self, text: str) -> None:
        line = f"[{time.time() - self.started:7.1f} s] {text}"
        print(line, flush=True)
        with open(self.run / "driver.log", "a") as handle:
            handle.write(line + "\n")

    def write_status(self) -> None:
        status = {name: {"state": job.state, "needs": job.needs, "returncode": job.returncode,
                         "seconds": None if job.started is None else round((job.ended or time.time()) - job.started, 1)}
                  for name, job in self.jobs.items()}
        write_json(self.run / "status.json", status)

    def _start(self, job: Job) -> None:
        command = job.command()
        job.started = time.time()
        if command is None:  # a step done in the driver itself
            job.state, job.ended, job.returncode = "done", time.time(), 0
            (self.run / "logs" / f"{job.name}.done").touch()
            self.log(f"done    {job.name}")
            return
        log = open(self.run / "logs" / f"{job.name}.log", "a")
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        job.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                       env={**os.environ, **job.env} if job.env else None)
        job.state = "running"
        self.log(f"start   {job.name}")

    def _ready(self, job: Job) -> bool:
        ended = all(self.jobs[n].state in ("done", "failed", "skipped") for n in job.after)
        return job.state == "waiting" and ended and all(self.jobs[n].state == "done" for n in job.needs)

    def _out_of_memory(self, job: Job) -> bool:
        """Whether the job's last lines report CUDA running out of memory."""
        with open(self.run / "logs" / f"{job.name}.log", "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 20_000))
            tail = handle.read().decode("utf-8", "replace")
        return "OutOfMemoryError" in tail or "CUDA out of memory" in tail

    def run_all(self) -> bool:
        while True:
            changed = False
            for job in self.jobs.values():
                if job.state == "running" and job.process.poll() is not None:
                    job.ended, job.returncode = time.time(), job.process.returncode
                    job.state = "done" if job.returncode == 0 else "failed"
                    if job.state == "done":
                        (self.run / "logs" / f"{job.name}.done").touch()
                    self.log(f"{job.state:7s} {job.name} ({job.ended - job.started:.0f} s, exit {job.returncode})")
                    if job.state == "failed" and job.kind == "train" and not job.alone and self._out_of_memory(job):
                        # Conversions resume from their checkpoints: run it again once it can have the GPU alone.
                        job.state, job.alone = "waiting", True
                        self.log(f"retry   {job.name} (out of GPU memory beside other jobs): once no training runs")
                    changed = True
            for job in self.jobs.values():
                if job.state == "waiting" and any(self.jobs[n].state in ("failed", "skipped") for n in job.needs):
                    job.state = "skipped"
                    self.log(f"skipped {job.name} (a job it needs did not finish)")
                    changed = True
            running = sum(job.state == "running" for job in self.jobs.values())
            training = sum(job.state == "running" and job.kind == "train" for job in self.jobs.values())
            # A retried job waits for the running trainings to end, and no new one starts meanwhile.
            draining = any(job.alone and self._ready(job) for job in self.jobs.values())
            for job in self.jobs.values():
                if running >= self.parallel:
                    break
                if job.kind == "train" and (training >= self.train_slots or (draining and not job.alone)
                                            or (job.alone and training > 0)):
                    continue
                if self._ready(job):
                    try:
                        self._start(job)
                    except Exception as err:  # noqa: BLE001 - a job that cannot start fails alone
                        job.state, job.ended, job.returncode = "failed", time.time(), -1
                        self.log(f"failed  {job.name}: {type(err).__name__}: {err}")
                    running += job.state == "running"
                    training += job.state == "running" and job.kind == "train"
                    changed = True
            if changed:
                self.write_status()
            if all(job.state in ("done", "failed", "skipped") for job in self.jobs.values()):
                self.log("all jobs finished")
                return all(job.state == "done" for job in self.jobs.values())
            time.sleep(2)


def explicit_layers(items: list[str]) -> str | None:
    """The attention layers the main run's `selection.method` names outright ("0,1,7"), or None for a rule."""
    methods = [item.split("=", 1)[1] for item in items if item.startswith("selection.method=")]
    return methods[-1] if methods and re.fullmatch(r"\d+(,\d+)*", methods[-1]) else None


def chosen_layers(folder: Path) -> str:
    manifest = json.loads((folder / "02-select" / "manifest.json").read_text())
    return ",".join(str(layer) for layer in manifest["results"]["chosen"])


def copy_stages(source: Path, target: Path, stages: list[str]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        if not (target / stage).exists():
            shutil.copytree(source / stage, target / stage, ignore=shutil.ignore_patterns("checkpoints"))


def move_longest_files(text: Path, target: Path, count: int) -> list[Path]:
    """Move the `count` largest files under `text` into `target` (staged, then renamed: all or nothing)."""
    files = sorted((path for path in text.rglob("*") if path.is_file()), key=lambda p: (-p.stat().st_size, str(p)))
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    moved = []
    for path in files[:count]:
        name = "__".join(path.relative_to(text).parts)
        shutil.copy2(path, staging / name)
        moved.append(path)
    staging.rename(target)
    for path in moved:
        path.unlink()
    return moved


def build_graph(args: argparse.Namespace, sizes: Sizes) -> Graph:
    run = args.run
    ablations = {name: spec for name, spec in ABLATIONS.items() if name in args.ablations}
    graph = Graph(run, args.parallel or sizes.parallel, args.train_slots or sizes.train_slots)
    corpus, teacher_hf = run / "corpus", run / "teacher-hf"
    device = ["--device", sizes.device]
    dtype = ["--dtype", "bfloat16" if sizes.device == "cuda" else "float32"]

    def sets(items: list[str]) -> list[str]:
        return [part for item in items for part in ("--set", item)]

    # A recipe preset (--preset) brings its own data sources, read from the text cache ($HYLA_TEXT_DIR).
    data = [] if args.preset else ["--data", str(corpus)]

    def convert(out: Path, items: list[str], *extra: str) -> list[str]:
        return HYLA + ["convert", "--teacher", args.teacher, "--out", str(out), "--preset", sizes.preset,
                       *data, *device, *sets(items), *extra]

    if args.scaling_docs:  # the longest text files leave the training text and become the scaling stage's corpus
        scaling_text, scaling_corpus = run / "scaling-text", run / "scaling-corpus"

        def split_off_longest():
            if not scaling_text.exists():
                move_longest_files(args.text, scaling_text, args.scaling_docs)
            return HYLA + ["data", "prepare", "--tokenizer", args.teacher, "--source", str(scaling_text),
                           "--out", str(scaling_corpus)]

        graph.add("scaling-corpus", split_off_longest, env=TOKENIZE_ENV)
        sizes.main = sizes.main + [f"scaling.data={scaling_corpus}"]
        sizes.ablation = sizes.ablation + [f"scaling.data={scaling_corpus}"]
    sources = ["--source", str(args.text)] if args.text else []
    for span in args.recall.split(",") if args.recall else []:  # synthetic recall documents (hyla.data.recall)
        sources += ["--source", f"recall@{span}:{args.text or 'stdlib'}"]
    weights = ["--weights", args.corpus_weights] if args.corpus_weights else []
    prepare = HYLA + ["data", "prepare", "--tokenizer", args.teacher, *sources, "--source", "stdlib", *weights,
                      "--out", str(corpus), "--max-tokens", sizes.corpus_tokens]
    if args.preset:  # the conversions prepare their own corpora in their data stage
        prepare = [sys.executable, "-c", f"print('corpus: the data sources of preset {args.preset}')"]
    graph.add("corpus", lambda: prepare, needs=["scaling-corpus"] if args.scaling_docs else [], env=TOKENIZE_ENV)
    graph.add("teacher-check", lambda: [sys.executable, str(Path(__file__).parent / "teacher_check.py"),
                                        args.teacher, str(teacher_hf), sizes.device])
    if args.gpu_tests:
        graph.add("gpu-tests", lambda: [sys.executable, "-m", "pytest", *args.gpu_tests.split(","), "-q", "-m", "gpu",
                                        "-rA", "-p", "no:cacheprovider"])

    # Conversions: the HALO run (stages 00-02 shared), then the main budget and the ablations.
    halo = run / "main"
    # With a recipe preset the conversion's own data stage tokenizes (~65M tokens for halo-smollm2): on all cores.
    graph.add("convert-select", lambda: convert(halo, sizes.main, "--until-stage", "select"),
              needs=["corpus", "teacher-check"], kind="train", env=TOKENIZE_ENV if args.preset else None)
    # The ablations copy the HALO run's stages 00-02 (or redo its alignment): they take its alignment and selection
    # settings, so that the copied stages match and only the design or the selection rule differs.
    explicit = explicit_layers(sizes.main)
    shared = [item for item in sizes.main
              if item.split(".", 1)[0] in SHARED_SECTIONS or item.split("=", 1)[0] in SHARED_SETTINGS]
    for name, (extra, origin) in ablations.items():
        if origin == "own-align":
            graph.add(f"{name}-align", lambda n=name, e=extra: convert(run / n, shared + sizes.ablation + e,
                                                                      "--until-stage", "align"),
                      needs=["corpus", "teacher-check"], kind="train")
    graph.add("convert-main", lambda: convert(halo, sizes.main), needs=["convert-select"], kind="train")
    for name, (extra, origin) in ablations.items():
        def start(n=name, e=extra, o=origin):
            if o == "copy-select":
                copy_stages(halo, run / n, ["00-data", "01-align", "02-select"])
            elif o == "copy-align":
                copy_stages(halo, run / n, ["00-data", "01-align"])
            items = shared + sizes.ablation + e
            if o == "own-align":  # the HALO run's attention layers, so that only the design differs
                items = items + [f"selection.method={explicit or chosen_layers(halo)}"]
            return convert(run / n, items)

        # An ablation with its own alignment needs the HALO run only for its layer choice, unless that was given.
        own = origin == "own-align"
        needs = ([] if own and explicit else ["convert-select"]) + ([f"{name}-align"] if own else [])
        graph.add(f"convert-{name}", start, needs=needs, kind="train")

    # Evaluations: the same harness and flags for the teacher and every hybrid.
    def niah(model: Path | str, out: str, lengths: list[str], samples: int, batch: int, tasks=TASKS, extra=()):
        return HYLA + ["eval", "niah", "--model", str(model), "--out", str(run / "evals" / out), *device, *dtype,
                       "--tasks", ",".join(tasks), "--lengths", ",".join(lengths), "--num-samples", str(samples),
                       "--batch-size", str(batch), "--max-new-tokens", str(sizes.max_new_tokens), *extra]

    def csr(model, out, extra=()):
        return HYLA + ["eval", "csr", "--model", str(model), "--out", str(run / "evals" / out), *device, *dtype,
                       "--limit", str(sizes.csr_limit), "--batch-size", "32", *extra]

    def ppl(model, out, extra=()):
        return HYLA + ["eval", "ppl", "--model", str(model), "--out", str(run / "evals" / out), *device, *dtype,
                       "--seq-len", sizes.ppl_len, "--num-sequences", str(sizes.ppl_sequences), *extra]

    models = {"teacher": (teacher_hf, "teacher-check", [("", ())]),
              "main": (halo / "06-export", "convert-main", [("", ()), ("-off", ("--logit-scaling-a", "off"))])}
    for label, (model, need, variants) in models.items():
        for suffix, extra in variants:
            for task in TASKS:
                graph.add(f"niah-{label}{suffix}-{task}-long", lambda m=model, o=f"niah-{label}{suffix}-{task}-long",
                          t=task, e=extra: niah(m, o, sizes.long, sizes.samples, 1, [t], e), needs=[need])
                graph.add(f"niah-{label}{suffix}-{task}-short", lambda m=model, o=f"niah-{label}{suffix}-{task}-short",
                          t=task, e=extra: niah(m, o, sizes.short, sizes.samples, 4, [t], e), needs=[need])
            graph.add(f"csr-{label}{suffix}", lambda m=model, o=f"csr-{label}{suffix}", e=extra: csr(m, o, e),
                      needs=[need])
            graph.add(f"ppl-{label}{suffix}", lambda m=model, o=f"ppl-{label}{suffix}", e=extra: ppl(m, o, e),
                      needs=[need])
    for a in args.niah_scaling.split(",") if args.niah_scaling else []:  # retrieval at each fixed logit scaling
        for task in TASKS:
            graph.add(f"niah-main-a{a}-{task}-long", lambda o=f"niah-main-a{a}-{task}-long", t=task, a=a:
                      niah(halo / "06-export", o, sizes.long, sizes.samples, 1, [t], ("--logit-scaling-a", a)),
                      needs=["convert-main"])
    for name in ablations:
        model = run / name / "06-export"
        graph.add(f"niah-{name}", lambda m=model, o=f"niah-{name}": niah(m, o, sizes.ablation_lengths,
                                                                         sizes.ablation_samples, 1),
                  needs=[f"convert-{name}"])
        graph.add(f"csr-{name}", lambda m=model, o=f"csr-{name}": csr(m, o), needs=[f"convert-{name}"])
    if args.evals_after_training:  # the hybrids' evaluations; the teacher's run beside the first stages
        trainings = [name for name, job in graph.jobs.items() if job.kind == "train"]
        for job in graph.jobs.values():
            kind, model = (job.name.split("-") + [""])[:2]
            if job.kind == "eval" and kind in ("niah", "csr", "ppl") and model != "teacher":
                job.after = trainings
    if args.family_lh:
        graph.add("family-lh", lambda: ["bash", "bench/family_lh/run.sh", str(corpus), str(run / "family-lh")]
                  + (["--smoke"] if args.smoke else []), needs=["corpus"])
    return graph


def keep_only(graph: Graph, names: list[str]) -> None:
    """Drop every job but `names` and what they need, transitively (their `after` orderings stay as they are)."""
    unknown = sorted(set(names) - set(graph.jobs))
    if unknown:
        raise SystemExit(f"driver: unknown jobs {unknown}; the graph has {', '.join(graph.jobs)}")
    wanted, stack = set(), list(names)
    while stack:
        name = stack.pop()
        if name not in wanted:
            wanted.add(name)
            stack.extend(graph.jobs[name].needs)
    graph.jobs = {name: job for name, job in graph.jobs.items() if name in wanted}
    for job in graph.jobs.values():
        job.after = [name for name in job.after if name in wanted]


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Sizes]:
    """The command line, and the sizes it selects (with --main-set / --ablation-set applied)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", required=True, help="teacher GGUF file or HF folder")
    parser.add_argument("--text", type=Path, default=None, help="folder of training text (besides the stdlib)")
    parser.add_argument("--run", type=Path, required=True, help="working folder (checkpoints, logs, results)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes on CPU (plumbing check)")
    parser.add_argument("--parallel", type=int, default=None, help="jobs at once (default 14 on GPU, 3 smoke)")
    parser.add_argument("--train-slots", type=int, default=None,
                        help="conversions at once (default 4 as in the recorded run, where 4 ran out of memory: use 2)")
    parser.add_argument("--main-set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="extra --set for the main conversion (repeatable), e.g. distill.tokens=40e6")
    parser.add_argument("--ablation-set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="extra --set for every ablation conversion (repeatable)")
    parser.add_argument("--ablations", default="all",
                        help=f"ablation conversions to run: all, none, or some of {','.join(ABLATIONS)} (default all)")
    parser.add_argument("--ablation-lengths", default=None, metavar="L1,L2,...",
                        help="NIAH lengths of the ablations (default: the long lengths, 32K,64K on GPU), e.g. "
                             "4K,32K,64K to see them where retrieval is not yet zero")
    parser.add_argument("--evals-after-training", action="store_true",
                        help="start the hybrids' evaluations only when every conversion has ended (the teacher's "
                             "start as soon as it is checked, beside the corpus and the first stages)")
    parser.add_argument("--recall", default=None, metavar="MIN-MAX[,MIN-MAX...]",
                        help="add synthetic recall documents (hyla data prepare --source recall@MIN-MAX:TEXT, haystacks "
                             "of MIN-MAX characters of the training text) to the conversion corpus; several ranges "
                             "give one source each (e.g. short ones for the distillation windows, long ones for the "
                             "fine-tuning windows)")
    parser.add_argument("--corpus-weights", default=None, metavar="W1,W2,...",
                        help="shares of the corpus text, one per source in order: --text (if given), each --recall "
                             "range, stdlib (hyla data prepare --weights; default: turn-taking)")
    parser.add_argument("--corpus-tokens", default=None, metavar="N",
                        help="cut the conversion corpus at N tokens (hyla data prepare --max-tokens; default 200000000, "
                             "i.e. all the text). Training visits the whole corpus in random order, so --corpus-weights "
                             "set the training mix only where this cut comes before a source runs out")
    parser.add_argument("--scaling-docs", type=int, default=0, metavar="N",
                        help="take the N largest files of --text out of the training text and choose the logit "
                             "scaling a on them (hyla convert scaling.data; SPEC: a is chosen on long documents). "
                             "Default 0: the corpus's held-out tail")
    parser.add_argument("--gpu-tests", nargs="?", const=",".join(FAMILY_GPU_TESTS), default=None, metavar="FILES",
                        help="also run GPU tests beside the rest: these comma-separated test files (alone: the "
                        "GLA/GDN/SWA ones)")
    parser.add_argument("--family-lh", action="store_true", help="also run bench/family_lh/run.sh on the corpus")
    parser.add_argument("--niah-scaling", default=None, metavar="A1,A2,...",
                        help="also evaluate the main hybrid's NIAH at the long lengths with each of these fixed "
                        "logit scalings a (besides the chosen a and off): whether a retrieval-based choice of a "
                        "differs from the loss-based one")
    parser.add_argument("--only", default=None, help="comma-separated job names to run (with what they need)")
    parser.add_argument("--preset", default=None, metavar="NAME",
                        help="convert with this recipe preset (e.g. halo-smollm2) and its own data sources instead of "
                             "the driver's corpus and the GPU sizes' budget overrides (--main-set still applies)")
    parser.add_argument("--text-cache", type=Path, default=None, metavar="DIR",
                        help="the offline-text cache the preset's sources are read from (sets HYLA_TEXT_DIR)")
    args = parser.parse_args(argv)
    names = {"all": list(ABLATIONS), "none": []}.get(args.ablations, args.ablations.split(","))
    unknown = sorted(set(names) - set(ABLATIONS))
    if unknown:
        parser.error(f"unknown ablations {unknown}; choose from {', '.join(ABLATIONS)}")
    args.ablations = names
    fixed = [item for item in args.ablation_set
             if item.split(".", 1)[0] in SHARED_SECTIONS or item.split("=", 1)[0] in SHARED_SETTINGS]
    if fixed:
        parser.error(f"--ablation-set {fixed[0]}: the ablations share the HALO run's data, alignment and selection "
                     f"stages; set it with --main-set for all of them")
    for a in args.niah_scaling.split(",") if args.niah_scaling else []:
        try:
            if float(a) <= 1:
                raise ValueError
        except ValueError:
            parser.error(f"--niah-scaling: each a must be a number > 1, got {a!r}")
    if args.scaling_docs and not args.text:
        parser.error("--scaling-docs needs --text (the files it takes the longest of)")
    sizes = dataclasses.replace(SMOKE if args.smoke else GPU)
    if args.preset and not args.smoke:
        # The recipe is the budget: drop the GPU sizes' token overrides.
        sizes.preset, sizes.main, sizes.ablation = args.preset, [], []
    if args.text_cache:
        os.environ["HYLA_TEXT_DIR"] = str(args.text_cache)
    sizes.main = sizes.main + args.main_set
    sizes.ablation = sizes.ablation + args.ablation_set
    if args.corpus_tokens:
        sizes.corpus_tokens = str(int(float(args.corpus_tokens)))
    sizes.ablation_lengths = args.ablation_lengths.split(",") if args.ablation_lengths else list(sizes.long)
    return args, sizes


def main() -> int:
    args, sizes = parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    graph = build_graph(args, sizes)
    if args.only:
        keep_only(graph, args.only.split(","))
    graph.log(f"driver: {len(graph.jobs)} jobs, {graph.parallel} at once, sizes {'smoke' if args.smoke else 'gpu'}")
    graph.write_status()
    return 0 if graph.run_all() else 1


if __name__ == "__main__":
    sys.exit(main())
