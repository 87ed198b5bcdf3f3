.PHONY: setup setup-test test test-fast demo bench soak fuzz lint clean

# What `make demo` needs: system packages, stasis in .venv, the default image (other images build on first use).
setup:
	@scripts/setup.sh

# That, and what the suite needs besides: test dependencies, Harbor's venv, E2B's npm package, every image.
setup-test:
	@scripts/setup.sh test

# Each file on one worker, the slowest first (tests/durations.json): xdist would order them by how many tests each has.
test: setup-test
	.venv/bin/ruff check src tests benchmarks demo
	.venv/bin/pytest -v -rs --durations=25 -n 2 --dist loadfile --no-loadscope-reorder

# No runsc, QEMU or image: the real agent on a fake backend, the tables, the store, the SDK recipes.
test-fast: .venv/.stasis-installed
	env -u PYTHONDONTWRITEBYTECODE .venv/bin/pytest -q -m "fast and not slow" -n 2  # rewritten test modules cached: 13 s less collecting

.venv/.stasis-installed: pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q uv
	.venv/bin/uv pip install -q --python .venv/bin/python -e '.[dev,integrations,fleet]'
	touch $@

demo: setup
	.venv/bin/python demo/demo.py $(ARGS)

bench: setup
	.venv/bin/python benchmarks/lifecycle.py
	.venv/bin/python benchmarks/checkpoints.py
	.venv/bin/python benchmarks/agent.py
	.venv/bin/python benchmarks/shell.py
	.venv/bin/python benchmarks/microvm.py
	.venv/bin/python benchmarks/network.py
	.venv/bin/python benchmarks/images.py
	.venv/bin/python benchmarks/fs.py --backends gvisor,gvisor:fast,microvm
	.venv/bin/python benchmarks/pools.py
	.venv/bin/python benchmarks/exec.py
	.venv/bin/python benchmarks/density.py
	.venv/bin/python benchmarks/remote.py
	.venv/bin/python benchmarks/e2b_face.py
	.venv/bin/python benchmarks/cli.py
	.venv/bin/python benchmarks/code.py
	.venv/bin/python benchmarks/devloop.py --backends gvisor,gvisor:fast
	.venv/bin/python benchmarks/storage.py
	.venv/bin/python benchmarks/fleet.py
	.venv/bin/python benchmarks/templates.py
	.venv/bin/python benchmarks/volumes.py
	.venv/bin/python benchmarks/teams.py

soak: setup
	.venv/bin/python benchmarks/soak.py --iterations 30
	.venv/bin/python benchmarks/cycles.py --cycles 1000

fuzz: setup
	.venv/bin/python scripts/fuzz.py --max-examples 25

lint:
	.venv/bin/ruff check src tests benchmarks demo
	.venv/bin/ruff format --check src tests benchmarks demo

clean:
	rm -rf .venv .venv-harbor build src/*.egg-info .pytest_cache .ruff_cache
