# Two commands for a fresh machine:
#   make lab    set everything up (idempotent) and open the course in JupyterLab
#   make test   set everything up and run the linter and the whole test suite
#               (it also installs Debian's chromium for the browser test: target browser)
#
# EXTRA picks the accelerator stack: cpu (default; Triton's interpreter), cuda or npu.
#   make lab EXTRA=cuda    # NVIDIA GPU: upstream triton
#   make lab EXTRA=npu     # Ascend NPU: triton-ascend + torch_npu (CANN installed first)
# One virtual environment holds one stack: triton and triton-ascend overwrite each other.
#
#   make lab COURSE_LANG=zh   the course in Chinese (slotmap lab --lang zh)
#
#   make site              the course as a static site, in English and Chinese, every lesson
#                          executed on the CPU (cached in _build/site-cache): _build/site/.
#                          docs/site.md says how to publish it.
#
#   make ascend-ir         a second environment, .venv-ascend, with triton-ascend's compiler
#                          (no CANN, no NPU): every kernel the course launches on the NPU is
#                          lowered by it. `make test` builds it and runs tests/ascend in it.

SHELL := /bin/bash
.DEFAULT_GOAL := lab

EXTRA ?= cpu
# The course's language: make lab COURSE_LANG=zh (or en); empty: $SLOTMAP_LANG, else the locale.
COURSE_LANG ?=
VENV ?= .venv
PYTHON ?=
PIP_INSTALL_ARGS ?=
PYTEST_ARGS ?=
# pytest-xdist workers for the main suite: one more than the cores, because much of the
# suite's time is spent waiting on the servers, kernels and ranks it starts (tests/conftest.py
# keeps the tests that share a module-scoped fixture on one worker, and starts the two longest
# tests first). PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= $(shell echo $$(( $$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1) + 1 )))
ASCEND_VENV ?= .venv-ascend

# torch_npu 2.7.1 on x86-64 requires torch==2.7.1+cpu, which lives on PyTorch's CPU index
# (on PyPI, x86-64 torch is a CUDA build that also pulls upstream triton).
ifeq ($(EXTRA),npu)
PIP_INSTALL_ARGS += --extra-index-url https://download.pytorch.org/whl/cpu
endif

# EXTRA=cpu: PyPI's x86-64 torch is a CUDA build (several GB). Setup installs the pin from
# CPU_TORCH_INDEX, a PEP 503 index of PyTorch's CPU wheels: PyTorch's own by default; behind
# a package mirror (the usual case in mainland China) a mirror of it, e.g.
#   make lab CPU_TORCH_INDEX=https://<mirror>/whl/cpu
# When that index cannot give the pin, setup stops and says so (it never falls back to the
# multi-GB CUDA build on its own). CPU_TORCH_INDEX= (empty) takes torch from pip's own
# index instead: on x86-64 Linux, PyPI's CUDA build; elsewhere (aarch64, macOS) PyPI's torch is
# a CPU build already. Keep CPU_TORCH in step with pyproject.toml's cpu extra.
CPU_TORCH := torch==2.13.0
CPU_TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

VENV_PY := $(VENV)/bin/python
# Run by a Python: prints why other users cannot run it (a folder or file without o+x on the
# way to its interpreter or its standard library), nothing when they can.
EVERYONE_RUNS := -c 'import os, sys; from pathlib import Path; \
  p = Path(os.path.realpath(sys.executable)); b = Path(sys.base_prefix).resolve(); \
  closed = [q for x in (p, b) for q in (x, *x.parents) if not q.stat().st_mode & 1]; \
  print(f"{p}: {closed[0]} (mode {closed[0].stat().st_mode & 0o777:o}) is closed to other users" \
        if closed else "", end="")'
STAMP := $(VENV)/.slotmap-$(EXTRA).stamp

.PHONY: lab test setup browser ascend-ir

lab: setup
	$(VENV)/bin/slotmap lab $(if $(COURSE_LANG),--lang $(COURSE_LANG))

# The two environments and chromium are set up side by side (each pip mostly waits on one core
# or the network), each one's log in one piece. Then the main suite, its output as it comes;
# beside it, triton-ascend's compiler on every recorded NPU launch (tests/ascend says why
# apart; one process for about 15 s), its output shown after the main suite's.
MAIN_SUITE = SLOTMAP_BACKEND="$${SLOTMAP_BACKEND:-cpu}" $(VENV_PY) -m pytest --ignore=tests/ascend \
  -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)
ASCEND_SUITE = SLOTMAP_BACKEND=ascend-ir $(ASCEND_VENV)/bin/python -m pytest \
  --confcutdir=tests/ascend tests/ascend $(PYTEST_ARGS)
ASCEND_LOG := $(ASCEND_VENV)/tests-ascend.log

test:
	@$(MAKE) --no-print-directory -j2 --output-sync=target setup browser ascend-ir hub
	@# After the others: two pip runs in one environment at once would race.
	@$(MAKE) --no-print-directory site-env
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@echo '$(ASCEND_SUITE) > $(ASCEND_LOG) &'
	@echo '$(MAIN_SUITE)'
	@$(ASCEND_SUITE) > $(ASCEND_LOG) 2>&1 & ascend=$$!; \
	$(MAIN_SUITE); main=$$?; \
	wait $$ascend; ascend=$$?; \
	echo "tests/ascend, beside the main suite ($(ASCEND_LOG)):"; cat $(ASCEND_LOG); \
	exit $$(( main != 0 || ascend != 0 ))

# The course site (site/build.py, docs/site.md): the site extra in $(VENV), then the build.
# SITE_ARGS: e.g. --reduced (two lessons and one exercise a language, as tests/test_site.py
# builds), --out DIR, --jobs N (notebooks executed at once; default: one a core).
# make site-publish SITE_DEST=user@host:/var/www/slotmap: the built site copied there.
SITE_STAMP := $(VENV)/.site.stamp
SITE_ARGS ?=
SITE_DEST ?=
.PHONY: site site-env site-publish
site-env: $(SITE_STAMP)

$(SITE_STAMP): pyproject.toml $(STAMP)
	$(VENV_PY) -m pip install $(PIP_INSTALL_ARGS) -e ".[site]"
	touch $@

site: site-env
	$(VENV_PY) site/build.py $(SITE_ARGS)

site-publish: site
	@if [ -z "$(SITE_DEST)" ]; then \
	  echo "error: say where: make site-publish SITE_DEST=user@host:/var/www/slotmap" >&2; exit 1; fi
	rsync -a --delete _build/site/ "$(SITE_DEST)/"

# The compile-only environment: triton-ascend 3.2.0 (which needs pybind11 and does not say
# so), a CPU torch and slotmap. Never the same environment as upstream triton.
ascend-ir:
	@$(MAKE) --no-print-directory setup EXTRA=ascend-ir VENV=$(ASCEND_VENV)

setup: $(STAMP)

# The CPU torch pin from CPU_TORCH_INDEX (see above), into $(VENV).
.PHONY: cpu-torch
cpu-torch:
	@if [ -z "$(CPU_TORCH_INDEX)" ]; then \
	  echo "CPU_TORCH_INDEX is empty: torch comes from pip's own index (on x86-64 Linux, PyPI's CUDA build)"; \
	elif ! $(VENV_PY) -m pip install --retries 1 --timeout 15 --index-url "$(CPU_TORCH_INDEX)" \
	    "$(CPU_TORCH)"; then \
	  echo "error: $(CPU_TORCH) could not be installed from CPU_TORCH_INDEX=$(CPU_TORCH_INDEX)." >&2; \
	  echo "Behind a package mirror, set it to a mirror of PyTorch's CPU wheels (an index):" >&2; \
	  echo "  make ... CPU_TORCH_INDEX=https://<mirror>/whl/cpu" >&2; \
	  echo "or take torch from pip's own index (on x86-64 Linux a CUDA build of several GB):" >&2; \
	  echo "  make ... CPU_TORCH_INDEX=" >&2; \
	  exit 1; \
	fi

# The browser test (tests/test_browser.py) drives Debian's chromium through the playwright
# package (never `playwright install`: it downloads a browser of its own). Only `make test`
# installs chromium, with apt-get as root or through passwordless sudo; `make lab` never
# needs root. Nothing to do when chromium is on PATH. Where it cannot be installed the
# browser test skips, except under CI (CI set), where this target fails.
browser:
	@if command -v chromium >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; \
	else sudo=none; fi; \
	if [ "$$sudo" != none ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's chromium for the browser test"; \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q \
	    && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	         chromium; \
	fi; \
	if command -v chromium >/dev/null 2>&1; then exit 0; fi; \
	echo "chromium is not installed and could not be (needs apt-get, as root or with sudo):" >&2; \
	echo "  apt-get install chromium" >&2; \
	if [ -n "$$CI" ]; then echo "error: CI is set, and the browser test must run in CI" >&2; exit 1; fi; \
	echo "the browser test (tests/test_browser.py) will be skipped" >&2

# The workshop (workshop/, tests/test_workshop_hub.py): JupyterHub and its idle culler (the
# workshop extra), and the hub's proxy, a node program pinned by workshop/hub-proxy's lockfile
# (npm ci installs exactly it into $(VENV)/hub-proxy). Once done, nothing to do (a stamp).
# Without npm the hub test skips, except under CI.
HUB_STAMP := $(VENV)/.workshop-hub.stamp
HUB_PROXY := workshop/hub-proxy
# The oldest node every package of the lockfile runs on (configurable-http-proxy 5.1.0 and its
# dependencies: Debian 12's node 18 is enough; 5.2 and later need node 20, 5.3's commander 22).
NODE_MIN := 18
.PHONY: hub hub-node hub-python
# hub-python first: the refusal below comes before any install (torch and the rest take minutes).
hub: hub-python $(HUB_STAMP)  # make test sets it up with the environments

# As root (a room of system users), refuse an environment learners cannot run: pyenv or conda
# under a 0700 /root would make every learner's first login fail with "Permission denied".
hub-python: | $(VENV_PY)
	@closed="$$($(VENV_PY) $(EVERYONE_RUNS))"; if [ "$$(id -u)" = 0 ] && [ -n "$$closed" ]; then \
	  echo "error: learners cannot run $(VENV)'s Python ($$closed); rebuild it on one they can:" \
	    "rm -rf $(VENV) && make hub PYTHON=/usr/bin/python3.11" >&2; exit 1; fi

# Node and npm for the proxy: say what to install when they are missing or too old.
hub-node:
	@if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then \
	  echo "node and npm are not installed: the workshop's hub needs node >= $(NODE_MIN) and npm:" >&2; \
	  echo "  Debian 12, Ubuntu 24.04: apt-get install nodejs npm" >&2; \
	  echo "  with NodeSource's nodejs installed, npm came with it (apt-get install npm then" >&2; \
	  echo "  fails: 'nodejs : Conflicts: npm'); install only what is missing." >&2; \
	  exit 1; \
	fi; \
	version=$$(node --version); major=$${version#v}; major=$${major%%.*}; \
	if ! [ "$$major" -ge $(NODE_MIN) ] 2>/dev/null; then \
	  echo "error: node $$version is older than $(NODE_MIN), which the hub's proxy needs" >&2; \
	  echo "($(HUB_PROXY)/package-lock.json). Install a newer node: Debian 12 and Ubuntu 24.04's" >&2; \
	  echo "nodejs package (18), or NodeSource's node 20 (its nodejs package includes npm)." >&2; \
	  exit 1; \
	fi

$(HUB_STAMP): pyproject.toml $(STAMP) $(HUB_PROXY)/package.json $(HUB_PROXY)/package-lock.json
	@$(MAKE) --no-print-directory hub-python
	$(VENV_PY) -m pip install $(PIP_INSTALL_ARGS) -e ".[workshop]"
	@if ! command -v npm >/dev/null 2>&1 && [ -z "$$CI" ]; then \
	  $(MAKE) --no-print-directory hub-node; \
	  echo "the hub test (tests/test_workshop_hub.py) will be skipped" >&2; exit 0; \
	fi; \
	$(MAKE) --no-print-directory hub-node || exit 1; \
	mkdir -p $(VENV)/hub-proxy \
	  && cp $(HUB_PROXY)/package.json $(HUB_PROXY)/package-lock.json $(VENV)/hub-proxy/ \
	  && npm ci --prefix $(VENV)/hub-proxy --no-audit --no-fund \
	  && touch $@

# A Python 3.11 every user can run comes first (the hub's learners run this environment as
# themselves; pyenv or conda under a 0700 /root is root's only), else the first 3.11 found.
$(VENV_PY):
	@py="$(PYTHON)"; \
	if [ -z "$$py" ]; then \
	  for candidate in python3.11 python3 /usr/bin/python3.11 /usr/local/bin/python3.11; do \
	    if command -v "$$candidate" >/dev/null 2>&1 \
	       && "$$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
	          >/dev/null 2>&1; then \
	      [ -z "$$py" ] && py="$$candidate"; \
	      if [ -z "$$("$$candidate" $(EVERYONE_RUNS))" ]; then py="$$candidate"; break; fi; \
	    fi; \
	  done; \
	fi; \
	if [ -z "$$py" ] || ! "$$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
	      >/dev/null 2>&1; then \
	  echo "error: slotmap needs Python 3.11 (the only version both triton >= 3.3 and" >&2; \
	  echo "triton-ascend 3.2 support), and neither python3.11 nor python3 on PATH is 3.11." >&2; \
	  echo "Install Python 3.11 (e.g. apt install python3.11 python3.11-venv, pyenv, or" >&2; \
	  echo "conda env create -f environment.yml), or run: make PYTHON=/path/to/python3.11" >&2; \
	  exit 1; \
	fi; \
	echo "creating $(VENV) with $$py ($$("$$py" -c 'import sys; print(sys.version.split()[0])'))"; \
	if ! "$$py" -m venv "$(VENV)"; then \
	  rm -rf "$(VENV)"; \
	  echo "error: '$$py -m venv' failed; on Debian/Ubuntu install python3.11-venv" >&2; \
	  exit 1; \
	fi

$(STAMP): pyproject.toml | $(VENV_PY)
	@case "$(EXTRA)" in cpu|cuda|npu|ascend-ir) ;; \
	  *) echo "error: EXTRA=$(EXTRA): expected cpu, cuda, npu or ascend-ir" >&2; exit 1;; esac
	@for other in $(VENV)/.slotmap-*.stamp; do \
	  if [ -e "$$other" ] && [ "$$other" != "$(STAMP)" ]; then \
	    echo "error: $(VENV) was set up for EXTRA=$$(basename "$$other" .stamp | sed 's/^.slotmap-//')," >&2; \
	    echo "not EXTRA=$(EXTRA); one environment holds one stack. Remove it (rm -rf $(VENV))" >&2; \
	    echo "or use another one (make ... EXTRA=$(EXTRA) VENV=.venv-$(EXTRA))." >&2; \
	    exit 1; \
	  fi; \
	done
	$(VENV_PY) -m pip install --upgrade pip
ifneq ($(filter cpu ascend-ir,$(EXTRA)),)
	@$(MAKE) --no-print-directory cpu-torch
endif
ifeq ($(EXTRA),ascend-ir)
	$(VENV_PY) -m pip install $(PIP_INSTALL_ARGS) -e ".[ascend-ir]"
else
	$(VENV_PY) -m pip install $(PIP_INSTALL_ARGS) -e ".[$(EXTRA),lab,test]"
endif
ifeq ($(EXTRA),npu)
	@# A dependency that asks for upstream triton overwrites triton-ascend's files: put them back.
	@if $(VENV_PY) -m pip show --quiet triton >/dev/null 2>&1; then \
	  echo "upstream triton was pulled in next to triton-ascend: removing it"; \
	  $(VENV_PY) -m pip uninstall --yes triton && \
	  $(VENV_PY) -m pip install --force-reinstall --no-deps "triton-ascend==3.2.0"; \
	fi
endif
	touch $(STAMP)
