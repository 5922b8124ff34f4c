"""A random-weight HypeNet of the shape hyla converts SmolLM2-135M to, saved as a model folder with a teacher's
tokenizer: what `hyla eval niah --model DIR` and `bench/engine_first_call.py` time when no converted model is at hand
(their costs depend on the shapes, not on the weights; the predictions of random weights mean nothing).

    python bench/random_hybrid_export.py --tokenizer TEACHER.gguf --out DIR [--device cuda] [--dtype bfloat16]

`--no-weights` writes the config and tokenizer only (a folder to carry to a GPU machine as the tokenizer); `--toy`
the toy sizes of the same layout (the tests); `--like CONFIG_JSON` takes the layer types, the NoPE logit scaling's a
and the norms' epsilon from a converted model's config.json (`hyla convert`'s export): the layout a conversion chose
instead of the fixed one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


# What `--like` copies from a converted model's config.json (the keys it is saved under, then the config's field).
LIKE_FIELDS = (("hypenet_layer_types", "layer_types"), ("layer_types", "layer_types"),
               ("attention_logit_scaling_a", "attention_logit_scaling_a"), ("rms_norm_eps", "rms_norm_eps"))


def export(tokenizer_spec: str, out: Path, *, device: str, dtype: str, weights: bool = True,
           toy: bool = False, like: Path | None = None) -> Path:
    from hyla.bench.model import build_hypenet
    from hyla.bench.shapes import converted_135m_config
    from hyla.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_spec)
    config = converted_135m_config(toy=toy)
    if like is not None:
        import json

        saved = json.loads(Path(like).read_text())
        for key, field in LIKE_FIELDS:
            if key in saved:
                setattr(config, field, saved[key])
        if len(config.layer_types) != config.num_hidden_layers:
            raise ValueError(f"{like} has {len(config.layer_types)} layer types; this shape has "
                             f"{config.num_hidden_layers} layers")
    config.eos_token_id = tokenizer.eos_token_id
    config.bos_token_id = tokenizer.bos_token_id
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if len(tokenizer) > config.vocab_size:
        config.vocab_size = len(tokenizer)  # (the toy sizes' vocabulary is smaller than a real tokenizer's)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    if weights:
        build_hypenet(config, device=torch.device(device), dtype=getattr(torch, dtype)).save_pretrained(out)
    else:
        config.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True, help="HF folder, .gguf file or teacher alias")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--no-weights", action="store_true")
    parser.add_argument("--toy", action="store_true")
    parser.add_argument("--like", type=Path, help="a converted model's config.json: its layer types, a and epsilon")
    args = parser.parse_args()
    try:
        out = export(args.tokenizer, Path(args.out), device=args.device, dtype=args.dtype,
                     weights=not args.no_weights, toy=args.toy, like=args.like)
    except (FileNotFoundError, ValueError) as err:  # a tokenizer spec that does not resolve, before anything is written
        raise SystemExit(f"error: {err}") from None
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
