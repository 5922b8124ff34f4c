"""`hyla bench train` on toy shapes on CPU: every stage on both paths, its files, and FLOPs per token that match
what torch's FLOP counter counts for the same steps."""

import json
import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM

from hyla.bench.train import TOY, training_flops_per_token
from hyla.cli import main
from hyla.convert.align import AlignmentTwins, alignment_loss
from hyla.convert.distill import StudentWithTeacher, build_student, distill_loss
from hyla.models.transfer import to_hypenet


def test_bench_train_toy_writes_both_paths_of_every_stage(tmp_path):
    assert main(["bench", "train", "--toy", "--device", "cpu", "--steps", "1", "--warmup", "1",
                 "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "train.json").read_text())
    measured = {(case["stage"], case["path"]) for case in results["cases"]}
    assert measured == {(stage, path) for stage in ("align", "distill", "finetune") for path in ("eager", "fast")}
    for case in results["cases"]:
        assert case["tok_per_s"] > 0 and case["flops_per_token"]["total"] > 0
        assert case["fast_path"]["fused_loss"] == (case["path"] == "fast" and case["stage"] != "align")
        if case["path"] == "fast":
            assert case["profile"]["top"]
    assert {(row["loss"], row["implementation"]) for row in results["losses"]} >= {
        ("kl", "logits"), ("kl", "hyla-chunked"), ("ce", "logits"), ("ce", "hyla-chunked")}
    assert all(row["relative_difference"] < 1e-4 for row in results["losses"])
    assert "| distill | 2x128 | fast |" in (tmp_path / "train.md").read_text()
    assert (tmp_path / "train.png").stat().st_size > 0


def test_bench_train_bf16_teacher_path_runs_the_stages_with_a_teacher(tmp_path):
    assert main(["bench", "train", "--toy", "--device", "cpu", "--steps", "1", "--warmup", "1", "--no-losses",
                 "--paths", "fast,fast-bf16-teacher", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "train.json").read_text())
    measured = {(case["stage"], case["path"]) for case in results["cases"]}
    assert measured == {("align", "fast"), ("distill", "fast"), ("finetune", "fast"), ("align", "fast-bf16-teacher"),
                        ("distill", "fast-bf16-teacher")}
    by_path = {(case["stage"], case["path"]): case["losses"][0] for case in results["cases"]}
    for stage in ("align", "distill"):  # same weights and batch: bf16 rounding of the teacher's activations only
        assert by_path[(stage, "fast-bf16-teacher")] == pytest.approx(by_path[(stage, "fast")], rel=0.05)
        assert by_path[(stage, "fast-bf16-teacher")] != by_path[(stage, "fast")], f"{stage}: float32 teacher"


def test_bench_train_batched_twins_with_a_bf16_teacher_is_an_align_path(tmp_path):
    assert main(["bench", "train", "--toy", "--device", "cpu", "--steps", "1", "--warmup", "1", "--no-losses",
                 "--paths", "fast-batched,fast-batched-bf16-teacher", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "train.json").read_text())
    cases = {case["path"]: case for case in results["cases"]}
    assert {(case["stage"], case["path"]) for case in results["cases"]} == {
        ("align", "fast-batched"), ("align", "fast-batched-bf16-teacher")}
    assert all(case["alignment_loss"]["batched"] for case in cases.values())
    batched, bf16 = cases["fast-batched"]["losses"][0], cases["fast-batched-bf16-teacher"]["losses"][0]
    assert bf16 == pytest.approx(batched, rel=0.05) and bf16 != batched  # the teacher's bf16 rounding only


def test_bench_train_whole_block_paths_time_every_stage_beside_the_fast_path(tmp_path):
    assert main(["bench", "train", "--toy", "--device", "cpu", "--steps", "1", "--warmup", "1", "--no-losses",
                 "--paths", "fast,fast-whole-blocks,fast-whole-blocks-bf16-teacher", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "train.json").read_text())
    cases = {(case["stage"], case["path"]): case for case in results["cases"]}
    assert set(cases) == {(stage, path) for stage in ("align", "distill", "finetune")
                          for path in ("fast", "fast-whole-blocks")} | {
        ("align", "fast-whole-blocks-bf16-teacher"), ("distill", "fast-whole-blocks-bf16-teacher")}
    for (stage, path), case in cases.items():
        assert case["whole_blocks"] == (path != "fast")
        if stage == "align":  # on CPU the fast path compiles nothing: the loop's reference loss either way
            assert not case["alignment_loss"]["whole_twins"] and not case["alignment_loss"]["compiled"]
        if path == "fast-whole-blocks":  # the same weights and batch, the same formulas: rounding order only
            assert case["losses"][0] == pytest.approx(cases[(stage, "fast")]["losses"][0], rel=1e-5)
    assert "| distill | 2x128 | fast-whole-blocks |" in (tmp_path / "train.md").read_text()


def test_bench_train_bf16_activations_path_times_the_stages_that_train_the_hybrid(tmp_path):
    assert main(["bench", "train", "--toy", "--device", "cpu", "--steps", "1", "--warmup", "0", "--no-losses",
                 "--no-profile", "--cases", "align:2x64,distill:2x64,finetune:1x64",
                 "--paths", "fast-whole-blocks-bf16-teacher,fast-bf16-activations", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "train.json").read_text())
    cases = {(case["stage"], case["path"]): case for case in results["cases"]}
    assert set(cases) == {("align", "fast-whole-blocks-bf16-teacher"), ("distill", "fast-whole-blocks-bf16-teacher"),
                          ("distill", "fast-bf16-activations"), ("finetune", "fast-bf16-activations")}
    assert [case["bf16_activations"] for case in results["cases"]] == [False, False, True, True]
    # The same path but for the activations; CPU trains without autocast, where they stay float32: the same loss
    # (tests/train/test_bf16_activations.py compares them under autocast).
    assert (cases[("distill", "fast-bf16-activations")]["losses"]
            == cases[("distill", "fast-whole-blocks-bf16-teacher")]["losses"])
    assert "| distill | 2x64 | fast-bf16-activations |" in (tmp_path / "train.md").read_text()


@pytest.mark.parametrize("mixer", ["gla", "gdn"])
def test_bench_train_times_gla_and_gdn_conversions(mixer, tmp_path):
    assert main(["bench", "train", "--toy", "--device", "cpu", "--steps", "1", "--warmup", "0", "--no-losses",
                 "--no-profile", "--paths", "fast", "--cases", "align:2x64,distill:2x128", "--rnn-mixer", mixer,
                 "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "train.json").read_text())
    assert results["settings"]["rnn_mixer"] == mixer
    assert [(case["stage"], case["path"]) for case in results["cases"]] == [("align", "fast"), ("distill", "fast")]
    assert all(case["tok_per_s"] > 0 and math.isfinite(case["losses"][0]) for case in results["cases"])


@pytest.mark.parametrize("text", ["distill", "distill:4", "nosuch:2x64", "align:0x64"])
def test_bench_train_refuses_a_bad_case_in_one_line(text, tmp_path, capsys):
    assert main(["bench", "train", "--toy", "--device", "cpu", "--cases", text, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "STAGE:BATCHxLEN" in err[0] or "stage one of" in err[0]
    assert not (tmp_path / "train.json").exists()


@pytest.mark.parametrize("paths,named", [("fast,bogus", "unknown path bogus;"),
                                         ("nope,fast,bad", "unknown paths nope, bad;"), (",", "no path given")])
def test_bench_train_names_only_the_unknown_paths_in_one_line(paths, named, tmp_path, capsys):
    assert main(["bench", "train", "--toy", "--device", "cpu", "--paths", paths, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0] and "fast-cuda-graphs" in err[0], err
    assert "unknown path fast" not in err[0] and not (tmp_path / "train.json").exists()


def counted_flops(fn) -> int:
    # The math backend writes attention as matrix products the counter sees (it counts the full T x T square, twice
    # the causal triangle the model FLOPs count).
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def attention_square_excess(model, length: int) -> float:
    """What the counter counts beyond the causal triangle per token: one more triangle, forward (2 T H D)."""
    return sum(2.0 * length * block.mixer.num_heads * block.mixer.head_dim for block in model.model.layers
               if block.layer_type in ("attention", "attention_rope"))


def gdn_reference_excess(model, chunk: int = 64) -> float:
    """What the CPU reference's batched GDN form computes per token beyond the products the formula counts (fla's
    chunked algorithm: k k^T, q k^T and its product with u, the keys' and the queries' reads of the state, the state
    write). The reference solves for u_v and w = u's state-dependent part once for every chunk, so it also applies
    the chunk's attention to w (C^2 D a chunk) and passes the state through a [D, D] transition (D^3 a chunk):
    2 (C D + D^3 / C) FLOPs per token and head."""
    return sum(2.0 * block.mixer.num_heads * (chunk * block.mixer.head_dim + block.mixer.head_dim**3 / chunk)
               for block in model.model.layers if block.layer_type == "gdn")


def test_flops_per_token_match_torchs_flop_counter():
    """Forward passes match exactly; a training step is within 1%: model FLOPs count the backward as twice the
    forward, the reference Lightning kernel skips a few products whose gradients nothing needs (the zero initial
    state's)."""
    torch.manual_seed(0)
    teacher_hf = LlamaForCausalLM(LlamaConfig(**TOY)).double().eval()
    teacher = to_hypenet(teacher_hf, attention_rope=True).double().eval()
    student = build_student(teacher_hf, [0], None, lightning_rope=True, lightning_qk_norm=True).double().train()
    length = 256  # four Lightning chunks: the skipped zero-state products are a small share, as in training
    ids = torch.randint(0, TOY["vocab_size"], (2, length))
    batch, tokens = {"input_ids": ids, "labels": ids}, ids.numel()

    for model in (teacher, student):
        with torch.no_grad():
            counted = counted_flops(lambda: model(ids, use_cache=False))
        forward = training_flops_per_token("finetune", model, length)["total"] / 3
        assert counted / tokens == pytest.approx(forward + attention_square_excess(model, length), rel=1e-12)

    for fused in (False, True):
        counted = counted_flops(
            lambda: distill_loss(StudentWithTeacher(student, teacher), batch, fused=fused)[0].backward())
        formula = training_flops_per_token("distill", student, length, teacher)["total"]
        excess = 3 * attention_square_excess(student, length) + attention_square_excess(teacher, length)
        assert counted / tokens == pytest.approx(formula + excess, rel=1e-2)

    twins = AlignmentTwins(teacher, teacher_hf).double()
    counted = counted_flops(lambda: alignment_loss(twins, batch)[0].backward())
    formula = training_flops_per_token("align", twins, length, teacher)["total"]
    assert counted / tokens == pytest.approx(formula + attention_square_excess(teacher, length), rel=1e-2)


@pytest.mark.parametrize("mixer", ["gla", "gdn"])
def test_flops_per_token_of_gla_and_gdn_hybrids_match_torchs_flop_counter(mixer):
    """A forward pass of the hybrid on the CPU reference's chunked forms (chunk 64, as fla's): GLA's products are
    Lightning's, GDN's half again as many; the reference's GDN form does a few more (`gdn_reference_excess`)."""
    torch.manual_seed(0)
    teacher_hf = LlamaForCausalLM(LlamaConfig(**TOY)).double().eval()
    student = build_student(teacher_hf, [0], None, rnn_mixer=mixer).double().train()
    assert student.config.layer_types[1:] == [mixer] * 3
    length = 256
    ids = torch.randint(0, TOY["vocab_size"], (2, length))
    tokens = ids.numel()
    with torch.no_grad():
        counted = counted_flops(lambda: student(ids, use_cache=False))
    forward = training_flops_per_token("finetune", student, length)["total"] / 3
    excess = attention_square_excess(student, length) + gdn_reference_excess(student)
    assert counted / tokens == pytest.approx(forward + excess, rel=1e-12)



def test_the_profile_says_whether_the_host_or_the_gpu_sets_the_pace():
    from hyla.bench.train_report import bound_by, profile_lines

    # sitting B's measurements (docs/results/train-speed.md): alignment with the bf16 teacher, and distillation
    assert bound_by(131.7, 0.205).endswith("(64%): bound by the host (launches, Python).")
    assert bound_by(282.1, 0.294).endswith("(96%): bound by the GPU.")
    assert bound_by(None, 0.2) == "" and bound_by(100.0, None) == ""  # CPU runs have no kernel times
    case = {"stage": "align", "batch": 128, "seq_len": 512, "path": "fast", "median_step_s": 0.205,
            "profile": {"wall_ms": 230.1, "kernel_ms": 131.7, "kernels": 2852, "by_kind_ms": {"matmul": 43.2},
                        "top": [{"us_per_step": 1000.0, "calls_per_step": 3, "name": "k"}]}}
    header = profile_lines({"cases": [case]})[1]
    assert "matmul 43.2 ms. Its kernels fill 132 ms of the timed step's 205 ms (64%): bound by the host" in header
    case["compiled"] = {"graphs": 9, "graph_breaks": 4}
    assert "2852 kernels from 9 compiled graphs (4 graph breaks); by kind" in profile_lines({"cases": [case]})[1]


@pytest.mark.slow
def test_a_whole_blocks_path_after_the_fast_path_compiles_whole_blocks(monkeypatch):
    """Each case starts from an empty compile cache. With fla's chunk call stood in for by a torch.compiler.disable'd
    function (what splits a compiled Lightning block on CUDA), the fast path compiles each Lightning block in pieces
    (fast-split-blocks) and fast-whole-blocks, measured after it in the same process, one graph per kind of block
    with no graph break: without the reset it reused the fast path's pieces. Same weights, batch and formulas: the
    losses agree to float32 rounding order (1e-5, as the whole-blocks test above)."""
    import hyla.bench.train as bench
    import hyla.ops.lightning as lightning
    from hyla.convert.presets import make_plan
    from hyla.train.fast import FastPath

    chunked = lightning.lightning_chunked
    monkeypatch.setattr(lightning, "lightning_chunked", torch.compiler.disable(chunked))
    # compiled on CPU too (the bench compiles on CUDA only); the fused loss as on CUDA
    def compiled(path, stage, device):  # the path's own blocks setting, the float32 teacher
        whole = bench.PATH_SETTINGS[path][0]
        return FastPath(compile=True, fused_loss=True, fused_optimizer=False, micro_batch_size=None,
                        whole_blocks=bool(whole)), False

    monkeypatch.setattr(bench, "_fast_path", compiled)
    torch.manual_seed(0)
    teacher = LlamaForCausalLM(LlamaConfig(**TOY)).eval()
    plan = make_plan("quick", sum(p.numel() for p in teacher.parameters()))
    settings = bench.TrainBenchSettings(toy=True, device="cpu", steps=1, warmup=0, profile=False)
    case = bench.Case("distill", 2, 64)
    fast, whole = (bench.measure_case(case, path, teacher, plan, (0,), settings)
                   for path in ("fast-split-blocks", "fast-whole-blocks"))
    assert fast["compiled"]["graph_breaks"] > 0 and fast["compiled"]["graphs"] > 3
    # the teacher's block, the student's attention block and its Lightning block
    assert whole["compiled"] == {"graphs": 3, "graph_breaks": 0}
    assert whole["losses"][0] == pytest.approx(fast["losses"][0], rel=1e-5)
    torch._dynamo.reset()


def test_a_path_that_fails_is_a_row_and_the_other_paths_are_measured(tmp_path, monkeypatch, capsys):
    """A fault in one path (a kernel, a compile) leaves the paths after it measured; the row names the error, and
    the command exits 1 once every file is written (running out of memory is a measurement: exit 0)."""
    import hyla.bench.train as bench

    real = bench.measure_case

    def failing(case, path, *args, **kwargs):
        if path == "fast-bf16-teacher":
            raise RuntimeError("a kernel failed\nmore lines")
        return real(case, path, *args, **kwargs)

    monkeypatch.setattr(bench, "measure_case", failing)
    assert main(["bench", "train", "--toy", "--device", "cpu", "--steps", "1", "--warmup", "0", "--no-losses",
                 "--no-profile", "--cases", "distill:2x128", "--paths", "fast-bf16-teacher,fast",
                 "--out", str(tmp_path)]) == 1
    cases = json.loads((tmp_path / "train.json").read_text())["cases"]
    assert [case["path"] for case in cases] == ["fast-bf16-teacher", "fast"]
    assert cases[0]["error"] == "RuntimeError: a kernel failed" and cases[1]["tok_per_s"] > 0
    assert "| fast-bf16-teacher | RuntimeError: a kernel failed |" in (tmp_path / "train.md").read_text()
    assert "failed: distill fast-bf16-teacher" in capsys.readouterr().err
