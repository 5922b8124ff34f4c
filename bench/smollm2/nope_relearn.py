"""Can attention layers that lost their RoPE learn retrieval again, and from what data? A small CPU experiment.

Start from the teacher-equivalent HypeNet with RoPE removed at the attention layers S only (every other layer is the
teacher's, with RoPE): it has lost the teacher's retrieval (docs/results/smollm2-135m.md, "Where retrieval is
lost"). Train only the q/k/v/o projections of the layers in S, by KL distillation from the teacher, on one of two
corpora of the same size built from the same text (the Python standard library):

- `recall`: synthetic recall documents (`hyla.data.recall`: facts and a question in the text);
- `plain`: the same text without facts or questions.

NIAH SK1/SK2 (RULER wording, which the recall documents do not use) and the essay loss are scored before and after.

    python bench/smollm2/nope_relearn.py --teacher smollm2-135m --layers 0,1,7,16,18,19,23 --data recall \
        --seq-len 1024 --steps 150 --lr 3e-4 --out OUT.json

Prints a table last and writes OUT.json (settings, curve, scores before and after).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from hyla.convert.distill import kl_divergence
from hyla.convert.teacher import load_teacher
from hyla.convert.transfer import to_hypenet
from hyla.data.recall import recall_documents
from hyla.data.sources import open_source
from hyla.evals import niah as niah_eval
from hyla.evals.ppl import long_token_sequences
from hyla.outputs import write_json
from hyla.train.optim import OptimSettings, lr_at

sys.path.insert(0, str(Path(__file__).resolve().parent))
from after_align import score_model  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", required=True)
    parser.add_argument("--layers", required=True, help="attention layers S whose RoPE is removed and trained")
    parser.add_argument("--data", choices=("recall", "plain"), required=True)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--haystack-chars", default="1000-3000", help="recall haystack characters (MIN-MAX)")
    parser.add_argument("--tasks", default="SK1,SK2")
    parser.add_argument("--eval-length", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def training_windows(tokenizer, data: str, *, seq_len: int, count: int, chars: tuple[int, int], seed: int):
    """[count, seq_len] LongTensor of packed documents (EOS between them). Both corpora cut the same text into the
    same haystacks; `plain` leaves out the facts and the question."""
    texts = open_source("stdlib", seed=seed).documents()
    ids: list[int] = []
    eos = tokenizer.eos_token_id
    for doc in recall_documents(texts, seed=seed, min_chars=chars[0], max_chars=chars[1]):
        text = doc.text
        if data == "plain":
            body = text.rsplit("\n\n", 1)[0].split("\n")
            text = "\n".join(line for line in body if not any(key in line for key in doc.keys))
        ids += tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        if len(ids) >= seq_len * count:
            break
    return torch.tensor(ids[: seq_len * count]).view(count, seq_len)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    layers = sorted({int(item) for item in args.layers.split(",") if item})
    chars = tuple(int(x) for x in args.haystack_chars.split("-"))
    loaded = load_teacher(args.teacher)
    tokenizer = loaded.tokenizer
    teacher = to_hypenet(loaded.model, attention_rope=True).float().eval()
    student = to_hypenet(loaded.model, attention_rope=True).float()
    trained = []
    for param in student.parameters():
        param.requires_grad_(False)
    for index in layers:
        mixer = student.model.layers[index].mixer
        mixer.use_rope = False
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            for param in getattr(mixer, name).parameters():
                param.requires_grad_(True)
                trained.append(param)
    samples = [sample for task in args.tasks.split(",")
               for sample in niah_eval.build_samples(tokenizer, task, args.eval_length, args.samples, 42)]
    essays = long_token_sequences(tokenizer, args.eval_length, 2)
    data = training_windows(tokenizer, args.data, seq_len=args.seq_len, count=args.steps * args.batch_size,
                            chars=chars, seed=args.seed)
    student.eval()
    before = score_model(student, tokenizer, samples, essays, batch_size=4, num_examples=2)
    print(f"[relearn] before: {before['recall']} loss {before['loss']:.3f}", flush=True)
    optimizer = torch.optim.AdamW(trained, lr=args.lr, weight_decay=0.0)

    # Warmup, then cosine down to a tenth of the peak.
    schedule = OptimSettings(lr=args.lr, min_lr=0.1 * args.lr, warmup_steps=args.warmup)

    curve, started = [], time.time()
    student.train()
    for step in range(args.steps):
        batch = data[step * args.batch_size:(step + 1) * args.batch_size]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.steps, schedule)
        with torch.no_grad():
            target = teacher(batch, use_cache=False).logits
        loss = kl_divergence(target, student(batch, use_cache=False).logits)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        curve.append(loss.item())
        if step % 10 == 0 or step == args.steps - 1:
            print(f"[relearn] step {step + 1}/{args.steps} KL {loss.item():.4f} ({time.time() - started:.0f} s)",
                  flush=True)
    student.eval()
    after = score_model(student, tokenizer, samples, essays, batch_size=4, num_examples=2)
    report = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "layers": layers, "trained_parameters": sum(p.numel() for p in trained),
              "train_tokens": int(data.numel()), "train_seconds": round(time.time() - started, 1),
              "kl_curve": curve, "before": before, "after": after}
    write_json(args.out, report)
    tasks = args.tasks.split(",")
    print(f"\n{'data=' + args.data:<16}" + "".join(f"{t:>8}" for t in tasks) + f"{'loss':>8}")
    for name, result in (("before", before), ("after", after)):
        print(f"{name:<16}" + "".join(f"{result['recall'][t]:>8.2f}" for t in tasks) + f"{result['loss']:>8.3f}")
    first, last = sum(curve[:10]) / min(10, len(curve)), sum(curve[-10:]) / min(10, len(curve))
    print(f"KL first 10 steps {first:.4f}, last 10 steps {last:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
