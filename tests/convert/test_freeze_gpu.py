"""`distill.freeze` on CUDA's training fast path (compiled whole blocks with Lightning's kernel as a custom op, the
fused LM head + loss, fused AdamW): the kept attention layers' teacher weights leave stage 2 bitwise as the teacher
has them, while the rest of the student trains. The CPU test (tests/convert/test_branch.py) checks the same on the
eager path; here the compiled graphs and the fused optimizer must leave the frozen tensors alone too."""

from __future__ import annotations

import json

import pytest
import torch
from test_branch import _teacher_tensors, _tensors
from test_convert_pipeline import convert_args

from hyla.cli import main

pytestmark = pytest.mark.gpu


def test_a_distillation_on_the_cuda_fast_path_keeps_the_frozen_attention_weights(tiny_teacher, tmp_path):
    out = tmp_path / "run"
    # Stage 1 eager: its compiled twins would double the test's compile time (over 4 minutes on a fresh H200).
    assert main(convert_args(tiny_teacher, out, "--device", "cuda", "--set", "align.compile=false",
                             "--set", "distill.freeze=attention", "--set", "distill.lr=3e-3",
                             "--until-stage", "distill")) == 0
    distill = json.loads((out / "03-distill" / "manifest.json").read_text())
    fast = distill["results"]["fast_path"]
    assert fast["compile"] and fast["fused_loss"] and fast["fused_optimizer"], fast  # the path a conversion takes
    chosen = json.loads((out / "02-select" / "selection.json").read_text())["chosen"]
    assert chosen
    teacher = _teacher_tensors(tiny_teacher)
    aligned = _tensors(out / "01-align" / "twins.safetensors")
    trained = _tensors(out / "03-distill" / "student.safetensors")
    for layer in chosen:
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            expected = teacher[f"model.layers.{layer}.self_attn.{name}.weight"].float()
            assert torch.equal(trained[f"model.layers.{layer}.mixer.{name}.weight"].float(), expected), (layer, name)
        mlp = f"model.layers.{layer}.mlp.down_proj.weight"
        assert not torch.equal(trained[mlp].float(), teacher[mlp].float())  # the layer's MLP still trains
    other = next(i for i in range(len({k.split(".")[2] for k in trained if k.startswith("model.layers.")}))
                 if i not in chosen)
    # stage 1's twin of a recurrent layer (keys "LAYER.NAME") against the same tensors after stage 2
    twin = {f"model.layers.{other}.mixer.{key.split('.', 1)[1]}": key for key in aligned if key.startswith(f"{other}.")}
    assert twin and all(name in trained for name in twin), sorted(twin)
    assert any(not torch.equal(trained[name].float(), aligned[key].float()) for name, key in twin.items())
