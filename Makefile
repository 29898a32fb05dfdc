# Two commands work on a fresh machine: `make demo` and `make test` (each creates .venv first).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Dev/test installs pin the local CPU wheel; the package itself only asks for a range.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test lint docs test-faults dist bench bench-peers install pillow-simd clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check $(TORCH_SPEC)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[test,demo,lint,docs]'
	touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/feedpipe demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not heavy" tests

# ruff (style, likely bugs), mypy (strict on the public API), lint-imports (the one-way layers
# of ARCHITECTURE.md). Settings: pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site (mkdocs.yml) into site/, strict: a broken link, anchor or API reference
# fails the build. CI runs it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The package as released: wheel and sdist built and checked (twine), the wheel installed into a
# fresh virtualenv (constrained to the CPU torch) where `feedpipe demo` runs. CI runs it.
DIST_VENV := .venv-dist
dist: $(STAMP)
	rm -rf dist $(DIST_VENV)
	$(BIN)/python -m build -q --outdir dist .
	$(BIN)/twine check --strict dist/*
	$(PY) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/pip install -q --disable-pip-version-check -c constraints.txt \
		"$$(ls dist/feedpipe-*.whl)[demo]"
	cd "$$(mktemp -d)" && $(CURDIR)/$(DIST_VENV)/bin/feedpipe demo --images 48 && \
		$(CURDIR)/$(DIST_VENV)/bin/python -m feedpipe --version

# The heavy fault, abuse and soak tests (tests/faults/, marked `heavy`); CI runs them after `make test`.
test-faults: $(STAMP)
	$(BIN)/python -m pytest -q -m heavy tests

bench: $(STAMP)
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
pillow-simd: $(STAMP)
	$(BIN)/pip uninstall -y -q pillow
	CC="cc -mavx2" $(BIN)/pip install -q --no-binary :all: pillow-simd

clean:
	rm -rf $(VENV) $(PEERS_VENV) $(DIST_VENV) dist site demo-data bench-data .pytest_cache
