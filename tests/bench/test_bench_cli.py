"""`hyla bench` on toy shapes on CPU: the code paths run end to end, write their files, and a failed check stops
the report."""

import json

import pytest
import torch

from hyla.bench import kernels, model
from hyla.bench.floors import ModelShape
from hyla.bench.shapes import hypenet_config, qwen3_engine_config
from hyla.bench.timing import CheckFailed
from hyla.cli import main


def test_bench_model_toy_writes_results(tmp_path):
    code = main(["bench", "model", "--toy", "--device", "cpu", "--out", str(tmp_path), "--contexts", "48",
                 "--systems", "hypenet,hypenet-fused,qwen3-engine,qwen3-hf-default", "--large-batch", "2",
                 "--large-batch-contexts", "48", "--no-compile", "--prefill-chunk", "16", "--decode-steps", "2",
                 "--repeats", "1"])
    assert code == 0
    results = json.loads((tmp_path / "model.json").read_text())
    assert set(results["systems"]) == {"hypenet", "hypenet-fused", "qwen3-engine", "qwen3-hf-default"}
    for name in ("hypenet", "hypenet-fused"):
        hypenet = results["systems"][name]
        assert max(hypenet["check"]["relative_errors"].values()) <= hypenet["check"]["bar"]
        assert {(r["batch"], r["context"]) for r in hypenet["decode"]} == {(1, 48), (2, 48)}
        # on CPU the tuned settings are the eager step; hypenet-fused is the fused-projections step beside it
        assert hypenet["engine"]["decode_step"] == ("fused-projections" if name == "hypenet-fused" else "eager")
        assert not hypenet["engine"]["compile_decode"]
    assert results["systems"]["qwen3-engine"]["engine"]["decode_step"] == "eager"
    assert results["systems"]["hypenet"]["engine"]["matvec"] == "cublas"
    assert (tmp_path / "model.png").stat().st_size > 0 and "Targets" in (tmp_path / "model.md").read_text()
    merged = tmp_path / "merged"
    assert main(["bench", "report", str(tmp_path / "model.json"), "--out", str(merged)]) == 0
    assert json.loads((merged / "model.json").read_text())["systems"].keys() == results["systems"].keys()


def bench_model_settings(out, monkeypatch, *flags: str):
    """The ModelSettings `hyla bench model --toy --device cpu FLAGS` runs with, and the model.json it writes, with
    its systems left out (no model is built)."""
    from dataclasses import replace

    seen, run_model_bench = [], model.run_model_bench

    def run_no_systems(settings, **kwargs):
        seen.append(settings)
        return run_model_bench(replace(settings, systems=()), **kwargs)

    monkeypatch.setattr(model, "run_model_bench", run_no_systems)
    assert main(["bench", "model", "--toy", "--device", "cpu", "--out", str(out), *flags]) == 0
    return seen[0], json.loads((out / "model.json").read_text())


@pytest.mark.parametrize("source", ["tuned", "file"])
def test_bench_model_runs_the_settings_prefill_chunk_and_attention_unless_an_expert_option_sets_them(
        tmp_path, monkeypatch, source):
    """Without --prefill-chunk and --attention-backend the engine runs the values of its settings (the tuned settings
    of the device, or --engine-settings); with them, the options' values. model.json records the values that ran."""
    from types import SimpleNamespace

    from hyla.inference import settings as engine_settings

    chosen = engine_settings.EngineSettings(prefill_chunk=4096, attention_backend="flash", name="chosen")
    if source == "tuned":
        monkeypatch.setattr(engine_settings, "tuned_settings", lambda device: chosen)
        flags = []
    else:
        path = tmp_path / "settings.json"
        path.write_text(json.dumps(chosen.to_json()))
        flags = ["--engine-settings", str(path)]
    settings, results = bench_model_settings(tmp_path / "unset", monkeypatch, *flags)
    assert (settings.prefill_chunk, settings.attention_backend) == (None, None)
    # what bench_engine_system builds each engine with, and records as the system's "engine"
    fitted, _ = model.engine_settings(settings, SimpleNamespace(device=torch.device("cpu")), 1)
    assert (fitted.prefill_chunk, fitted.attention_backend) == (4096, "flash")
    assert (results["engine"]["prefill_chunk"], results["engine"]["attention_backend"]) == (4096, "flash")
    assert results["settings"]["prefill_chunk"] is None  # the request: not set
    merged = tmp_path / "merged"
    assert main(["bench", "report", str(tmp_path / "unset" / "model.json"), "--out", str(merged)]) == 0
    assert json.loads((merged / "model.json").read_text())["runs"][0]["engine"] == results["engine"]
    settings, results = bench_model_settings(tmp_path / "set", monkeypatch, *flags, "--prefill-chunk", "1K",
                                             "--attention-backend", "torch")
    fitted, _ = model.engine_settings(settings, SimpleNamespace(device=torch.device("cpu")), 1)
    assert (fitted.prefill_chunk, fitted.attention_backend) == (1024, "torch")
    assert (results["engine"]["prefill_chunk"], results["engine"]["attention_backend"]) == (1024, "torch")


def help_sections(capsys, *argv: str) -> dict[str, str]:
    """`hyla ARGV --help` by section: the heading line (an argument group's title and colon) -> the section."""
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    sections = [section for section in capsys.readouterr().out.split("\n\n") if section.strip()]
    return {section.splitlines()[0]: section for section in sections}


@pytest.mark.parametrize("verb,options", [
    ("model", ["--prefill-chunk", "--attention-backend", "--decode-step", "--matvec", "--no-compile",
               "--compile-mode", "--compile-prefill", "--no-pdl"]),
    ("profile", ["--attention-backend", "--decode-step", "--matvec", "--no-compile", "--compile-mode",
                 "--compile-prefill", "--no-pdl"]),
    ("generate", ["--decode-step"]),
])
def test_bench_options_that_override_the_engine_settings_are_listed_as_expert_options(capsys, verb, options):
    import re

    sections = help_sections(capsys, "bench", verb)
    expert = sections.pop("expert options (experiments against the engine's settings):")
    others = "\n".join(text for heading, text in sections.items() if not heading.startswith("usage:"))
    for option in options:
        assert re.search(rf"^  {option}\b", expert, re.M), option
        assert not re.search(rf"^  {option}\b", others, re.M), option


def test_bench_model_help_names_hypenet_fused_an_expert_comparison(capsys):
    options = next(text for heading, text in help_sections(capsys, "bench", "model").items() if "--systems" in text
                   and not heading.startswith("usage:"))
    assert "expert comparison, hypenet-fused" in " ".join(options.split())


def test_bench_generate_toy_times_both_paths_on_the_same_prompts(tmp_path):
    """`hyla bench generate --toy`: NIAH prompts through hyla's engine and transformers' generate; each result names
    its generation path; float32 on CPU, so both paths give the same greedy text."""
    code = main(["bench", "generate", "--toy", "--device", "cpu", "--dtype", "float32", "--lengths", "192,320",
                 "--num-prompts", "3,2", "--batch-sizes", "2,1", "--max-new-tokens", "4", "--out", str(tmp_path)])
    assert code == 0
    results = json.loads((tmp_path / "generate.json").read_text())
    assert [row["length"] for row in results["lengths"]] == [192, 320]
    for row in results["lengths"]:
        assert row["paths"]["engine"]["path"] == "engine" and row["paths"]["hf"]["path"] == "hf"
        assert row["paths"]["engine"]["engine"]["decode_step"] == "eager"
        assert row["same_predictions"] == 1.0 and row["speedup"] > 0
        assert row["paths"]["engine"]["timed"]["prompt_tokens"] == row["paths"]["hf"]["timed"]["prompt_tokens"] > 0
        for path in ("engine", "hf"):
            host, timed = row["paths"][path]["host_s_per_prompt"], row["paths"][path]["timed"]
            assert host["outside_generation"] == pytest.approx(
                (row["paths"][path]["seconds"] - timed["seconds"]) / row["num_prompts"])
            assert host["encode"] == timed["encode_s"] == 0.0  # the samples kept their token ids
            assert (host["engine_outside_prefill_decode"] is None) == (path == "hf")
    markdown = (tmp_path / "generate.md").read_text()
    assert "speedup" in markdown and "engine outside generation s/prompt" in markdown


def test_bench_generate_compares_mixers_and_inference_modes(tmp_path):
    """`--rnn-mixer` x `--variants`: one model per recurrent mixer, a row per mixer and variant with the engine's
    prefill and decode costs and their ratios to direct; the swla+log rows ran on an engine whose cache holds SWLA's
    window ring (W = 64, S = 32: two windows open per token), and transformers' path, under the same options, gives
    the same greedy text (float32)."""
    from hyla.bench.generate import COSTS, variant_options

    code = main(["bench", "generate", "--toy", "--device", "cpu", "--dtype", "float32", "--lengths", "320",
                 "--num-prompts", "2", "--batch-sizes", "2", "--max-new-tokens", "4", "--rnn-mixer", "lightning,gla",
                 "--variants", "direct,swla+log", "--eme-window", "64", "--eme-stride", "32",
                 "--logit-scaling-train-length", "64", "--out", str(tmp_path)])
    assert code == 0
    results = json.loads((tmp_path / "generate.json").read_text())
    rows = results["rows"]
    assert [(row["rnn_mixer"], row["variant"]) for row in rows] == [
        ("lightning", "direct"), ("lightning", "swla+log"), ("gla", "direct"), ("gla", "swla+log")]
    assert {mixer: sorted(set(model["config"]["layer_types"])) for mixer, model in results["models"].items()} == {
        "lightning": ["attention", "lightning"], "gla": ["attention", "gla"]}
    for row in rows:
        engine = row["paths"]["engine"]
        expected = variant_options(row["variant"], eme_window=64, eme_stride=32, train_length=64).changes()
        assert row["options"] == engine["inference_options"] == row["paths"]["hf"]["inference_options"] == expected
        if row["variant"] == "swla+log":
            assert engine["swla"]["window"] == 64 and engine["swla"]["stride"] == 32
            # [batch, ring slots, heads, head dim, head dim] in every recurrent layer
            assert [shape[:2] for shape in engine["swla"]["ring_shapes"]] == [[2, 2]]
        else:
            assert engine["swla"] is None
        assert row["same_predictions"] == 1.0
        costs = row["engine_costs"]
        assert costs["prefill_s_per_prompt"] == pytest.approx(engine["timed"]["prefill_s"] / 2)
        assert costs["decode_ms_per_step"] > 0 and costs["seconds_per_prompt"] == engine["seconds_per_prompt"]
        direct = next(other for other in rows if other["rnn_mixer"] == row["rnn_mixer"] and
                      other["variant"] == "direct")
        for name in COSTS:
            assert row["ratios"][name] == pytest.approx(costs[name] / direct["engine_costs"][name])
        assert row["ratios"]["hf_seconds_per_prompt"] == pytest.approx(
            row["paths"]["hf"]["seconds_per_prompt"] / direct["paths"]["hf"]["seconds_per_prompt"])
    markdown = (tmp_path / "generate.md").read_text()
    assert "| gla | swla+log | 320 | 2 | 2 | eager |" in markdown and "SWLA window W = 64, stride S = 32" in markdown


@pytest.mark.parametrize("options,message", [
    (["--rnn-mixer", "swa"], "unknown recurrent mixers"),
    (["--variants", "direct,eme"], "unknown variant"),
    (["--variants", "direct,log", "--eme-window", "64"], "--eme-window applies to the swla variants"),
    (["--logit-scaling-train-length", "64"], "--logit-scaling-train-length applies to the log variants"),
    (["--variants", "swla", "--eme-window", "64", "--eme-stride", "128"], "EME needs 1 <= eme_stride <= eme_window"),
    (["--variants", "swla", "--decode-step", "triton-fused"], "the swla variants run SWLA's window states"),
])
def test_bench_generate_refuses_modes_it_cannot_run(tmp_path, capsys, options, message):
    assert main(["bench", "generate", "--toy", "--device", "cpu", "--out", str(tmp_path), *options]) != 0
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before any model is built


@pytest.mark.parametrize("verb", ["generate", "model", "train"])
def test_bench_device_defaults_to_the_machine_and_refuses_a_missing_cuda(tmp_path, capsys, monkeypatch, verb):
    from hyla.bench.cli import _device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _device("auto") == "cpu" and _device("CPU") == "cpu"
    with pytest.raises(SystemExit):  # argparse's usage error: one line, before anything is built
        main(["bench", verb, "--toy", "--device", "cuda", "--out", str(tmp_path / "out")])
    assert "this machine has no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _device("auto") == "cuda" and _device("cuda:1") == "cuda:1"


def test_synthetic_niah_prompts_have_exact_token_counts():
    from hyla.bench.generate import synthetic_niah_samples, synthetic_tokenizer

    tokenizer = synthetic_tokenizer(500)
    samples = synthetic_niah_samples(500, 1024, 3, tokens_to_generate=128, seed=0, tokenizer=tokenizer)
    assert [s.depth_percent for s in samples] == [0, 50, 100]
    assert samples == synthetic_niah_samples(500, 1024, 3, tokens_to_generate=128, seed=0)  # but the ids kept
    for sample in samples:
        ids = tokenizer(sample.input)["input_ids"]
        assert sample.prompt_ids.of(tokenizer).tolist() == ids
        assert len(ids) == sample.num_prompt_tokens and 0.99 * (1024 - 128) <= len(ids) <= 1024 - 128
        assert tokenizer.decode(tokenizer(sample.outputs[0])["input_ids"]) == sample.outputs[0]


def test_bench_kernels_toy_writes_results(tmp_path):
    code = main(["bench", "kernels", "--device", "cpu", "--out", str(tmp_path), "--lengths", "64,128", "--heads", "2",
                 "--head-dim", "16", "--repeats", "2"])
    assert code == 0
    results = json.loads((tmp_path / "kernels.json").read_text())
    assert {r["mixer"] for r in results["results"]} == {"lightning", "sdpa"}
    assert {r["mode"] for r in results["results"]} == {"forward", "forward+backward"}


def test_failed_check_refuses_to_report(monkeypatch):
    broken = kernels.Mixer("broken", lambda q, k, v: (q + k + v) * 1.5, lambda q, k, v: q + k + v)
    monkeypatch.setattr(kernels, "available_mixers", lambda settings, device: [broken])
    with pytest.raises(CheckFailed, match="no timings"):
        kernels.run_kernel_bench(kernels.KernelSettings(lengths=(64,), num_heads=2, head_dim=16, device="cpu"))


def test_engine_check_fails_on_a_wrong_reference():
    torch.manual_seed(0)
    toy = model.build_hypenet(hypenet_config(toy=True), device="cpu", dtype=torch.float32)
    other = model.build_hypenet(hypenet_config(toy=True), device="cpu", dtype=torch.float32)
    with torch.no_grad():
        other.lm_head.weight.mul_(1.1)
    settings = model.ModelSettings(toy=True, device="cpu", check_length=20, compile_decode=False)
    with pytest.raises(CheckFailed):
        model.check_engine(toy, other, settings)


def test_floors_match_hand_counts():
    config = qwen3_engine_config()
    with torch.device("meta"):
        qwen3 = model.build_hypenet(config, device="meta", dtype=torch.bfloat16)
    shape = ModelShape.of(qwen3)
    # 28 layers x (K and V) x 8 heads x 128 dims x 2 bytes
    assert shape.kv_bytes_per_token() == 28 * 2 * 8 * 128 * 2
    assert shape.decode_bytes(2**19, 1) == shape.weight_bytes + 2**19 * 28 * 2 * 8 * 128 * 2
    causal = 2 * (2**19) ** 2 * 16 * 128
    assert shape.prefill_flops(2**19) == pytest.approx(2 * shape.matmul_params * 2**19 + 28 * causal)
    hypenet = hypenet_config()
    assert [i for i, kind in enumerate(hypenet.layer_types) if kind == "attention"] == [2, 3, 6, 8, 9, 21, 25]


@pytest.mark.filterwarnings("error:`past_key_values` is deprecated:FutureWarning")
def test_hf_static_cache_step_matches_dynamic_cache_step():
    # The step that qwen3-hf-graph captures, run eagerly: HF's StaticCache path over the synthetic cache must give
    # the DynamicCache path's logits (float32: only summation order differs).
    from hyla.bench import hf_baseline
    from hyla.bench.shapes import qwen3_hf_config

    qwen3 = hf_baseline.build_qwen3(qwen3_hf_config(toy=True), device="cpu", dtype=torch.float32)
    decoder = hf_baseline.HFGraphDecoder(qwen3, batch=1, context=16)
    positions = decoder.position_ids.clone()
    with torch.no_grad():
        decoder._step()
        expected = model._hf_eager_step(qwen3, decoder.tokens, positions, 16, torch.float32)
    assert int(decoder.position_ids) == 17
    assert ((decoder.logits.float() - expected).norm() / expected.norm()).item() <= 1e-5


def test_qwen3_baseline_keeps_exact_rope_frequencies_in_bfloat16():
    from hyla.bench import hf_baseline
    from hyla.bench.shapes import qwen3_hf_config

    exact = hf_baseline.build_qwen3(qwen3_hf_config(toy=True), device="cpu", dtype=torch.float32)
    half = hf_baseline.build_qwen3(qwen3_hf_config(toy=True), device="cpu", dtype=torch.bfloat16)
    assert half.model.embed_tokens.weight.dtype == torch.bfloat16
    assert half.model.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.equal(half.model.rotary_emb.inv_freq, exact.model.rotary_emb.inv_freq)


def test_qwen3_engine_passes_its_check_against_hf_in_bfloat16():
    # The benchmark's qwen3-engine gate as on the GPU (bfloat16, HF Qwen3 as reference), on one layer of the real
    # width (the toy's near-uniform attention hides RoPE errors) at positions up to 1K, where bf16 RoPE frequencies
    # turn the angles by radians: with them the gate fails (0.10 > 0.02 here; 0.61 on the H200, 28 layers).
    from transformers import Qwen3Config

    from hyla.bench import hf_baseline
    from hyla.bench.shapes import QWEN3_1P7B
    from hyla.models.configuration import HypeNetConfig

    sizes = dict(QWEN3_1P7B, num_hidden_layers=1, vocab_size=1024)
    qwen3 = hf_baseline.build_qwen3(Qwen3Config(**sizes, attn_implementation="sdpa"), device="cpu",
                                    dtype=torch.bfloat16)
    engine_config = HypeNetConfig(**sizes, layer_types=["attention_rope"], attention_qk_norm=True,
                                  attention_output_gate=False, attention_logit_scaling_a=None)
    engine_model = model.build_hypenet(engine_config, device="cpu", dtype=torch.bfloat16)
    hf_baseline.copy_qwen3_weights_into_hypenet(qwen3, engine_model)
    settings = model.ModelSettings(device="cpu", dtype="bfloat16", check_length=1024, attention_backend="torch",
                                   compile_decode=False)
    check = model.check_engine(engine_model, qwen3, settings)  # raises CheckFailed above its bar
    assert max(check["relative_errors"].values()) <= check["bar"]


def test_bench_profile_toy_writes_results(tmp_path):
    def profile(*extra: str) -> dict:
        assert main(["bench", "profile", "--toy", "--device", "cpu", "--dtype", "float32", "--context", "48",
                     "--steps", "2", "--no-compile", "--out", str(tmp_path), *extra]) == 0
        name = "hypenet-fused-projections" if "fused-projections" in extra else "hypenet"
        return json.loads((tmp_path / f"profile-{name}-48-b1.json").read_text())

    top = profile("--top", "5")
    assert top["wall_ms_per_step"] > 0 and top["kernel_ms_per_step"] is None  # no device timeline on CPU
    assert 0 < len(top["rows"]) <= 5 and top["rows_total"] >= len(top["rows"])
    assert "| kernel / operator |" in (tmp_path / "profile-hypenet-48-b1.md").read_text()
    # Every operator (rankings by CPU time move under load; counts do not).
    result, fused = profile("--top", "1000"), profile("--top", "1000", "--decode-step", "fused-projections")
    assert len(result["rows"]) == result["rows_total"]

    def matrix_products(rows):
        return next(row["calls_per_step"] for row in rows if row["name"] == "aten::mm")

    # Each block's 8 input/output maps (q, k, v, gate, o; MLP gate, up, down) become 4 (qkv+gate, o, gate+up, down).
    layers = len(hypenet_config(toy=True).layer_types)
    assert matrix_products(result["rows"]) - matrix_products(fused["rows"]) == 4 * layers


def prefill_profile(tmp_path, *extra: str, system: str = "hypenet") -> dict:
    assert main(["bench", "profile", "--phase", "prefill", "--toy", "--device", "cpu", "--dtype", "float32",
                 "--context", "48", "--chunk", "16", "--steps", "1", "--top", "1000", "--out", str(tmp_path),
                 "--system", system, *extra]) == 0
    name = system + ("-compiled" if "--compile-prefill" in extra else "")
    assert "Prefill chunk profile" in (tmp_path / f"profile-{name}-prefill16-48-b1.md").read_text()
    return json.loads((tmp_path / f"profile-{name}-prefill16-48-b1.json").read_text())


def test_bench_profile_prefill_chunk_toy(tmp_path):
    result = prefill_profile(tmp_path)
    shape = ModelShape.of(model.build_hypenet(hypenet_config(toy=True), device=torch.device("cpu"),
                                              dtype=torch.float32))
    assert result["flops_per_step"] == shape.prefill_flops(64) - shape.prefill_flops(48)
    assert result["floor_ms"] is None and result["wall_ms_per_step"] > 0  # no FLOP ceiling for a CPU
    assert len(result["rows"]) == result["rows_total"]
    kinds = result["us_per_step_by_kind"]
    assert sum(kinds.values()) == pytest.approx(sum(row["us_per_step"] for row in result["rows"]))
    assert kinds["matmul"] > 0


def test_bench_profile_prefills_a_whole_prompt_of_the_converted_shape_on_the_attention_backend_it_is_given(
        tmp_path):
    """`--system converted-135m` (what `hyla eval niah` prefills on a converted SmolLM2-135M), its toy sizes here,
    `--context 0`: a whole prompt, as an evaluation prefills it (no cached prefix to attend to and merge); the
    chunk's FLOPs are that shape's, and `--attention-backend` reaches the engine."""
    from hyla.bench.shapes import converted_135m_config

    assert main(["bench", "profile", "--phase", "prefill", "--toy", "--device", "cpu", "--dtype", "float32",
                 "--context", "0", "--chunk", "16", "--steps", "1", "--top", "1000", "--out", str(tmp_path),
                 "--system", "converted-135m", "--attention-backend", "torch"]) == 0
    result = json.loads((tmp_path / "profile-converted-135m-prefill16-0-b1.json").read_text())
    shape = ModelShape.of(model.build_hypenet(converted_135m_config(toy=True), device=torch.device("cpu"),
                                              dtype=torch.float32))
    assert result["flops_per_step"] == shape.prefill_flops(16) > 0
    assert result["settings"]["attention_backend"] == "torch" and result["engine"]["attention_backend"] == "torch"
    assert result["shape"]["num_attention_layers"] == shape.num_attention_layers


@pytest.mark.slow
def test_bench_profile_compiled_prefill_toy(tmp_path):
    # Compiled, the norms, RoPE, gates and MLP activations run inside compiled regions: fewer eager operator calls.
    plain, compiled = prefill_profile(tmp_path), prefill_profile(tmp_path, "--compile-prefill")
    assert compiled["settings"]["compile_prefill"]

    def eager_calls(result):
        return sum(row["calls_per_step"] for row in result["rows"] if row["name"] in ("aten::mul", "aten::add"))

    assert eager_calls(compiled) < eager_calls(plain)


def test_compile_modes_reach_torch_compile(monkeypatch):
    from hyla.bench import cli, train
    from hyla.inference import decode_step, settings
    from hyla.inference import engine as engine_module

    assert cli.COMPILE_MODES_CLI == settings.COMPILE_MODES
    assert cli.DECODE_STEPS == settings.DECODE_STEPS and cli.MATVEC_KERNELS == settings.MATVEC_KERNELS
    assert cli.TRAINED_MIXERS == train.TRAINED_MIXERS and cli.TRAIN_PATHS == train.PATHS
    modes = []
    monkeypatch.setattr(torch, "compile", lambda f, **kwargs: modes.append(kwargs["mode"]) or f)
    monkeypatch.setattr(decode_step, "_COMPILED", {})  # the process-wide compiled functions, empty
    toy = model.build_hypenet(hypenet_config(toy=True), device=torch.device("cpu"), dtype=torch.float32)
    engine_module.InferenceEngine(toy, batch_size=1, max_length=8, compile_decode=True,
                                  compile_mode="max-autotune-no-cudagraphs")
    # the decode step's six functions: Lightning block, GLA/GDN block, attention block before and after attention,
    # embed, logits
    assert modes == ["max-autotune-no-cudagraphs"] * 6
    # a second engine shares them
    engine_module.InferenceEngine(toy, batch_size=2, max_length=8, compile_decode=True,
                                  compile_mode="max-autotune-no-cudagraphs")
    assert len(modes) == 6
    with pytest.raises(ValueError, match="compile_mode"):
        engine_module.InferenceEngine(toy, batch_size=1, max_length=8, compile_decode=True,
                                      compile_mode="reduce-overhead")


def test_prefill_traffic_scales_with_the_chunk():
    """bench/prefill_bytes.py scales bytes counted at T tokens to 64K: the count must be per-token work."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from prefill_bytes import block_traffic

    for kind in ("lightning", "attention"):
        small = block_traffic(hypenet_config(toy=True), kind, 64)
        large = block_traffic(hypenet_config(toy=True), kind, 128)
        assert small[1] == large[1] > 10  # the same operations
        assert large[0] / small[0] == pytest.approx(2.0, rel=2e-3)  # bytes in proportion to tokens


def test_device_rows_count_each_kernel_once():
    """Eager CUDA profiles list an operator (aten::mm, an autograd function, inductor's launch record named as its
    kernel) beside each kernel it launched, both holding the kernel's device time, and CUPTI's "Command Buffer Full"
    beside them: the 2026-11-30 prefill profiles summed all of it, 7.7 s of "kernels" in a 3.9 s step."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from hyla.bench.profile import device_rows

    def event(key, us, device_type, count=2):
        return SimpleNamespace(key=key, self_device_time_total=us, count=count, device_type=device_type)

    events = [event("aten::mm", 300.0, DeviceType.CPU), event("nvjet_sm90_tst_192x192", 300.0, DeviceType.CUDA),
              event("triton_poi_fused_mul_0", 40.0, DeviceType.CPU), event("triton_poi_fused_mul_0", 40.0,
                                                                              DeviceType.CUDA),
              event("ChunkSimpleGLAFunction", 20.0, DeviceType.CPU), event("chunk_fwd_kernel_o", 20.0, DeviceType.CUDA),
              event("Command Buffer Full", 900.0, DeviceType.CUDA), event("Memset (Device)", 2.0, DeviceType.CUDA),
              event("aten::empty", 0.0, DeviceType.CPU)]
    rows, queue_full_ms = device_rows(events, steps=2)
    assert sorted(row["name"] for row in rows) == ["Memset (Device)", "chunk_fwd_kernel_o", "nvjet_sm90_tst_192x192",
                                                    "triton_poi_fused_mul_0"]
    assert sum(row["us_per_step"] for row in rows) == (300 + 40 + 20 + 2) / 2
    assert queue_full_ms == 900 / 2 / 1e3


def test_long_prefill_repeats_are_all_timed_after_one_chunk_of_warm_up():
    """At >= 128K the benchmark warms up on one chunk, then times `long_repeats` full prefills, however long each
    takes (time_ms would otherwise cut repeats past 10 s), and keeps every time."""
    import statistics
    from types import SimpleNamespace

    from hyla.bench import model as bench_model
    from hyla.bench.floors import ModelShape
    from hyla.bench.shapes import hypenet_config
    from hyla.models.configuration import HypeNetConfig

    calls = []
    fake_model = SimpleNamespace(device=torch.device("cpu"), config=SimpleNamespace(vocab_size=100))
    # The engine's interface as time_engine_prefill uses it (the chunk length lives in its settings).
    from hyla.inference.settings import EngineSettings

    assert "prefill_chunk" in EngineSettings.__dataclass_fields__
    engine = SimpleNamespace(model=fake_model, device=torch.device("cpu"), batch_size=1,
                             settings=SimpleNamespace(prefill_chunk=2**16), reset=lambda: calls.append("reset"), prefill=lambda ids: calls.append(ids.shape[1]))
    shape = ModelShape.of(bench_model.build_hypenet(HypeNetConfig(**hypenet_config(toy=True).to_dict()),
                                                    device="cpu", dtype=torch.float32))
    row = bench_model.time_engine_prefill(engine, shape, 2**17, log=lambda _: None, repeats=3, long_repeats=4)
    assert [c for c in calls if c != "reset"] == [2**16] + [2**17] * 4
    assert len(row["times_ms"]) == 4 and row["ms"] == statistics.median(row["times_ms"])
    row = bench_model.time_engine_prefill(engine, shape, 2**10, log=lambda _: None, repeats=3)
    assert len(row["times_ms"]) == 3  # short contexts: one warm-up run, then `repeats`


def test_model_plot_marks_a_panel_without_measurements(tmp_path):
    """A decode-only run (synthetic caches) has no prefill rows: that panel says so instead of an empty log axis."""
    import warnings

    from hyla.bench.report import plot_model

    row = {"context": 2**17, "batch": 1, "ms_per_token": 2.7, "floor_ms": 1.8, "weights_plus_cache_gib": 7.0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns when a legend has nothing to show
        plot_model({"systems": {"hypenet": {"decode": [row], "prefill": []}}}, tmp_path / "model.png")
    assert (tmp_path / "model.png").stat().st_size > 0


@pytest.mark.parametrize("verb", ["model", "profile"])
def test_triton_kernels_and_bad_settings_are_refused_up_front(tmp_path, capsys, verb):
    common = ["bench", verb, "--toy", "--out", str(tmp_path), "--device", "cpu"]
    assert main(common + ["--decode-step", "triton-fused"]) != 0
    assert "Triton decode kernels need a CUDA device" in capsys.readouterr().err
    assert main(common + ["--matvec", "triton"]) != 0
    assert "products of --decode-step fused-projections" in capsys.readouterr().err
    assert main(common + ["--engine-settings", str(tmp_path / "missing.json")]) != 0
    assert "not an engine settings file" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written
