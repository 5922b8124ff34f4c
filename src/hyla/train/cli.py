"""`hyla train`: from-scratch training of a HypeNet configuration."""

from __future__ import annotations

import argparse
from pathlib import Path

from hyla.train.losses import LOSSES


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train", help="train a HypeNet configuration from scratch on a prepared corpus",
        description="Train any HypeNet config (layer_types of any mixers) on a corpus made by `hyla data prepare`. "
        "Resumable: rerun the same command to continue from the newest checkpoint. Under torchrun, DDP or FSDP2.",
    )
    parser.add_argument("--config", type=Path, required=True, help="HypeNet config JSON (HypeNetConfig fields)")
    parser.add_argument("--data", type=Path, required=True, help="prepared corpus folder (hyla data prepare)")
    parser.add_argument("--out", type=Path, required=True, help="output folder: checkpoints, metrics, model/")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps")
    parser.add_argument("--seq-len", type=int, default=1024, help="training sequence length (default 1024)")
    parser.add_argument("--batch-size", type=int, default=8, help="global batch in sequences (default 8)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    parser.add_argument("--min-lr", type=float, default=1e-5, help="final learning rate of the cosine (1e-5)")
    parser.add_argument("--warmup-steps", type=int, default=50, help="linear warm-up steps (default 50)")
    parser.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                        help="learning rate after warm-up: cosine down to --min-lr, or constant (default cosine)")
    parser.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (default 0.1)")
    parser.add_argument("--loss", choices=LOSSES, default="ce",
                        help="ce: next-token cross-entropy; longce: cross-entropy weighted by how much the long "
                        "context helps each token (docs/method.md, 'LongCE')")
    parser.add_argument("--longce-window", type=int, default=256, help="LongCE short-context window (default 256)")
    parser.add_argument("--longce-cap", type=float, default=5.0, help="LongCE weight cap (default 5)")
    parser.add_argument("--checkpoint-every", type=int, default=200, help="steps between checkpoints (200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the data order (0)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile each block before training (in place; checkpoints keep their names)")
    parser.add_argument("--checkpoint-activations", action="store_true",
                        help="recompute each block's activations in the backward pass: one more forward per step "
                        "for much less memory (long sequences)")
    parser.add_argument("--data-parallel", choices=("auto", "ddp", "fsdp", "fsdp-no-reshard"), default="auto",
                        help="under torchrun: a replica per process (ddp), FSDP2 sharding (fsdp), FSDP2 keeping the "
                        "gathered weights from forward to backward (fsdp-no-reshard); auto (default): ddp when "
                        "weights, gradients and AdamW state take at most half the device's memory, else fsdp")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from hyla.train.scratch import TrainRequest, train

    fields = {k: v for k, v in vars(args).items() if k not in ("handler", "command")}
    train(TrainRequest(**fields))
    return 0
