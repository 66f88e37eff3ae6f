"""The measured drift of stored cells re-run by ``fedfew study verify``: one markdown row per re-run cell
of every study's equivalence files for one code version (``studies/store/*/equal-code/SOURCE-equals-*.json``),
with a closing summary line. docs/studies.md ("Measured drift") holds its output; a test checks the two agree.

    python scripts/drift_table.py [--source SOURCE] [--store studies/store]

``--source`` defaults to this installation's number-code version (fedfew.core.codeversion.numbers_version).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def equivalences(store: Path, source: str) -> list[dict[str, Any]]:
    """Every equivalence file written by code version ``source``, by study name."""
    found = []
    for path in sorted(store.glob(f"*/equal-code/{source}-equals-*.json")):
        data = json.loads(path.read_text())
        data["_study"] = path.parent.parent.name
        found.append(data)
    return found


def environment_text(environment: dict[str, Any]) -> str:
    return (f"{environment.get('cpu') or 'unknown CPU'} ({environment.get('cpu_capability') or '?'}), "
            f"Python {environment.get('python')}, torch {environment.get('torch')}, numpy {environment.get('numpy')}, "
            f"{environment.get('threads')} thread(s), {environment.get('precision')}")


def table(store: Path, source: str) -> str:
    files = equivalences(store, source)
    if not files:
        raise SystemExit(f"no equivalence files of code version {source} under {store}")
    # `verify --old-code`: the re-run is compared with the older code run here, and the record's own value
    # (made on its machine) stands in a last column
    by_tree = any("recorded" in cell for data in files for cell in data["cells"])
    rows = (["| study | cell | metric | older code here | re-run | difference | tolerance | environments | judged | "
             "stored record |", "|---|---|---|---|---|---|---|---|---|---|"] if by_tree else
            ["| study | cell | metric | stored | re-run | difference | tolerance | environments | judged |",
             "|---|---|---|---|---|---|---|---|---|"])
    labels: dict[str, str] = {}
    differences = []
    for data in files:
        for label, environment in (data.get("environments") or {}).items():
            labels.setdefault(label, environment_text(environment))
        for cell in data["cells"]:
            if "stored" not in cell:  # an equivalence written before verify measured drift: exact by rule
                continue
            scale = 100.0 if cell["metric"].endswith("accuracy") else 1.0
            difference = scale * cell["difference"]
            differences.append((abs(difference), cell.get("exact", False)))
            rows.append(f"| {data['_study']} | {cell['method']} / {cell['setting']} / seed {cell['seed']} | "
                        f"{cell['metric']} | {scale * cell['stored']:.4f} | {scale * cell['rerun']:.4f} | "
                        f"{difference:+.4f} | ± {scale * cell['tolerance']:.4f} | "
                        f"{' → '.join(cell.get('environments', []))} | {cell['judged']} |"
                        + (f" {_recorded(cell, scale)} |" if by_tree else ""))
    exact = sum(1 for _, same in differences if same)
    how = " (the older code run on the same machine)" if by_tree else ""
    largest = max((d for d, _ in differences), default=0.0)
    olds = sorted({data["equal_to"]["source"] for data in files})
    lines = [*rows, "",
             f"{len(differences)} re-run cells of {len(files)} studies, code {source} against "
             f"{', '.join(olds)}{how}: {exact} the same exactly, largest difference {largest:.4f} points "
             "(accuracies in %)."]
    lines += [f"{label}: {text}." for label, text in sorted(labels.items())]
    return "\n".join(lines)


def _recorded(cell: dict[str, Any], scale: float) -> str:
    """The stored record's own value beside a `--old-code` comparison ("—" for a cell compared with it)."""
    return "—" if cell.get("recorded") is None else f"{scale * cell['recorded']:.4f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=None, help="the code version whose verifications to show")
    parser.add_argument("--store", default=str(REPO / "studies" / "store"))
    args = parser.parse_args(argv)
    if args.source is None:
        from fedfew.core.codeversion import numbers_version

        args.source = numbers_version()
    print(table(Path(args.store), args.source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
