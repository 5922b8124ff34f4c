"""Generation on the inference engine (`hyla.generate`) through its CPU fallback: ragged (left-padded) batches,
greedy and sampled tokens against transformers' generate on the same model, end-of-sequence stopping per row, the
routing of requests and models between the two paths, and the session's engine reuse."""

import pytest
import torch

import hyla
from hyla import HypeNetConfig, HypeNetForCausalLM, InferenceOptions
from hyla.inference import InferenceEngine
from hyla.inference.generate import (
    GenerationSession,
    Sampling,
    generation_path,
    generation_path_record,
    hf_request_to_engine,
)

# float64 models: the engine and the model's forward differ by summation order only (~1e-15), so greedy and sampled
# tokens agree exactly with transformers' generate on the same model.
TOL = 1e-9
PAD = 0


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    settings = dict(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, layer_types=["lightning", "attention", "lightning", "attention_rope"],
        attention_logit_scaling_a=5.0, attention_output_gate=True, attention_qk_norm=True, pad_token_id=PAD,
        eos_token_id=None, bos_token_id=None,
    )
    settings.update(overrides)
    return HypeNetForCausalLM(HypeNetConfig(**settings)).double().eval()


def left_pad(prompts, pad_id=PAD):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return ids, mask


def prompts_of(lengths, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 101, (n,), generator=generator).tolist() for n in lengths]


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_ragged_prefill_and_decode_equal_each_prompt_alone():
    """A left-padded batch (real tokens, not pad ids, under the padding: only the mask may keep them out) prefills each
    row at its own positions, rows of equal length together: logits, Lightning states and decode steps equal each
    prompt run alone."""
    model = tiny_model()
    prompts = prompts_of([5, 17, 17, 1, 30])
    ids, mask = left_pad(prompts)
    ids[mask == 0] = torch.randint(3, 101, (int((mask == 0).sum()),))
    engine = InferenceEngine(model, batch_size=len(prompts), max_length=40, prefill_chunk=12)
    logits = [engine.prefill(ids, mask)]
    assert engine.lengths == [len(p) for p in prompts]
    steps = torch.randint(3, 101, (len(prompts), 3), generator=torch.Generator().manual_seed(2))
    logits += [engine.decode(steps[:, t : t + 1]) for t in range(3)]
    for row, prompt in enumerate(prompts):
        sequence = torch.tensor([prompt + steps[row].tolist()])
        with torch.no_grad():
            alone = model(sequence, use_cache=True)
        expected = alone.logits[0, len(prompt) - 1:]
        assert rel(torch.stack([step[row] for step in logits]), expected) <= TOL, f"row {row}"
        for index, state in engine.cache.states.items():
            assert rel(state[row], alone.past_key_values.recurrent_state(index)[0]) <= TOL


def test_prefill_refuses_padding_that_is_not_on_the_left():
    model = tiny_model()
    engine = InferenceEngine(model, batch_size=2, max_length=16)
    ids = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="left-padded"):
        engine.prefill(ids, torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="at least one real token"):
        engine.prefill(ids, torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]))


@pytest.mark.parametrize("lengths", [(9,), (5, 17, 1, 30), (6, 6, 6)])
def test_greedy_tokens_equal_transformers_generate(lengths):
    model = tiny_model()
    ids, mask = left_pad(prompts_of(lengths))
    ours = hyla.generate(model, ids, mask, max_new_tokens=12, pad_token_id=PAD)
    theirs = model.hf_generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=PAD)
    assert ours.shape == theirs.shape == (len(lengths), ids.shape[1] + 12)
    assert torch.equal(ours, theirs)


def test_rows_stop_at_their_end_of_sequence_token_as_transformers_does():
    """Each row ends at its first EOS (later positions pad), and generation stops when every row has ended: the
    result is as long as transformers' (fewer than max_new_tokens columns), token for token."""
    model = tiny_model(3)
    ids, mask = left_pad(prompts_of((4, 11, 7), seed=5))
    free = hyla.generate(model, ids, mask, max_new_tokens=20, pad_token_id=PAD)[:, ids.shape[1]:]
    # an EOS that the first row reaches at its 4th new token
    eos = int(free[0, 3])
    ours = hyla.generate(model, ids, mask, max_new_tokens=20, eos_token_id=[eos, 100], pad_token_id=PAD)
    theirs = model.hf_generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=[eos, 100],
                               pad_token_id=PAD)
    assert torch.equal(ours, theirs)
    first_row = ours[0, ids.shape[1]:]
    assert first_row[3] == eos and (first_row[4:] == PAD).all()


@pytest.mark.parametrize("lengths", [(5, 8), (8, 5), (5, 17, 1, 30, 5)])
def test_sampling_draws_what_transformers_draws_under_one_seed(lengths):
    """Temperature, top-k and top-p in transformers' order, one draw a step from torch's global generator over the
    rows in the batch's order (not the engine's order by length): the same seed gives the same tokens on both paths,
    and again on a second run."""
    model = tiny_model(4)
    ids, mask = left_pad(prompts_of(lengths, seed=7))
    kwargs = dict(max_new_tokens=10, do_sample=True, temperature=0.9, top_k=20, top_p=0.9, pad_token_id=PAD)
    torch.manual_seed(0)
    ours = hyla.generate(model, ids, mask, **kwargs)
    torch.manual_seed(0)
    again = hyla.generate(model, ids, mask, **kwargs)
    torch.manual_seed(0)
    theirs = model.hf_generate(ids, attention_mask=mask, **kwargs)
    assert torch.equal(ours, again) and torch.equal(ours, theirs)


def test_streamer_receives_the_prompt_then_each_token():
    class Collect:
        def __init__(self):
            self.calls, self.ended = [], False

        def put(self, value):
            self.calls.append(value.clone())

        def end(self):
            self.ended = True

    model = tiny_model()
    ids = torch.tensor([prompts_of((6,))[0]])
    streamer = Collect()
    out = hyla.generate(model, ids, max_new_tokens=5, streamer=streamer)
    assert torch.equal(streamer.calls[0], ids) and streamer.ended
    assert torch.equal(torch.cat([c.reshape(-1) for c in streamer.calls[1:]]), out[0, 6:])
    # A ragged batch the engine reorders by length: each step's tokens reach the streamer in the batch's row order.
    ids, mask = left_pad(prompts_of((8, 5, 3)))
    streamer = Collect()
    out = hyla.generate(model, ids, mask, max_new_tokens=4, pad_token_id=PAD, streamer=streamer)
    assert torch.equal(torch.stack(streamer.calls[1:], dim=1), out[:, ids.shape[1]:])


def test_session_rebuilds_its_engine_when_the_weights_change():
    model = tiny_model()
    session = GenerationSession(model)
    ids = torch.tensor([prompts_of((7,))[0]])
    first = session.generate(ids, max_new_tokens=6)
    engine = session.engine
    assert not engine.graph_captured, "CUDA graphs only on CUDA"
    assert torch.equal(session.generate(ids, max_new_tokens=6), first) and session.engine is engine
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)
    changed = session.generate(ids, max_new_tokens=6)
    assert session.engine is not engine
    assert torch.equal(changed, model.hf_generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=PAD))
    assert session.stats.prompt_tokens == 7 and session.stats.new_tokens == 6


def test_each_call_reports_the_seconds_it_spent_building_an_engine():
    """A slow first batch, told apart: the call that builds an engine reports its seconds, a call that reuses it 0;
    `engine_built_s` keeps the last build's. No graph is captured on the CPU."""
    session = GenerationSession(tiny_model())
    ids = torch.tensor([prompts_of((7,))[0]])
    session.generate(ids, max_new_tokens=3)
    first = session.stats
    assert first.engine_build_s > 0 and first.engine_built_s == first.engine_build_s
    session.generate(ids, max_new_tokens=3)
    assert session.stats.engine_build_s == 0 and session.stats.engine_built_s == first.engine_build_s
    session.generate(ids.repeat(2, 1), max_new_tokens=3)  # another batch size: a new engine
    assert session.stats.engine_build_s > 0 and session.stats.engine_built_s == session.stats.engine_build_s
    assert first.graph_capture_s == session.stats.graph_capture_s == 0


@pytest.mark.parametrize("lengths", [(9,), (5, 1), (1,)])
def test_a_greedy_batch_of_fewer_rows_runs_on_the_reserved_engine_with_filler_rows(lengths):
    """An engine reserved for 3 rows of 40 positions serves smaller, shorter greedy batches (filler rows after the
    batch's, dropped): the tokens, the EOS stop and the output's width are transformers', the stats count the
    batch's rows only, the streamer sees them only, and no other engine is built."""
    model = tiny_model(3)
    session = GenerationSession(model)
    assert session.reserve(3, 40) > 0 and session.builds == 1 and session.engine.batch_size == 3
    ids, mask = left_pad(prompts_of(lengths, seed=5))
    free = session.generate(ids, mask, max_new_tokens=12, pad_token_id=PAD)[:, ids.shape[1]:]
    eos = int(free[0, 2])  # the first row ends at its 3rd new token
    theirs = model.hf_generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=eos,
                               pad_token_id=PAD)
    streamed = []

    class Collect:
        def put(self, value):
            streamed.append(value.clone())

        def end(self):
            pass

    ours = session.generate(ids, mask, max_new_tokens=12, eos_token_id=eos, pad_token_id=PAD, streamer=Collect())
    assert torch.equal(ours, theirs)
    assert session.builds == 1 and session.stats.engine_build_s == 0 and session.engine.batch_size == 3
    assert session.stats.prompt_tokens == sum(lengths)
    real = theirs[:, ids.shape[1]:]
    assert session.stats.new_tokens == sum(int((row == eos).long().cumsum(0).sub((row == eos).long()).eq(0).sum())
                                           for row in real)
    assert all(call.shape[0] == len(lengths) for call in streamed[1:])
    streamed = torch.stack(streamed[1:], dim=1)  # after every row's EOS, pads up to the next check
    assert torch.equal(streamed[:, : real.shape[1]], real) and (streamed[:, real.shape[1]:] == PAD).all()


def test_a_sampled_batch_of_fewer_rows_gets_an_engine_of_its_own():
    """Filler rows would take draws of the sampler: a sampled batch runs on an engine of its own rows, and draws what
    transformers draws under the same seed."""
    model = tiny_model(4)
    session = GenerationSession(model)
    session.reserve(3, 40)
    ids, mask = left_pad(prompts_of((5, 8), seed=7))
    kwargs = dict(max_new_tokens=8, do_sample=True, temperature=0.9, top_k=20, pad_token_id=PAD)
    torch.manual_seed(0)
    ours = session.generate(ids, mask, sampling=Sampling(do_sample=True, temperature=0.9, top_k=20),
                            max_new_tokens=8, pad_token_id=PAD)
    torch.manual_seed(0)
    theirs = model.hf_generate(ids, attention_mask=mask, **kwargs)
    assert torch.equal(ours, theirs) and session.builds == 2 and session.engine.batch_size == 2


def test_a_reserved_engine_is_kept_for_shorter_prompts_and_replaced_for_longer_ones():
    model = tiny_model()
    session = GenerationSession(model)
    session.reserve(2, 64)
    engine = session.engine
    assert session.reserve(1, 30) == 0 and session.engine is engine  # served by the current one
    ids = torch.tensor([prompts_of((7,))[0]])
    assert torch.equal(session.generate(ids, max_new_tokens=4),
                       model.hf_generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=PAD))
    assert session.engine is engine
    assert engine.cache.max_length < 300  # buffers are rounded up (to 256 positions at least)
    long_ids = torch.tensor([prompts_of((300,))[0]])
    session.generate(long_ids, max_new_tokens=4)
    assert session.engine is not engine and session.engine.cache.max_length >= 304 and session.builds == 2


def test_models_the_engine_cannot_run_keep_transformers_generate():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tiny_llama = LlamaForCausalLM(LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=64,
                                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                              pad_token_id=PAD)).eval()
    assert generation_path(tiny_llama)[0] == "hf"
    hybrid = tiny_model(layer_types=["lightning", "hh_gdn", "lightning", "attention"], headwise_ratio="1:1")
    path, reason = generation_path(hybrid)
    assert path == "hf" and "hh_gdn" in reason
    with pytest.raises(ValueError, match="cannot run this model"):
        generation_path(hybrid, "engine")
    assert generation_path(tiny_model())[0] == "engine"
    ids = torch.tensor([[5, 6, 7]])
    out = hyla.generate(tiny_llama, ids, max_new_tokens=3, pad_token_id=PAD)
    assert torch.equal(out, tiny_llama.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=PAD))


def test_a_result_names_the_one_path_its_outputs_took_or_both():
    assert generation_path_record("engine") == "engine"
    assert generation_path_record("hf", "hf", None) == "hf"
    assert generation_path_record("hf", "engine") == generation_path_record("engine+hf", "hf") == "engine+hf"
    assert generation_path_record() is None and generation_path_record(None) is None


def greedy_by_forward(model, ids, steps, options):
    sequence = ids
    with torch.no_grad():
        for _ in range(steps):
            logits = model(sequence, use_cache=False, inference_options=options).logits
            sequence = torch.cat([sequence, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return sequence


@pytest.mark.parametrize("options", [InferenceOptions(logit_scaling_a=1.5), InferenceOptions(eme_window=4)],
                         ids=["logit-scaling", "eme"])
def test_generation_runs_under_the_inference_options_it_is_given(options):
    """Given per call or as the model's own: on the engine and on transformers' generate, the tokens are the greedy
    continuation of the forward under those options."""
    model = tiny_model()
    ids = torch.tensor([prompts_of((9,))[0]])
    expected = greedy_by_forward(model, ids, 6, options)
    assert not torch.equal(expected, greedy_by_forward(model, ids, 6, InferenceOptions()))
    assert generation_path(model, "auto", options)[0] == "engine"
    assert torch.equal(hyla.generate(model, ids, max_new_tokens=6, inference_options=options), expected)
    assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=PAD,
                                      inference_options=options), expected)
    model.inference_options = options
    assert torch.equal(hyla.generate(model, ids, max_new_tokens=6), expected)
    assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=PAD), expected)


def test_model_generate_requests_the_engine_serves(monkeypatch):
    """On CUDA, `model.generate` runs on the engine for greedy and plain sampling requests; beams, penalties, scores
    and the like stay with transformers. (On CPU every request stays there.)"""
    model = tiny_model()
    ids = torch.tensor([[5, 6, 7, 8]])
    assert hf_request_to_engine(model, ids, None, {"max_new_tokens": 4}) is None  # a CPU model
    monkeypatch.setattr(type(model), "device", property(lambda self: torch.device("cuda")))
    request = hf_request_to_engine(model, ids, None, {"max_new_tokens": 4, "do_sample": False})
    assert request["max_new_tokens"] == 4 and request["sampling"] == Sampling()
    default_length = hf_request_to_engine(model, ids, None, {})
    assert default_length["max_new_tokens"] == 20 - 4  # transformers' default max_length
    sampled = hf_request_to_engine(model, None, None, {"input_ids": ids, "do_sample": True, "temperature": 0.7})
    assert sampled["sampling"] == Sampling(do_sample=True, temperature=0.7, top_k=50, top_p=1.0)
    for refused in ({"num_beams": 2}, {"repetition_penalty": 1.2}, {"output_scores": True,
                                                                    "return_dict_in_generate": True},
                    {"min_new_tokens": 2}, {"inputs_embeds": torch.zeros(1, 4, 64)}):
        assert hf_request_to_engine(model, ids, None, {"max_new_tokens": 4, **refused}) is None, refused


def test_importing_hyla_and_generating_on_cpu_loads_no_triton_kernel_module():
    """`import hyla` (and generation on CPU) never loads hyla's Triton modules: only hyla/ops/*/gpu.py import triton
    at module level, and they are imported only when a CUDA (or interpreted) kernel is asked for."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, torch, hyla, hyla.cli, hyla.inference.generate\n"
            "from hyla import HypeNetConfig, HypeNetForCausalLM\n"
            "config = HypeNetConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,\n"
            "    num_attention_heads=2, num_key_value_heads=1, head_dim=16, layer_types=['lightning', 'attention'])\n"
            "hyla.generate(HypeNetForCausalLM(config).eval(), torch.tensor([[3, 4, 5]]), max_new_tokens=3)\n"
            "print(sorted(name for name in sys.modules if name.startswith('hyla.') and name.endswith('.gpu')))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
    import re

    source = Path(hyla.__file__).parent
    top_level = re.compile(r"^(import triton|from triton)", re.M)  # module level; inside functions is lazy
    importing = sorted(str(path.relative_to(source)) for path in source.rglob("*.py")
                       if top_level.search(path.read_text()))
    assert all(path.startswith("ops/") and path.endswith("/gpu.py") for path in importing), importing
