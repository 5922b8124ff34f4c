"""Graded retrieval from `hyla eval niah` records: for numeric needles (SK1, SK2), the first 7-digit number in each
answer against the needle: exact (the harness's score), mean digits right by position (chance 0.1 for a random
7-digit answer), the share with >= 4 leading digits right, and the share of answers that hold a 7-digit number at
all. Prints a markdown table for every `niah-*/results.json` under EVALS:

    python bench/smollm2/niah_digits.py EVALS
"""

import collections
import glob
import json
import re
import sys

rows = collections.defaultdict(list)
for path in sorted(glob.glob(sys.argv[1] + "/niah-*/results.json")):
    model = path.split("/")[-2].rsplit("-", 2)[0].replace("niah-", "")
    for r in json.load(open(path))["records"]:
        if r["task"] not in ("SK1", "SK2"):
            continue
        needle = r["outputs"][0]
        found = re.search(r"\d{7}", r["pred"].replace(",", ""))
        guess = found.group(0) if found else ""
        positional = sum(a == b for a, b in zip(guess, needle)) / 7 if guess else 0.0
        lead = next((i for i, (a, b) in enumerate(zip(guess, needle)) if a != b), min(len(guess), 7))
        rows[(model, r["task"], r["length"])].append((needle in r["pred"], positional, lead >= 4, bool(guess)))
print("| model | task | length | n | exact | digits right | >= 4 leading digits | answers with 7 digits |")
print("|---|---|---|---|---|---|---|---|")
for (model, task, length), v in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
    n = len(v)
    print(f"| {model} | {task} | {length} | {n} | {sum(x[0] for x in v)/n:.2f} | {sum(x[1] for x in v)/n:.2f} | "
          f"{sum(x[2] for x in v)/n:.2f} | {sum(x[3] for x in v)/n:.2f} |")
