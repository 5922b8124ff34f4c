"""`hyla convert`: the HALO conversion of a pretrained Transformer into a HypeNet hybrid."""

from __future__ import annotations

import argparse
from pathlib import Path

from hyla.convert.presets import PRESETS
from hyla.convert.stages import STAGES
from hyla.evals.cli import _scaling_a


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a Transformer into a HypeNet hybrid (HALO)",
        description="HALO: align Lightning twins, select attention layers, distil, fine-tune long, choose the "
        "logit scaling, export an HF folder. Resumable: rerun the same command to continue.",
    )
    parser.add_argument("verb", nargs="?", choices=("run", "select", "reselect", "snapshot", "check-branch"),
                        default="run",
                        help="run: the whole pipeline (default); select: stop after layer selection (its report: "
                        "OUT/02-select/selection.json, .png); reselect: the noise-aware rule applied again to OUT's "
                        "recorded selection scores, no scoring (OUT/reselect/, options below); snapshot: a finished "
                        "training stage's student as an HF model folder, from OUT's records, no training (options "
                        "below); check-branch: whether a branch (--from-stage S with the arguments after --branch "
                        "added) can start from the stages before S of a conversion made with these arguments, "
                        "without loading the teacher or writing anything")
    parser.add_argument("--teacher", default=None,
                        help="HF folder, hub id, GGUF file, or alias (smollm2-135m); required but for reselect, "
                        "where it measures the teacher's output energies for runs whose alignment did not log them; "
                        "for snapshot, the teacher OUT was converted from (checked against its fingerprint)")
    parser.add_argument("--out", required=True, type=Path, help="output folder (stage folders + final model)")
    parser.add_argument("--preset", default="smoke", choices=PRESETS, help="budget preset (default: smoke)")
    parser.add_argument("--data", action="append", default=None,
                        help="text source (repeatable): stdlib, a folder/glob/file, hf:NAME, teacher:SPEC, an offline "
                        "text (hotpotqa, aa-lcr, perl-doc, ...), or a prepared corpus folder (default: the preset's "
                        "data.sources, else stdlib)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override a plan number, e.g. distill.lr=3e-5, align.tokens=2e6, selection.method=uniform")
    parser.add_argument("--select", default=None, metavar="METHOD",
                        help="layer selection: halo, jet-nemotron, kl-ls, uniform, latter-half, or a list like 3,7,11")
    parser.add_argument("--from-stage", choices=STAGES, help="redo this stage and the ones after it")
    parser.add_argument("--until-stage", choices=STAGES, help="stop after this stage")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--seed", type=int, default=0)
    reselect = parser.add_argument_group("reselect")
    reselect.add_argument("--noise-z", type=float, default=2.0, help="noise threshold in standard errors (default 2)")
    reselect.add_argument("--k", type=int, default=None, help="attention layers to keep (default: the recorded k)")
    reselect.add_argument("--energy-data", default=None, metavar="CORPUS",
                          help="prepared corpus the teacher's output energies are measured on (with --teacher)")
    reselect.add_argument("--energy-batches", type=int, default=4)
    reselect.add_argument("--energy-shape", default="4x512", metavar="BATCHxSEQ")
    reselect.add_argument("--report-dir", type=Path, default=None, help="report folder (default OUT/reselect)")
    snapshot = parser.add_argument_group("snapshot")
    snapshot.add_argument("--stage", default=None,
                          help="the finished stage whose student to write: distill (03-distill: before the long "
                          "fine-tuning) or finetune (04-finetune: before the scaling stage chooses a)")
    snapshot.add_argument("--to", type=Path, default=None,
                          help="the model folder to write (new, or empty; outside OUT), whole or not at all")
    snapshot.add_argument("--logit-scaling-a", type=_scaling_a, default=None, metavar="A|off",
                          help="the attention logit scaling constant saved in the model (default off: stages 2 and "
                          "3 train without it unless STAGE.logit_scaling_a was set, which the snapshot's README "
                          "names; the scaling stage chooses a after them)")
    branch = parser.add_argument_group("check-branch")
    branch.add_argument("--branch", nargs=argparse.REMAINDER, default=None, metavar="ARGS",
                        help="the branch's own arguments (--set, --data, --select, --seed), after the common ones; "
                        "the rest of the command line")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from hyla.convert.pipeline import ConvertRequest, convert

    if args.verb == "reselect":
        return _reselect(args)
    if args.verb == "snapshot":
        return _snapshot(args)
    if args.verb == "check-branch":
        return _check_branch(args)
    if args.branch is not None:
        raise ValueError("--branch belongs to check-branch (hyla convert check-branch ... --from-stage S --branch ARGS)")
    if args.teacher is None:
        raise ValueError("--teacher is required (HF folder, hub id, GGUF file, or alias such as smollm2-135m)")
    overrides = _overrides(args)
    convert(ConvertRequest(
        teacher=args.teacher, out=args.out, preset=args.preset, data=args.data, overrides=overrides,
        from_stage=args.from_stage, until_stage="select" if args.verb == "select" else args.until_stage,
        device=args.device, seed=args.seed,
    ))
    return 0


def _overrides(args: argparse.Namespace) -> list[str]:
    return list(args.overrides) + ([f"selection.method={args.select}"] if args.select else [])


def _check_branch(args: argparse.Namespace) -> int:
    from hyla.convert.pipeline import ConvertRequest, branch_conflicts

    if args.from_stage is None or args.branch is None:
        raise ValueError("check-branch needs --from-stage STAGE and --branch ARGS... (the branch's own arguments, "
                         "last; none: --branch alone)")
    own = argparse.ArgumentParser(prog="hyla convert check-branch --branch", add_help=False, allow_abbrev=False)
    own.add_argument("--set", dest="overrides", action="append", default=[])
    own.add_argument("--data", action="append", default=None)
    own.add_argument("--select", default=None)
    own.add_argument("--seed", type=int, default=None)
    extra, unknown = own.parse_known_args(args.branch)
    if unknown:
        raise ValueError(f"--branch: {' '.join(unknown)}: a branch's arguments are --set, --data, --select, --seed")
    base = ConvertRequest(teacher=args.teacher or "", out=args.out, preset=args.preset, data=args.data,
                          overrides=_overrides(args), seed=args.seed)
    branch = ConvertRequest(teacher=args.teacher or "", out=args.out, preset=args.preset,
                            data=[*(args.data or []), *(extra.data or [])] or None,
                            overrides=_overrides(args) + _overrides(extra), from_stage=args.from_stage,
                            seed=args.seed if extra.seed is None else extra.seed)
    conflicts = branch_conflicts(base, branch, args.device)
    if conflicts:
        first = next(iter(conflicts))
        raise ValueError(
            f"a branch from {args.from_stage} takes over stages {', '.join(conflicts)} unchanged, but its arguments "
            f"change their settings ({first}: {conflicts[first]}; 'then' is the base's value, 'now' the branch's): "
            f"set the value in the common arguments, or branch from {first}")
    print(f"branch from {args.from_stage}: the stages before it have the same settings as the base's")
    return 0


def _reselect(args: argparse.Namespace) -> int:
    from hyla.convert.reselect import ReselectRequest, reselect

    try:
        shape = tuple(int(part) for part in args.energy_shape.split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 2:
        raise ValueError(f"--energy-shape: expected BATCHxSEQ like 4x512, got {args.energy_shape!r}")
    result = reselect(ReselectRequest(run=args.out, out=args.report_dir, noise_z=args.noise_z, k=args.k,
                                      teacher=args.teacher, energy_data=args.energy_data,
                                      energy_batches=args.energy_batches, energy_shape=shape))
    print(f"recorded {result['recorded_chosen']} | noise-aware (alignment tie-break) "
          f"{result['noise_aware_alignment_tie_break']} | noise-aware (raw-s tie-break) "
          f"{result['noise_aware_halo_tie_break']}; wrote {result['out']}")
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    from hyla.convert.snapshot import SnapshotRequest, snapshot

    for flag, value in (("--stage", args.stage), ("--to", args.to)):
        if value is None:
            raise ValueError(f"snapshot needs {flag} (hyla convert snapshot --out RUN --stage distill --to DIR "
                             f"--teacher SPEC)")
    result = snapshot(SnapshotRequest(run=args.out, stage=args.stage, to=args.to, teacher=args.teacher,
                                      attention_logit_scaling_a=None if args.logit_scaling_a == "off"
                                      else args.logit_scaling_a))
    layers = result["layer_types"]
    print(f"wrote {result['to']}: the {result['stage']} stage's student ({layers.count('attention')} attention layers "
          f"of {len(layers)})")
    return 0
