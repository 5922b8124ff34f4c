"""The inference engine's settings: which decode step runs, what is compiled, and the tuned kernel launch settings.

The tuned settings ship with the package, one JSON file per GPU model under `hyla/inference/tuned/` (written by
`hyla bench sweep`, or by hand from a sweep's result), chosen by `torch.cuda.get_device_name()`; other GPUs get
`default.json` (no hyla Triton kernels in the decode step, cuBLAS products, compiled decode blocks), CPUs the
eager step. `tuned_settings(device)` is what the engine, `hyla.generate`, `hyla bench model` and `hyla generate` use
unless told otherwise; `load_settings(path)` reads another file of the same form (`hyla ... --engine-settings`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path

import torch

from hyla.ops.chunk_attention import fused_kernels_run
from hyla.ops.decode_attention import KERNELS as DECODE_ATTENTION_KERNELS
from hyla.ops.decode_attention import DecodeKernelConfig, triton_available
from hyla.ops.lightning_step import BLOCK_V, NUM_WARPS
from hyla.ops.matvec import DEFAULT_CONFIG, MatvecConfig

# The decode step's implementations (hyla.inference.decode_step): the model's own modules; each block's input maps
# concatenated into one product (q/k/v/gate; MLP gate/up); and hyla's fused Triton kernels (batch 1).
DECODE_STEPS = ("eager", "fused-projections", "triton-fused")
# The products of the "fused-projections" step: cuBLAS (F.linear) or hyla's Triton matrix-vector kernel (batch 1).
MATVEC_KERNELS = ("cublas", "triton")
# torch.compile modes for the decode blocks: the engine captures the whole step in one CUDA graph itself.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
# The layers the triton-fused step has kernels for (the others run on the fused-projections step).
TRITON_FUSED_LAYER_TYPES = ("lightning", "attention", "attention_rope")
# The shipped settings files: package data, hyla/inference/tuned/*.json.
TUNED_DIR = "tuned"


@dataclass(frozen=True)
class EngineSettings:
    """decode_step: one of DECODE_STEPS. matvec: the fused-projections step's products (MATVEC_KERNELS).
    compile_decode / compile_mode: torch.compile the decode blocks (the step is graph-captured either way on CUDA).
    compile_prefill: torch.compile what surrounds the mixing kernels in a prefill chunk. launch_pdl: programmatic
    dependent launch of the triton-fused kernels (None: where the GPU has it). prefill_chunk: tokens (summed over
    the rows prefilled together) per prefill call. attention_backend: the prefill attention kernel
    (hyla.ops.chunk_attention). decode_attention: "auto", "triton" or "torch". matvec_shapes: ((N, K), MatvecConfig or
    None for cuBLAS) per weight shape, matvec_default for other shapes; lightning_step: (block_v, num_warps);
    decode_attention_config: the split-K kernel's launch. batched: fields replaced for batch sizes above 1.
    evaluation: fields replaced when the engine serves an evaluation (`for_evaluation`): many prompts of different
    lengths in one fresh process, where a setting's first-call cost is not earned back. name: where the settings
    came from."""

    decode_step: str = "eager"
    matvec: str = "cublas"
    compile_decode: bool = False
    compile_mode: str = "default"
    compile_prefill: bool = False
    launch_pdl: bool | None = None
    prefill_chunk: int = 65536
    attention_backend: str = "auto"
    decode_attention: str = "auto"
    matvec_default: MatvecConfig = DEFAULT_CONFIG
    matvec_shapes: tuple = ()
    lightning_step: tuple[int, int] = (BLOCK_V, NUM_WARPS)
    decode_attention_config: DecodeKernelConfig = DecodeKernelConfig()
    batched: tuple = ()
    evaluation: tuple = ()
    name: str = "explicit"

    def __post_init__(self) -> None:
        for value, allowed, what in ((self.decode_step, DECODE_STEPS, "decode_step"),
                                     (self.matvec, MATVEC_KERNELS, "matvec"),
                                     (self.compile_mode, COMPILE_MODES, "compile_mode"),
                                     (self.decode_attention, DECODE_ATTENTION_KERNELS, "decode_attention")):
            if value not in allowed:
                raise ValueError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if self.matvec == "triton" and self.decode_step != "fused-projections":
            raise ValueError("matvec='triton' sets the products of decode_step='fused-projections'")

    def matvec_table(self) -> dict[tuple[int, int], MatvecConfig | None]:
        return {tuple(shape): config for shape, config in self.matvec_shapes}

    def for_batch(self, batch_size: int) -> EngineSettings:
        """These settings for `batch_size` rows: `batched` replaces its fields above batch 1."""
        return replace(self, **dict(self.batched), batched=()) if batch_size > 1 and self.batched else self

    def for_evaluation(self, model=None) -> EngineSettings:
        """These settings for an evaluation of `model`: `evaluation`'s fields replaced, named in `name`; a fused
        prefill attention kernel among them only where the model can run it (float16/bfloat16 on CUDA)."""
        evaluation = dict(self.evaluation)
        fused = model is None or fused_kernels_run(model.device, model.dtype)
        if evaluation.get("attention_backend", "auto") not in ("auto", "torch") and not fused:
            evaluation.pop("attention_backend")
        if not evaluation:
            return replace(self, evaluation=()) if self.evaluation else self
        changed = ", ".join(f"{field}={value}" for field, value in evaluation.items())
        return replace(self, **evaluation, evaluation=(), name=f"{self.name} (evaluation: {changed})")

    def summary(self) -> dict:
        """The settings that describe a run (for logs and result files)."""
        return {"settings": self.name, "decode_step": self.decode_step, "matvec": self.matvec,
                "compile_decode": self.compile_decode, "compile_prefill": self.compile_prefill,
                "launch_pdl": self.launch_pdl, "prefill_chunk": self.prefill_chunk,
                "attention_backend": self.attention_backend}

    def to_json(self) -> dict:
        """The file form (`settings_from_json` reads it back)."""
        engine = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _KERNEL_FIELDS}
        engine.pop("name")
        return {"name": self.name, "engine": engine, "batched": dict(self.batched),
                "evaluation": dict(self.evaluation),
                "matvec": {"default": dataclasses.asdict(self.matvec_default),
                           "shapes": [{"n": n, "k": k, "config": None if c is None else dataclasses.asdict(c)}
                                      for (n, k), c in self.matvec_shapes]},
                "lightning_step": {"block_v": self.lightning_step[0], "num_warps": self.lightning_step[1]},
                "decode_attention": dataclasses.asdict(self.decode_attention_config)}


_KERNEL_FIELDS = ("matvec_default", "matvec_shapes", "lightning_step", "decode_attention_config", "batched",
                  "evaluation")


def settings_from_json(payload: dict, *, name: str) -> EngineSettings:
    """EngineSettings from the file form (`EngineSettings.to_json`); unknown engine fields are an error."""
    engine = dict(payload.get("engine", {}))
    known = {f.name for f in fields(EngineSettings)} - set(_KERNEL_FIELDS) - {"name"}
    unknown = sorted(set(engine) - known) + sorted(
        set(payload.get("batched", {})) - known) + sorted(set(payload.get("evaluation", {})) - known)
    if unknown:
        raise ValueError(f"{name}: unknown engine settings {unknown}; known: {', '.join(sorted(known))}")
    matvec = payload.get("matvec", {})
    shapes = tuple(((int(s["n"]), int(s["k"])), None if s["config"] is None else MatvecConfig(**s["config"]))
                   for s in matvec.get("shapes", []))
    step = payload.get("lightning_step", {})
    return EngineSettings(
        **engine, name=payload.get("name", name), matvec_shapes=shapes,
        matvec_default=MatvecConfig(**matvec["default"]) if "default" in matvec else DEFAULT_CONFIG,
        lightning_step=(int(step.get("block_v", BLOCK_V)), int(step.get("num_warps", NUM_WARPS))),
        decode_attention_config=DecodeKernelConfig(**payload.get("decode_attention", {})),
        batched=tuple(sorted(payload.get("batched", {}).items())),
        evaluation=tuple(sorted(payload.get("evaluation", {}).items())))


def load_settings(path: str | Path) -> EngineSettings:
    """A settings file (the package's form, `hyla bench sweep`'s settings.json). One clear error for a bad file."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
        return settings_from_json(payload, name=str(path))
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not an engine settings file: {type(err).__name__}: {err}") from None


def _packaged() -> list[tuple[str, dict]]:
    files = resources.files("hyla.inference") / TUNED_DIR
    return [(entry.name, json.loads(entry.read_text())) for entry in sorted(files.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".json")]


def packaged_settings_for(device_name: str, capability: tuple[int, int]) -> EngineSettings:
    """The shipped settings of a GPU: the first file whose `devices` names a part of `device_name` and whose
    `min_capability` the GPU meets, else default.json."""
    default = None
    for file_name, payload in _packaged():
        if file_name == "default.json":
            default = payload
            continue
        named = any(part.lower() in device_name.lower() for part in payload.get("devices", []))
        if named and tuple(capability) >= tuple(payload.get("min_capability", (0, 0))):
            return settings_from_json(payload, name=f"hyla/inference/tuned/{file_name}")
    return settings_from_json(default or {}, name="hyla/inference/tuned/default.json")


def tuned_settings(device: torch.device | str) -> EngineSettings:
    """The fastest verified settings for `device`: the shipped file of its GPU model (CUDA), the eager step on CPU.
    Without triton, nothing that needs it (hyla's kernels, torch.compile on CUDA)."""
    device = torch.device(device)
    if device.type != "cuda":
        return EngineSettings(name="cpu (eager decode step)")
    index = device.index if device.index is not None else torch.cuda.current_device()
    settings = packaged_settings_for(torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index))
    if not triton_available():
        settings = replace(settings, decode_step="fused-projections" if settings.decode_step != "eager" else "eager",
                           matvec="cublas", compile_decode=False, compile_prefill=False, decode_attention="torch",
                           name=settings.name + " (no triton: eager kernels)")
    return settings


def fit_to_model(settings: EngineSettings, model, batch_size: int,
                 options=None) -> tuple[EngineSettings, list[str]]:
    """`settings` for `batch_size` rows, the triton-fused step replaced by fused projections where this model,
    batch or the InferenceOptions `options` (None: the model's own) cannot run it; returns (settings, the reasons
    for each replacement)."""
    settings = settings.for_batch(batch_size)
    options = options if options is not None else getattr(model, "inference_options", None)
    reasons = (triton_fused_obstacles(model.config, batch_size, options) if settings.decode_step == "triton-fused"
               else [])
    if reasons:
        settings = replace(settings, decode_step="fused-projections", matvec="cublas", launch_pdl=None)
    return settings, reasons


def triton_fused_obstacles(config, batch_size: int, options=None) -> list[str]:
    """Why the triton-fused decode step cannot run this model at this batch size under the InferenceOptions
    `options` (empty: it can)."""
    reasons = []
    if options is not None and options.eme_window is not None:
        reasons.append("decode_step='triton-fused' keeps one Lightning state a layer; EME (eme_window) runs SWLA's "
                       "window states on the fused-projections step")
    if batch_size != 1:
        reasons.append(f"decode_step='triton-fused' decodes one sequence (batch_size=1), got batch_size={batch_size}")
    if config.hidden_act != "silu":
        reasons.append(f"decode_step='triton-fused' computes the MLP's SiLU in its kernel; this model's activation "
                       f"is {config.hidden_act!r}")
    others = sorted(set(config.layer_types) - set(TRITON_FUSED_LAYER_TYPES))
    if others:
        reasons.append(f"decode_step='triton-fused' runs {', '.join(TRITON_FUSED_LAYER_TYPES)} layers, not "
                       f"{others}")
    if "lightning" in config.layer_types and config.head_dim % 32:
        reasons.append(f"decode_step='triton-fused' runs Lightning heads whose dimension is a multiple of 32, got "
                       f"{config.head_dim}")
    return reasons


def matvec_table_from_sweep(path: str | Path) -> tuple:
    """The per-shape choice of a matrix-vector sweep's result (`hyla bench sweep matvec|fused`, matvec-sweep.json
    or fused-sweep.json): the fastest checked setting of each shape where it beat cuBLAS, else None (cuBLAS); a shape
    measured with and without a bias that disagree: cuBLAS. As `EngineSettings.matvec_shapes`."""
    try:
        results = json.loads(Path(path).read_text())["results"]
        table: dict[tuple[int, int], MatvecConfig | None] = {}
        for r in results:
            best = r.get("fastest")
            faster = best is not None and best["us"] < r["cublas_us"]
            config = MatvecConfig(**{f.name: int(best[f.name]) for f in fields(MatvecConfig)}) if faster else None
            key = (int(r["n"]), int(r["k"]))
            if key in table and table[key] != config:
                config = None
            table[key] = config
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a matvec sweep result (`hyla bench sweep matvec|fused`): "
                         f"{type(err).__name__}: {err}") from None
    return tuple(sorted(table.items()))




# EngineSettings fields a command line may set on top of a settings file (None: the file's value).
OVERRIDABLE = ("decode_step", "matvec", "compile_decode", "compile_mode", "compile_prefill", "launch_pdl",
               "prefill_chunk", "attention_backend")


def resolve_settings(device: torch.device | str, *, path: str | Path | None = None, **overrides) -> EngineSettings:
    """The settings file at `path` (None: the tuned settings of `device`) with the `overrides` that are not None
    (fields of OVERRIDABLE) replaced."""
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    if unknown:
        raise ValueError(f"not engine settings a command may set: {unknown}")
    base = load_settings(path) if path is not None else tuned_settings(device)
    return with_fields(base, {name: value for name, value in overrides.items() if value is not None})


def with_fields(settings: EngineSettings, fields_: dict) -> EngineSettings:
    """`settings` with `fields_` replaced; a decode step other than triton-fused drops the launch setting of the
    fused kernels (a settings file's launch_pdl) unless `fields_` sets it too."""
    if not fields_:
        return settings
    fields_ = dict(fields_)
    if fields_.get("decode_step", "triton-fused") != "triton-fused" and "launch_pdl" not in fields_:
        fields_["launch_pdl"] = None
    return replace(settings, **fields_)


__all__ = ["COMPILE_MODES", "DECODE_STEPS", "MATVEC_KERNELS", "OVERRIDABLE", "EngineSettings", "fit_to_model",
           "load_settings", "matvec_table_from_sweep", "packaged_settings_for", "resolve_settings",
           "settings_from_json", "triton_fused_obstacles", "tuned_settings", "with_fields"]
