"""Batched greedy generation and loss by position against unbatched / unchunked references."""

from __future__ import annotations

import pytest
import torch

from hyla.evals.generation import (
    Generation,
    encode_prompts,
    generate_greedy,
    left_padded_batch,
    left_padded_ids,
)
from hyla.evals.ppl import bucket_means, default_bucket_edges, long_token_sequences, ppl_by_position, token_losses
from hyla.evals.tokens import plain_backend


def _tiny_hypenet(vocab_size: int = 97):
    """A 2-layer random HypeNet (Lightning + NoPE attention): the evaluations must work for hybrids too."""
    from hyla.models import HypeNetConfig, HypeNetForCausalLM

    torch.manual_seed(0)
    config = HypeNetConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           layer_types=["lightning", "attention"], pad_token_id=0, eos_token_id=1, bos_token_id=2)
    return HypeNetForCausalLM(config).eval()


def test_left_padding_right_aligns_prompts_without_touching_the_tokenizer(smollm2_tokenizer):
    padding_side = smollm2_tokenizer.padding_side
    input_ids, attention_mask = left_padded_batch(smollm2_tokenizer, ["a b c d e f", "hi"])
    assert smollm2_tokenizer.padding_side == padding_side
    assert attention_mask[0].all() and attention_mask[1, -1] == 1 and attention_mask[1, 0] == 0
    assert smollm2_tokenizer.decode(input_ids[1][attention_mask[1].bool()]) == "hi"


def test_prompts_encoded_in_one_call_equal_each_prompt_encoded_alone(smollm2_tokenizer):
    prompts = ["The grass is green. " * 50, "hi", "", "One of the special magic numbers for x-y is: 1234567."]
    assert plain_backend(smollm2_tokenizer) is not None  # the backend's own batched call, without offsets
    assert encode_prompts(smollm2_tokenizer, prompts) == [smollm2_tokenizer(p)["input_ids"] for p in prompts]
    assert encode_prompts(smollm2_tokenizer, []) == []


_WORD_PROMPTS = ["w4 w5 w6 w7 w8 w9 w10", "w11", "", "w12 <eos> w13 unknown w14", "w15  w16\nw17"]


@pytest.mark.parametrize("bos", [False, True])
def test_word_level_prompts_encode_as_the_tokenizer_encodes_them(make_word_tokenizer, bos):
    tokenizer = make_word_tokenizer(bos=bos)
    assert plain_backend(tokenizer) is not None
    assert encode_prompts(tokenizer, _WORD_PROMPTS) == [tokenizer(p)["input_ids"] for p in _WORD_PROMPTS]


def test_a_backend_set_to_truncate_or_split_specials_encodes_as_its_tokenizer(make_word_tokenizer):
    """A backend left with truncation on, or told to split special tokens differently from the tokenizer, is not
    called directly: the tokenizer's own call (which resets both) encodes, untruncated."""
    truncating = make_word_tokenizer()
    truncating.backend_tokenizer.enable_truncation(max_length=2)
    assert plain_backend(truncating) is None
    encoded = encode_prompts(truncating, _WORD_PROMPTS)
    assert len(encoded[0]) == 7 and encoded == [make_word_tokenizer()(p)["input_ids"] for p in _WORD_PROMPTS]
    splitting = make_word_tokenizer(split_special_tokens=True)
    splitting.backend_tokenizer.encode_special_tokens = False
    assert plain_backend(splitting) is None
    # Split, "<eos>" is text: "w12<eos>w13" is one unknown word (not w12, <eos>, w13).
    prompts = [*_WORD_PROMPTS, "w12<eos>w13"]
    encoded = encode_prompts(splitting, prompts)
    assert encoded == [splitting(p)["input_ids"] for p in prompts] and encoded[-1] == [3]


def test_a_tokenizer_that_encodes_in_python_is_called_as_it_is(make_word_tokenizer):
    from transformers import PreTrainedTokenizerFast

    class Lowering(PreTrainedTokenizerFast):
        def _encode_plus(self, text, *args, **kwargs):
            return super()._encode_plus([t.lower() for t in text], *args, **kwargs)

    base = make_word_tokenizer()
    tokenizer = Lowering(tokenizer_object=base.backend_tokenizer, pad_token="<pad>", unk_token="<unk>")
    assert plain_backend(tokenizer) is None
    assert encode_prompts(tokenizer, ["W4 w5"]) == [[4, 5]]


def _left_padded_reference(encoded, pad_id):
    # The plain-torch construction, row by row.
    longest = max(len(ids) for ids in encoded)
    input_ids = torch.full((len(encoded), longest), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(encoded), longest), dtype=torch.long)
    for row, ids in enumerate(encoded):
        input_ids[row, longest - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, longest - len(ids) :] = 1
    return input_ids, attention_mask


@pytest.mark.parametrize("encoded", [[[5, 6, 7], [8], [], [9, 10]], [[3] * 70_000], [[]], [[2**40, 0], [1]]])
def test_left_padded_tensors_equal_the_row_by_row_construction(encoded):
    input_ids, attention_mask = left_padded_ids(encoded, pad_id=7)
    expected_ids, expected_mask = _left_padded_reference(encoded, 7)
    assert input_ids.dtype == attention_mask.dtype == torch.long
    assert torch.equal(input_ids, expected_ids) and torch.equal(attention_mask, expected_mask)


def test_generation_records_the_host_work_around_each_batch(smollm2_tokenizer, tiny_llama):
    generation = Generation(tiny_llama, "hf")
    generate_greedy(tiny_llama, smollm2_tokenizer, ["Hi", "The grass is green."], max_new_tokens=2,
                    generation=generation)
    described = generation.describe()
    assert described["calls"] == 2
    assert all(described[name] >= 0 for name in ("encode_s", "tensors_s", "detokenize_s"))
    # the first batch apart, and what the process compiled: a slow start's causes, told apart in results.json
    assert 0 <= described["first_batch_s"] <= described["seconds"]
    assert "triton_cache_dir" in described["compile"]


def test_engine_generation_records_its_first_batch_and_engine_builds_apart(smollm2_tokenizer):
    """On the engine path results.json also says what the first batch spent in prefill and decode, the seconds
    spent building engines (inside `seconds`) and capturing decode graphs over every batch, and how many engines
    were built: one for more rows, none for a longer prompt that fits the buffer or for fewer rows."""
    from hyla import HypeNetConfig, HypeNetForCausalLM

    torch.manual_seed(0)
    model = HypeNetForCausalLM(HypeNetConfig(
        vocab_size=len(smollm2_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, layer_types=["lightning", "attention"])).eval()
    generation = Generation(model, "engine")
    builds = []
    for prompts in (["Hi"], ["The grass is green."], ["One", "Two"], ["Three"]):
        generate_greedy(model, smollm2_tokenizer, prompts, max_new_tokens=2, generation=generation, batch_size=2)
        builds.append(generation.session.builds)
    described = generation.describe()
    assert builds == [1, 1, 2, 2] and described["engines_built"] == 2
    assert described["calls"] == 4 and 0 < described["engine_build_s"] < described["seconds"]
    assert described["graph_capture_s"] == 0  # CUDA graphs only on CUDA
    assert 0 < described["first_prefill_s"] <= described["prefill_s"]
    assert 0 < described["first_decode_s"] <= described["decode_s"]
    assert described["first_prefill_s"] + described["first_decode_s"] <= described["first_batch_s"]


def test_generation_records_what_torch_compile_built_and_read_from_its_cache(tmp_path, monkeypatch):
    import torch._dynamo

    from hyla.evals.generation import compile_record

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    before = compile_record()
    torch.compile(lambda x: x.sin() + 1)(torch.ones(3))
    after = compile_record()
    assert after["graphs"] == before["graphs"] + 1
    assert after["fxgraph_cache_miss"] + after["fxgraph_cache_hit"] + after["fxgraph_cache_bypass"] > sum(
        before[name] for name in ("fxgraph_cache_miss", "fxgraph_cache_hit", "fxgraph_cache_bypass"))


@pytest.mark.parametrize("model_kind", ["llama", "hypenet"])
def test_batched_greedy_generation_equals_one_prompt_at_a_time(smollm2_tokenizer, model_kind, request):
    model = request.getfixturevalue("tiny_llama") if model_kind == "llama" else _tiny_hypenet(len(smollm2_tokenizer))
    prompts = ["The grass is green.", "One of the special magic numbers for x-y is: 1234567. What is it?", "Hi"]
    batched = generate_greedy(model, smollm2_tokenizer, prompts, max_new_tokens=6, batch_size=3)
    single = generate_greedy(model, smollm2_tokenizer, prompts, max_new_tokens=6, batch_size=1)
    assert batched == single
    assert all(text for text in batched)


def test_batch_size_must_be_positive(smollm2_tokenizer, tiny_llama):
    with pytest.raises(ValueError, match="batch size"):
        generate_greedy(tiny_llama, smollm2_tokenizer, ["x"], batch_size=0)


# transformers >= 5.24 renamed the cache argument to `cache` and warns on the old name, which 5.40 removes.
@pytest.mark.filterwarnings("error:`past_key_values` is deprecated:FutureWarning")
@pytest.mark.parametrize("model_kind", ["llama", "hypenet"])
def test_chunked_losses_equal_one_full_forward(model_kind, request):
    # The hybrid model ignores a cache passed without use_cache=True: the last chunk must still set it.
    model = request.getfixturevalue("tiny_llama") if model_kind == "llama" else _tiny_hypenet()
    torch.manual_seed(1)
    input_ids = torch.randint(3, 97, (2, 50))
    with torch.no_grad():
        log_probs = model(input_ids).logits[:, :-1].log_softmax(-1)
    reference = -log_probs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    for chunk_size in (7, 1000):
        # fp32 on CPU: chunked attention over a cache differs from one pass only by summation order.
        torch.testing.assert_close(token_losses(model, input_ids, chunk_size=chunk_size), reference,
                                   rtol=1e-5, atol=1e-5)


def test_default_bucket_edges():
    assert default_bucket_edges(8192) == [0, 1024, 2048, 4096, 8192]
    assert default_bucket_edges(6000) == [0, 1024, 2048, 4096, 6000]
    assert default_bucket_edges(512) == [0, 64, 128, 256, 512]


def test_bucket_means_assign_each_loss_to_the_predicted_position():
    # losses[:, p-1] is the loss at position p; positions 1..7 carry losses 1..7.
    losses = torch.arange(1, 8, dtype=torch.float32)[None].repeat(3, 1)
    buckets = bucket_means(losses, [0, 2, 4, 8])
    assert [bucket["loss"] for bucket in buckets] == [1.0, 2.5, 5.5]
    assert buckets[0]["perplexity"] == pytest.approx(torch.tensor(1.0).exp().item())


def test_ppl_by_position_on_essays(smollm2_tokenizer, tiny_llama, tmp_path):
    from hyla.evals.ppl import plot_loss_by_position

    input_ids = long_token_sequences(smollm2_tokenizer, 256, 2)
    assert input_ids.shape == (2, 256)
    result = ppl_by_position(tiny_llama, input_ids, batch_size=2, chunk_size=100)
    assert [(b["start"], b["end"]) for b in result["buckets"]] == [(0, 32), (32, 64), (64, 128), (128, 256)]
    assert result["summary"]["loss"] == pytest.approx(sum(b["loss"] * (b["end"] - max(b["start"], 1))
                                                          for b in result["buckets"]) / 255, rel=1e-5)
    plot_loss_by_position(result, tmp_path / "ppl.png")
    assert (tmp_path / "ppl.png").stat().st_size > 1000


def test_long_token_sequences_reads_user_files(smollm2_tokenizer, tmp_path):
    text_file = tmp_path / "doc.txt"
    text_file.write_text("word " * 400)
    assert long_token_sequences(smollm2_tokenizer, 100, 3, [text_file]).shape == (3, 100)
    with pytest.raises(ValueError, match="tokens"):
        long_token_sequences(smollm2_tokenizer, 1000, 3, [text_file])
    with pytest.raises(FileNotFoundError):
        long_token_sequences(smollm2_tokenizer, 10, 1, [tmp_path / "missing.txt"])


def test_atomic_writes_make_ordinary_files(tmp_path):
    import os

    from hyla.evals.report import write_json

    write_json(tmp_path / "results.json", {"a": 1})
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "results.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_niah_evaluation_builds_one_engine_for_all_its_lengths_and_batches(smollm2_tokenizer):
    """`evaluate_niah` reserves an engine for its longest length and largest batch up front: two lengths and a
    smaller last batch (3 samples, batch 2) run on it, with the predictions transformers' generate gives."""
    from hyla.evals.niah import evaluate_niah

    model = _tiny_hypenet(len(smollm2_tokenizer)).double()
    kwargs = dict(tasks=["SK1"], lengths=[256, 512], num_samples=3, batch_size=2, max_new_tokens=4)
    engine = Generation(model, "engine")
    ours = evaluate_niah(model, smollm2_tokenizer, generation=engine, **kwargs)
    theirs = evaluate_niah(model, smollm2_tokenizer, generation=Generation(model, "hf"), **kwargs)
    assert ours["generation"]["engines_built"] == 1 and engine.session.engine.batch_size == 2
    assert engine.session.engine.cache.max_length >= 512 and ours["generation"]["calls"] == 4
    assert [record["pred"] for record in ours["records"]] == [record["pred"] for record in theirs["records"]]
