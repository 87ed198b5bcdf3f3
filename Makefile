.PHONY: setup test demo bench soak lint clean

setup:
	@scripts/setup.sh

test: setup
	.venv/bin/ruff check src tests benchmarks demo
	.venv/bin/pytest -v -rs

demo: setup
	.venv/bin/python demo/demo.py $(ARGS)

bench: setup
	.venv/bin/python benchmarks/lifecycle.py
	.venv/bin/python benchmarks/checkpoints.py
	.venv/bin/python benchmarks/agent.py
	.venv/bin/python benchmarks/shell.py
	.venv/bin/python benchmarks/microvm.py

soak: setup
	.venv/bin/python benchmarks/soak.py --iterations 30

lint:
	.venv/bin/ruff check src tests benchmarks demo
	.venv/bin/ruff format --check src tests benchmarks demo

clean:
	rm -rf .venv build src/*.egg-info .pytest_cache .ruff_cache
