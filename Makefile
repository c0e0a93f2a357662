# Two commands do everything on a fresh machine:
#   make demo   set up .venv, run the demo grid on the embedded digits data, print the leaderboard
#   make test   set up .venv and run the test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ddlib-installed
WORKERS ?= 2
PARAMS ?= params/demo.yaml

PORT ?= 5000
# make server BACKEND=postgresql://user:password@127.0.0.1:5432/mlflow ARTIFACTS=/srv/mlflow-artifacts
BACKEND ?=
ARTIFACTS ?=

.PHONY: demo test setup run summary leaderboard ui server bench docs clean-store

setup: $(STAMP)

$(STAMP): pyproject.toml vendor/torchattacks-3.5.1+ddlib1-py3-none-any.whl
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install vendor/torchattacks-3.5.1+ddlib1-py3-none-any.whl -e ".[test,cluster]"
	$(PY) -m pip check
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m ddlib run $(PARAMS) --workers $(WORKERS)
	$(PY) -m ddlib summary

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

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/train_speed.py

# the docs site (mkdocs.yml) into build/docs/; `$(VENV)/bin/mkdocs serve` to browse it while editing
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean-store:
	rm -rf mlruns/mlflow.db mlruns/artifacts mlruns/locks
