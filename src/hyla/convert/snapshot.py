"""`hyla convert snapshot`: a finished training stage's student (distill, finetune) as a loadable HF HypeNet folder,
written as the export stage writes the final model, so that an evaluation can tell what each stage taught.

It reads what the conversion recorded, not a plan: the layout the select stage chose, the student options the align
and distill stages were made with (their manifests' settings), the teacher's fingerprint, and the stage's saved
weights. It trains nothing and writes nothing into the conversion folder; the model folder appears whole or not at
all (a staging folder renamed at the end). Every check that needs no teacher runs before the teacher loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyla.convert.export import training_table
from hyla.convert.runners import check_weights_file, stage_student
from hyla.convert.stages import STAGES, Stage, settings_hash
from hyla.data.tokenize import staging_folder
from hyla.models.loading import load_teacher, load_teacher_config, teacher_fingerprint
from hyla.outputs import run_metadata, write_atomic, write_json

# The stages that train the whole student and save it (`student.safetensors`).
SNAPSHOT_STAGES = ("distill", "finetune")
WHAT_THE_STAGE_IS = {"distill": "HALO's stage 2, end-to-end distillation from the teacher",
                     "finetune": "HALO's stage 3, long-context fine-tuning"}
NOT_A_STUDENT = {"data": "a corpus", "align": "the stage-1 twins, layer by layer", "select": "a layer choice",
                 "scaling": "a choice of a", "export": "already a model folder"}


@dataclass
class SnapshotRequest:
    run: Path  # the conversion folder (`hyla convert --out`)
    stage: str  # one of SNAPSHOT_STAGES
    to: Path  # the model folder to write: absent, or an empty folder
    teacher: str | None  # the teacher the run was converted from (its sizes and tokenizer)
    attention_logit_scaling_a: float | None = None  # None: no logit scaling, as stages 2 and 3 train

    def check(self) -> dict[str, dict]:
        """One clear ValueError for a bad request, before anything loads; the manifests of the stages up to
        `stage`, by name."""
        if self.stage not in STAGES:
            raise ValueError(f"--stage {self.stage!r} is not a stage; a snapshot is of {' or '.join(SNAPSHOT_STAGES)}")
        if self.stage not in SNAPSHOT_STAGES:
            raise ValueError(f"--stage {self.stage}: its output is {NOT_A_STUDENT[self.stage]}, not a student; a "
                             f"snapshot is of {' or '.join(SNAPSHOT_STAGES)}")
        if self.teacher is None:
            raise ValueError("--teacher is required: the teacher the run was converted from (HF folder, hub id, GGUF "
                             "file, or alias such as smollm2-135m)")
        if self.attention_logit_scaling_a is not None and not self.attention_logit_scaling_a > 1:
            raise ValueError(f"--logit-scaling-a must be > 1 or off, got {self.attention_logit_scaling_a:g}")
        if not (self.run / f"{STAGES.index('data'):02d}-data").is_dir():
            raise ValueError(f"{self.run} is not a conversion folder (no 00-data/ in it)")
        self._check_target()
        return self._finished_stages()

    def _check_target(self) -> None:
        to, run = self.to.resolve(), self.run.resolve()
        if to == run or run in to.parents:
            raise ValueError(f"--to {self.to} is inside the conversion folder {self.run}; a snapshot does not change "
                             f"the run: choose a folder outside it")
        if to.exists() and not to.is_dir():
            raise ValueError(f"--to {self.to} is a file; choose a new folder")
        if to.is_dir() and any(to.iterdir()):
            raise ValueError(f"--to {self.to} exists and is not empty; choose a new folder, or delete it")

    def _finished_stages(self) -> dict[str, dict]:
        """Every stage up to `stage` complete, each made from the one before it as recorded (the settings hashes
        chain, as a resume checks them)."""
        manifests, upstream = {}, ""
        for name in STAGES[: STAGES.index(self.stage) + 1]:
            stage = Stage(self.run, name, {}, {})
            manifest = stage.read_manifest()
            if manifest is None or manifest.get("status") != "complete":
                raise ValueError(f"the {name} stage of {self.run} has not finished ({stage.manifest_path} "
                                 f"{'is missing' if manifest is None else 'is not complete'}); run the conversion "
                                 f"up to it first (hyla convert ... --until-stage {self.stage})")
            settings = manifest.get("settings")
            if not isinstance(settings, dict):
                raise ValueError(f"{stage.manifest_path} records no settings (made by an earlier hyla): the student's "
                                 f"options cannot be read from it")
            if settings.get("upstream") != upstream:
                raise ValueError(f"{stage.path} was not made from the {STAGES[stage.index - 1]} stage now in "
                                 f"{self.run} (their recorded settings do not chain); redo it with --from-stage {name}")
            upstream = settings_hash(settings)
            manifests[name] = manifest
        return manifests


def recorded_build_options(manifests: dict[str, dict]) -> dict[str, Any]:
    """`build_student`'s options as the run recorded them: the RNN mixer and twin options of the align stage's
    settings, the attention RoPE flag of the distill stage's (`ConvertPlan.student_options`, by
    `hyla.convert.pipeline.stage_settings`)."""
    align, distill = manifests["align"]["settings"], manifests["distill"]["settings"]
    return {"rnn_mixer": align.get("rnn_mixer", "lightning"), **align["twins"],
            "attention_rope": distill["attention_rope"]}


def check_teacher(recorded: dict, current: dict, request: SnapshotRequest) -> None:
    """The recorded teacher fingerprint against `--teacher`'s (from its config alone, or with its weights)."""
    differ = sorted(key for key in set(recorded) & set(current) if recorded[key] != current[key])
    if differ:
        raise ValueError(f"{request.run} was converted from another teacher than {request.teacher} ({', '.join(differ)}"
                         f" differ: {recorded.get('family')}, {recorded.get('num_layers')} layers recorded); give the "
                         f"--teacher it was converted from")


def _scaling_line(scaling: float | None, trained: float | None) -> str:
    """The card's logit-scaling line: the snapshot's a against the a the stage trained with (None: off)."""
    if scaling == trained:
        return "off, as the stage trained" if scaling is None else f"{scaling:g}, as the stage trained"
    given = "off" if scaling is None else f"{scaling:g}"
    how = "without" if trained is None else f"with a = {trained:g} (`--logit-scaling-a {trained:g}` gives that)"
    return f"{given}, set by the snapshot (the stage trained {how})"


def snapshot_card(report: dict) -> str:
    stage, stages = report["stage"], report["stages"]
    scaling = report["attention_logit_scaling_a"]
    trained_a = report["stage_settings"][stage].get("budget", {}).get("logit_scaling_a")
    lines = [
        "---", "library_name: transformers", "tags: [hyla, hypenet, hybrid-linear-attention, intermediate-checkpoint]",
        "---", "",
        f"# HypeNet from `{report['teacher']}`: the student after the `{stage}` stage (an intermediate checkpoint)", "",
        f"The student of a HALO conversion (`hyla convert`) as its `{stage}` stage left it "
        f"({WHAT_THE_STAGE_IS[stage]}), written by `hyla convert snapshot` from the conversion folder "
        f"`{report['run']}`. **Not the converted model**: that is the export stage's folder (`06-export`), after "
        "every stage and with the logit scaling the scaling stage chose. Load with `import hyla` then "
        "`AutoModelForCausalLM.from_pretrained(folder)`.", "",
        f"- attention layers kept (NoPE, output-gated): {stages['select'].get('chosen')} by "
        f"`{stages['select'].get('method')}`",
        f"- the other layers: `{report['build_options']['rnn_mixer']}`",
        "- logit scaling a: " + _scaling_line(scaling, trained_a), "",
        *training_table(stages, [name for name in ("align", "distill", "finetune") if name in stages]),
        "", "What the snapshot read and how it was made: `snapshot.json`.", "",
    ]
    return "\n".join(lines)


def snapshot(request: SnapshotRequest, log=print) -> dict[str, Any]:
    """Write the stage's student to `request.to` (model, tokenizer, README.md, snapshot.json); returns what was
    written."""
    manifests = request.check()
    stages = {name: Stage(request.run, name, manifest["settings"], manifest["teacher"])
              for name, manifest in manifests.items()}
    for name, file_name in (("align", "twins.safetensors"), (request.stage, "student.safetensors")):
        check_weights_file(stages[name].path / file_name, name)
    options = recorded_build_options(manifests)
    recorded_teacher = manifests[request.stage]["teacher"]
    config = load_teacher_config(request.teacher)
    check_teacher(recorded_teacher, teacher_fingerprint(config), request)
    results = manifests[request.stage]["results"]
    scaling = "off" if request.attention_logit_scaling_a is None else f"{request.attention_logit_scaling_a:g}"
    log(f"snapshot: the {request.stage} stage of {request.run} ({results.get('steps')} steps, "
        f"{results.get('tokens', 0):,} tokens{', skipped: the distilled weights' if results.get('skipped') else ''}); "
        f"attention at {manifests['select']['results']['chosen']}, "
        f"{', '.join(f'{key} {value}' for key, value in options.items())}, logit scaling {scaling} -> {request.to}")
    hf_teacher, tokenizer = load_teacher(request.teacher, config=config)
    check_teacher(recorded_teacher, teacher_fingerprint(hf_teacher), request)
    student = stage_student(hf_teacher, stages, request.stage, **options,
                            attention_logit_scaling_a=request.attention_logit_scaling_a).float()
    report = {"stage": request.stage, "intermediate": True, "run": str(request.run.resolve()),
              "teacher": request.teacher, "teacher_fingerprint": recorded_teacher, "build_options": options,
              "attention_logit_scaling_a": request.attention_logit_scaling_a,
              "layer_types": student.config.layer_types,
              "weights": str(stages[request.stage].path.resolve() / "student.safetensors"),
              "stages": {name: manifest["results"] for name, manifest in manifests.items()},
              "stage_settings": {name: manifest["settings"] for name, manifest in manifests.items()},
              **run_metadata({"stage": request.stage, "logit_scaling_a": request.attention_logit_scaling_a})}
    with staging_folder(request.to) as staging:
        student.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        write_json(staging / "snapshot.json", report)
        write_atomic(staging / "README.md", snapshot_card(report).encode())
    return {"to": str(request.to), "stage": request.stage, "layer_types": report["layer_types"],
            "attention_logit_scaling_a": request.attention_logit_scaling_a}

