"""Parameter displacement per head: zero against itself, non-zero only for a perturbed head."""

import json

import pytest
import torch
from safetensors.torch import save_file

from hyla import HypeNetForCausalLM
from hyla.analysis.displacement import (
    compare_checkpoints,
    head_slices,
    load_checkpoint,
    spectral_norms,
    summarize_displacement,
)


def save_copy(model: HypeNetForCausalLM, folder, edit=None):
    if edit is not None:
        with torch.no_grad():
            edit(model)
    model.save_pretrained(folder)
    return load_checkpoint(folder)


def nonzero(records):
    return {(record["layer"], record["projection"], record["head"]) for record in records if record["r"] != 0}


@pytest.fixture
def model(make_tiny_config):
    torch.manual_seed(0)
    return HypeNetForCausalLM(make_tiny_config())


def test_checkpoint_against_itself_is_zero_everywhere(model, tmp_path):
    checkpoint = save_copy(model, tmp_path / "a")
    records = compare_checkpoints(checkpoint, load_checkpoint(tmp_path / "a"))
    # 4 layers: q and o have 4 heads; k and v have 4 (Lightning, MHA) or 2 (attention, GQA) heads.
    assert len(records) == 4 * 8 + 3 * 8 + 1 * 4
    assert nonzero(records) == set()


@pytest.mark.parametrize(
    "layer, projection, head",
    [(0, "q", 2), (3, "k", 1), (1, "v", 3), (3, "o", 0)],
)
def test_one_perturbed_head_is_the_only_one_displaced(model, tmp_path, layer, projection, head):
    before = save_copy(model, tmp_path / "before")
    head_dim = model.config.head_dim

    def perturb(model):
        weight = getattr(model.model.layers[layer].mixer, f"{projection}_proj").weight
        rows = slice(head * head_dim, (head + 1) * head_dim)
        if projection == "o":
            weight[:, rows] += 0.01 * torch.randn_like(weight[:, rows])
        else:
            weight[rows] += 0.01 * torch.randn_like(weight[rows])

    after = save_copy(model, tmp_path / "after", perturb)
    records = compare_checkpoints(before, after)
    assert nonzero(records) == {(layer, projection, head)}
    summary = summarize_displacement(records)
    layer_type = model.config.layer_types[layer]
    assert summary["by_group"][layer_type][projection] > 0
    assert summary["by_layer"][layer]["layer_type"] == layer_type


def test_o_proj_heads_are_column_slices():
    weight = torch.arange(4 * 6, dtype=torch.float64).reshape(4, 6)  # hidden 4, 3 heads of dim 2
    slices = head_slices(weight, "o", 2)
    assert len(slices) == 3
    torch.testing.assert_close(slices[1], weight[:, 2:4])


def write_checkpoint(folder, tensors, **config):
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return load_checkpoint(folder)


def test_repeated_key_heads_are_compared_with_the_head_they_copy(tmp_path):
    # A GQA teacher's 2 key heads become 4 MHA heads (head j copies head j // 2); then head 3 moves.
    key = torch.randn(2 * 8, 32, dtype=torch.float64)
    repeated = key.reshape(2, 8, 32).repeat_interleave(2, dim=0).reshape(4 * 8, 32).clone()
    repeated[3 * 8 : 4 * 8] *= 1.5
    name = "model.layers.0.self_attn.k_proj.weight"
    before = write_checkpoint(tmp_path / "teacher", {name: key}, hidden_size=32, num_attention_heads=4)
    after = write_checkpoint(tmp_path / "student", {name.replace("self_attn", "mixer"): repeated}, hidden_size=32,
                             num_attention_heads=4, layer_types=["lightning"])
    records = compare_checkpoints(before, after)
    assert [record["source_head"] for record in records] == [0, 0, 1, 1]
    assert [round(record["r"], 12) for record in records] == [0, 0, 0, 0.5]


def test_bad_paths_are_one_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing" / "folder")


@pytest.mark.parametrize("shape", [(3, 8, 40), (3, 40, 8), (2, 16, 16)])
def test_spectral_norms_equal_matrix_norm_ord_2(shape):
    matrices = torch.randn(*shape, dtype=torch.float64)
    # √λ_max of the Gram matrix is accurate to ~1e-15 relative in float64; 1e-10 catches any wrong axis or root.
    torch.testing.assert_close(spectral_norms(matrices), torch.linalg.matrix_norm(matrices, ord=2), rtol=1e-10,
                               atol=0)
    assert spectral_norms(torch.zeros(1, 4, 6, dtype=torch.float64)).item() == 0
