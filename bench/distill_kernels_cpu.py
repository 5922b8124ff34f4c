"""Inductor's Triton kernels of the distillation step, generated on a CPU: which module each kernel of a GPU
profile comes from, and the bytes it moves at 16 x 4096 tokens.

The step's blocks (the SmolLM2-135M widths, 2 layers: an attention and a Lightning block, the teacher's two blocks)
compile under CPU bf16 autocast as `hyla bench train` compiles them on CUDA. Each graph is lowered twice: once with
inductor's Triton backend, whose code is kept and never loaded (kernel names and fusions as on CUDA, e.g.
`triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0`), then with the C++ backend, which runs. fla's chunk call,
`torch.compiler.disable`d on CUDA, is stood in for by a disabled call of the reference (the five pieces of a compiled
Lightning block), or runs as the custom op (`--whole-blocks`). Each kernel's bytes are the sizes of its pointer
arguments, taken at 256 and 512 tokens and extrapolated to 65,536; `--bandwidth` turns them into a time.

`--bf16-activations`: the student's activations in the autocast dtype (`hyla.models.modeling.use_autocast_activations`,
the stage setting `distill.bf16_activations`). `--compare`: the step without it and with it, one after the other,
and the bytes and time it saves. Kernels outside the compiled blocks (the embeddings, the final norm, the loss) are
not modelled.

Run: `python bench/distill_kernels_cpu.py [--whole-blocks] [--bf16-teacher] [--bf16-activations | --compare]
[--kernels]` (two compilations at each of two sizes, ~2 minutes on 2 cores; twice that with `--compare`). The inductor
internals it hooks are torch 2.13's.
"""

from __future__ import annotations

import argparse
import copy
import functools
import glob
import math
import os
import re
import subprocess
import sys
import tempfile

import torch

BLOCKS = {"teacher": 30, "attention": 7, "lightning": 23}  # blocks of each kind in the SmolLM2 hybrid
TOKENS = (256, 512)  # toy sizes whose bytes are extrapolated
STEP_TOKENS = 16 * 4096
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8, "i64": 8, "i32": 4, "i1": 1, "u8": 1}


def capture_triton_code(out_dir: str) -> None:
    """Every graph inductor compiles is first lowered with the Triton backend; its code is written to `out_dir`
    before loading, and the lowering stops there."""
    import torch._inductor.compile_fx as compile_fx
    import torch._inductor.config as inductor_config
    import torch.utils._triton as torch_triton
    from torch._inductor.graph import GraphLowering

    # A Triton cache key needs a driver; none is active without a GPU, and nothing is compiled.
    torch_triton.triton_hash_with_backend = functools.cache(lambda: "CPU-CODEGEN-ONLY")
    original, count = compile_fx.fx_codegen_and_compile, [0]

    class Captured(Exception):
        pass

    def save(code: str) -> None:
        count[0] += 1
        with open(f"{out_dir}/graph_{count[0]:03d}.py", "w") as file:
            file.write(code)
        raise Captured

    def both(gm, example_inputs, *args, **kwargs):
        GraphLowering.save_output_code = staticmethod(save)
        try:
            with inductor_config.patch(cpu_backend="triton", fx_graph_cache=False):
                original(copy.deepcopy(gm), example_inputs, *args, **kwargs)
        except Captured:
            pass
        finally:
            GraphLowering.save_output_code = None
        return original(gm, example_inputs, *args, **kwargs)

    compile_fx.fx_codegen_and_compile = both
    inductor_config.fx_graph_cache = False


def run_step(tokens: int, whole_blocks: bool, bf16_teacher: bool, bf16_activations: bool) -> None:
    """One distillation step of the compiled blocks, under CPU bf16 autocast, at `tokens` tokens (rows of 128)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import hyla.ops.lightning as lightning
    from hyla.bench.train import SMOLLM2_135M
    from hyla.compile import compile_blocks
    from hyla.convert.distill import StudentWithTeacher, bf16_teacher as to_bf16, build_student, distill_loss
    from hyla.models.modeling import use_autocast_activations
    from hyla.models.transfer import to_hypenet

    if not whole_blocks:
        lightning.lightning_chunked = torch.compiler.disable(lightning.lightning_chunked)
    torch.manual_seed(0)
    hf_teacher = LlamaForCausalLM(LlamaConfig(**dict(SMOLLM2_135M, vocab_size=512, num_hidden_layers=2))).eval()
    teacher = to_hypenet(hf_teacher, attention_rope=True).eval()
    teacher = to_bf16(teacher) if bf16_teacher else teacher
    student = build_student(hf_teacher, [0], None, lightning_rope=True, lightning_qk_norm=True).float().train()
    use_autocast_activations(student, bf16_activations)
    compile_blocks([*student.model.layers, *teacher.model.layers])
    ids = torch.randint(0, 512, (tokens // 128, 129))
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}
    with lightning.chunk_kernel_as_custom_op(whole_blocks), torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = distill_loss(StudentWithTeacher(student, teacher), batch, fused=True)
    loss.backward()


def _numel(text: str) -> int:
    return math.prod(int(d) for d in re.findall(r"\d+", text))


def graph_kernels(path: str) -> tuple[str, str, list[tuple[str, int, str]]]:
    """(kind of block, FWD or BWD, [(kernel, bytes of its pointer arguments, source nodes)]) of one graph's code."""
    code = open(path).read()
    defs = {}
    for match in re.finditer(r"\ndef (triton_\w+)\(", code):
        head = code[:match.start()]
        source = re.match(r"# Topologically Sorted Source Nodes: \[(.*?)\]",
                          head[head.rfind("# Topologically Sorted Source Nodes"):])
        pointers = re.findall(r"'(\w+_ptr\d+)': '\*(\w+)'", head[head.rfind("triton_meta="):])
        defs[match.group(1)] = (source.group(1) if source else "", pointers)
    call = code[code.index("def call(self, args)"):]
    sizes, kernels = {}, []
    for line in call.splitlines():
        if m := re.match(r"\s*assert_size_stride\((\w+), \(([^)]*)\)", line):
            sizes[m.group(1)] = _numel(m.group(2))
        elif m := re.match(r"\s*(\w+) = empty_strided\w*\(\(([^)]*)\)", line):
            sizes[m.group(1)] = _numel(m.group(2))
        elif m := re.match(r"\s*(\w+) = reinterpret_tensor\((\w+), \(([^)]*)\)", line):
            sizes[m.group(1)] = _numel(m.group(3))
        elif (m := re.match(r"\s*(\w+) = (\w+); del \w+  # reuse", line)) and m.group(2) in sizes:
            sizes[m.group(1)] = sizes[m.group(2)]
        if m := re.match(r"\s*(triton_\w+)\.run\((.*)\)", line):
            source, pointers = defs[m.group(1)]
            arguments = re.findall(r"reinterpret_tensor\((\w+), \(([^)]*)\)[^)]*\)|(\w+)", m.group(2))
            numels = [_numel(shape) if base else sizes.get(name) for base, shape, name in arguments]
            numels = [n for n in numels if n is not None][:len(pointers)]
            moved = sum(n * DTYPE_BYTES[dtype] * (2 if name.startswith("in_out") else 1)
                        for n, (name, dtype) in zip(numels, pointers))
            kernels.append((m.group(1), moved, source))
    backward = "tangents" in re.search(r"\n\s+(.*?) = args\n", call).group(1)
    if "flash_attention_for_cpu_backward" in code:
        kind = "attention"
    elif "flash_attention_for_cpu" in code:
        kind = "attention" if "sigmoid" in code else "teacher"
    else:
        kind = "lightning"
    return kind, "BWD" if backward else "FWD", kernels


def step_kernels(dirs: list[str]) -> list[tuple[str, str, str, float, str]]:
    """(kind, FWD/BWD, kernel, bytes at STEP_TOKENS, source) of every kernel, from the dumps at the two sizes
    (kernels matched by name without their index, and order of size: their order differs between sizes)."""
    small, large = (sorted(glob.glob(f"{d}/graph_*.py")) for d in dirs)
    if len(small) != len(large):
        raise RuntimeError(f"{len(small)} graphs at {TOKENS[0]} tokens, {len(large)} at {TOKENS[1]}")
    rows = []
    for path_small, path_large in zip(small, large):
        kind, direction, at_small = graph_kernels(path_small)
        _, _, at_large = graph_kernels(path_large)
        base = functools.partial(re.sub, r"_\d+$", "")
        at_small.sort(key=lambda k: (base(k[0]), k[1]))
        at_large.sort(key=lambda k: (base(k[0]), k[1]))
        for (name, bytes_small, source), (_, bytes_large, _) in zip(at_small, at_large):
            slope = (bytes_large - bytes_small) / (TOKENS[1] - TOKENS[0])
            rows.append((kind, direction, name, bytes_small + slope * (STEP_TOKENS - TOKENS[0]), source))
    return rows


def dumped_step(flags: list[str]) -> list[tuple[str, str, str, float, str]]:
    """`step_kernels` of the step compiled with `flags`, one fresh process per size."""
    root = tempfile.mkdtemp(prefix="distill-kernels-")
    dirs = [f"{root}/{tokens}" for tokens in TOKENS]
    for tokens, out_dir in zip(TOKENS, dirs):
        # One process per size: the graphs compile afresh, without a cache to reuse.
        os.makedirs(out_dir)
        subprocess.run([sys.executable, __file__, *flags, "--worker", str(tokens), out_dir], check=True)
    return step_kernels(dirs)


def summary(rows, args, label: str) -> tuple[float, float]:
    """Prints the totals by kind of block and direction (and every kernel with --kernels); returns the step's
    (bytes, ms) over all blocks."""
    totals: dict[tuple[str, str], float] = {}
    moved_total = 0.0
    for kind, direction, name, moved, source in rows:
        us = moved / args.bandwidth * 1e6 + args.launch_us
        totals[kind, direction] = totals.get((kind, direction), 0.0) + us * BLOCKS[kind]
        moved_total += moved * BLOCKS[kind]
        if args.kernels:
            print(f"{kind:9s} {direction} {moved / 1e6:7.0f} MB {us:7.1f} us x{BLOCKS[kind]:2d}  {name}  <- "
                  f"{source[:100]}")
    ms = sum(totals.values()) / 1e3
    print(f"{label}: compiled blocks' Triton kernels at {STEP_TOKENS} tokens, {args.bandwidth / 1e12:.1f} TB/s: "
          + ", ".join(f"{kind} {direction} {us / 1e3:.1f} ms" for (kind, direction), us in sorted(totals.items()))
          + f"; total {moved_total / 1e9:.1f} GB, {ms:.1f} ms")
    return moved_total, ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--whole-blocks", action="store_true", help="Lightning's chunk call as the custom op")
    parser.add_argument("--bf16-teacher", action="store_true", help="the frozen teacher in bf16")
    parser.add_argument("--bf16-activations", action="store_true", help="the student's activations in bf16")
    parser.add_argument("--compare", action="store_true", help="without and with --bf16-activations")
    parser.add_argument("--kernels", action="store_true", help="list every kernel, not only the totals")
    parser.add_argument("--bandwidth", type=float, default=4.2e12, help="bytes/s for the times (H200: ~4.2e12)")
    parser.add_argument("--launch-us", type=float, default=2.0, help="added to each kernel's time")
    parser.add_argument("--worker", nargs=2, metavar=("TOKENS", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        capture_triton_code(args.worker[1])
        run_step(int(args.worker[0]), args.whole_blocks, args.bf16_teacher, args.bf16_activations)
        return
    flags = [flag for flag, on in (("--whole-blocks", args.whole_blocks), ("--bf16-teacher", args.bf16_teacher),
                                   ("--bf16-activations", args.bf16_activations)) if on]
    if not args.compare:
        summary(dumped_step(flags), args, " ".join(flags) or "split blocks")
        return
    flags = [flag for flag in flags if flag != "--bf16-activations"]
    label = " ".join(flags) or "split blocks"
    before = summary(dumped_step(flags), args, label)
    after = summary(dumped_step([*flags, "--bf16-activations"]), args, f"{label} --bf16-activations")
    print(f"--bf16-activations saves {(before[0] - after[0]) / 1e9:.1f} GB and {before[1] - after[1]:.1f} ms of the "
          f"compiled blocks' kernels a step ({before[1]:.1f} -> {after[1]:.1f} ms at {args.bandwidth / 1e12:.1f} TB/s)")


if __name__ == "__main__":
    main()
