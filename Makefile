# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv from the pinned requirements.txt when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
BAZEL_OFFLINE := $(foreach repo,rules_cc rules_java remote_coverage_tools,\
	--override_repository=$(repo)=$(CURDIR)/tools/bazel_offline/$(repo))

.PHONY: demo test lint pytest bazel-check clean

$(INSTALLED): requirements.txt setup.py zz_disco_xla_hook.pth
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	cp zz_disco_xla_hook.pth "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
	touch $(INSTALLED)

demo: $(INSTALLED)
	$(BIN)/python -m disco_xla.demo

test: lint bazel-check pytest

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

pytest: $(INSTALLED)
	$(BIN)/python -m pytest -q tests

# `bazel build //...` offline with Debian's bazel-bootstrap (Bazel 4.2.3).
bazel-check:
	command -v bazel >/dev/null || (apt-get update -q && apt-get install -y -q bazel-bootstrap)
	bazel build $(BAZEL_OFFLINE) //...

clean:
	rm -rf $(VENV) build bazel-* .pytest_cache .ruff_cache *.egg-info
