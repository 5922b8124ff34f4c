"""`hyla convert`: HALO end to end, as numbered stage folders that hand off by directory (docs/method.md, "HALO
conversion")."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hyla.convert.data import prepared_corpus, scaling_documents
from hyla.convert.export import run_export
from hyla.convert.presets import ConvertPlan, apply_overrides, check_plan_for_teacher, make_plan
from hyla.convert.recipes import scale_tokens
from hyla.convert.runners import Run, check_stage_inputs, run_align, run_data, run_distill, run_finetune
from hyla.convert.scaling import run_scaling
from hyla.convert.select_stage import run_select
from hyla.convert.stages import STAGES, Stage, settings_differences, settings_hash
from hyla.train.distributed import barrier, exclusive_run_folder, init_distributed
from hyla.train.divergence import TrainingDiverged
from hyla.train.fast import check_kl_kernel, resolve_bf16_activations, resolve_fast_path, resolve_teacher_bf16

RUNNERS = {"data": run_data, "align": run_align, "select": run_select, "distill": run_distill,
           "finetune": run_finetune, "scaling": run_scaling, "export": run_export}


@dataclass
class ConvertRequest:
    teacher: str
    out: Path
    preset: str = "smoke"
    data: list[str] | None = None  # None: the preset's data.sources, else stdlib
    overrides: list[str] = field(default_factory=list)
    from_stage: str | None = None
    until_stage: str | None = None
    device: str | None = None
    seed: int = 0


def _check_stage_name(name: str | None, flag: str) -> None:
    if name is not None and name not in STAGES:
        raise ValueError(f"{flag} {name!r} is not a stage; stages: {', '.join(STAGES)}")


def stage_settings(plan: ConvertPlan, request: ConvertRequest) -> dict[str, dict]:
    """What each stage's output depends on, chained so that a change upstream invalidates what follows."""
    if prepared_corpus(request.data) is not None:
        # A prepared corpus is used as it is: the stage budgets do not change it.
        data = {"corpus": str(prepared_corpus(request.data)), "heldout": plan.heldout_tokens, "seed": plan.seed}
    else:
        data = {"sources": request.data, "tokens": plan.data_tokens, "heldout": plan.heldout_tokens, "seed": plan.seed}
        if plan.data.weights:
            data["weights"] = plan.data.weights
    data.update(plan.data.settings())
    if plan.data.long_sources:
        data["long_tokens"] = plan.long_data_tokens
    align = {"budget": plan.align.settings(), "twins": plan.twin_options(),
             "init": {"mode": plan.model.twin_init, "batches": plan.model.twin_init_batches}}
    if plan.model.rnn_mixer != "lightning":  # Lightning runs keep their hash
        align["rnn_mixer"] = plan.model.rnn_mixer
    own = {
        "data": data,
        "align": align,
        "select": {"plan": plan.selection.__dict__},
        "distill": {"budget": plan.distill.settings(), "attention_rope": plan.model.attention_rope,
                    **({"align_attention": plan.attn_align.settings()} if plan.model.align_attention else {})},
        "finetune": {"budget": plan.finetune.settings()},
        "scaling": {"plan": plan.scaling.settings()}, "export": {},
    }
    settings, upstream = {}, ""
    for name in STAGES:
        settings[name] = {**own[name], "upstream": upstream}
        upstream = settings_hash(settings[name])
    return settings


def resolve_plan(request: ConvertRequest, num_params: int,
                 device: torch.device) -> tuple[ConvertPlan, ConvertRequest]:
    """The plan a conversion runs for `request` with a teacher of `num_params` parameters on `device` (the preset,
    the overrides, the token scale, the seed; the frozen teacher's precision and the hybrid's activations resolved
    for the device, None: bf16 on CUDA, as the stages' hashes hold them), and the request with its data sources
    filled in."""
    plan = scale_tokens(apply_overrides(make_plan(request.preset, num_params), request.overrides))
    plan.seed = request.seed
    for budget in (plan.align, plan.distill):
        budget.teacher_bf16 = resolve_teacher_bf16(budget.teacher_bf16, device)
    for budget in (plan.distill, plan.finetune):
        budget.bf16_activations = resolve_bf16_activations(budget.bf16_activations, device)
    return plan, dataclasses.replace(request, data=request.data or plan.data.sources or ["stdlib"])


def planned_settings(request: ConvertRequest, device: str | None = None) -> dict[str, dict]:
    """Each stage's settings (`stage_settings`) as `hyla convert` would resolve them for `request` on `device`,
    without loading the teacher: the budgets are the preset's for a teacher of unknown size (the recipes' do not
    depend on it; the paper presets' scale alike on both sides of a comparison)."""
    where = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return stage_settings(*resolve_plan(request, 0, where))


def branch_conflicts(base: ConvertRequest, branch: ConvertRequest, device: str | None = None) -> dict[str, str]:
    """The stages a branch takes over from its base conversion (those before `branch.from_stage`) whose settings
    differ between the two, each with what differs in it: a `hyla convert --from-stage` in a folder holding the
    base's stages would refuse them after loading the teacher (`Stage.check_compatible`). Empty: the branch can
    start from the base's stages."""
    if branch.from_stage is None:
        raise ValueError("a branch starts from a stage: give --from-stage")
    _check_stage_name(branch.from_stage, "--from-stage")
    ours, theirs = planned_settings(base, device), planned_settings(branch, device)
    conflicts = {}
    for name in STAGES[: STAGES.index(branch.from_stage)]:
        if settings_hash(ours[name]) != settings_hash(theirs[name]):
            conflicts[name] = settings_differences(ours[name], theirs[name])
    return conflicts


def print_plan(run: Run, num_params: int) -> None:
    from rich.console import Console
    from rich.table import Table

    plan, env = run.plan, run.env
    config = run.hf_teacher.config
    table = Table(title=f"hyla convert: {run.teacher_spec} -> HypeNet (preset {plan.preset})")
    for column in ("stage", "tokens", "steps", "seq", "batch", "lr"):
        table.add_column(column)
    for name in ("align", "attn_align", "distill", "finetune"):
        if name == "attn_align" and not plan.model.align_attention:
            continue
        b = getattr(plan, name)
        if name == "finetune" and plan.finetune_skipped:
            table.add_row(name, "0 (skipped)", "0", "-", "-", "-")
            continue
        table.add_row(name, f"{b.steps * b.seq_len * b.batch_size:,}", str(b.steps), str(b.seq_len),
                      str(b.batch_size), f"{b.lr:g}->{b.min_lr:g} {b.schedule}")
    console = Console(stderr=True)
    console.print(
        f"teacher {config.model_type}: {num_params / 1e6:.1f}M params, {config.num_hidden_layers} layers, "
        f"{config.num_attention_heads} heads / {config.num_key_value_heads} KV heads | device {env.device} "
        f"x{env.world_size} | data {', '.join(run.data_sources)}"
    )
    console.print(table)
    s = plan.selection
    model = plan.model
    console.print(f"student: {student_mixer_text(model)}, attention {'RoPE' if model.attention_rope else 'NoPE'}")
    scaling_on = plan.scaling.data or ", ".join(plan.data.scaling_sources) or "the held-out tail"
    console.print(f"select: {s.method}, k={s.k or config.num_hidden_layers // 4}, NIAH {s.niah_tasks} at "
                  f"{s.niah_lengths} x{s.niah_samples}, CSR {s.csr_tasks} limit {s.csr_limit}, gaps below "
                  f"{s.noise_z:g} se count as 0 | scaling a in {plan.scaling.candidates} at {plan.scaling.length} "
                  f"tokens on {scaling_on}{scaling_recall_text(plan.scaling)} | twin init {model.twin_init}"
                  + (" | attention alignment before distillation" if model.align_attention else ""))
    if plan.data.long_sources:
        console.print(f"stage 3 data: {', '.join(plan.data.long_sources)}")


def scaling_recall_text(scaling) -> str:
    """The scaling stage's recall documents and criterion as `print_plan` names them ("" when there are none)."""
    if scaling.recall_source is None:
        return ""
    return (f", recall documents {scaling.recall_docs} x {scaling.recall_lengths or [scaling.length]} tokens on "
            f"{scaling.recall_source}, chosen by {'answer' if scaling.criterion == 'recall' else 'held-out'} loss")


def student_mixer_text(model) -> str:
    """The non-attention layers as `print_plan` names them."""
    if model.rnn_mixer == "lightning":
        return (f"Lightning RoPE {'on' if model.lightning_rope else 'off'}, Lightning q/k norm "
                f"{'on' if model.lightning_qk_norm else 'off'}")
    if model.rnn_mixer == "swa":
        return f"SWA layers (the teacher's attention, RoPE, window {model.swa_window}; no alignment)"
    rope = "RoPE on" if getattr(model, f"{model.rnn_mixer}_rope") else "no RoPE"
    return f"{model.rnn_mixer.upper()} layers (gates start at Lightning's decay, {rope})"


def check_data_sources(plan: ConvertPlan, request: ConvertRequest) -> None:
    """Every text source the data stage will read is there (a folder, an offline text in the text cache, ...),
    checked before the teacher loads; a complete data stage reads none, and `hf:` datasets are opened when read."""
    from hyla.data.sources import open_source

    redo = request.from_stage == "data"
    if not redo and Stage(Path(request.out), "data", {}, {}).manifest_path.is_file():
        return
    main = request.data or plan.data.sources or ["stdlib"]
    for sources in (main, plan.data.long_sources, plan.data.scaling_sources):
        if prepared_corpus(sources) is not None:
            continue
        for spec in sources:
            if not spec.startswith("hf:"):
                open_source(spec)


def convert(request: ConvertRequest) -> dict:
    """Run (or resume) a conversion; returns the results of every stage. Every setting is checked before the teacher
    loads, and the run folder is locked against a second writer."""
    from hyla.models.loading import resolve_spec

    _check_stage_name(request.from_stage, "--from-stage")
    _check_stage_name(request.until_stage, "--until-stage")
    # Settings are checked before the teacher loads (the teacher's size only scales the paper presets' budgets).
    early = scale_tokens(apply_overrides(make_plan(request.preset, 0), request.overrides))
    if early.scaling.data is not None:  # read only at the end: check it now
        scaling_documents(early.scaling)
    if early.scaling.recall_source is not None and "hf:" not in early.scaling.recall_source:
        from hyla.data.sources import open_source

        open_source(early.scaling.recall_source)  # the recall documents' text, read only at the end: check it now
    check_data_sources(early, request)
    resolve_spec(request.teacher, role="teacher")  # an unknown name fails here, before anything is written
    env = init_distributed(request.device)
    with exclusive_run_folder(Path(request.out), env):
        return _convert_locked(request, early, env)


def _convert_locked(request: ConvertRequest, early: ConvertPlan, env) -> dict:
    from hyla.models.loading import load_teacher, load_teacher_config, teacher_fingerprint
    from hyla.models.transfer import check_full_attention

    teacher_config = load_teacher_config(request.teacher)
    check_full_attention(teacher_config, request.teacher)
    check_plan_for_teacher(early, teacher_config.num_hidden_layers)
    if early.distill.kl_kernel is not None:  # None: the device's default (hyla.train.fast.resolve_fast_path)
        check_kl_kernel(early.distill.kl_kernel, device=env.device, setting="distill.kl_kernel")
    if early.align.cuda_graphs:  # what stage 1 would resolve, refused now rather than after the stages before it
        resolve_fast_path(compile=early.align.compile, fused_loss=None, fused_optimizer=None, micro_batch_size=None,
                          device=env.device, whole_blocks=early.align.whole_blocks, cuda_graphs=True)
    hf_teacher, tokenizer = load_teacher(request.teacher, device=env.device, config=teacher_config)
    num_params = sum(p.numel() for p in hf_teacher.parameters())
    plan, request = resolve_plan(request, num_params, env.device)
    fingerprint = teacher_fingerprint(hf_teacher)
    settings = stage_settings(plan, request)
    stages = {name: Stage(Path(request.out), name, settings[name], fingerprint) for name in STAGES}
    log = print if env.is_main else (lambda *a, **k: None)
    run = Run(request.teacher, hf_teacher, tokenizer, plan, env, stages, request.data, log=log)
    if env.is_main:
        print_plan(run, num_params)
    first = STAGES.index(request.from_stage) if request.from_stage else 0
    last = STAGES.index(request.until_stage) if request.until_stage else len(STAGES) - 1
    results = {}
    for index, name in enumerate(STAGES[: last + 1]):
        stage = stages[name]
        if index >= first and env.is_main and request.from_stage:
            stage.remove()
        barrier(env)
        stage.check_compatible()
        if stage.complete:
            log(f"[{name}] complete: {stage.path} (skipped)")
            results[name] = stage.read_manifest()["results"]
            continue
        # What the stage reads from the stages before it, checked before its folder is made.
        check_stage_inputs(run, name)
        started = time.perf_counter()
        log(f"[{name}] start -> {stage.path}")
        if env.is_main:
            stage.begin()
        barrier(env)
        # Every stage starts from the same random state, whether the run is fresh or resumed.
        torch.manual_seed(plan.seed * 1000 + index)
        try:
            results[name] = RUNNERS[name](run, stage)
        except TrainingDiverged as err:
            raise TrainingDiverged(f"{err}{_diverged_advice(name)}") from None
        if env.is_main:
            stage.finish({**results[name], "seconds": round(time.perf_counter() - started, 1)})
        barrier(env)
        log(f"[{name}] done in {time.perf_counter() - started:.1f} s")
    if env.is_main:
        print_summary(results, stages)
    return results


def _diverged_advice(name: str) -> str:
    """How to go on after stage `name` diverged: its settings change, so the stage is redone from its start."""
    budget = {"align": "align", "select": "distill", "distill": "distill", "finetune": "finetune"}.get(name)
    if budget is None:
        return ""
    return (f" (--set {budget}.lr=...), then rerun with --from-stage {name}; the stages before it are kept")


def print_summary(results: dict, stages: dict[str, Stage]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="conversion summary")
    table.add_column("stage")
    table.add_column("result")
    for name, result in results.items():
        if result.get("skipped"):
            text = f"skipped: the weights of {result['weights_from']} unchanged"
        elif name in ("align", "distill", "finetune"):
            text = (f"{result['steps']} steps, {result['tokens']:,} tokens, loss "
                    f"{result['first'].get('loss', float('nan')):.4g} -> {result['last'].get('loss', float('nan')):.4g}")
        elif name == "select":
            text = f"{result['method']}: attention at {result['chosen']}"
        elif name == "scaling":
            text = f"a = {result['chosen_a']}"
        elif name == "export":
            text = f"model folder {stages[name].resolve(result['model'])}"
        else:
            text = f"{result.get('num_tokens', 0):,} tokens in {stages[name].resolve(result['corpus'])}"
        table.add_row(name, text)
    Console(stderr=True).print(table)
