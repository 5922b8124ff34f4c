"""Per NoPE layer: mean hit rate / entropy; per prompt: heads that find the needle (hit rate >= 0.5).

    cd docs/results/seed003-smollm2/2026-12-05-sitting-2 && tar xJf results.tar.xz evals && python heads_by_layer.py
"""
import json, pathlib, statistics
for job in sorted(pathlib.Path("evals").glob("analyze-*")):
    heads = json.loads((job / "results.json").read_text())["heads"]
    nope = {}
    for h in heads:
        if h["head_kind"] != "recurrent":
            nope.setdefault(h["layer"], []).append(h)
    by_layer = " ".join(f"L{layer} {statistics.mean(h['hit_rate'] for h in hs):.2f}/"
                        f"{statistics.mean(h['answer_entropy'] for h in hs):.2f}" for layer, hs in sorted(nope.items()))
    finds = [[sum(h["hit_rate_by_sample"][i] >= 0.5 for h in heads if (h["head_kind"] == "recurrent") == rec)
              for i in range(4)] for rec in (False, True)]
    print(job.name, "| NoPE hit/entropy by layer:", by_layer, "| find by prompt, NoPE", finds[0], "recurrent", finds[1])
