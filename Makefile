# Two entry points for a fresh machine (see README): `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MODEL ?= smollm2-135m
ARTIFACT ?= artifacts/$(MODEL)
PROMPT ?= Give me three short tips for staying focused while studying.

.PHONY: setup demo test bench bench-decode bench-soak compare-docs chat lock clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-deps -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

demo: setup
	$(BIN)/specmemo export --model $(MODEL) --out $(ARTIFACT)
	$(BIN)/specmemo plan --artifact $(ARTIFACT)
	$(BIN)/specmemo generate --artifact $(ARTIFACT) --prompt "$(PROMPT)"

test: setup
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/specmemo bench step --artifact $(ARTIFACT)

bench-decode: setup
	$(BIN)/specmemo bench decode --artifact $(ARTIFACT) --torch-reference

bench-soak: setup
	$(BIN)/specmemo bench soak --artifact $(ARTIFACT)

# regenerates docs/compare/ (report.md, results.json, JSONL, plots): ~25 min on 2 cores
compare-docs: setup
	$(BIN)/specmemo compare --model $(MODEL) --artifact $(ARTIFACT) --questions 10 --rounds 2 --out docs/compare

chat: setup
	$(BIN)/specmemo chat --artifact $(ARTIFACT)

lock:
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^specmemo' | sed 's/+cpu//' > requirements.lock.new
	@echo "review requirements.lock.new, keep the header, then move it over requirements.lock"

clean:
	rm -rf $(VENV) artifacts results .pytest_cache
