# make test        every */test_*.py: small shapes in Triton's interpreter without a GPU, full sizes with one
#                  (JOBS=4: four scripts at once, each printed when it ends)
# make bench       every benchmarks/*_bench.py on a CUDA GPU -> benchmarks/results/*.json and *.png
#                  (BENCH=norm,attention: those only; ARGS='--dtype bf16 --only rmsnorm': to each benchmark)
# make bench-smoke the same benchmark code on tiny shapes in the interpreter, into build/bench-smoke
#                  (JOBS=2: two at once)
# make report      docs/results/*.md and the README's summary table from benchmarks/results/*.json
# make lint        ruff check (pyproject.toml's rules) and ruff format --check; ruff comes with the [dev] extras
# make format      ruff format: rewrites the files make lint would refuse for their layout
PYTHON ?= python3

.PHONY: test bench bench-smoke deps report lint format
deps:
	@$(PYTHON) scripts/deps.py  # a plain script: it must not import what it is about to install

test: deps
	@$(PYTHON) -m llmk.scripts.run_tests $(if $(JOBS),--jobs $(JOBS))

bench: deps
	@$(PYTHON) -m llmk.scripts.run_benchmarks $(if $(BENCH),--bench $(BENCH)) $(ARGS)

bench-smoke: deps
	@$(PYTHON) -m llmk.scripts.run_benchmarks --smoke $(if $(JOBS),--jobs $(JOBS)) $(if $(BENCH),--bench $(BENCH)) $(ARGS)

report:
	@$(PYTHON) scripts/report.py  # a plain script: no torch, no GPU

lint:
	@$(PYTHON) -m ruff --version > /dev/null 2>&1 || { echo "make lint: ruff is not installed (pip install -e \".[dev]\")"; exit 2; }
	@$(PYTHON) -m ruff check .
	@$(PYTHON) -m ruff format --check . || { echo "make lint: run make format"; exit 1; }

format:
	@$(PYTHON) -m ruff --version > /dev/null 2>&1 || { echo "make format: ruff is not installed (pip install -e \".[dev]\")"; exit 2; }
	@$(PYTHON) -m ruff format .
