.PHONY: setup test demo bench lint clean

setup:
	@scripts/setup.sh

test: setup
	.venv/bin/ruff check src tests benchmarks demo
	.venv/bin/pytest -v -rs

demo: setup
	.venv/bin/python demo/demo.py $(ARGS)

bench: setup
	.venv/bin/python benchmarks/lifecycle.py

lint:
	.venv/bin/ruff check src tests benchmarks demo
	.venv/bin/ruff format --check src tests benchmarks demo

clean:
	rm -rf .venv build src/*.egg-info .pytest_cache .ruff_cache
