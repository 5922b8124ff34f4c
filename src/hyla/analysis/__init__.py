"""Head analyses of hybrid models (docs/method.md, "Analysis"): Jacobian concentration α~ and its normalized entropy,
top-k hit rate on NIAH needles, and per-head parameter displacement between checkpoints. The command line is
`hyla analyze`."""

from hyla.analysis.capture import CAPTURES, MixerLayer, capture_heads, mixer_layers, register_mixer
from hyla.analysis.concentration import (
    FORMS,
    HeadInputs,
    concentration,
    concentration_blocks,
    normalized_entropy,
    register_form,
    top_k_hit_rate,
)
from hyla.analysis.displacement import compare_checkpoints, load_checkpoint, summarize_displacement
from hyla.analysis.heads import Probe, head_records, measure_probe, measure_probes
from hyla.analysis.probes import needle_token_positions, niah_probes, text_probes
from hyla.analysis.run import ProbeSettings, run_displacement, run_entropy, run_hitrate

__all__ = [
    "CAPTURES",
    "FORMS",
    "HeadInputs",
    "MixerLayer",
    "Probe",
    "ProbeSettings",
    "capture_heads",
    "compare_checkpoints",
    "concentration",
    "concentration_blocks",
    "head_records",
    "load_checkpoint",
    "measure_probe",
    "measure_probes",
    "mixer_layers",
    "needle_token_positions",
    "niah_probes",
    "normalized_entropy",
    "register_form",
    "register_mixer",
    "run_displacement",
    "run_entropy",
    "run_hitrate",
    "summarize_displacement",
    "text_probes",
    "top_k_hit_rate",
]
