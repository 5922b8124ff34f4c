"""Stage-1 initialisation at the teacher's output scale (hyla.convert.calibrate), on tiny random teachers: Lightning
twins, and GLA/GDN twins (a per-head output norm; a swish output gate opened along the mean input first)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from hyla.convert.align import AlignmentTwins, alignment_loss, record_mixers
from hyla.convert.calibrate import SWISH_GATE_LEVEL, calibrate_twins, collect_output_stats
from hyla.models.transfer import to_hypenet

COMMON = dict(vocab_size=120, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
              num_key_value_heads=2, max_position_embeddings=256)


def make_twins(family: str, rnn_mixer: str = "lightning") -> AlignmentTwins:
    torch.manual_seed(0)
    if family == "llama":
        teacher = LlamaForCausalLM(LlamaConfig(**COMMON, tie_word_embeddings=True, attention_bias=True))
    else:
        # head_dim 16: the attention width (96) differs from the hidden size (48)
        teacher = Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=False))
    with torch.no_grad():
        for layer in teacher.model.layers:
            # Attention outputs of different scales per layer, as in a trained teacher.
            layer.self_attn.v_proj.weight.mul_(torch.rand(()) * 20)
    equivalent = to_hypenet(teacher, attention_rope=True).eval()
    return AlignmentTwins.for_training(equivalent, teacher, equivalent.config, torch.device("cpu"),
                                       rnn_mixer=rnn_mixer)


def batches(count=2, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 120, (2, 24), generator=generator)} for _ in range(count)]


def measured_relative_errors(twins, data) -> list[float]:
    """The alignment loss's own per-layer MSE over `data`, relative to the teacher's output energy."""
    mse, energy = torch.zeros(len(twins.twins)), torch.zeros(len(twins.twins))
    with torch.no_grad():
        for batch in data:
            _, metrics = alignment_loss(twins, batch)
            mse += torch.stack([metrics[f"mse_{i:02d}"] for i in range(len(twins.twins))])
            energy += torch.stack([metrics[f"energy_{i:02d}"] for i in range(len(twins.twins))])
    return (mse / energy).tolist()


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("mode", ["none", "rms", "lstsq"])
def test_reported_errors_equal_the_alignment_loss_before_and_after(family, mode):
    twins, data = make_twins(family), batches()
    before = measured_relative_errors(twins, data)
    report = calibrate_twins(twins, data, mode)
    after = measured_relative_errors(twins, data)
    # float64 sums against the float32 loss on the same tokens: agreement to float32 rounding of sums of squares
    assert report["relative_error_before"] == pytest.approx(before, rel=1e-4, abs=1e-6)
    assert report["relative_error_after"] == pytest.approx(after, rel=1e-4, abs=1e-6)


def test_lstsq_is_the_least_error_and_rms_matches_the_energy_per_channel():
    data = batches()
    errors = {}
    for mode in ("none", "rms", "lstsq"):
        twins = make_twins("llama")
        errors[mode] = calibrate_twins(twins, data, mode)["relative_error_after"]
        if mode == "rms":
            # The sums are taken at weight 1: the twin's output energy per channel scales with the weight squared.
            stats = collect_output_stats(twins, data)
            for i, layer in stats.items():
                twin_square = layer.b_outer.diagonal() * twins.twins[i].o_norm.weight.double() ** 2
                assert torch.allclose(twin_square, layer.a_square, rtol=1e-4)
    for layer in range(3):
        # The ridge term costs a little: lstsq is the optimum up to it.
        assert errors["lstsq"][layer] <= min(errors["none"][layer], errors["rms"][layer]) * (1 + 1e-3)


@pytest.mark.parametrize("rnn_mixer", ["gla", "gdn"])
@pytest.mark.parametrize("mode", ["none", "rms", "lstsq"])
def test_per_head_norm_twins_report_the_alignment_loss_before_and_after(rnn_mixer, mode):
    """GLA/GDN: one o_norm weight shared by the heads, and (rms, lstsq) the swish gate opened in between: the
    reported errors are still the alignment loss of the twins as built and as left."""
    twins, data = make_twins("qwen3", rnn_mixer), batches()
    before = measured_relative_errors(twins, data)
    report = calibrate_twins(twins, data, mode)
    after = measured_relative_errors(twins, data)
    assert report["relative_error_before"] == pytest.approx(before, rel=1e-4, abs=1e-6)
    assert report["relative_error_after"] == pytest.approx(after, rel=1e-4, abs=1e-6)
    assert ("input_mean_share" in report) == (mode != "none")


@pytest.mark.parametrize("rnn_mixer", ["gla", "gdn"])
def test_lstsq_is_the_least_error_over_the_shared_per_head_weight(rnn_mixer):
    """Both rules open the gates alike (same data), then pick a weight of head_dim: lstsq's is the optimum."""
    data = batches()
    rms = calibrate_twins(make_twins("qwen3", rnn_mixer), data, "rms")["relative_error_after"]
    lstsq = calibrate_twins(make_twins("qwen3", rnn_mixer), data, "lstsq")["relative_error_after"]
    for layer in range(3):
        assert lstsq[layer] <= rms[layer] * (1 + 1e-3)


def test_swish_gates_open_to_their_level_at_the_mean_input():
    """W_g = c m / |m|^2 on every channel: the gate's pre-activation averaged over the calibration tokens is c."""
    twins, data = make_twins("llama", "gla"), batches()
    calibrate_twins(twins, data, "lstsq")
    inputs = {i: [] for i in range(len(twins.twins))}
    for batch in data:
        recorder, _ = record_mixers(twins.teacher[0], batch["input_ids"])
        for i in inputs:
            inputs[i].append(recorder.inputs[i].reshape(-1, recorder.inputs[i].shape[-1]))
    for i, twin in enumerate(twins.twins):
        with torch.no_grad():
            pre_activation = twin.g_proj(torch.cat(inputs[i])).mean(0)
        assert torch.allclose(pre_activation, torch.full_like(pre_activation, SWISH_GATE_LEVEL), rtol=1e-4)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown twin init"):
        calibrate_twins(make_twins("llama"), batches(), "ones")


def test_calibration_leaves_the_teacher_unchanged_and_removes_its_hooks():
    twins, data = make_twins("llama"), batches()
    teacher = twins.teacher[0]
    state = {k: v.clone() for k, v in teacher.state_dict().items()}
    calibrate_twins(twins, data, "lstsq")
    assert all(torch.equal(state[k], v) for k, v in teacher.state_dict().items())
    for block in teacher.model.layers:
        assert not block.mixer.o_proj._forward_pre_hooks and not block.mixer._forward_hooks
