# attune: `make demo` tunes the bundled example on this machine; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BUDGET ?= 0.12
BENCH_OUT ?= runs/bench
BENCH_JOBS ?= 2

.PHONY: install demo test test-fast test-k8s crds prometheus bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: the CPU build lies on disk; an unpinned torch would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[torch,llm,optuna,k8s,test]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) -m attune tune examples/tiny-gpt-cpu.yaml --budget $(BUDGET)

# the operator's end-to-end tests scrape trainers with a real Prometheus (Debian package)
prometheus:
	command -v prometheus >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus)

test: install prometheus
	$(PY) -m pytest

# the equal-budget tuner benchmark on the shipped suite (simulator; ~15 trials' worth of budget, 5 seeds)
bench: install
	$(PY) -m attune bench --suite suite --tuners attune,random,tpe,gp --budget 15t --seeds 5 --jobs $(BENCH_JOBS) --out $(BENCH_OUT)

test-k8s: install prometheus
	$(PY) -m pytest -m k8s tests/k8s

crds: install
	$(PY) -m attune operator crds

test-fast: install
	$(PY) -m pytest -m "not slow"

clean:
	rm -rf $(VENV) runs .pytest_cache
