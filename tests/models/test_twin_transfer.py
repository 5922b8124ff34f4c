"""GLA, GDN and SWA twins built from a teacher's attention layer (hyla.models.transfer): the transferred weights, the
gates' start at Lightning's fixed decay, and the parities that hold at that start. Expected values are written out
here (the decay formula, the sum over positions), not taken from the code under test."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from hyla.convert.align import record_mixers
from hyla.layers.rope import RotaryEmbedding, apply_rotary
from hyla.models.transfer import (TWIN_BUILDERS, gdn_from_attention, gla_from_attention, hypenet_config_from_teacher,
                                  lightning_from_attention, swa_from_attention, to_hypenet)
from hyla.ops.gdn import gdn_attention
from hyla.ops.gla import gla_attention
from hyla.ops.lightning import lightning_attention

HEADS, KV_HEADS, HEAD_DIM = 6, 2, 8
COMMON = dict(vocab_size=120, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=HEADS,
              num_key_value_heads=KV_HEADS, max_position_embeddings=256, rms_norm_eps=1e-5)


def expected_log_decay() -> torch.Tensor:
    """HypeNet's g_h = -2^(-8h/H), h = 1..H (float64 [H]), from the formula."""
    return torch.tensor([-(2.0 ** (-8.0 * h / HEADS)) for h in range(1, HEADS + 1)], dtype=torch.float64)


def llama_teacher(dtype=torch.float32, **fields):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**COMMON, **fields)).eval().to(dtype)


def context_of(teacher, hidden_states):
    """The mixers' context (positions, RoPE) for a pass over `hidden_states` [B, T, hidden], no cache."""
    equivalent = to_hypenet(teacher, attention_rope=True).eval()
    return equivalent.model._context(hidden_states, None, None, None, None)


def linear_attention_oracle(q, k, v, log_decay, scale):
    """o_t = scale * sum_{s <= t} exp(g_h (t - s)) (q_t . k_s) v_s, written out per position (float64)."""
    q, k, v = q.double(), k.double(), v.double()
    length = q.shape[1]
    lag = torch.arange(length)[:, None] - torch.arange(length)[None, :]  # t - s
    weights = torch.where(lag[None] >= 0, (log_decay.double()[:, None, None] * lag[None]).exp(), 0.0)  # [H, T, S]
    scores = torch.einsum("bthd,bshd->bhts", q, k) * weights[None] * scale
    return torch.einsum("bhts,bshd->bthd", scores, v)


@pytest.mark.parametrize("kind", ["lightning", "gla", "gdn"])
def test_linear_twins_map_query_head_to_kv_head_of_its_group(kind):
    """Query heads 0-2 take KV head 0, heads 3-5 KV head 1 (g = 3), weights and biases; q and o are copied."""
    teacher = Qwen2ForCausalLM(Qwen2Config(**COMMON)).eval()
    attention = teacher.model.layers[0].self_attn
    with torch.no_grad():
        for kv in range(KV_HEADS):
            rows = slice(kv * HEAD_DIM, (kv + 1) * HEAD_DIM)
            attention.k_proj.weight[rows], attention.k_proj.bias[rows] = float(kv + 1), 10.0 * (kv + 1)
            attention.v_proj.weight[rows], attention.v_proj.bias[rows] = -float(kv + 1), -10.0 * (kv + 1)
    config = hypenet_config_from_teacher(teacher, [kind] * 2)
    twin = TWIN_BUILDERS[kind](attention, config, 0)
    per_head = [1.0] * 3 + [2.0] * 3
    assert twin.k_proj.weight.view(HEADS, HEAD_DIM, -1)[:, 0, 0].tolist() == per_head
    assert twin.v_proj.weight.view(HEADS, HEAD_DIM, -1)[:, 0, 0].tolist() == [-x for x in per_head]
    assert twin.k_proj.bias.view(HEADS, HEAD_DIM)[:, 0].tolist() == [10.0 * x for x in per_head]
    assert twin.v_proj.bias.view(HEADS, HEAD_DIM)[:, 0].tolist() == [-10.0 * x for x in per_head]
    assert torch.equal(twin.q_proj.weight, attention.q_proj.weight)
    assert torch.equal(twin.q_proj.bias, attention.q_proj.bias)
    assert torch.equal(twin.o_proj.weight, attention.o_proj.weight)


def test_gla_and_gdn_twins_start_at_the_lightning_decay_on_every_token():
    teacher = llama_teacher()
    config = hypenet_config_from_teacher(teacher, ["gla", "gdn"])
    hidden = torch.randn(2, 13, COMMON["hidden_size"]) * 3
    context = context_of(teacher, hidden)
    expected = expected_log_decay()
    lightning = lightning_from_attention(teacher.model.layers[0].self_attn, config, 0)
    assert torch.allclose(lightning.log_decay(torch.device("cpu")), expected, rtol=1e-15, atol=0)

    gla_gate = gla_from_attention(teacher.model.layers[0].self_attn, config, 0).token_inputs(hidden, context)["g"]
    # GLA's gate is float32 (logsigmoid(b) / 16 from a float32 bias): float32 rounding of g_h.
    assert gla_gate.dtype == torch.float32 and gla_gate.shape == (2, 13, HEADS, HEAD_DIM)
    assert torch.allclose(gla_gate.double(), expected[None, None, :, None].expand_as(gla_gate), rtol=1e-6, atol=0)

    gdn = gdn_from_attention(teacher.model.layers[1].self_attn, config, 1)
    gdn_gate, beta = gdn.token_inputs(hidden, context).values()
    assert torch.allclose(gdn_gate.double(), expected.expand_as(gdn_gate), rtol=1e-6, atol=0)
    assert torch.equal(beta, torch.full_like(beta, 0.5))


def test_gates_at_their_start_have_a_gradient():
    """Zeroed maps (GLA's W2, GDN's Wa and Wb) still learn: the gates become data-dependent during alignment."""
    teacher = llama_teacher()
    config = hypenet_config_from_teacher(teacher, ["gla", "gdn"])
    hidden = torch.randn(2, 9, COMMON["hidden_size"])
    context = context_of(teacher, hidden)
    gla = gla_from_attention(teacher.model.layers[0].self_attn, config, 0)
    gdn = gdn_from_attention(teacher.model.layers[1].self_attn, config, 1)
    (gla(hidden, context).square().sum() + gdn(hidden, context).square().sum()).backward()
    for grad in (gla.gk_proj[1].weight.grad, gdn.a_proj.weight.grad, gdn.b_proj.weight.grad):
        assert grad is not None and grad.abs().max() > 0


@pytest.mark.parametrize("rope", [False, True])
def test_gla_twin_recurrence_equals_the_lightning_twins_without_qk_norm(rope):
    """Where the parity holds: with Lightning's q/k norm off and RoPE alike in both (both off, or Lightning's and
    `gla_rope` on), both twins have the same q, k, v (same transferred weights, no feature map, the same rotation)
    and a gate of g_h on every key channel, Diag(exp(g_h) 1) = exp(g_h) I, so both recurrences are linear attention
    with decay exp(g_h): the outputs before the output norm are equal. Past that point they differ by construction
    (Lightning: one RMSNorm over all heads and a sigmoid gate; GLA: a per-head RMSNorm and a swish gate), so the
    layers' outputs are not compared. The oracle's q and k are the teacher's projections, rotated here with
    `apply_rotary` at positions 0.. when `rope`."""
    teacher = llama_teacher(torch.float64)
    config = hypenet_config_from_teacher(teacher, ["gla", "lightning"], lightning_rope=rope,
                                         lightning_qk_norm=False, gla_rope=rope)
    attention = teacher.model.layers[0].self_attn
    hidden = torch.randn(2, 21, COMMON["hidden_size"], dtype=torch.float64)
    context = context_of(teacher, hidden)
    q_l, k_l, v_l = lightning_from_attention(attention, config, 0).project(hidden, context)
    gla = gla_from_attention(attention, config, 0)
    q_g, k_g, v_g = gla.project(hidden, context)
    gate = gla.token_inputs(hidden, context)["g"]
    assert torch.equal(q_l, q_g) and torch.equal(k_l, k_g) and torch.equal(v_l, v_g)
    q, k, v = (expand_kv(proj(hidden)) for proj in (attention.q_proj, attention.k_proj, attention.v_proj))
    if rope:
        cos, sin = RotaryEmbedding(config)(torch.arange(21)[None].expand(2, -1), torch.float64)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    scale = HEAD_DIM**-0.5
    expected = linear_attention_oracle(q, k, v, expected_log_decay(), scale)
    lightning_out, _ = lightning_attention(q_l, k_l, v_l, log_decay=expected_log_decay(), scale=scale)
    gla_out, _ = gla_attention(q_g, k_g, v_g, g=gate, scale=scale)
    # float64 but for GLA's float32 gate: a relative error ~1e-7 per step in the decay.
    assert torch.allclose(lightning_out, expected, rtol=1e-10, atol=1e-10)
    assert torch.allclose(gla_out.double(), expected, rtol=1e-5, atol=1e-6)
    unrotated = hypenet_config_from_teacher(teacher, ["gla", "lightning"], lightning_qk_norm=False)
    assert torch.equal(gla_from_attention(attention, unrotated, 0).project(hidden, context)[1], k_l) is not rope


def expand_kv(projected: torch.Tensor) -> torch.Tensor:
    """[B, T, heads * D] of a teacher projection -> [B, T, HEADS, D], KV heads repeated for their query heads."""
    heads = projected.view(*projected.shape[:2], -1, HEAD_DIM)
    return heads.repeat_interleave(HEADS // heads.shape[2], dim=2)


def test_gdn_twin_on_orthogonal_keys_writes_half_the_linear_attention_state():
    """Where GDN's start (beta = 1/2, decay g_h) meets linear attention: for orthonormal keys the delta rule erases
    nothing, so the state is half that of linear attention with the same decay (GDN has no parity with Lightning on
    general keys: the delta rule overwrites overlapping keys, and GDN applies silu and L2 norms of its own)."""
    teacher = llama_teacher(torch.float64)
    config = hypenet_config_from_teacher(teacher, ["gdn", "gdn"])
    hidden = torch.randn(1, HEAD_DIM, COMMON["hidden_size"], dtype=torch.float64)
    gdn = gdn_from_attention(teacher.model.layers[0].self_attn, config, 0)
    context = context_of(teacher, hidden)
    q, _, v = gdn.project(hidden, context)
    gate, beta = gdn.token_inputs(hidden, context).values()
    # Key t of every head is the unit vector e_t: orthonormal over the HEAD_DIM positions.
    keys = torch.eye(HEAD_DIM, dtype=torch.float64)[None, :, None, :].expand(1, HEAD_DIM, HEADS, HEAD_DIM)
    scale = HEAD_DIM**-0.5
    output, _ = gdn_attention(q, keys.contiguous(), v, g=gate, beta=beta, scale=scale)
    expected = 0.5 * linear_attention_oracle(q, keys, v, expected_log_decay(), scale)
    assert torch.allclose(output.double(), expected, rtol=1e-5, atol=1e-6)


def teacher_attention_io(teacher, input_ids):
    """The HF teacher's own attention layers, recorded: {layer: (input hidden states, output)}."""
    records, handles = {}, []
    for index, layer in enumerate(teacher.model.layers):
        def hook(module, args, kwargs, output, index=index):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            records[index] = (hidden.detach(), output[0].detach())

        handles.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            teacher(input_ids)
    finally:
        for handle in handles:
            handle.remove()
    return records


@pytest.mark.parametrize("length", [5, 16])
def test_swa_twin_is_the_teacher_attention_within_its_window(length):
    """SWA keeps the teacher's GQA weights, q/k norms and RoPE: on sequences no longer than the window its output is
    the teacher's attention output (float64; the RoPE tables differ in rounding: transformers builds its inverse
    frequencies in float32)."""
    teacher = llama_teacher(torch.float64, rope_theta=1e5)
    config = hypenet_config_from_teacher(teacher, ["swa", "swa"], swa_window=16)
    input_ids = torch.randint(0, COMMON["vocab_size"], (2, length), generator=torch.Generator().manual_seed(3))
    records = teacher_attention_io(teacher, input_ids)
    for index, layer in enumerate(teacher.model.layers):
        twin = swa_from_attention(layer.self_attn, config, index)
        assert twin.k_proj.weight.shape == layer.self_attn.k_proj.weight.shape  # GQA kept
        hidden, expected = records[index]
        with torch.no_grad():
            actual = twin(hidden, context_of(teacher, hidden))
        assert torch.allclose(actual, expected, rtol=0, atol=1e-9), index


def test_swa_twin_differs_from_the_teacher_only_past_its_window():
    teacher = llama_teacher(torch.float64)
    config = hypenet_config_from_teacher(teacher, ["swa", "swa"], swa_window=8)
    input_ids = torch.randint(0, COMMON["vocab_size"], (1, 20), generator=torch.Generator().manual_seed(4))
    hidden, expected = teacher_attention_io(teacher, input_ids)[0]
    twin = swa_from_attention(teacher.model.layers[0].self_attn, config, 0)
    with torch.no_grad():
        actual = twin(hidden, context_of(teacher, hidden))
    # Positions 0-7 see at most 8 keys: the window changes nothing there; every later query loses keys.
    assert torch.allclose(actual[:, :8], expected[:, :8], rtol=0, atol=1e-9)
    assert ((actual[:, 8:] - expected[:, 8:]).abs().amax(-1) > 1e-6).all()


def test_to_hypenet_builds_gla_and_gdn_layers_from_the_teacher():
    teacher = llama_teacher()
    student = to_hypenet(teacher, ["gla", "gdn"])
    assert [block.layer_type for block in student.model.layers] == ["gla", "gdn"]
    for block, layer in zip(student.model.layers, teacher.model.layers):
        assert torch.equal(block.mixer.q_proj.weight, layer.self_attn.q_proj.weight)
    tokens = torch.randint(0, COMMON["vocab_size"], (1, 11))
    with torch.no_grad():
        assert torch.isfinite(student(tokens).logits).all()


def test_alignment_targets_of_a_swa_twin_are_exact_within_the_window():
    """The stage-1 recording (the teacher-equivalent HypeNet) gives a SWA twin zero error on short sequences."""
    teacher = llama_teacher()
    equivalent = to_hypenet(teacher, attention_rope=True).eval()
    config = copy.deepcopy(equivalent.config)
    config.swa_window = 32
    recorder, context = record_mixers(equivalent, torch.randint(0, COMMON["vocab_size"], (2, 32)))
    for index, layer in enumerate(teacher.model.layers):
        with torch.no_grad():
            output = swa_from_attention(layer.self_attn, config, index)(recorder.inputs[index], context)
        assert torch.allclose(output, recorder.outputs[index], rtol=1e-5, atol=1e-6)
