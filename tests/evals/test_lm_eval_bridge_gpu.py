"""The lm-eval-harness bridge on CUDA: a HypeNet answers a local `generate_until` task on hyla's inference engine
(this GPU's tuned settings, uncompiled, graph-captured decode) with the text of HFLM's own call of transformers'
generate.

Float32 and the pure-torch Lightning op on both paths (`use_backend("torch")`), as in
tests/inference/test_generate_gpu.py: nothing rounds to bf16 or TF32, so the greedy tokens, and the texts lm-eval
cuts from them, must be identical. Offline: the task's YAML and data are written to the test's folder. The GPU
image has no lm-eval; scripts/gpu-session/gpu-tests.sh installs it from .gpu-inputs/lmeval
(scripts/gpu-session/pack_inputs.sh).
"""

from __future__ import annotations

import pytest
import torch

from hyla.ops.dispatch import use_backend
from offline_models import teacher_tokenizer

pytestmark = pytest.mark.gpu
pytest.importorskip("lm_eval", reason="lm-eval-harness is not installed (pip install lm-eval==0.4.13)")

TASK = "hyla_local_until_gpu"
# Three lengths: lm-eval left-pads the batch, and the engine prefills each row at its own positions.
_PROMPTS = ["The quick brown", "def add(a, b):\n", "One of the special magic numbers is"]
_MAX_GEN_TOKS = 16
# The engine's start-up without torch.compile: the test is about the bridge, not the compiled kernels.
_UNCOMPILED = {"compile_decode": False, "compile_prefill": False}


def _tiny_hypenet(tokenizer):
    """A float32 HypeNet on CUDA (Lightning and attention layers) with the head size the GPU kernels take."""
    from hyla import HypeNetConfig, HypeNetForCausalLM

    torch.manual_seed(0)
    config = HypeNetConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                           layer_types=["lightning", "attention", "lightning", "lightning"],
                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    return HypeNetForCausalLM(config).to("cuda", torch.float32).eval()


def _continuations(lm, folder) -> list[str]:
    """lm's answer to each document of the local task, in document order, as lm-eval scores it."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    task_manager = TaskManager(include_path=str(folder), include_defaults=False)
    output = lm_eval.simple_evaluate(model=lm, tasks=[TASK], task_manager=task_manager, log_samples=True,
                                     bootstrap_iters=0)
    samples = sorted(output["samples"][TASK], key=lambda sample: sample["doc_id"])
    return [sample["filtered_resps"][0] for sample in samples]


def test_a_hypenet_answers_an_lm_eval_task_on_the_engine_on_cuda_with_hflms_text(tmp_path, monkeypatch, engine_calls,
                                                                                  until_task):
    from lm_eval.models.huggingface import HFLM

    from hyla.evals.generation import Generation
    from hyla.evals.lm_eval_bridge import lm_eval_model

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    until_task(tmp_path, TASK, _PROMPTS, max_gen_toks=_MAX_GEN_TOKS)
    tokenizer = teacher_tokenizer()
    model = _tiny_hypenet(tokenizer)
    with use_backend("torch"):
        hflm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=len(_PROMPTS), device="cuda")
        expected = _continuations(hflm, tmp_path)
        # lm-eval's stopping criteria keep HFLM's call of model.generate on transformers' generate, off the engine.
        assert engine_calls == []
        generation = Generation(model, "engine", **_UNCOMPILED)
        bridged = lm_eval_model(model, tokenizer, batch_size=len(_PROMPTS), generation=generation)
        assert _continuations(bridged, tmp_path) == expected
    assert any(expected), "every continuation is empty: the comparison would show nothing"
    assert len(engine_calls) == 1 and engine_calls[0][0] == len(_PROMPTS)
    described = generation.describe()
    assert described["path"] == "engine" and described["calls"] == 1
    assert described["engine"]["compile_decode"] is False and described["graph_capture_s"] > 0
