"""One training loop for every conversion stage and for from-scratch training: optimizer and schedule, resumable
`step-N` checkpoints, progress, and data parallelism under torchrun (DDP or FSDP2, `hyla.train.parallel`)."""

from hyla.train.loop import LoopSettings, TrainingDiverged, TrainResult, run_training
from hyla.train.optim import OptimSettings

__all__ = ["LoopSettings", "OptimSettings", "TrainResult", "TrainingDiverged", "run_training"]
