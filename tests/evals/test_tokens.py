"""Token ids kept from building prompts, and the tokenizer's Rust backend called directly: the same ids as the
tokenizer's own call, given back to that tokenizer only."""

from __future__ import annotations

import gc
import pickle
from dataclasses import replace

import pytest

from hyla.evals import niah
from hyla.evals.generation import Generation
from hyla.evals.haystack import count_tokens
from hyla.evals.niah_samples import build_samples
from hyla.evals.tokens import kept_prompt_ids, plain_backend


def _encoding_in_python(tokenizer):
    """The same tokenizer under a subclass that encodes through Python (so its backend is not called directly)."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    class Overridden(type(tokenizer)):
        def _encode_plus(self, *args, **kwargs):
            return TokenizersBackend._encode_plus(self, *args, **kwargs)

    tokenizer.__class__ = Overridden
    assert plain_backend(tokenizer) is None
    return tokenizer


@pytest.mark.parametrize("bos", [False, True])
def test_kept_ids_are_the_tokenizers_own_with_special_tokens(make_word_tokenizer, bos):
    tokenizer = make_word_tokenizer(bos=bos)
    texts = ["w4 w5 w6", "", "w7 <eos> nope w8"]
    kept = kept_prompt_ids(tokenizer, texts)
    assert [ids.of(tokenizer).tolist() for ids in kept] == [tokenizer(text)["input_ids"] for text in texts]
    assert [len(ids.of(tokenizer)) for ids in kept] == [count_tokens(tokenizer, text) + bos for text in texts]


def test_kept_ids_go_to_the_tokenizer_that_made_them_while_it_encodes_the_same(make_word_tokenizer):
    tokenizer, twin = make_word_tokenizer(bos=True), make_word_tokenizer(bos=True)
    (kept,) = kept_prompt_ids(tokenizer, ["w4 w5"])
    assert kept.of(twin) is None and kept.of(tokenizer) is not None
    tokenizer.backend_tokenizer.enable_truncation(max_length=1)
    assert kept.of(tokenizer) is None
    copied = pickle.loads(pickle.dumps(kept))
    assert copied.of(tokenizer) is None and copied.ids.tolist() == kept.ids.tolist() == [2, 4, 5]
    del tokenizer
    gc.collect()
    assert kept.tokenizer() is None
    assert kept_prompt_ids(_encoding_in_python(twin), ["w4"]) == [None]


@pytest.mark.parametrize("task_name", ["SK1", "SK3", "MK3", "MQ"])
def test_samples_keep_the_ids_the_tokenizer_gives_their_prompts(smollm2_tokenizer, task_name):
    samples = build_samples(smollm2_tokenizer, task_name, 2048, 2, seed=3)
    for sample in samples:
        assert sample.prompt_ids.of(smollm2_tokenizer).tolist() == smollm2_tokenizer(sample.input)["input_ids"]
        assert sample.num_prompt_tokens == count_tokens(smollm2_tokenizer, sample.input)
        assert "prompt_ids" not in sample.to_dict()


@pytest.mark.parametrize("task_name", ["SK2", "MK2"])
def test_samples_are_the_same_whether_the_backend_is_called_directly_or_not(smollm2_tokenizer, task_name):
    from hyla.models.loading import load_tokenizer

    direct = build_samples(smollm2_tokenizer, task_name, 4096, 3, seed=5)
    through_python = build_samples(_encoding_in_python(load_tokenizer("smollm2-135m")), task_name, 4096, 3, seed=5)
    assert direct == through_python  # every field but the kept ids
    assert all(s.prompt_ids is None for s in through_python) and all(s.prompt_ids is not None for s in direct)


def test_evaluation_with_kept_ids_equals_the_one_that_encodes(smollm2_tokenizer, tiny_llama):
    samples = build_samples(smollm2_tokenizer, "SK1", 1024, 3, seed=1) + build_samples(
        smollm2_tokenizer, "MV", 1024, 2, seed=1)
    kept, encoding = Generation(tiny_llama, "hf"), Generation(tiny_llama, "hf")
    with_ids = niah.evaluate_samples(tiny_llama, smollm2_tokenizer, samples, batch_size=2, max_new_tokens=4,
                                     generation=kept)
    without = niah.evaluate_samples(tiny_llama, smollm2_tokenizer, [replace(s, prompt_ids=None) for s in samples],
                                    batch_size=2, max_new_tokens=4, generation=encoding)
    assert with_ids == without and all(record["pred"] for record in with_ids)
    assert kept.totals["encode_s"] == 0.0 < encoding.totals["encode_s"]
