"""Each A/B cell: the run the batch's code made (a `fedfew study verify` re-run, /work/runs-verify) and the
run the code before the batch made of the same resolved config (`fedfew run`, /work/ab/old), compared
exactly: summary.json's test and initial scores and selected round, and every round of metrics.jsonl
without its clock fields."""
import json
import re
from pathlib import Path


def strip(obj):
    if isinstance(obj, dict):
        return {k: strip(v) for k, v in obj.items() if "seconds" not in k and k not in {"time", "updated"}}
    if isinstance(obj, list):
        return [strip(v) for v in obj]
    return obj

def numbers(run: Path):
    s = json.loads((run / "summary.json").read_text())
    rows = [strip(json.loads(line)) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return strip({k: s.get(k) for k in ("test", "initial_score", "selected_round", "selected_score")}), rows

same = 0
olds = sorted(Path("/work/ab/old").glob("*/*-2026*"))
for old in [o for o in olds if (o / "summary.json").exists()]:
    name = re.sub(r"-\d{8}-\d{6}$", "", old.name)
    new = sorted(Path("/work/runs-verify", old.parent.name).glob(f"*/{name}-2026*"))[-1]
    a, b = numbers(new), numbers(old)
    ok = a == b
    same += ok
    print(f"{name}: {'identical' if ok else 'DIFFERENT'} (test accuracy {a[0]['test']['accuracy']:.6f} batch, "
          f"{b[0]['test']['accuracy']:.6f} before; {len(a[1])} rounds of metrics compared)")
print(f"{same} of {len(olds)} cells identical")
