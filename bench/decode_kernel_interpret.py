"""Check the decode kernels' logic on CPU through Triton's interpreter (no GPU needed): the split-K attention
kernel, the batch-1 matrix-vector kernel with each prologue (`hyla.inference.matvec_triton`) and the Lightning step
kernel (`hyla.inference.lightning_step_triton`), each against a float64 reference; then the engine's
matvec="triton-fused" decode of a tiny float32 model against the model's own forward.

Needs triton importable (e.g. `pip install --no-deps --target /tmp/tri triton==3.6.0`), then:
`TRITON_INTERPRET=1 PYTHONPATH=/tmp/tri:src python bench/decode_kernel_interpret.py`.
The interpreter holds scalars as 1-element arrays, which numpy 2 refuses to turn into a loop bound; the patch below
reads the element instead. Compiled kernels are unaffected.
"""

import torch
import triton.runtime.interpreter as interpreter

import hyla.inference.decode_triton as decode_triton
from hyla.inference.decode_attention import decode_attention_reference

_patch_tensor = interpreter._patch_lang_tensor


def _patch_with_scalar_index(tensor, scope):
    _patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


interpreter._patch_lang_tensor = _patch_with_scalar_index
decode_triton._num_sms = lambda index: 4  # a few splits per row even for short buffers


CONFIGS = [decode_triton.DecodeKernelConfig()] + [
    decode_triton.DecodeKernelConfig(block_n=b, programs_per_sm=p) for b, p in ((64, 4), (32, 1), (128, 8))]


def main():
    torch.manual_seed(0)
    cases = [(1, 4, 2, 300, 1, torch.float32), (1, 4, 2, 300, 300, torch.float32), (2, 4, 2, 500, 277, torch.float16),
             (2, 2, 2, 200, 65, torch.float32), (3, 8, 2, 130, 129, torch.float16)]
    for batch, heads, kv_heads, max_length, length, dtype in cases:
        q = torch.randn(batch, heads, 32).to(dtype)
        keys = torch.randn(batch, kv_heads, max_length, 32).to(dtype)
        values = torch.randn(batch, kv_heads, max_length, 32).to(dtype)
        keys[:, :, length:] = float("nan")  # never to be read
        values[:, :, length:] = float("nan")
        ref = decode_attention_reference(q.double(), keys[:, :, :length].double(), values[:, :, :length].double(),
                                         length, scale=32**-0.5)
        shape = f"B={batch} H={heads} Hkv={kv_heads} Tmax={max_length} length={length} {dtype}"
        for config in CONFIGS:  # the launch settings bench/decode_attention_sweep.py times on a GPU
            out = decode_triton.decode_attention_triton(q, keys, values, torch.tensor(length), scale=32**-0.5,
                                                        config=config)
            error = ((out.double() - ref).norm() / ref.norm()).item()
            print(f"{shape} block_n={config.block_n} programs/SM={config.programs_per_sm or 'auto'}: relative error "
                  f"{error:.2e}")
    check_matvec()


def check_matvec():
    """Row counts that are and are not multiples of block_n, with and without a bias; and the refusals."""
    import torch.nn.functional as F

    from hyla.inference.matvec import MatvecConfig
    from hyla.inference.matvec_triton import matvec_triton, supports

    for n, k, has_bias, config in ((100, 128, True, MatvecConfig(block_n=8, block_k=64)),
                                   (7, 64, False, MatvecConfig(block_n=4, block_k=32)),
                                   (33, 96, True, MatvecConfig(block_n=16, block_k=32))):
        weight, x = torch.randn(n, k), torch.randn(1, 1, k)
        bias = torch.randn(n) if has_bias else None
        out = matvec_triton(x, weight, bias, config=config)
        ref = F.linear(x.double(), weight.double(), bias.double() if has_bias else None)
        print(f"matvec N={n} K={k} bias={has_bias} block_n={config.block_n} block_k={config.block_k}: relative error "
              f"{((out.double() - ref).norm() / ref.norm()).item():.2e}")
    assert not supports(torch.randn(2, 1, 512), torch.randn(8, 512))  # two rows: F.linear's job
    check_prologues()
    check_lightning_step()
    check_engine()


def report(what: str, got: torch.Tensor, ref: torch.Tensor, bound: float) -> None:
    error = ((got.double() - ref.double()).norm() / ref.double().norm()).item()
    print(f"{what}: relative error {error:.2e}")
    assert error <= bound, f"{what}: {error:.2e} > {bound:.0e}"


def check_prologues():
    """Every prologue and epilogue, with K a multiple of block_k and not, with and without a bias and a norm weight."""
    from hyla.inference.matvec import NORM, PROLOGUES, SCALED, MatvecConfig, fused_matvec_reference
    from hyla.inference.matvec_triton import fused_matvec_triton

    gen = torch.Generator().manual_seed(1)
    for prologue in PROLOGUES:
        for epilogue in ("none", "residual", "glu"):
            for n, k, has_bias, config in ((24, 64, True, MatvecConfig(block_n=4, block_k=32)),
                                           (8, 80, False, MatvecConfig(block_n=2, block_k=32)),
                                           (10, 48, True, MatvecConfig(block_n=8, block_k=64))):
                weight, x, x2 = (torch.randn(n, k, generator=gen), torch.randn(1, 1, k, generator=gen),
                                 torch.randn(1, 1, k, generator=gen))
                bias = torch.randn(n, generator=gen) if has_bias else None
                norm_weight = torch.rand(k, generator=gen) + 0.5 if prologue == NORM and has_bias else None
                partials = torch.rand(5, generator=gen) * k if prologue == SCALED else None
                residual = torch.randn(1, 1, n, generator=gen) if epilogue == "residual" else None
                kwargs = dict(prologue=prologue, x2=x2, norm_weight=norm_weight, partials=partials, eps=1e-6,
                              residual=residual, glu=epilogue == "glu")
                y = fused_matvec_triton(x, weight, bias, config=config, **kwargs)
                ref = fused_matvec_reference(x, weight, bias, **kwargs)
                assert y.shape == ref.shape
                report(f"prologue {prologue} epilogue {epilogue} N={n} K={k} bias={has_bias} norm weight="
                       f"{norm_weight is not None} block_n={config.block_n} block_k={config.block_k}", y, ref, 1e-6)


def check_lightning_step():
    """The Lightning step with and without q/k norms, RoPE and the output gate; the state written back."""
    from hyla.inference.lightning_step import lightning_step_reference
    from hyla.inference.lightning_step_triton import BLOCK_V, lightning_step_triton

    gen = torch.Generator().manual_seed(2)
    heads, dim = 3, 64
    for norms, rope, gate in ((True, True, True), (False, False, False), (True, False, True), (False, True, False)):
        y = torch.randn(1, 1, (4 if gate else 3) * heads * dim, generator=gen)
        angle = torch.rand(dim // 2, generator=gen) * 6
        cos, sin = (torch.cat([angle.cos(), angle.cos()]).view(1, 1, dim),
                    torch.cat([angle.sin(), angle.sin()]).view(1, 1, dim)) if rope else (None, None)
        qw, kw = (torch.rand(dim, generator=gen) + 0.5 for _ in range(2)) if norms else (None, None)
        state = torch.randn(1, heads, dim, dim, generator=gen)
        decay = torch.rand(heads, generator=gen)
        ref_state = state.clone()
        u, partials = lightning_step_triton(y, cos, sin, qw, kw, state, decay, scale=dim**-0.5, eps=1e-6,
                                            has_gate=gate)
        ref_u, ref_partials = lightning_step_reference(y, cos, sin, qw, kw, ref_state, decay, scale=dim**-0.5,
                                                       eps=1e-6, has_gate=gate, block_v=BLOCK_V)
        what = f"Lightning step norms={norms} rope={rope} gate={gate}"
        report(what + " output", u, ref_u, 1e-6)
        report(what + " partials", partials, ref_partials, 1e-6)
        report(what + " state", state, ref_state, 1e-6)


def check_engine():
    """matvec="triton-fused" decode of a float32 model (Lightning and attention layers, q/k norms, gates, biases)
    against the model's forward; eager (no CUDA graph on CPU), every kernel interpreted."""
    from hyla import HypeNetConfig, HypeNetForCausalLM
    from hyla.inference import InferenceEngine

    torch.manual_seed(0)
    for bias in (False, True):
        config = HypeNetConfig(
            vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=2,
            num_key_value_heads=1, head_dim=32, layer_types=["lightning", "attention", "lightning"],
            attn_logits_scaling_a=5.0, attention_output_gate=True, attention_qk_norm=True, attention_bias=bias,
        )
        model = HypeNetForCausalLM(config).float().eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.uniform_(0.5, 1.5)  # norm weights away from 1, so that folding them is checked
        tokens = torch.randint(0, 101, (1, 14))
        with torch.no_grad():
            full = model(tokens, use_cache=False).logits
            engine = InferenceEngine(model, batch_size=1, max_length=16, prefill_chunk=4, fuse_projections=True,
                                     matvec="triton-fused")
            engine.prefill(tokens[:, :10])
            steps = [engine.decode(tokens[:, t : t + 1]).clone() for t in range(10, 14)]
        report(f"engine triton-fused decode (bias={bias}) vs model forward", torch.stack(steps, 1), full[:, 10:], 1e-5)


if __name__ == "__main__":
    main()
