"""Where a model's CSR average falls short of its teacher's, task by task: each task's difference divided by the
number of tasks, so that the parts sum to the difference of the averages. Sitting M's CSR paragraph
(docs/log/2026-12-04-smollm2-135m-halo-sitting-m.md) comes from:

    F=docs/results/smollm2-135m/halo-sitting-f/results.tar.xz M=docs/results/smollm2-135m/halo-sitting-m/results.tar.xz
    python scripts/csr_gap.py $F:evals/csr-teacher/results.json $F:evals/csr-main/results.json \
        $M:evals/csr-main/results.json $M:evals/csr-d125/results.json

The first file is the teacher's, each later one a model's (`hyla eval csr` results.json, or ARCHIVE.tar.xz:MEMBER
inside a run's results archive); the metric of each task is the report's (acc_norm; WinoGrande and LAMBADA: acc).
"""

from __future__ import annotations

import argparse
import tarfile

from niah_paired import read_result

from hyla.experiment.report import CSR_METRIC


def task_scores(result: dict) -> dict[str, float]:
    return {task: values[CSR_METRIC.get(task, "acc")] for task, values in result["tasks"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("teacher", help="the teacher's CSR results.json")
    parser.add_argument("models", nargs="+", help="the models' CSR results.json files")
    args = parser.parse_args()
    scores = {}
    for spec in [args.teacher, *args.models]:
        try:
            scores[spec] = task_scores(read_result(spec))
        except (OSError, KeyError, ValueError, tarfile.TarError) as err:
            raise SystemExit(f"error: {spec}: cannot read CSR results ({err!r})") from None
    teacher = scores[args.teacher]
    models = {spec: scores[spec] for spec in args.models}
    tasks = sorted(teacher)
    for spec, scores in models.items():
        if sorted(scores) != tasks:
            raise SystemExit(f"error: {spec} has tasks {sorted(scores)}, the teacher {tasks}")
    print("model: average gap; each task's part of it (share of the gap)")
    for spec, scores in models.items():
        parts = {task: (scores[task] - teacher[task]) / len(tasks) for task in tasks}
        gap = sum(parts.values())
        shown = ", ".join(f"{task} {part:+.4f} ({part / gap:.0%})" if gap else f"{task} {part:+.4f}"
                          for task, part in parts.items())
        print(f"{spec}: {gap:+.4f}; {shown}")


if __name__ == "__main__":
    main()
