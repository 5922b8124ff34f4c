"""`hyla bench kernels`: sequence mixers head to head (Lightning, causal SDPA by backend, sliding-window attention),
forward and forward+backward over lengths; every mixer is checked against its pure-torch reference first."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from hyla.bench.timing import CheckFailed, peak_memory_gib, relative_error, reset_peak_memory, time_ms
from hyla.ops.attention import softmax_attention_reference
from hyla.ops.dispatch import fla_available, use_backend
from hyla.ops.lightning import lightning_attention, lightning_log_decay

# bf16 inputs against an fp32 reference on the same (rounded) inputs: bf16 outputs and intermediate products.
CHECK_TOLERANCE = 1e-2
CHECK_LENGTH = 1000  # odd, not a multiple of any kernel's block


@dataclass(frozen=True)
class KernelSettings:
    lengths: tuple[int, ...] = tuple(2**p for p in range(12, 21))  # 4K .. 1M
    batch_size: int = 1
    num_heads: int = 16
    head_dim: int = 128
    window: int = 512
    softmax_max_length: int = 2**18  # quadratic: longer runs cost more device time than they teach
    cudnn_forward_max_length: int = 2**20
    repeats: int = 5
    mixers: tuple[str, ...] | None = None  # None = every mixer available on the device
    device: str = "cuda"
    dtype: str = "bfloat16"


@dataclass
class Mixer:
    name: str
    run: object  # (q, k, v) [B, T, H, D] -> [B, T, H, D]
    reference: object
    quadratic: bool = False
    needs_cuda: bool = False
    flops_per_token: object = field(default=None)  # (length, heads, dim) -> forward FLOPs / token, or None


def _lightning(q, k, v):
    decay = lightning_log_decay(q.shape[2]).to(q.device)
    return lightning_attention(q, k, v, log_decay=decay, scale=q.shape[-1] ** -0.5)[0]


def _lightning_reference(q, k, v):
    with use_backend("torch"):
        return _lightning(q, k, v)


def _sdpa(backend_name: str | None):
    def run(q, k, v):
        context = contextlib.nullcontext()
        if backend_name is not None:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            context = sdpa_kernel(getattr(SDPBackend, backend_name))
        with context:
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
        return out.transpose(1, 2)

    return run


def _swa(window: int):
    def run(q, k, v):
        from fla.ops.attn.parallel import parallel_attn

        return parallel_attn(q, k, v, scale=q.shape[-1] ** -0.5, window_size=window)

    def reference(q, k, v):
        positions = torch.arange(q.shape[1], device=q.device)
        distance = positions[:, None] - positions[None, :]
        band = (distance >= 0) & (distance < window)
        return softmax_attention_reference(q, k, v, attention_mask=band[None, None])

    return run, reference


def available_mixers(settings: KernelSettings, device: torch.device) -> list[Mixer]:
    causal_flops = lambda length, heads, dim: 2.0 * length * heads * dim  # noqa: E731  (2 T^2 H D / T)
    mixers = [Mixer("lightning", _lightning, _lightning_reference)]
    if device.type == "cuda":
        for name, backend in (("sdpa-flash", "FLASH_ATTENTION"), ("sdpa-cudnn", "CUDNN_ATTENTION")):
            mixers.append(Mixer(name, _sdpa(backend), softmax_attention_reference, quadratic=True,
                                needs_cuda=True, flops_per_token=causal_flops))
        if fla_available():
            run, reference = _swa(settings.window)
            mixers.append(Mixer(f"swa-{settings.window}", run, reference, needs_cuda=True))
    else:
        mixers.append(Mixer("sdpa", _sdpa(None), softmax_attention_reference, quadratic=True,
                            flops_per_token=causal_flops))
    if settings.mixers is not None:
        unknown = sorted(set(settings.mixers) - {m.name for m in mixers})
        if unknown:
            raise ValueError(f"mixers {unknown} are not available here; available: {[m.name for m in mixers]}")
        mixers = [m for m in mixers if m.name in settings.mixers]
    return mixers


def _inputs(settings: KernelSettings, length: int, device, *, seed: int, grad: bool):
    dtype = getattr(torch, settings.dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (settings.batch_size, length, settings.num_heads, settings.head_dim)
    # Unit-norm rows, as after HypeNet's q/k RMSNorm and the 1/sqrt(d) scale.
    tensors = [torch.randn(shape, device=device, generator=gen).to(dtype) for _ in range(3)]
    return [t.requires_grad_(grad) for t in tensors]


def check_mixer(mixer: Mixer, settings: KernelSettings, device) -> dict:
    """Output and every input gradient against the reference (fp32 on the same bf16 inputs)."""
    q, k, v = _inputs(settings, CHECK_LENGTH, device, seed=11, grad=True)
    weights = torch.randn(q.shape, device=device, generator=torch.Generator(device=device).manual_seed(12))
    results = {}
    for label, fn, cast in (("fast", mixer.run, lambda t: t), ("reference", mixer.reference, lambda t: t.float())):
        inputs = [cast(t.detach()).requires_grad_() for t in (q, k, v)]
        out = fn(*inputs)
        (out.float() * weights).sum().backward()
        results[label] = [out.detach()] + [t.grad for t in inputs]
    errors = {name: relative_error(f, r) for name, f, r in zip(("out", "dq", "dk", "dv"), results["fast"],
                                                                 results["reference"])}
    worst = max(errors.values())
    if not worst <= CHECK_TOLERANCE:
        raise CheckFailed(f"{mixer.name}: relative error {errors} exceeds {CHECK_TOLERANCE}; no timings reported")
    return {"length": CHECK_LENGTH, "tolerance": CHECK_TOLERANCE, "relative_errors": errors}


def _within_cap(mixer: Mixer, mode: str, length: int, settings: KernelSettings) -> bool:
    if not mixer.quadratic:
        return True
    cap = settings.softmax_max_length
    if mixer.name == "sdpa-cudnn" and mode == "forward":
        cap = max(cap, settings.cudnn_forward_max_length)
    return length <= cap


def time_mixer(mixer: Mixer, mode: str, length: int, settings: KernelSettings, device) -> dict:
    q, k, v = _inputs(settings, length, device, seed=length, grad=mode == "forward+backward")
    if mode == "forward":
        def step():
            with torch.no_grad():
                mixer.run(q, k, v)
    else:
        grad_out = torch.randn_like(q)

        def step():
            mixer.run(q, k, v).backward(grad_out)
            for t in (q, k, v):
                t.grad = None
    reset_peak_memory(device)
    # Warm-up (kernel compilation, cuDNN plans) matters at short lengths only; long runs cost seconds each.
    timing = time_ms(step, device=device, warmup=1 if length <= 2**17 else 0, repeats=settings.repeats, budget_s=4.0)
    row = {"mixer": mixer.name, "mode": mode, "length": length, "median_ms": timing["median_ms"],
           "min_ms": timing["min_ms"], "repeats": len(timing["times_ms"]), "peak_memory_gib": peak_memory_gib(device)}
    if mixer.flops_per_token is not None:
        flops = settings.batch_size * length * mixer.flops_per_token(length, settings.num_heads, settings.head_dim)
        flops *= 1.0 if mode == "forward" else 3.5  # backward of flash-style attention: 2.5 forward passes
        row["tflops"] = flops / (timing["median_ms"] * 1e-3) / 1e12
    return row


def run_kernel_bench(settings: KernelSettings, *, log=print) -> dict:
    device = torch.device(settings.device)
    mixers = available_mixers(settings, device)
    log(f"kernels: {[m.name for m in mixers]} | B={settings.batch_size} H={settings.num_heads} "
        f"D={settings.head_dim} {settings.dtype} | lengths {list(settings.lengths)}")
    checks = {m.name: check_mixer(m, settings, device) for m in mixers}
    for name, check in checks.items():
        log(f"check {name}: max relative error {max(check['relative_errors'].values()):.2e} (<= {CHECK_TOLERANCE})")
    rows, skipped = [], []
    for mode in ("forward", "forward+backward"):
        for mixer in mixers:
            for length in settings.lengths:
                if not _within_cap(mixer, mode, length, settings):
                    skipped.append({"mixer": mixer.name, "mode": mode, "length": length, "reason": "length cap"})
                    continue
                try:
                    row = time_mixer(mixer, mode, length, settings, device)
                except torch.OutOfMemoryError:
                    skipped.append({"mixer": mixer.name, "mode": mode, "length": length, "reason": "out of memory"})
                    torch.cuda.empty_cache()
                    continue
                rows.append(row)
                log(f"{mode:16s} {mixer.name:12s} T={length:>8d} {row['median_ms']:10.3f} ms"
                    + (f" {row['tflops']:6.1f} TFLOP/s" if "tflops" in row else ""))
    return {"settings": asdict(settings), "checks": checks, "results": rows, "skipped": skipped}
