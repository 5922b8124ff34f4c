"""Check the decode kernels' logic on CPU through Triton's interpreter (no GPU needed): the split-K attention
kernel, and the batch-1 matrix-vector kernel (`hyla.inference.matvec_triton`), each against a float64 reference.

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
    assert not supports(torch.randn(1, 1, 100), torch.randn(8, 100))  # K not a multiple of block_k


if __name__ == "__main__":
    main()
