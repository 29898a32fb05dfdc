# Two commands work on a fresh machine: `make demo` and `make test` (each creates .venv first).
# Each target installs only what it runs, in steps that show pip's progress: torch (the CPU wheel
# pinned below), then the package with that target's extra (demo, test, lint, docs), each with
# its own stamp in .venv, so `make demo` never waits for the test, lint or docs tools.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Dev/test installs pin the local CPU wheel; the package itself only asks for a range.
TORCH_SPEC ?= torch==2.13.0
PIP := $(BIN)/pip install --disable-pip-version-check
TORCH_STAMP := $(VENV)/.torch
STAMP := $(VENV)/.installed

.PHONY: demo test lint docs test-faults dist bench bench-peers install pillow-simd clean

$(TORCH_STAMP):
	$(PY) -m venv $(VENV)
	$(PIP) $(TORCH_SPEC)
	touch $@

# the package (editable) and one extra: .venv/.installed-demo, -test, -lint, -docs
$(VENV)/.installed-%: pyproject.toml constraints.txt | $(TORCH_STAMP)
	$(PIP) -c constraints.txt -e '.[$*]'
	touch $@

# everything a developer uses at once (the demo, test, lint and docs tools)
$(STAMP): $(VENV)/.installed-demo $(VENV)/.installed-test $(VENV)/.installed-lint \
		$(VENV)/.installed-docs
	touch $@

install: $(STAMP)

demo: $(VENV)/.installed-demo
	$(BIN)/feedpipe demo

# the fast tier, a test file per core (at most 4: each test file starts DataLoader workers of its
# own), printing the 15 slowest tests
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m "not heavy" -n auto --maxprocesses 4 --dist loadfile --durations=15 tests

# ruff (style, likely bugs), mypy (strict on the public API), lint-imports (the one-way layers
# of ARCHITECTURE.md). Settings: pyproject.toml.
lint: $(VENV)/.installed-lint
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site (mkdocs.yml) into site/, strict: a broken link, anchor or API reference
# fails the build. CI runs it.
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The package as released: wheel and sdist built and checked (twine), the wheel installed into a
# fresh virtualenv (constrained to the CPU torch) where `feedpipe demo` runs. CI runs it.
DIST_VENV := .venv-dist
dist: $(VENV)/.installed-lint
	rm -rf dist $(DIST_VENV)
	$(BIN)/python -m build -q --outdir dist .
	$(BIN)/twine check --strict dist/*
	$(PY) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/pip install -q --disable-pip-version-check -c constraints.txt \
		"$$(ls dist/feedpipe-*.whl)[demo]"
	cd "$$(mktemp -d)" && $(CURDIR)/$(DIST_VENV)/bin/feedpipe demo --images 48 && \
		$(CURDIR)/$(DIST_VENV)/bin/python -m feedpipe --version

# The heavy fault, abuse and soak tests (tests/faults/, marked `heavy`); CI runs them after `make test`.
test-faults: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m heavy tests

bench: $(VENV)/.installed-demo
	$(BIN)/python benchmarks/bench_convert.py
	$(BIN)/python benchmarks/bench_kernel.py
	$(BIN)/python benchmarks/bench_loader.py

# feedpipe against FFCV, WebDataset, LitData, Mosaic Streaming and a hand-tuned DataLoader
# (benchmarks/peers/README.md). The peers live in their own virtualenv, .venv-peers; CI never
# runs this. Pass options with PEERS_ARGS, e.g. `make bench-peers PEERS_ARGS="--images 500"`.
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed
PEERS_ARGS ?=

$(PEERS_STAMP): pyproject.toml benchmarks/peers/install.sh benchmarks/peers/constraints.txt \
		$(wildcard benchmarks/peers/requirements*.txt)
	PY=$(PY) PEERS_VENV=$(PEERS_VENV) bash benchmarks/peers/install.sh
	touch $@

bench-peers: $(PEERS_STAMP)
	$(PEERS_VENV)/bin/python benchmarks/peers/run.py $(PEERS_ARGS)

# pillow-simd: a faster drop-in for Pillow, built from source (needs Debian's
# libjpeg62-turbo-dev and zlib1g-dev). `feedpipe decoders` says which one is active.
pillow-simd: $(VENV)/.installed-demo
	$(BIN)/pip uninstall -y -q pillow
	CC="cc -mavx2" $(BIN)/pip install -q --no-binary :all: pillow-simd

clean:
	rm -rf $(VENV) $(PEERS_VENV) $(DIST_VENV) dist site demo-data bench-data .pytest_cache
