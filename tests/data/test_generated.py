"""Teacher-generated text from a tiny random teacher: batched, seeded, prompt first."""

from __future__ import annotations

import torch

from hyla.data.generated import PROMPTS, GenerationSettings
from hyla.data.sources import open_source
from hyla.data.tokenize import PrepareSettings, prepare_corpus


def _generated(teacher_dir, **options) -> list[str]:
    settings = GenerationSettings(num_documents=5, max_new_tokens=6, batch_size=2, **options)
    return list(open_source(f"teacher:{teacher_dir}", generation=settings).documents())


def test_teacher_source_samples_reproducibly_from_varied_prompts(tiny_teacher_dir):
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    documents = _generated(tiny_teacher_dir, seed=1)
    assert torch.equal(torch.rand(1), before), "sampling must leave the global RNG alone"
    assert len(documents) == 5
    assert all(any(document.startswith(prompt) for prompt in PROMPTS) for document in documents)
    assert any(len(document) > len(prompt) for document in documents for prompt in PROMPTS
               if document.startswith(prompt))
    assert _generated(tiny_teacher_dir, seed=1) == documents
    assert _generated(tiny_teacher_dir, seed=2) != documents


def test_generated_text_becomes_a_corpus_with_its_settings_recorded(tmp_path, tiny_teacher_dir):
    generation = GenerationSettings(num_documents=3, max_new_tokens=4, batch_size=3)
    settings = PrepareSettings(tokenizer=str(tiny_teacher_dir), sources=(f"teacher:{tiny_teacher_dir}",),
                               generation=generation)
    result = prepare_corpus(tmp_path / "corpus", settings, show_progress=False)
    assert result.manifest["num_documents"] == 3
    assert result.manifest["settings"]["generation"]["max_new_tokens"] == 4
    assert result.manifest["sources"][0]["generation_path"] == "engine"


def test_a_source_built_on_teacher_text_names_the_path_it_was_sampled_on(tiny_teacher_dir):
    settings = GenerationSettings(num_documents=2, max_new_tokens=3, batch_size=2)
    source = open_source(f"docs@0-1:teacher:{tiny_teacher_dir}", generation=settings)
    assert source.record == {}, "known once sampling starts"
    assert len(list(source.documents())) == 1
    assert source.record == {"generation_path": "engine"}


def test_the_teacher_samples_as_its_teacher_equivalent_hypenet_on_the_engine(tiny_teacher_dir):
    from transformers import AutoModelForCausalLM

    from hyla.data.generated import generating_model
    from hyla.inference.generate import generation_path

    teacher = AutoModelForCausalLM.from_pretrained(tiny_teacher_dir).eval()
    model = generating_model(teacher)
    assert generation_path(model)[0] == "engine"
    ids = torch.randint(3, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, teacher(ids).logits, atol=1e-5)
