"""Apply the noise-aware selection rule to a recorded selection (a conversion's `02-select/selection.json`), without
scoring anything again, and write its report (JSON, PNG, table).

The tie-break needs each layer's stage-1 alignment error relative to the teacher's output energy. A run whose
alignment metrics log the energies (`energy_NN`, since the noise-aware rule exists) gives it directly; for an older
run, `--teacher` measures the teacher's per-layer attention-output energy on `--energy-data` (a prepared corpus), and
the run's last alignment MSEs are divided by it (an approximation when the text differs from the run's own).

    python bench/smollm2/reselect.py --selection RUN/02-select/selection.json \
        --align-metrics RUN/01-align/metrics.jsonl --teacher smollm2-135m --energy-data CORPUS --out reselect
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hyla.convert.noise_select import alignment_errors_from_metrics
from hyla.convert.select_report import build_report
from hyla.convert.selection import SelectionScores
from hyla.outputs import write_json
from hyla.train.progress import read_metrics


@torch.no_grad()
def teacher_output_energy(teacher_spec: str, corpus: str, *, batches: int, batch_size: int,
                          seq_len: int) -> list[float]:
    """Mean square of each layer's attention output of the teacher over `batches` windows of `corpus`."""
    from hyla.convert.align import MixerRecorder
    from hyla.convert.teacher import load_teacher
    from hyla.convert.transfer import to_hypenet
    from hyla.data.loader import TokenLoader

    hf_teacher, _ = load_teacher(teacher_spec)
    teacher = to_hypenet(hf_teacher, attention_rope=True).eval()
    loader = TokenLoader(corpus, seq_len=seq_len, batch_size=batch_size, seed=0)
    sums = torch.zeros(len(teacher.model.layers), dtype=torch.float64)
    for _ in range(batches):
        recorder = MixerRecorder(teacher)
        try:
            teacher.model(next(loader)["input_ids"], use_cache=False)
        finally:
            recorder.close()
        sums += torch.tensor([recorder.outputs[i].double().pow(2).mean().item() for i in range(len(sums))])
    return (sums / batches).tolist()


def alignment_errors(metrics: list[dict], num_layers: int, energies: list[float] | None) -> dict[int, float] | None:
    errors = alignment_errors_from_metrics(metrics, num_layers)
    if errors is not None or energies is None:
        return errors
    tail = metrics[-max(1, len(metrics) // 10):]
    return {i: sum(row[f"mse_{i:02d}"] for row in tail) / len(tail) / energies[i] for i in range(num_layers)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--selection", required=True, type=Path, help="a selection.json with recorded scores")
    parser.add_argument("--align-metrics", type=Path, default=None, help="the run's 01-align/metrics.jsonl")
    parser.add_argument("--teacher", default=None, help="measure the teacher's output energies (older runs)")
    parser.add_argument("--energy-data", default=None, help="prepared corpus for the energies")
    parser.add_argument("--energy-batches", type=int, default=4)
    parser.add_argument("--energy-shape", default="4x512", help="BATCHxSEQ of the energy batches")
    parser.add_argument("--z", type=float, default=2.0, help="noise threshold in standard errors")
    parser.add_argument("--k", type=int, default=None)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()

    recorded = json.loads(args.selection.read_text())
    scores = SelectionScores.from_dict(recorded)
    energies = None
    if args.teacher is not None:
        batch_size, seq_len = (int(part) for part in args.energy_shape.split("x"))
        energies = teacher_output_energy(args.teacher, args.energy_data, batches=args.energy_batches,
                                         batch_size=batch_size, seq_len=seq_len)
    metrics = read_metrics(args.align_metrics) if args.align_metrics else []
    errors = alignment_errors(metrics, scores.num_layers, energies) if metrics else None
    args.out.mkdir(parents=True, exist_ok=True)
    report = build_report(scores, "halo", args.k, noise_z=args.z, alignment_errors=errors,
                          settings={"recorded_settings": recorded.get("settings"), "z": args.z})
    report.write_json(args.out / "selection.json")
    report.plot(args.out / "selection.png")
    plain = build_report(scores, "halo", args.k)
    by_raw = build_report(scores, "halo", args.k, noise_z=args.z)
    write_json(args.out / "comparison.json", {
        "recorded_chosen": recorded.get("chosen"), "halo_recomputed": plain.chosen,
        "noise_aware_alignment_tie_break": report.chosen, "noise_aware_halo_tie_break": by_raw.chosen,
        "chosen_by_noise": report.noise.chosen_by_noise, "near_misses": report.noise.near_misses,
        "alignment_errors": errors, "teacher_output_energy": energies,
        "energy_data": args.energy_data, "energy_shape": args.energy_shape, "z": args.z,
    })
    report.print_table()
    print(f"recorded {recorded.get('chosen')} | noise-aware (alignment tie-break) {report.chosen} | "
          f"noise-aware (raw-s tie-break) {by_raw.chosen}")


if __name__ == "__main__":
    main()
