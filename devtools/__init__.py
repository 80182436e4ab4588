"""The tooling of the tests and benchmarks, outside the runtime (common/): the PASS/FAIL tables and
test tiers (testing.py), GPU turns shared by test scripts (gpu_turns.py), host timing and bandwidth
math (bench.py), the benchmark harness (harness.py), results JSON (results.py) and the peers compared
against (peers.py). No kernel imports it."""
