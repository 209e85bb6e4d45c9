# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv from the pinned requirements.txt when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# Horovod 0.28.1 builds only against tensorflow-cpu 2.12.1: its own pinned environment.
HOROVOD_VENV := .venv-horovod
HOROVOD_INSTALLED := $(HOROVOD_VENV)/.installed
HOROVOD_BUILD := HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo MAKEFLAGS=-j2
BAZEL_OFFLINE := $(foreach repo,rules_cc rules_java remote_coverage_tools,\
	--override_repository=$(repo)=$(CURDIR)/tools/bazel_offline/$(repo))

.PHONY: demo test lint pytest bazel-check clean

$(INSTALLED): requirements.txt setup.py zz_disco_xla_hook.pth
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	cp zz_disco_xla_hook.pth "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
	touch $(INSTALLED)

# pip's wheel cache (~/.cache/pip) keeps the built horovod wheel: later runs do not rebuild.
$(HOROVOD_INSTALLED): requirements-horovod.txt
	test -x $(HOROVOD_VENV)/bin/python || $(PYTHON) -m venv $(HOROVOD_VENV)
	grep -E '^(setuptools|wheel|packaging)==' requirements-horovod.txt > $(HOROVOD_VENV)/build-tools.txt
	grep -v '^horovod==' requirements-horovod.txt > $(HOROVOD_VENV)/dependencies.txt
	$(HOROVOD_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r $(HOROVOD_VENV)/build-tools.txt
	$(HOROVOD_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r $(HOROVOD_VENV)/dependencies.txt
	$(HOROVOD_BUILD) $(HOROVOD_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		--no-build-isolation --no-deps "$$(grep '^horovod==' requirements-horovod.txt)"
	echo "$(CURDIR)" > "$$($(HOROVOD_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/disco_xla_repo.pth"
	touch $(HOROVOD_INSTALLED)

demo: $(INSTALLED)
	$(BIN)/python -m disco_xla.demo

test: lint bazel-check pytest

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Two workers, one file each at a time (a file's fixtures are built once): most
# tests compile with XLA or wait on subprocesses, and one alone keeps about
# two-thirds of the 2 CPUs busy.
pytest: $(INSTALLED) $(HOROVOD_INSTALLED)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=30 tests

# `bazel build //...` offline with Debian's bazel-bootstrap (Bazel 4.2.3).
bazel-check:
	command -v bazel >/dev/null || (apt-get update -q && apt-get install -y -q bazel-bootstrap)
	bazel build $(BAZEL_OFFLINE) //...

clean:
	rm -rf $(VENV) $(HOROVOD_VENV) build bazel-* .pytest_cache .ruff_cache *.egg-info
