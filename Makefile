# make test        every */test_*.py: small shapes in Triton's interpreter without a GPU, full sizes with one
# make bench       every benchmarks/*_bench.py on a CUDA GPU -> benchmarks/results/*.json and *.png
# make bench-smoke the same benchmark code on tiny shapes in the interpreter, into build/bench-smoke
PYTHON ?= python3

.PHONY: test bench bench-smoke deps
deps:
	@$(PYTHON) common/deps.py  # a plain script: it must not import what it is about to install

test: deps
	@$(PYTHON) -m common.run_tests

bench: deps
	@$(PYTHON) -m common.run_benchmarks

bench-smoke: deps
	@$(PYTHON) -m common.run_benchmarks --smoke
