"""`hyla bench loss`: the LM head fused with its training loss, implementation by implementation, at the conversion's
shapes: stage 2's KL(teacher || student) and stage 3's cross-entropy, forward and backward under the training's bf16
autocast (the student's hidden states and head in float32, the frozen teacher in bf16, as `hyla convert` runs them on
CUDA). Every implementation is first checked against the float32 formulas on the same inputs, rounded to bf16 as
autocast rounds them (value and the gradients of the hidden states and of the head's weight), then timed; times and
peak memory are also given as ratios to hyla's chunked loss in the same run.

The implementations:
- `hyla-chunked`: `hyla.ops.linear_loss`, the training's default (the KL with the labels, whose cross-entropy the
  stage reports as a metric).
- `hyla-triton`: the same with the KL's per-chunk arithmetic in hyla's Triton kernel (`kernel="triton"`,
  `hyla.ops.linear_loss.gpu`: two reads of the logits where the compiled default makes three); on CUDA, for the
  KL only (the cross-entropy case skips it).
- `liger`: Liger Kernel's fused linear losses, on CUDA where `liger_kernel` imports. KL: `LigerFusedLinearJSD` with
  `jsd_beta=0`, which its JSD kernel computes as the forward KL sum_v P (log P - log Q) with P the teacher's and Q the
  student's distribution (liger_kernel/ops/jsd.py, `_jsd_kernel`, the `beta == 0.0` branch), summed over the
  vocabulary and scaled by 1 / (rows not ignored): without labels every row counts, hyla's mean over rows. Its
  `accum_dtype=torch.float32`: with the default the head's gradient accumulates in the weight's dtype through an
  in-place `addmm_`, which autocast leaves in float32, so a float32 head would take float32 products.
  Cross-entropy: `LigerFusedLinearCrossEntropyLoss()`, the mean over rows whose label is not -100.
- `fla`: flash-linear-attention's fused losses, on CUDA where `fla` imports. KL: `fla.modules.FusedKLDivLoss` (its
  only reduction, `batchmean`: sum_v P (log P - log Q) with P the teacher's distribution, summed over the vocabulary
  and divided by the rows, hyla's mean over rows; fla/modules/fused_kl_div/ops.py, `kl_div_kernel`), which takes no
  labels and computes its gradients inside the forward, over chunks of rows. Cross-entropy:
  `fla.modules.FusedLinearCrossEntropyLoss()`, the mean over rows whose label is not -100.
- `eager`: the plain formulas with the [rows, V] logits materialised (`hyla.ops.linear_loss.reference`), the stages'
  eager reference path; reported as out of memory where it does not fit.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import asdict, dataclass, replace

import torch

from hyla.bench.shapes import parse_case
from hyla.bench.timing import allocated_gib, peak_memory_gib, relative_error, reset_peak_memory, time_ms
from hyla.ops.linear_loss import (
    linear_cross_entropy_chunked,
    linear_cross_entropy_reference,
    linear_kl_divergence_chunked,
    linear_kl_divergence_reference,
)
from hyla.train.step import training_autocast

LOSSES = ("kl", "ce")
IMPLEMENTATIONS = ("hyla-chunked", "hyla-triton", "liger", "fla", "eager")
# The losses an implementation computes, where not all of LOSSES.
ONLY_LOSSES = {"hyla-triton": ("kl",)}
# Other projects' kernels: an error inside them is a finding the run reports and goes past, not a crash.
LIBRARIES = ("liger", "fla")
BASELINE = "hyla-chunked"
# The loss sums rows x V terms whose bf16 roundings average out (~1e-5 measured at 1,500 x 49,152 on CPU in bf16).
LOSS_TOLERANCE = 1e-3
# The head's products take bf16 operands and give bf16 logits (relative rounding 2^-9 ~ 2e-3 each), and the logits'
# gradient enters the backward products in bf16: 2-6e-3 relative against float32 at 1,500 x 49,152 (CPU, bf16).
# `hyla bench kernels` holds its bf16 kernels to the same 1e-2.
GRADIENT_TOLERANCE = 1e-2
IGNORED_EVERY = 7  # every seventh label -100: ignored rows in the cross-entropy


@dataclass(frozen=True)
class LossCase:
    loss: str
    batch: int
    seq_len: int

    @property
    def rows(self) -> int:
        return self.batch * self.seq_len

    @property
    def label(self) -> str:
        return f"{self.loss}:{self.batch}x{self.seq_len}"

    @classmethod
    def parse(cls, text: str) -> LossCase:
        """`LOSS:BATCHxLEN`, e.g. `kl:16x4096`."""
        return cls(*parse_case(text, LOSSES, what="loss", example="kl:16x4096"))


# Distillation (16 x 4096) and fine-tuning (4 x 16384) at the halo-smollm2 recipe's shapes.
DEFAULT_CASES = (LossCase("kl", 16, 4096), LossCase("ce", 4, 16384))
TOY_CASES = (LossCase("kl", 2, 64), LossCase("ce", 1, 128))


@dataclass(frozen=True)
class LossBenchSettings:
    cases: tuple[LossCase, ...] = DEFAULT_CASES
    hidden_size: int = 576  # SmolLM2-135M
    vocab_size: int = 49152
    implementations: tuple[str, ...] = IMPLEMENTATIONS
    # Odd: at V = 49,152 hyla's chunks of 5,376 rows leave a short third one.
    check_rows: int = 12289
    repeats: int = 5
    # None: bfloat16 on CUDA (the frozen teacher as distillation runs it there), float32 elsewhere.
    teacher_dtype: str | None = None
    toy: bool = False  # recorded: the sizes above are the toy ones
    device: str = "cuda"

    def __post_init__(self):
        unknown = sorted(set(self.implementations) - set(IMPLEMENTATIONS))
        if unknown:
            raise ValueError(f"unknown implementations {unknown}; known: {', '.join(IMPLEMENTATIONS)}")

    def resolved_teacher_dtype(self) -> torch.dtype:
        if self.teacher_dtype is not None:
            return getattr(torch, self.teacher_dtype)
        return torch.bfloat16 if torch.device(self.device).type == "cuda" else torch.float32


TOY_SETTINGS = dict(cases=TOY_CASES, hidden_size=64, vocab_size=512, check_rows=37, toy=True)


@dataclass
class LossInputs:
    """hidden: [N, H] float32; weight: [V, H] float32 (both leaves, with gradients); teacher_hidden: [N, H] and
    teacher_weight: [V, H] in the teacher's dtype; labels: [N], every seventh -100. Every value is a bf16 value, so
    that autocast's rounding leaves the inputs as they are."""

    hidden: torch.Tensor
    weight: torch.Tensor
    teacher_hidden: torch.Tensor
    teacher_weight: torch.Tensor
    labels: torch.Tensor

    def as_float32(self) -> LossInputs:
        return LossInputs(*(t.detach().float() for t in (self.hidden, self.weight, self.teacher_hidden,
                                                         self.teacher_weight)), self.labels)


def make_inputs(rows: int, settings: LossBenchSettings, *, seed: int) -> LossInputs:
    device = torch.device(settings.device)
    generator = torch.Generator(device=device).manual_seed(seed)

    def rounded(*shape, scale=1.0, dtype=torch.float32):
        values = torch.randn(*shape, device=device, generator=generator) * scale
        return values.to(torch.bfloat16).to(dtype)

    # Unit hidden states (after the final norm) and a head of std 0.05: logits of std ~1.2 at H = 576.
    hidden, size = settings.hidden_size, settings.vocab_size
    teacher = settings.resolved_teacher_dtype()
    labels = torch.randint(0, size, (rows,), device=device, generator=generator)
    labels[::IGNORED_EVERY] = -100
    return LossInputs(rounded(rows, hidden).requires_grad_(), rounded(size, hidden, scale=0.05).requires_grad_(),
                      rounded(rows, hidden, dtype=teacher), rounded(size, hidden, scale=0.05, dtype=teacher), labels)


def _unavailable(device: torch.device, library: str, modules: tuple[str, ...], pip_name: str) -> str | None:
    """Why a library's Triton kernels cannot run here (no CUDA; its first module not installed; an import error),
    or None when they can."""
    if device.type != "cuda":
        return f"needs CUDA ({library}'s kernels are Triton), not {device.type}"
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            if isinstance(err, ModuleNotFoundError) and err.name == modules[0]:
                return f"{modules[0]} is not installed (pip install {pip_name})"
            return f"{modules[0]} does not import: {err}"
    return None


def hyla_triton_unavailable(device: torch.device) -> str | None:
    """Why hyla's Triton KL cannot run here, or None when it can."""
    return _unavailable(device, "hyla", ("triton",), "triton")


def liger_unavailable(device: torch.device) -> str | None:
    """Why Liger's losses cannot run here, or None when they can."""
    return _unavailable(device, "Liger", ("liger_kernel", "liger_kernel.transformers"), "liger-kernel")


def fla_unavailable(device: torch.device) -> str | None:
    """Why fla's fused losses cannot run here, or None when they can."""
    return _unavailable(device, "fla", ("fla", "fla.modules"), "flash-linear-attention")


UNAVAILABLE = {"hyla-triton": hyla_triton_unavailable, "liger": liger_unavailable, "fla": fla_unavailable}


def not_computed(loss: str, implementation: str) -> str | None:
    """Why an implementation does not apply to `loss` (it computes other losses only), or None when it does."""
    losses = ONLY_LOSSES.get(implementation, LOSSES)
    return None if loss in losses else f"computes the {' and '.join(losses)} loss only"


def fla_description() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("fla-core", "flash-linear-attention"):
        try:
            return {"version": version(distribution), "distribution": distribution}
        except PackageNotFoundError:
            continue
    return {"version": None, "distribution": None}


def liger_description(device: torch.device) -> dict:
    """Liger's version and the kernel its KL dispatches to here (`jsd_loss_and_grad`, by preference)."""
    from importlib.metadata import version

    import liger_kernel

    impls = liger_kernel.available_impls("jsd_loss_and_grad", device)
    return {"version": version("liger-kernel"), "kl_inner_kernel": impls[0] if impls else None}


def loss_function(loss: str, implementation: str):
    """(LossInputs) -> the scalar loss, for one implementation."""
    if implementation == "hyla-chunked":
        if loss == "kl":
            return lambda x: linear_kl_divergence_chunked(x.hidden, x.weight, x.teacher_hidden, x.teacher_weight,
                                                          x.labels)[0]
        return lambda x: linear_cross_entropy_chunked(x.hidden, x.weight, x.labels)
    if implementation == "hyla-triton" and loss == "kl":
        return lambda x: linear_kl_divergence_chunked(x.hidden, x.weight, x.teacher_hidden, x.teacher_weight,
                                                      x.labels, kernel="triton")[0]
    if implementation == "eager":
        if loss == "kl":
            return lambda x: linear_kl_divergence_reference(x.hidden, x.weight, x.teacher_hidden,
                                                            x.teacher_weight)[0]
        return lambda x: linear_cross_entropy_reference(x.hidden, x.weight, x.labels)
    if implementation == "liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss, LigerFusedLinearJSD

        if loss == "kl":
            jsd = LigerFusedLinearJSD(jsd_beta=0.0, ignore_index=-100, temperature=1.0, accum_dtype=torch.float32)
            return lambda x: jsd(x.hidden, x.weight, x.teacher_hidden, x.teacher_weight, None)
        ce = LigerFusedLinearCrossEntropyLoss(ignore_index=-100, reduction="mean")
        return lambda x: ce(x.weight, x.hidden, x.labels)
    if implementation == "fla":
        from fla.modules import FusedKLDivLoss, FusedLinearCrossEntropyLoss

        if loss == "kl":
            kl = FusedKLDivLoss(reduction="batchmean")
            return lambda x: kl(x.hidden, x.teacher_hidden, x.weight, x.teacher_weight)
        ce = FusedLinearCrossEntropyLoss(ignore_index=-100, reduction="mean")
        return lambda x: ce(x.hidden.unsqueeze(0), x.labels.unsqueeze(0), x.weight)
    reason = not_computed(loss, implementation)
    if reason:
        raise ValueError(f"{implementation} {reason}")
    raise ValueError(f"unknown implementation {implementation!r}; known: {', '.join(IMPLEMENTATIONS)}")


@contextlib.contextmanager
def _float32_matmuls():
    """True float32 products (no TF32) for the reference."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def value_and_gradients(fn, inputs: LossInputs, device: torch.device, *, autocast: bool) -> list[torch.Tensor]:
    """[loss, d loss / d hidden, d loss / d weight] of `fn` on fresh leaves holding the inputs' values."""
    hidden = inputs.hidden.detach().clone().requires_grad_()
    weight = inputs.weight.detach().clone().requires_grad_()
    context = training_autocast(device) if autocast else _float32_matmuls()
    with context:
        value = fn(replace(inputs, hidden=hidden, weight=weight))
    value.backward()
    return [value.detach(), hidden.grad, weight.grad]


def check_errors(got: list[torch.Tensor], want: list[torch.Tensor]) -> dict:
    names = ("loss", "d_hidden", "d_weight")
    return {name: relative_error(g, w) for name, g, w in zip(names, got, want)}


def check_passes(errors: dict) -> bool:
    return errors["loss"] <= LOSS_TOLERANCE and max(errors["d_hidden"], errors["d_weight"]) <= GRADIENT_TOLERANCE


def _guarded(implementation: str, device: torch.device, thunk):
    """(thunk(), None), or (None, why) where it fails in a way the run reports and goes past: out of memory, or any
    error inside another project's kernels (LIBRARIES: a library that does not run on this stack is a finding, not
    a crash)."""
    try:
        return thunk(), None
    except torch.OutOfMemoryError:
        reason = "out of memory"
    except Exception as err:  # noqa: BLE001  (see the docstring)
        if implementation not in LIBRARIES:
            raise
        reason = f"{type(err).__name__}: {err}"[:300]
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return None, reason


def check_case(case: LossCase, implementations, settings: LossBenchSettings, device, log) -> tuple[list, list]:
    """Each implementation's value and gradients on `check_rows` rows against the float32 formulas on the same
    (bf16-valued) inputs. Returns the checks and the skipped implementations (failed or not run)."""
    inputs = make_inputs(settings.check_rows, settings, seed=0)
    reference = value_and_gradients(loss_function(case.loss, "eager"), inputs.as_float32(), device, autocast=False)
    checks, skipped = [], []
    for name in implementations:
        reason = not_computed(case.loss, name)
        if reason:
            skipped.append({"case": case.label, "implementation": name, "reason": reason})
            log(f"{case.label} {name}: skipped ({reason})")
            continue
        fn = loss_function(case.loss, name)
        got, reason = _guarded(name, device, lambda: value_and_gradients(fn, inputs, device, autocast=True))
        if got is None:
            skipped.append({"case": case.label, "implementation": name, "reason": f"check: {reason}"})
            log(f"check {case.label} {name}: {reason}; not timed")
            continue
        errors = check_errors(got, reference)
        passed = check_passes(errors)
        checks.append({"case": case.label, "implementation": name, "rows": settings.check_rows,
                       "relative_errors": errors, "passed": passed})
        shown = " / ".join(f"{value:.1e}" for value in errors.values())
        log(f"check {case.label} {name}: relative error loss / d_hidden / d_weight {shown} "
            f"(<= {LOSS_TOLERANCE:g} / {GRADIENT_TOLERANCE:g}): {'passed' if passed else 'FAILED, not timed'}")
        if not passed:
            skipped.append({"case": case.label, "implementation": name,
                            "reason": f"check failed (relative error loss / d_hidden / d_weight {shown})"})
    return checks, skipped


def time_implementation(case: LossCase, name: str, inputs: LossInputs, settings: LossBenchSettings, device) -> dict:
    """Forward and backward of one implementation at the case's rows: median time and peak memory, also above what
    was allocated before (the inputs)."""
    fn = loss_function(case.loss, name)

    def step():
        inputs.hidden.grad, inputs.weight.grad = None, None
        with training_autocast(device):
            value = fn(inputs)
        value.backward()

    inputs.hidden.grad, inputs.weight.grad = None, None
    reset_peak_memory(device)
    before = allocated_gib(device)
    # The first call compiles (hyla's chunk arithmetic, Liger's Triton kernels): one untimed call.
    timing = time_ms(step, device=device, warmup=1, repeats=settings.repeats)
    peak = peak_memory_gib(device)
    inputs.hidden.grad, inputs.weight.grad = None, None
    return {"case": case.label, "loss": case.loss, "rows": case.rows, "implementation": name,
            "median_ms": timing["median_ms"], "min_ms": timing["min_ms"], "repeats": len(timing["times_ms"]),
            "peak_gib": peak, "above_inputs_gib": None if peak is None else peak - before}


def add_ratios(rows: list[dict]) -> None:
    """Each row's time and memory above the inputs as ratios to hyla's chunked loss in the same case (None without
    it)."""
    base = next((row for row in rows if row["implementation"] == BASELINE), None)
    for row in rows:
        row["time_vs_hyla"] = row["median_ms"] / base["median_ms"] if base else None
        extra, base_extra = row["above_inputs_gib"], base and base["above_inputs_gib"]
        row["memory_vs_hyla"] = extra / base_extra if extra is not None and base_extra else None


def run_case(case: LossCase, implementations, settings: LossBenchSettings, device, log) -> dict:
    checks, skipped = check_case(case, implementations, settings, device, log)
    passed = [check["implementation"] for check in checks if check["passed"]]
    inputs = make_inputs(case.rows, settings, seed=1)
    rows = []
    for name in passed:
        row, reason = _guarded(name, device, lambda: time_implementation(case, name, inputs, settings, device))
        if row is None:
            skipped.append({"case": case.label, "implementation": name, "reason": reason})
            log(f"{case.label} {name}: {reason}")
            continue
        rows.append(row)
    add_ratios(rows)
    for row in rows:
        ratio = "" if row["time_vs_hyla"] is None else f" ({row['time_vs_hyla']:.2f}x hyla's)"
        peak = "" if row["peak_gib"] is None else f", peak {row['peak_gib']:.2f} GiB"
        log(f"{case.label} {row['implementation']}: {row['median_ms']:.2f} ms{ratio}{peak}")
    return {"checks": checks, "results": rows, "skipped": skipped}


def runnable_implementations(settings: LossBenchSettings, device: torch.device) -> tuple[list[str], list[dict]]:
    """The implementations asked for that can run here, and one skip (with its reason) for each that cannot."""
    runnable, skipped = [], []
    for name in settings.implementations:
        reason = UNAVAILABLE[name](device) if name in UNAVAILABLE else None
        if reason is None:
            runnable.append(name)
        else:
            skipped.append({"case": None, "implementation": name, "reason": reason})
    return runnable, skipped


def run_loss_bench(settings: LossBenchSettings, *, log=print, save=lambda results: None) -> dict:
    """Every case: the checks, then the timings of the implementations that passed. `save(results)` after each case,
    so that a run cut short keeps what it measured."""
    device = torch.device(settings.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("hyla bench loss: no CUDA device here; use --device cpu (with --toy for a quick check)")
    implementations, skipped = runnable_implementations(settings, device)
    teacher_dtype = str(settings.resolved_teacher_dtype()).removeprefix("torch.")
    results = {"settings": {**asdict(settings), "teacher_dtype": teacher_dtype},
               "precision": {"student": "float32", "teacher": teacher_dtype,
                             "autocast": "bfloat16" if device.type == "cuda" else None},
               "tolerances": {"loss": LOSS_TOLERANCE, "gradients": GRADIENT_TOLERANCE},
               "liger": liger_description(device) if "liger" in implementations else None,
               "fla": fla_description() if "fla" in implementations else None,
               "checks": [], "results": [], "skipped": skipped}
    autocast = "bf16 autocast" if device.type == "cuda" else "no autocast"
    log(f"loss bench: {', '.join(f'{case.label} ({case.rows} rows)' for case in settings.cases)} | "
        f"H={settings.hidden_size} V={settings.vocab_size} | student float32, teacher {teacher_dtype}, {autocast} on "
        f"{device} | {', '.join(implementations)} | checks at {settings.check_rows} rows against float32")
    if results["liger"]:
        log(f"liger-kernel {results['liger']['version']}: KL's inner kernel {results['liger']['kl_inner_kernel']}")
    if results["fla"]:
        log(f"fla: {results['fla']['distribution']} {results['fla']['version']}")
    for skip in skipped:
        log(f"{skip['implementation']}: skipped ({skip['reason']})")
    for case in settings.cases:
        measured = run_case(case, implementations, settings, device, log)
        for key in ("checks", "results", "skipped"):
            results[key].extend(measured[key])
        save(results)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def loss_markdown(results: dict, command: str) -> str:
    settings = results["settings"]
    precision = results["precision"]
    liger, fla = results.get("liger"), results.get("fla")
    lines = ["# LM-head losses: forward + backward", "", f"`{command}`", "",
             f"H = {settings['hidden_size']}, V = {settings['vocab_size']}; student float32, teacher "
             f"{precision['teacher']}, autocast {precision['autocast'] or 'off'}"
             + (f"; liger-kernel {liger['version']} (KL's inner kernel {liger['kl_inner_kernel']})" if liger else "")
             + (f"; {fla['distribution']} {fla['version']}" if fla else "")
             + f". Checked first at {settings['check_rows']} rows against float32 on the same inputs (relative "
               f"error; loss <= {results['tolerances']['loss']:g}, gradients <= "
               f"{results['tolerances']['gradients']:g}); ratios against hyla's chunked loss in the same run.", "",
             "| case | implementation | check: loss / d_hidden / d_weight | ms | vs hyla | peak GiB | "
             "above inputs GiB | vs hyla |", "|---|---|---|---|---|---|---|---|"]
    checks = {(c["case"], c["implementation"]): c for c in results["checks"]}
    for row in results["results"]:
        errors = checks[(row["case"], row["implementation"])]["relative_errors"]
        shown = " / ".join(f"{value:.1e}" for value in errors.values())
        peak = "-" if row["peak_gib"] is None else f"{row['peak_gib']:.2f}"
        extra = "-" if row["above_inputs_gib"] is None else f"{row['above_inputs_gib']:.2f}"
        lines.append(f"| {row['case']} | {row['implementation']} | {shown} | {row['median_ms']:.2f} | "
                     f"{_ratio(row['time_vs_hyla'])} | {peak} | {extra} | {_ratio(row['memory_vs_hyla'])} |")
    if results["skipped"]:
        lines += ["", "Not timed:", ""]
        for skip in results["skipped"]:
            where = f"{skip['case']} " if skip["case"] else ""
            lines.append(f"- {where}{skip['implementation']}: {skip['reason']}")
    return "\n".join(lines) + "\n"
