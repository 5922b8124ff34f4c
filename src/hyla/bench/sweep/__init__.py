"""`hyla bench sweep matvec|fused|decode-attention`: the kernel sweeps that choose the engine's launch settings on a
GPU. Each checks every setting against its reference, times the ones that pass, writes its raw results and an
engine settings file (settings.json: the base settings with the sweep's choices), which `--engine-settings` loads
and which, copied into hyla/inference/tuned/, becomes a GPU's shipped settings. `--smoke` runs the plumbing on CPU
through Triton's interpreter (TRITON_INTERPRET=1)."""
