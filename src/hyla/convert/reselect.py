"""`hyla convert reselect`: the noise-aware selection rule applied to a conversion's recorded selection scores
(`02-select/selection.json`), without scoring anything again; its report (JSON, PNG, table) and a comparison of the
rules' choices.

The tie-break needs each layer's stage-1 alignment error relative to the teacher's output energy. A run whose
alignment metrics log the energies (`energy_NN`, every run since the noise-aware rule exists) gives it directly; for
an older run, `teacher` measures the teacher's per-layer attention-output energy on `energy_data` (a prepared
corpus), and the run's last alignment MSEs are divided by it (an approximation when the text differs from the run's
own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hyla.convert.noise_select import DEFAULT_Z, alignment_errors_from_metrics
from hyla.convert.select_report import build_report
from hyla.convert.selection import SelectionScores
from hyla.outputs import write_json


@dataclass
class ReselectRequest:
    run: Path  # the conversion folder (`hyla convert --out`)
    out: Path | None = None  # the report folder; None: RUN/reselect
    noise_z: float = DEFAULT_Z
    k: int | None = None  # None: the recorded selection's k
    teacher: str | None = None  # measure the teacher's output energies (runs whose metrics lack them)
    energy_data: str | None = None  # prepared corpus for the energies
    energy_batches: int = 4
    energy_shape: tuple[int, int] = (4, 512)  # batch size, sequence length

    def check(self) -> None:
        if not self.noise_z > 0:
            raise ValueError(f"--noise-z must be > 0, got {self.noise_z}")
        if self.k is not None and self.k < 1:
            raise ValueError(f"--k must be >= 1, got {self.k}")
        if (self.teacher is None) != (self.energy_data is None):
            raise ValueError("--teacher and --energy-data go together (the energies are measured on that corpus)")
        if self.energy_batches < 1 or min(self.energy_shape) < 1:
            raise ValueError("--energy-batches and --energy-shape must be positive")
        for path in (self.selection_path, self.metrics_path):
            if not path.is_file():
                raise FileNotFoundError(f"{path} is missing: is {self.run} a conversion folder past its select stage?")

    @property
    def selection_path(self) -> Path:
        return self.run / "02-select" / "selection.json"

    @property
    def metrics_path(self) -> Path:
        return self.run / "01-align" / "metrics.jsonl"


@torch.no_grad()
def teacher_output_energy(teacher_spec: str, corpus: str, *, batches: int, batch_size: int,
                          seq_len: int) -> list[float]:
    """Mean square of each layer's attention output of the teacher over `batches` windows of `corpus`."""
    from hyla.convert.align import record_mixers
    from hyla.data.loader import TokenLoader
    from hyla.models.loading import load_teacher
    from hyla.models.transfer import to_hypenet

    hf_teacher, _ = load_teacher(teacher_spec)
    teacher = to_hypenet(hf_teacher, attention_rope=True).eval()
    loader = TokenLoader(corpus, seq_len=seq_len, batch_size=batch_size, seed=0)
    sums = torch.zeros(len(teacher.model.layers), dtype=torch.float64)
    for _ in range(batches):
        recorder, _ = record_mixers(teacher, next(loader)["input_ids"])
        sums += torch.tensor([recorder.outputs[i].double().pow(2).mean().item() for i in range(len(sums))])
    return (sums / batches).tolist()


def alignment_errors(metrics: list[dict], num_layers: int, energies: list[float] | None) -> dict[int, float] | None:
    """Per layer, the alignment error over the teacher's output energy: from the metrics' own energies, else from
    `energies` (the last tenth of the steps, as `alignment_errors_from_metrics`), else None."""
    errors = alignment_errors_from_metrics(metrics, num_layers)
    if errors is not None or energies is None or not metrics:
        return errors
    tail = metrics[-max(1, len(metrics) // 10):]
    return {i: sum(row[f"mse_{i:02d}"] for row in tail) / len(tail) / energies[i] for i in range(num_layers)}


def reselect(request: ReselectRequest) -> dict[str, Any]:
    """Write OUT/selection.json, selection.png and comparison.json; returns the comparison."""
    from hyla.train.progress import read_metrics

    request.check()
    recorded = json.loads(request.selection_path.read_text())
    scores = SelectionScores.from_dict(recorded)
    if not scores.recall:
        raise ValueError(f"{request.selection_path} records no recall scores (made by a rule that scores nothing)")
    k = request.k if request.k is not None else recorded.get("k")
    energies = None
    if request.teacher is not None:
        batch_size, seq_len = request.energy_shape
        energies = teacher_output_energy(request.teacher, request.energy_data, batches=request.energy_batches,
                                         batch_size=batch_size, seq_len=seq_len)
    errors = alignment_errors(read_metrics(request.metrics_path), scores.num_layers, energies)
    out = request.out if request.out is not None else request.run / "reselect"
    out.mkdir(parents=True, exist_ok=True)
    report = build_report(scores, "halo", k, noise_z=request.noise_z, alignment_errors=errors,
                          settings={"recorded_settings": recorded.get("settings"), "z": request.noise_z})
    report.write_json(out / "selection.json")
    report.plot(out / "selection.png")
    by_raw = build_report(scores, "halo", k, noise_z=request.noise_z)
    comparison = {
        "recorded_chosen": recorded.get("chosen"), "halo_recomputed": build_report(scores, "halo", k).chosen,
        "noise_aware_alignment_tie_break": report.chosen, "noise_aware_halo_tie_break": by_raw.chosen,
        "chosen_by_noise": report.noise.chosen_by_noise, "near_misses": report.noise.near_misses,
        "alignment_errors": errors, "teacher_output_energy": energies, "energy_data": request.energy_data,
        "energy_shape": "x".join(map(str, request.energy_shape)), "z": request.noise_z,
    }
    write_json(out / "comparison.json", comparison)
    report.print_table()
    return {**comparison, "out": str(out)}
