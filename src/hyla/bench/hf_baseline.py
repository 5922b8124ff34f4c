"""The Qwen3 baseline in HF transformers (random weights, SDPA): prefill, default decode (DynamicCache, what
`generate` does), and decode with HF's StaticCache under a CUDA graph (its best documented path). Long contexts are
decoded over a synthetic cache, since the time of a step does not depend on what the cache holds."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, StaticCache

from hyla.bench.timing import time_ms
from hyla.models.modeling import cache_argument


def build_qwen3(config, *, device, dtype):
    """Random-weight HF Qwen3 in `dtype`, with its RoPE frequencies kept in float32.

    `Module.to(dtype)` also casts HF's rotary `inv_freq` buffers: in bfloat16 they are off by up to 0.37%, which turns
    the rotation angle at position 2000 by up to ~7 radians, so the model would no longer compute Qwen3's function
    (HF's forward takes `inv_freq.float()`, too late). Weights follow `dtype`; the frequencies stay exact.
    """
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    frequencies = {name: buffer.clone() for name, buffer in model.named_buffers() if name.endswith("inv_freq")}
    model = model.to(dtype)
    for name, buffer in frequencies.items():
        owner, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(owner), attribute, buffer)
    return model.eval()


def copy_qwen3_weights_into_hypenet(qwen3, hypenet) -> None:
    """Load HF Qwen3 weights into the all-attention HypeNet shape (same network: q/k norms, RoPE, SwiGLU), so that
    both engines can be checked against each other."""
    state = {key.replace(".self_attn.", ".mixer."): value for key, value in qwen3.state_dict().items()}
    missing, unexpected = hypenet.load_state_dict(state, strict=False)
    missing = [key for key in missing if key != "lm_head.weight"]  # tied
    if missing or unexpected:
        raise ValueError(f"Qwen3 -> HypeNet weight map: missing {missing}, unexpected {unexpected}")


def _synthetic_kv(model, batch: int, length: int, generator):
    config = model.config
    shape = (batch, config.num_key_value_heads, length, config.head_dim)
    for _ in range(config.num_hidden_layers):
        keys = torch.randn(shape, device=model.device, generator=generator, dtype=model.dtype)
        yield keys, torch.randn(shape, device=model.device, generator=generator, dtype=model.dtype)


@torch.no_grad()
def hf_prefill(model, input_ids) -> torch.Tensor:
    return model(input_ids, use_cache=True, logits_to_keep=1).logits[:, -1]


@torch.no_grad()
def time_hf_default_decode(model, *, batch: int, context: int, steps: int = 5) -> dict:
    """Per-token time of plain eager decode with a DynamicCache holding `context` positions (median of `steps`
    single steps, each appending to the cache as `generate` does)."""
    generator = torch.Generator(device=model.device).manual_seed(context)
    cache = DynamicCache(config=model.config)
    for index, (keys, values) in enumerate(_synthetic_kv(model, batch, context, generator)):
        cache.update(keys, values, index)
        del keys, values
    tokens = torch.randint(0, model.config.vocab_size, (batch, 1), device=model.device, generator=generator)

    def step():
        model(tokens, **cache_argument(cache), use_cache=True)

    return time_ms(step, device=model.device, warmup=1, repeats=steps)


class HFGraphDecoder:
    """One decode step of HF Qwen3 over a StaticCache, captured in a CUDA graph (positions advance on the device)."""

    def __init__(self, model, *, batch: int, context: int, extra: int = 64):
        generator = torch.Generator(device=model.device).manual_seed(context)
        self.model = model
        self.cache = StaticCache(config=model.config, max_cache_len=context + extra)
        for layer, (keys, values) in zip(self.cache.layers, _synthetic_kv(model, batch, context, generator)):
            layer.update(keys, values)
            del keys, values
        self.tokens = torch.randint(0, model.config.vocab_size, (batch, 1), device=model.device, generator=generator)
        self.position_ids = torch.full((batch, 1), context, device=model.device, dtype=torch.long)
        self.logits = None
        self.graph = None

    def _step(self):
        self.logits = self.model(self.tokens, position_ids=self.position_ids, **cache_argument(self.cache),
                                 use_cache=True).logits
        self.position_ids.add_(1)

    @torch.no_grad()
    def capture(self):
        # Warm up on a side stream (lazy inits, autotuning), then rewind the cache length and positions.
        lengths = [layer.cumulative_length.clone() for layer in self.cache.layers]
        positions = self.position_ids.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()
        for layer, length in zip(self.cache.layers, lengths):
            layer.cumulative_length.copy_(length)
        self.position_ids.copy_(positions)

    def step(self):
        self.graph.replay()
