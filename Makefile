# Two commands do everything on a fresh machine:
#   make demo   set up .venv, run the demo grid on the embedded digits data, print the leaderboard
#   make test   set up .venv and run the test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ddlib-installed
WORKERS ?= 2
PARAMS ?= params/demo.yaml
# The one line `pip check` may print: torchattacks' requests pin (its code never imports requests).
KNOWN_PIP_CHECK := ^torchattacks [^ ]+ has requirement requests~=2\.25\.1, but you have requests [^ ]+\.$$|^No broken requirements found\.$$

PORT ?= 5000
# make server BACKEND=postgresql://user:password@127.0.0.1:5432/mlflow ARTIFACTS=/srv/mlflow-artifacts
BACKEND ?=
ARTIFACTS ?=

.PHONY: demo test setup peer-venv run summary leaderboard ui server bench docs clean-store

setup: $(STAMP)

# pyproject.toml declares ranges; requirements-lock.txt pins today's exact versions (used as constraints).
# torchattacks goes in without its dependencies: it pins requests~=2.25.1, which mlflow and jupyter
# cannot use, and imports only torch, numpy, scipy and tqdm (pyproject's adversarial extra). pip check
# must find nothing else wrong.
$(STAMP): pyproject.toml requirements-lock.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -c requirements-lock.txt -e ".[all]"
	$(PY) -m pip install -c requirements-lock.txt --no-deps torchattacks
	@problems=$$($(PY) -m pip check | grep -v -E "$(KNOWN_PIP_CHECK)"); \
	  if [ -n "$$problems" ]; then echo "$$problems"; exit 1; fi; \
	  echo "pip check: no broken requirements but torchattacks' requests pin"
	touch $(STAMP)

# the summary (ddlib summary) runs in the grid's process once every cell finished: a second process
# would import the stack again (5 s of the demo's 108 s on a 2-core Zen 4 EPYC, forced AVX2)
demo: $(STAMP)
	$(PY) -m ddlib run $(PARAMS) --workers $(WORKERS) --summary

run: $(STAMP)
	$(PY) -m ddlib run $(PARAMS) --workers $(WORKERS)

summary: $(STAMP)
	$(PY) -m ddlib summary

leaderboard: $(STAMP)
	$(PY) -m ddlib leaderboard --out site

# prints the runs page of every experiment, then serves MLflow's UI on the store at http://127.0.0.1:5000
ui: $(STAMP)
	$(PY) -m ddlib ui

server: $(STAMP)
	$(PY) -m ddlib server --port $(PORT) $(if $(BACKEND),--backend-store-uri '$(BACKEND)') $(if $(ARTIFACTS),--artifacts-destination '$(ARTIFACTS)')

# One pytest-xdist worker per core plus one (at most 4: each runs notebooks and grids of its own): the
# tests wait on kernels, subprocesses and timeouts part of the time, and a third worker on two cores
# fills that wait (forced AVX2, 2-core EPYCs: Zen 4 20 min 17 s -> 17 min 46 s, Zen 5 14:47 -> 13:33;
# bench/README.md). A test module stays on one worker (--dist loadfile) and tests/conftest.py sends
# the slowest modules out first.
TEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(min(4, 1 + (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)))')
test: $(STAMP) peer-venv
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# DD-Ranking's own code (ddranking==0.2.0 from PyPI) in a venv of its own, for the conformance tests
# (tests/test_conformance_ddranking.py; bench/vs_ddranking.py ensure_peer_venv, about 1.5 min the first
# time, then reused). Where it cannot be had the tests skip: said here and in pytest's warnings summary.
peer-venv: $(STAMP)
	@$(PY) -c "import sys; sys.path.insert(0, '.'); from bench.vs_ddranking import ensure_peer_venv as e; \
	  r = e(); print('DD-Ranking peer venv:', r['path'], '(reused)' if r['reused'] else '(built)')" \
	  || echo "WARNING: DD-Ranking's venv could not be set up (no network to PyPI?): the conformance tests will SKIP" >&2

bench: $(STAMP)
	$(PY) bench/train_speed.py

# the docs site (mkdocs.yml) into build/docs/; `$(VENV)/bin/mkdocs serve` to browse it while editing
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean-store:
	rm -rf mlruns/mlflow.db mlruns/artifacts mlruns/locks
