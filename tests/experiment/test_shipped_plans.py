"""Every plan in configs/experiments/ loads in each of its profiles, and each of its hyla commands parses; the
SmolLM2 plan is the recorded headline run; the budget helper plans that run's distillation tokens."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from experiment_helpers import PLANS

from hyla.cli import build_parser
from hyla.cli import main as hyla_main
from hyla.convert.presets import apply_overrides, make_plan
from hyla.evals.cli import _parse_length
from hyla.experiment.budget import convert_settings, distill_tokens
from hyla.experiment.plan import keep_only, load_plan, read_plan_file

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "smollm2-135m"
REQUIRED = ["text=/data/text"]


def cases():
    for path in PLANS:
        for profile in [None, *read_plan_file(path).get("profiles", {})]:
            yield pytest.param(path, profile, id=f"{path.stem}-{profile or 'default'}")


def test_plans_are_shipped():
    assert {path.stem for path in PLANS} >= {"smollm2", "smollm2-ablations", "seed-003", "halo-smollm2",
                                             "seed003-smollm2"}


@pytest.mark.parametrize("path, profile", list(cases()))
def test_every_hyla_command_of_a_shipped_plan_parses(tmp_path, path, profile):
    plan = load_plan(path, tmp_path, profile=profile, overrides=REQUIRED)
    parser = build_parser()
    for job in plan.jobs.values():
        if job.run is not None and job.run[0] == "hyla":
            args = parser.parse_args(list(job.run[1:]))
            assert getattr(args, "handler", None), job.name
    assert "report" in plan.jobs and plan.jobs["report"].always


def _sets(argv: tuple[str, ...]):
    items = [value for flag, value in zip(argv, argv[1:]) if flag == "--set"]
    preset = argv[argv.index("--preset") + 1]
    return apply_overrides(make_plan(preset, 0), items)


def test_the_smollm2_plan_is_the_recorded_headline_run(tmp_path):
    """Run 2 of docs/results/smollm2-135m.md, as the driver of that day built it (its driver.log lists the jobs)."""
    plan = load_plan(PLANS[[p.stem for p in PLANS].index("smollm2")], tmp_path,
                     overrides=["text=/root/keep/text", "teacher=/root/keep/smol.gguf"])
    recorded = [line.split()[-1] for line in (RESULTS / "run2" / "driver.log").read_text().splitlines()
                if " start " in line]
    renamed = {"convert-select": "convert", "convert-main": "convert"}
    assert {renamed.get(name, name) for name in recorded} | {"report"} == set(plan.jobs)
    corpus = plan.jobs["corpus"].run
    sources = [corpus[i + 1] for i, item in enumerate(corpus) if item == "--source"]
    assert sources == ["/root/keep/text", "recall@1000-12000:/root/keep/text", "stdlib"]
    assert corpus[corpus.index("--weights") + 1] == "3,1,1"
    assert corpus[corpus.index("--max-tokens") + 1] == "200000000"
    convert = _sets(plan.jobs["convert"].run)
    assert (convert.preset, convert.distill.tokens, convert.distill.seq_len, convert.distill.batch_size) == (
        "quick", 23_740_416, 4096, 4)
    assert convert.finetune.tokens == 4_000_000 and convert.selection.method == "0,1,7,16,18,19,23"
    # The published conversion's own record of its plan says the same.
    manifest = json.loads((RESULTS / "run2" / "summary.json").read_text())["conversions"]["main"]["stages"]
    assert manifest["03-distill"]["tokens"] == convert.distill.tokens
    long = plan.jobs["niah-main-off-SK2-long"].run
    assert long[long.index("--lengths") + 1] == "32K,64K" and long[-2:] == ("--logit-scaling-a", "off")
    assert plan.jobs["niah-main-SK1-short"].needs == ("convert",)
    assert plan.jobs["csr-teacher"].needs == ("teacher-check",)
    assert plan.jobs["convert"].kind == "train" and plan.train_slots == 1


def test_the_recipe_plan_trains_the_presets_budget_on_the_fast_path_and_evaluates_both_models(tmp_path):
    from hyla.convert.presets import SPEED_ONLY
    from hyla.convert.recipes import scale_tokens

    plan = load_plan(PLANS[[p.stem for p in PLANS].index("halo-smollm2")], tmp_path)
    command = plan.jobs["convert"].run
    convert = scale_tokens(_sets(command))
    recipe = make_plan("halo-smollm2", 135_000_000)
    for stage in ("align", "distill", "finetune"):
        assert getattr(convert, stage) == getattr(recipe, stage), stage  # the preset's budget, untouched
    assert convert.align.tokens + convert.distill.tokens + convert.finetune.tokens == 250_000_000
    assert "--data" not in command and convert.data == recipe.data  # the recipe's own corpora
    assert convert.selection.method == "halo" and command[command.index("--device") + 1] == "cuda"
    # The fast path is the CUDA default: the plan sets none of its switches.
    assert not [item for item in command if any(f".{name}=" in item for name in SPEED_ONLY)]
    assert plan.jobs["convert"].env["HYLA_TEXT_DIR"] == "~/.cache/hyla/text" and plan.train_slots == 1
    cells = set()
    for name, job in plan.jobs.items():
        if name.startswith("niah-") and not name.startswith(("niah-scaling-", "niah-samples")):
            run = job.run
            assert run[run.index("--num-samples") + 1] == "25"
            # the hybrid's jobs read the prompts its teacher's built (one tokenizer)
            assert run[run.index("--samples-cache") + 1] == f"{tmp_path}/niah-samples"
            lengths = run[run.index("--lengths") + 1].split(",")
            cells |= {(name.split("-")[1], run[run.index("--tasks") + 1], length) for length in lengths}
    assert cells == {(model, task, length) for model in ("teacher", "main") for task in ("SK1", "SK2", "SK3")
                     for length in ("4K", "16K", "32K", "64K")} | {
        ("distill", task, length) for task in ("SK1", "SK2", "SK3") for length in ("4K", "16K")} | {
        ("compare", task, length) for task in ("SK1", "SK2", "SK3") for length in ("32K", "64K")}
    # the final model's long cells again under a second a (compare_a), its own option on the same export
    for task in ("SK1", "SK2", "SK3"):
        compare, main = plan.jobs[f"niah-compare-{task}-long"].run, plan.jobs[f"niah-main-{task}-long"].run
        assert compare[compare.index("--logit-scaling-a") + 1] == "5000" and "--logit-scaling-a" not in main
        assert compare[compare.index("--model") + 1] == main[main.index("--model") + 1]
    for model in ("teacher", "main"):
        csr = plan.jobs[f"csr-{model}"].run
        assert csr[csr.index("--limit") + 1] == "500" and len(csr[csr.index("--tasks") + 1].split(",")) == 6
    assert plan.jobs["niah-main-SK1-long"].needs == ("convert", "niah-samples")
    # Every prompt the evaluations read is built once at the start, on the CPU, into their cache.
    samples = plan.jobs["niah-samples"].run
    assert samples[samples.index("--samples-cache") + 1] == f"{tmp_path}/niah-samples"
    assert samples[samples.index("--num-samples") + 1] == "25"
    assert {(task, length) for task in samples[samples.index("--tasks") + 1].split(",")
            for length in samples[samples.index("--lengths") + 1].split(",")} == {
        (task, length) for _, task, length in cells}
    assert all("niah-samples" in job.needs for name, job in plan.jobs.items()
               if name.startswith("niah-") and name != "niah-samples")
    # The scaling stage chooses a by loss alone; its NIAH report for every candidate runs as evaluations of the export
    # beside the others, with the recipe's grid and NIAH settings (the same numbers, off the conversion's path).
    assert convert.scaling.niah_samples == 0 and convert.scaling.candidates == recipe.scaling.candidates
    wanted = {"off": {"logit_scaling": "off"}} | {f"a{a:g}": {"logit_scaling_a": a} for a in recipe.scaling.candidates
                                                   if a is not None}
    wanted["cL"] = {"logit_scaling": "per_length", "logit_scaling_train_length": recipe.trained_seq_len}
    assert recipe.scaling.per_length and None in recipe.scaling.candidates
    jobs = {name.removeprefix("niah-scaling-"): job for name, job in plan.jobs.items()
            if name.startswith("niah-scaling-")}
    assert set(jobs) == set(wanted)
    for name, job in jobs.items():
        args = job.run
        assert job.needs == ("convert", "niah-samples") and args[args.index("--model") + 1].endswith("/main/06-export")
        niah_settings = (args[args.index("--tasks") + 1].split(","), args[args.index("--num-samples") + 1],
                         args[args.index("--max-new-tokens") + 1], args[args.index("--batch-size") + 1])
        assert niah_settings == (recipe.scaling.niah_tasks, str(recipe.scaling.niah_samples),
                                 str(recipe.scaling.niah_max_new_tokens), "1")
        lengths = [_parse_length(item) for item in args[args.index("--lengths") + 1].split(",")]
        assert lengths == recipe.scaling.niah_lengths
        options = _options_of(args)
        assert options == wanted[name], name
    # every job that waits for the conversion starts once it ends
    assert len([job for job in plan.jobs.values() if "convert" in job.needs]) == 21 <= plan.parallel
    assert not [name for name in plan.jobs if name.startswith("warm-")]  # the layers are chosen by the run itself
    # The conversion reads the teacher itself, not the check's folder: it runs beside the check, which can stop it.
    assert plan.jobs["convert"].needs == () and plan.jobs["convert"].checked_by == ("teacher-check",)
    assert "teacher-hf" not in " ".join(command)


def test_the_recipe_plan_evaluates_the_distilled_student_beside_the_final_model(tmp_path):
    plan = load_plan(PLANS[[p.stem for p in PLANS].index("halo-smollm2")], tmp_path)
    snapshot = build_parser().parse_args(list(plan.jobs["snapshot-distill"].run[1:]))
    assert (snapshot.verb, snapshot.stage, snapshot.logit_scaling_a) == ("snapshot", "distill", None)
    assert snapshot.out == tmp_path.resolve() / "main" and snapshot.to == tmp_path.resolve() / "main-distill"
    assert snapshot.teacher == plan.jobs["convert"].run[plan.jobs["convert"].run.index("--teacher") + 1]
    assert plan.jobs["snapshot-distill"].needs == ("convert",)
    for task in ("SK1", "SK2", "SK3"):
        distill, main = plan.jobs[f"niah-distill-{task}-short"], plan.jobs[f"niah-main-{task}-short"]
        assert distill.needs == ("snapshot-distill", "niah-samples")
        # The final model's command on the snapshot: the same prompts (samples cache), lengths and settings.
        renamed = (item.replace("/main/06-export", "/main-distill").replace("niah-main-", "niah-distill-")
                   for item in main.run)
        assert distill.run == tuple(renamed)
    off = load_plan(PLANS[[p.stem for p in PLANS].index("halo-smollm2")], tmp_path, overrides=["stage_evals=false"])
    assert set(plan.jobs) - set(off.jobs) == {"snapshot-distill", *(f"niah-distill-{task}-short" for task in
                                                                     ("SK1", "SK2", "SK3"))}
    off = load_plan(PLANS[[p.stem for p in PLANS].index("halo-smollm2")], tmp_path, overrides=["compare_a_evals=false"])
    assert set(plan.jobs) - set(off.jobs) == {f"niah-compare-{task}-long" for task in ("SK1", "SK2", "SK3")}


def test_the_h200_profile_compiles_every_evaluation_shape_on_a_stand_in_while_the_conversion_trains(tmp_path):
    """warm-convert builds the final model's architecture from the conversion's own command (a tiny budget on other
    text); warm-niah-* run one batch of every shape and inference setting the evaluations after the conversion run,
    so that those find torch.compile's cache warm."""
    from hyla.convert.recipes import scale_tokens

    plan = load_plan(PLANS[[p.stem for p in PLANS].index("halo-smollm2")], tmp_path, profile="h200")
    convert, warm = plan.jobs["convert"].run, plan.jobs["warm-convert"].run
    assert warm[:6] == ("nice", "-n", "15", plan.variables["python"], "-m", "hyla.cli")
    warm = ("hyla", *warm[6:])
    assert build_parser().parse_args(list(warm[1:])).handler
    main, stand_in = scale_tokens(_sets(convert)), scale_tokens(_sets(warm))
    # everything the exported config is made of is the conversion's
    assert stand_in.model == main.model and stand_in.selection.method == main.selection.method == "7,8,16,17,18,19,23"
    assert warm[warm.index("--teacher") + 1] == convert[convert.index("--teacher") + 1]
    assert stand_in.scaling.candidates == [10000.0] and stand_in.distill.tokens <= 2048
    assert stand_in.scaling.recall_lengths == [512] and stand_in.scaling.recall_docs == 1  # a few short documents
    assert not any(getattr(stand_in, stage).compile for stage in ("align", "distill", "finetune", "attn_align"))
    # with the attention alignment on (convert_args), the stand-in aligns a few thousand tokens, not the recipe's 5M
    aligned = load_plan(PLANS[[p.stem for p in PLANS].index("halo-smollm2")], tmp_path, profile="h200",
                        overrides=['convert_args=["--set","model.align_attention=true"]'])
    stand_in_aligned = scale_tokens(_sets(("hyla", *aligned.jobs["warm-convert"].run[6:])))
    assert stand_in_aligned.model.align_attention and stand_in_aligned.attn_align.tokens <= 2048
    assert scale_tokens(_sets(aligned.jobs["convert"].run)).attn_align.tokens == 5_000_000
    # it starts once the teacher's evaluations have ended (the GPU and the cores are the conversion's then)
    assert set(plan.jobs["warm-convert"].after) == {name for name in plan.jobs if name.endswith("-teacher")
                                                    or name.startswith("niah-teacher-")}

    def hyla_command(job):  # `nice -n 15 PYTHON -m hyla.cli ARGS` as `hyla ARGS`
        return ("hyla", *job.run[job.run.index("hyla.cli") + 1:]) if job.run[0] == "nice" else job.run

    def shape(job):
        args = build_parser().parse_args(list(hyla_command(job)[1:]))
        return args.batch_size, tuple(args.lengths), args.dtype, args.max_new_tokens

    warmed = {}
    for name, job in plan.jobs.items():
        if name.startswith("warm-niah-"):
            assert job.run[:3] == ("nice", "-n", "15")
            run = hyla_command(job)
            assert run[run.index("--model") + 1] == f"{tmp_path}/warm/main/06-export"
            options = _options_of(run)
            warmed.setdefault(shape(job), []).append(options)
    # each evaluation after the conversion: its shape warmed under its own settings; the final model's own (no
    # option: the a the scaling stage chooses) under every candidate
    candidates = [{"logit_scaling": "off"} if a is None else {"logit_scaling_a": a} for a in main.scaling.candidates]
    candidates.append({"logit_scaling": "per_length", "logit_scaling_train_length": main.trained_seq_len})
    checked = 0
    for name, job in plan.jobs.items():
        if name.startswith("niah-") and not name.startswith(("niah-teacher-", "niah-samples")):
            options = _options_of(job.run)
            assert shape(job) in warmed, name
            needed = candidates if not options else [{"logit_scaling": "off"} if "distill" in name else options]
            assert all(option in warmed[shape(job)] for option in needed), name
            checked += 1
    assert checked == 3 * 2 + 3 + 3 + len(candidates)
    off = load_plan(PLANS[[p.stem for p in PLANS].index("halo-smollm2")], tmp_path, profile="h200",
                    overrides=["warm_engine=false"])
    assert set(plan.jobs) - set(off.jobs) == {"warm-convert"} | {f"warm-niah-{name}-{span}" for span in ("long", "short")
                                                                 for name in ("off", "a1000", "a2000", "a3000",
                                                                              "a5000", "a10000", "a20000", "a100000",
                                                                              "cL")}


def _options_of(args) -> dict:
    """The inference options `hyla eval niah ARGS` runs under, as its command line parses them."""
    from hyla.evals.cli import _OVERRIDE_OPTIONS
    from hyla.evals.overrides import apply_inference_overrides
    from hyla.models import HypeNetConfig, HypeNetForCausalLM

    parsed = build_parser().parse_args(list(args[1:]))
    model = HypeNetForCausalLM(HypeNetConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                             num_attention_heads=1, num_key_value_heads=1, head_dim=8,
                                             layer_types=["attention"]))
    return apply_inference_overrides(model, **{name: getattr(parsed, name) for name in _OVERRIDE_OPTIONS})


def test_the_ablations_share_the_halo_runs_first_stages(tmp_path):
    plan = load_plan(PLANS[[p.stem for p in PLANS].index("smollm2-ablations")], tmp_path, overrides=REQUIRED)
    halo = _sets(plan.jobs["convert-abl-halo"].run)
    assert halo.selection.method == "0,1,7,16,18,19,23" and halo.distill.tokens == 6_000_000
    assert halo.scaling.data == f"{tmp_path.resolve()}/scaling-corpus"
    assert _sets(plan.jobs["convert-abl-uniform"].run).selection.method == "uniform"
    assert not _sets(plan.jobs["convert-abl-no-rnn-rope"].run).model.lightning_rope
    assert plan.jobs["convert-abl-no-rnn-rope"].needs == ("abl-no-rnn-rope-align",)
    assert [Path(p).name for p in plan.jobs["copy-abl-uniform"].copy["from"]] == ["00-data", "01-align"]
    assert plan.jobs["copy-abl-halo"].needs == ("convert-select",)


def test_the_budget_gives_the_recorded_runs_distillation_tokens(tmp_path, capsys):
    """DISTILL_SECONDS=420 at run 2's probed 56.5K tokens/s at 4x4096: 23,740,416 tokens."""
    path = PLANS[[p.stem for p in PLANS].index("smollm2")]
    plan = load_plan(path, tmp_path, overrides=REQUIRED)
    probe = json.loads((RESULTS / "run2" / "probe.json").read_text())
    preset, overrides = convert_settings(plan, "convert")
    assert distill_tokens(probe, 420, 80e6, preset, overrides) == plan.variables["distill_tokens"] == 23_740_416
    assert hyla_main(["experiment", "budget", str(path), "--set", REQUIRED[0], "--probe",
                      str(RESULTS / "run2" / "probe.json"), "--seconds", "420"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "23740416"


PROBE = {"cases": [{"stage": "distill", "seq_len": 512, "batch": 32, "tok_per_s": 50_000.0},
                   {"stage": "distill", "seq_len": 4096, "batch": 4, "tok_per_s": 56_535.6},
                   {"stage": "distill", "seq_len": 4096, "batch": 8, "tok_per_s": 70_000.0},
                   {"stage": "distill", "seq_len": 4096, "batch": 4, "compiled": True, "tok_per_s": 90_000.0},
                   {"stage": "distill", "seq_len": 4096, "batch": 16, "checkpointed": True, "tok_per_s": 80_000.0},
                   {"stage": "distill", "seq_len": 2048, "batch": 8, "compiled": True, "error": "RuntimeError: x"}]}


def test_the_budget_takes_the_rate_of_the_runs_own_shape_and_variant():
    shape = ["distill.seq_len=4096", "distill.batch_size=4"]
    assert distill_tokens(PROBE, 100, 1e9, "quick", shape) == int(56_535.6 * 100 // 16384) * 16384
    assert distill_tokens(PROBE, 100, 1e9, "quick", shape + ["distill.compile=true"]) == \
        int(90_000.0 * 100 // 16384) * 16384
    kept = ["distill.seq_len=4096", "distill.batch_size=16", "distill.checkpoint_activations=true"]
    assert distill_tokens(PROBE, 100, 1e9, "quick", kept) == int(80_000.0 * 100 // 65536) * 65536
    # a batch size the probe did not measure: the first case at that length
    assert distill_tokens(PROBE, 100, 1e9, "quick", ["distill.seq_len=4096", "distill.batch_size=2"]) == \
        int(56_535.6 * 100 // 8192) * 8192
    assert distill_tokens(PROBE, 10_000, 1e6, "quick", []) == int(1e6 // (512 * 32)) * 512 * 32  # the cap
    assert distill_tokens(PROBE, 0.1, 1e9, "quick", []) == 512 * 32  # at least one step
    with pytest.raises(ValueError, match="no fast distill case at seq_len 2048"):
        distill_tokens(PROBE, 100, 1e9, "quick", ["distill.seq_len=2048", "distill.compile=true"])


def test_the_budget_reads_bench_trains_results():
    """`hyla bench train`'s cases: the fast path's rate for a run on the default settings, the eager one's when
    the run switches compiling off."""
    results = {"cases": [{"stage": "distill", "seq_len": 4096, "batch": 16, "path": "eager", "tok_per_s": 75_000.0},
                         {"stage": "distill", "seq_len": 4096, "batch": 16, "path": "fast", "tok_per_s": 200_000.0}]}
    shape = ["distill.seq_len=4096", "distill.batch_size=16"]
    assert distill_tokens(results, 100, 1e9, "quick", shape) == int(200_000.0 * 100 // 65536) * 65536
    assert distill_tokens(results, 100, 1e9, "quick", shape + ["distill.compile=false"]) == \
        int(75_000.0 * 100 // 65536) * 65536


def test_the_example_plan_of_the_docs_loads(tmp_path):
    text = (Path(__file__).resolve().parents[2] / "docs" / "experiments.md").read_text()
    example = text.split("```json\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.json"
    path.write_text(example)
    plan = load_plan(path, tmp_path / "run", profile="smoke", overrides=["text=/data"])
    assert list(plan.jobs) == ["corpus", "convert", "niah-teacher", "niah-main", "report"]
    assert plan.jobs["niah-main"].needs == ("convert",) and plan.jobs["niah-teacher"].needs == ()
    assert plan.jobs["convert"].run[-2:] == ("--device", "cpu")


def test_the_recipe_plan_takes_a_fractional_token_scale(tmp_path):
    # A sitting too short for the whole budget scales it down (docs/results/smollm2-135m.md, "Next run").
    from hyla.convert.recipes import scale_tokens

    plan = load_plan(PLANS[[p.stem for p in PLANS].index("halo-smollm2")], tmp_path, overrides=["token_scale=0.6"])
    command = plan.jobs["convert"].run
    assert command[command.index("--set", command.index("selection.method=halo")) + 1] == "token_scale=0.6"
    assert scale_tokens(_sets(command)).distill.tokens == 90_000_000


def test_the_seed003_plan_converts_every_mixer_alike_and_evaluates_every_mode(tmp_path):
    from types import SimpleNamespace

    from hyla.convert.recipes import scale_tokens
    from hyla.evals.cli import _OVERRIDE_OPTIONS
    from hyla.evals.overrides import apply_inference_overrides

    plan = load_plan(PLANS[[p.stem for p in PLANS].index("seed003-smollm2")], tmp_path)
    recipe = make_plan("halo-smollm2", 135_000_000)
    # The data job is the Lightning conversion's command up to the data stage, which the others copy.
    assert plan.jobs["data"].run == (*plan.jobs["convert-lightning"].run, "--until-stage", "data")
    assert plan.jobs["convert-gla"].needs == ("copy-gla",) and plan.jobs["copy-gla"].needs == ("data",)
    budgets = set()
    for mixer in ("lightning", "gla", "gdn"):
        convert = scale_tokens(_sets(plan.jobs[f"convert-{mixer}"].run))
        assert convert.model.rnn_mixer == mixer and convert.selection.method == "7,8,16,17,18,19,23"
        assert convert.finetune_skipped and convert.distill.seq_len == 4096 and convert.trained_seq_len == 4096
        assert not convert.data.long_sources and convert.data.scaling_sources == recipe.data.scaling_sources
        # the recipe's own training texts, whatever they are when it runs: the plan names none
        assert convert.data.sources == recipe.data.sources
        assert not any(item.startswith("data.sources=") for item in plan.jobs[f"convert-{mixer}"].run)
        assert None not in convert.scaling.candidates and convert.scaling.niah_lengths == []
        budgets.add(json.dumps([convert.align.settings(), convert.distill.settings()]))
    (budget,) = budgets  # one budget for every mixer: the recipe's stages 1-2 times token_scale 0.2
    align, distill = json.loads(budget)
    assert (align["tokens"], distill["tokens"]) == (10_000_000, 30_000_000)
    assert (align["seq_len"], align["batch_size"], distill["batch_size"]) == (512, 128, 16)  # the measured shapes
    wanted = {"direct": {"logit_scaling": "off"},
              "log": {"logit_scaling": "per_length", "logit_scaling_train_length": 4096},
              "swla": {"logit_scaling": "off", "eme_window": 4096, "eme_stride": 1024},
              "swla+log": {"logit_scaling": "per_length", "logit_scaling_train_length": 4096, "eme_window": 4096,
                           "eme_stride": 1024},
              "per-query": {}}  # the model's own: per-query s_t with the a it was exported with
    parser, cells = build_parser(), set()
    samples = plan.jobs["niah-samples"].run  # every prompt built once, into the cache the evaluations read
    assert samples[samples.index("--samples-cache") + 1] == f"{tmp_path}/niah-samples"
    for name, job in plan.jobs.items():
        if not name.startswith("niah-") or name == "niah-samples":
            continue
        assert "niah-samples" in job.needs
        assert job.run[job.run.index("--lengths") + 1] == samples[samples.index("--lengths") + 1]
        mixer, mode = name.removeprefix("niah-").split("-", 1)  # niah-MIXER-MODE
        args = parser.parse_args(list(job.run[1:]))
        model = SimpleNamespace(inference_options=None)
        applied = apply_inference_overrides(model, **{k: getattr(args, k) for k in _OVERRIDE_OPTIONS})
        assert applied == wanted[mode], name
        assert args.model.endswith(f"/{mixer}/06-export") and args.out.name == name and args.num_samples == 10
        assert args.samples_cache == tmp_path / "niah-samples"  # one set of prompts for every row
        cells |= {(mixer, mode, task, length) for task in args.tasks for length in args.lengths}
    modes = {"lightning": set(wanted), "gla": set(wanted) - {"per-query"}, "gdn": set(wanted) - {"per-query"}}
    assert sum(name.startswith("niah-") and name != "niah-samples" for name in plan.jobs) == 13  # one job a row of the table
    assert cells == {(mixer, mode, task, length) for mixer in modes for mode in modes[mixer]
                     for task in ("SK1", "SK2", "SK3") for length in (4096, 16384, 32768, 65536)}
    assert plan.report["niah_table"] == "wide" and plan.train_slots == 1
    # every mixer's evaluations at once beside the next conversion
    assert plan.parallel >= 1 + sum(name.startswith("niah-lightning-") for name in plan.jobs)


def test_the_seed003_plans_mixer_args_reach_that_mixers_conversion_only(tmp_path):
    from hyla.convert.recipes import scale_tokens

    path = PLANS[[p.stem for p in PLANS].index("seed003-smollm2")]
    plain = load_plan(path, tmp_path)
    plan = load_plan(path, tmp_path, overrides=['gla_args=["--set", "model.gla_rope=true"]'])
    assert plan.jobs["convert-gla"].run == (*plain.jobs["convert-gla"].run, "--set", "model.gla_rope=true")
    assert scale_tokens(_sets(plan.jobs["convert-gla"].run)).model.gla_rope
    for name in ("convert-lightning", "convert-gdn", "data"):
        assert plan.jobs[name].run == plain.jobs[name].run


def test_the_seed003_plan_analyses_each_converted_hybrids_heads_at_two_lengths_with_and_without_eme(tmp_path):
    from hyla.evals.cli import inference_overrides
    from hyla.evals.overrides import inference_options_of

    plan = load_plan(PLANS[[p.stem for p in PLANS].index("seed003-smollm2")], tmp_path)
    eme = {"logit_scaling": "per_length", "logit_scaling_train_length": 4096, "eme_window": 4096, "eme_stride": 1024}
    wanted = {"direct": {"logit_scaling": "off"}, "eme": eme, "per-query": {}}  # per-query: the model's own a
    seen = set()
    for name, job in plan.jobs.items():
        if not name.startswith("analyze-"):
            continue
        mixer, length, mode = name.removeprefix("analyze-").split("-", 2)  # analyze-MIXER-LENGTH-MODE
        args = build_parser().parse_args(list(job.run[1:]))
        assert job.run[1:3] == ("analyze", "hitrate") and job.needs == (f"convert-{mixer}",)
        assert args.model.endswith(f"/{mixer}/06-export") and args.out == tmp_path / "evals" / name  # in the report
        assert (args.task, args.num_samples, args.device, args.dtype) == ("SK1", 4, "cuda", "bfloat16")
        assert args.length == {"4K": 4096, "32K": 32768}[length]
        assert inference_options_of(**inference_overrides(args)).changes() == wanted[mode], name
        seen.add((mixer, length, mode))
    # EME only beyond the training window: up to it SWLA's first window serves every position and c(L) = 1
    assert seen == {(mixer, length, "direct") for mixer in ("lightning", "gla", "gdn") for length in ("4K", "32K")} | {
        (mixer, "32K", "eme") for mixer in ("lightning", "gla", "gdn")} | {
        ("lightning", "4K", "per-query"), ("lightning", "32K", "per-query")}
    # --only picks one mixer's analyses with its conversion
    only = keep_only(plan, ["analyze-gdn-*"])
    assert {name for name in only.jobs if name.startswith(("analyze-", "convert-"))} == {
        "convert-gdn", "analyze-gdn-4K-direct", "analyze-gdn-32K-direct", "analyze-gdn-32K-eme"}


def test_the_recipe_plans_branches_redo_their_stages_from_the_main_conversions_earlier_ones(tmp_path):
    path = PLANS[[p.stem for p in PLANS].index("halo-smollm2")]
    assert not any(name.startswith(("copy-", "convert-")) for name in load_plan(path, tmp_path).jobs)
    branches = ('[{"name": "d125", "from": "distill", "args": ["--set", "distill.tokens=250e6"]}, '
                '{"name": "lr", "from": "finetune", "args": ["--set", "finetune.lr=1e-4"]}]')
    plan = load_plan(path, tmp_path, overrides=[f"branches={branches}"])
    run = tmp_path.resolve()
    main = plan.jobs["convert"]
    main_sets = [v for f, v in zip(main.run, main.run[1:]) if f == "--set"]
    for name, stage, extra in (("d125", "distill", "distill.tokens=250e6"), ("lr", "finetune", "finetune.lr=1e-4")):
        copy = plan.jobs[f"copy-{name}"]
        assert copy.needs == ("convert",) and Path(copy.copy["into"]) == run / f"branch-{name}"
        assert [Path(p).name for p in copy.copy["from"]] == ["00-data", "01-align", "02-select", "03-distill"]
        assert {Path(p).parent for p in copy.copy["from"]} == {run / "main"}
        branch = plan.jobs[f"convert-{name}"]
        assert branch.needs == (f"copy-{name}",) and branch.kind == "train"
        parsed = build_parser().parse_args(list(branch.run[1:]))
        assert Path(parsed.out) == run / f"branch-{name}" and parsed.from_stage == stage
        assert parsed.until_stage is None
        # The main conversion's settings, then the branch's own (the later --set wins).
        assert [v for f, v in zip(branch.run, branch.run[1:]) if f == "--set"] == main_sets + [extra]
        for task in ("SK1", "SK2", "SK3"):
            for span in ("long", "short"):
                ours, theirs = plan.jobs[f"niah-{name}-{task}-{span}"], plan.jobs[f"niah-main-{task}-{span}"]
                assert ours.needs == (f"convert-{name}", "niah-samples")
                renamed = (item.replace("/main/06-export", f"/branch-{name}/06-export")
                           .replace("niah-main-", f"niah-{name}-") for item in theirs.run)
                assert ours.run == tuple(renamed)
        renamed = (item.replace("/main/06-export", f"/branch-{name}/06-export").replace("csr-main", f"csr-{name}")
                   for item in plan.jobs["csr-main"].run)
        assert plan.jobs[f"csr-{name}"].run == tuple(renamed)
    assert _sets(plan.jobs["convert-d125"].run).distill.tokens == 250e6
    assert _sets(plan.jobs["convert-lr"].run).finetune.lr == 1e-4 and _sets(main.run).finetune.lr == 1e-5


def test_the_recipe_plans_offset_diagnostic_runs_a_branchs_sk2_on_moved_essays(tmp_path):
    """offset_branches: a named branch's SK2 at 16K and 32K with --haystack-offset, otherwise its own SK2 jobs'
    command (model, samples cache, budget); none by default."""
    path = PLANS[[p.stem for p in PLANS].index("halo-smollm2")]
    branches = '[{"name": "d60", "from": "distill", "args": ["--set", "distill.tokens=120e6"]}]'
    assert not any("offset" in name for name in load_plan(path, tmp_path, overrides=[f"branches={branches}"]).jobs)
    plan = load_plan(path, tmp_path, overrides=[f"branches={branches}", 'offset_branches=["d60"]',
                                                "haystack_offset=4000"])
    job = plan.jobs["niah-d60-offset-SK2"]
    assert job.kind == "eval" and job.needs == ("convert-d60",)
    parsed = build_parser().parse_args(list(job.run[1:]))
    assert parsed.haystack_offset == 4000 and parsed.tasks == ["SK2"] and parsed.lengths == [16384, 32768]
    theirs = build_parser().parse_args(list(plan.jobs["niah-d60-SK2-long"].run[1:]))
    for name in ("model", "samples_cache", "num_samples", "max_new_tokens", "device", "dtype"):
        assert getattr(parsed, name) == getattr(theirs, name), name
    assert Path(parsed.out).name == "niah-d60-offset-SK2"  # the report's label: d60-offset


def test_the_recipe_plans_branch_checks_run_at_the_start_and_refuse_a_branch_whose_args_change_a_copied_stage(
        tmp_path, capsys):
    path = PLANS[[p.stem for p in PLANS].index("halo-smollm2")]
    branches = ('[{"name": "d125", "from": "distill", "args": ["--set", "distill.tokens=250e6"]}, '
                '{"name": "lr", "from": "finetune", "args": ["--set", "finetune.lr=1e-4"]}]')
    plan = load_plan(path, tmp_path, overrides=[f"branches={branches}"])
    for name in ("d125", "lr"):
        check = plan.jobs[f"check-{name}"]
        assert check.kind == "check" and check.needs == () and check.after == ()
        assert plan.jobs[f"convert-{name}"].checked_by == (f"check-{name}",)
    # A second stage 3 at another lr takes over stages 0-3 as they are.
    assert hyla_main(list(plan.jobs["check-lr"].run[1:])) == 0
    # 250M distillation tokens need a larger corpus than the main conversion's data stage prepared (unless
    # data.min_tokens says so, tests/convert/test_branch.py): refused at once, naming the setting.
    capsys.readouterr()
    assert hyla_main(list(plan.jobs["check-d125"].run[1:])) == 2
    error = capsys.readouterr().err
    assert re.search(r"branch from distill takes over stages data, align, select unchanged.*"
                     r"\(data: tokens \d+ then, \d+ now", error), error
    assert error.count("\n") == 1  # one line
