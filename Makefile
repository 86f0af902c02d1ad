# Two commands on a fresh machine: `make demo` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.omnilab-installed
SOURCES := pyproject.toml CMakeLists.txt $(shell find cpp -name '*.cc' -o -name '*.h' 2>/dev/null)
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup demo test bench fuzz lint docs clean

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned to the release on local disk; then the build tools, so that the extension is
# compiled against the venv's own mujoco==4.0.0 (no build isolation); then the package.
$(STAMP): $(PY) $(SOURCES)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q scikit-build-core pybind11 ninja cmake mujoco==4.0.0
	$(PIP) install -q --no-build-isolation -e '.[dev,bench]'
	touch $(STAMP)

# trains the pendulum with APPO for a short budget (the CLI prints where the TensorBoard logs are)
demo: setup
	$(PY) -m lightning_unilab.train --config recipes/unilab/inverted_pendulum.yaml \
		--trainer.max_time 00:00:01:30
	$(PY) benchmarks/pool_throughput.py --quick --out build/pool_throughput_quick.json
	$(PY) -m lightning_omni.examples.multimodal_train fit --config recipes/omni/multimodal.yaml \
		--trainer.max_epochs 1 --data.samples_per_epoch 128 --trainer.enable_progress_bar false

# the oldest Lightning pyproject.toml admits: OmniStrategy's Lightning tests run on it too
LIGHTNING_OLDEST := 2.4.0
OLDEST_DIR := build/lightning-$(LIGHTNING_OLDEST)

test: setup
	$(PY) -m pytest -q
	test -d $(OLDEST_DIR) || $(PIP) install -q --no-deps --target $(OLDEST_DIR) lightning==$(LIGHTNING_OLDEST)
	PYTHONPATH=$(OLDEST_DIR) $(PY) -m pytest -q -p no:cacheprovider tests/omni/test_lightning_versions.py \
		tests/omni/test_refusals.py tests/omni/test_user_path.py -k "not bf16 and not 1-2 and not 2-2"

bench: setup
	$(PY) benchmarks/pool_throughput.py --out build/pool_throughput.json
	$(PY) benchmarks/omni_sim.py --out build/omni_sim.json
	$(PY) benchmarks/omni_lssp_reorder.py --out build/omni_lssp_reorder.json
	$(PY) benchmarks/omni_runtime.py --out build/omni_runtime.json
	$(PY) benchmarks/rl_cycle.py --out build/rl_cycle.json
	$(PY) benchmarks/integrations_speed.py --out build/integrations_speed.json

# generated bad input at every public entry point, time-boxed per entry point, seed printed
# (docs/reliability.md)
FUZZ_SEED ?= 0
fuzz: setup
	$(PY) fuzz/campaign.py --examples 3000 --time-box 600 --seed $(FUZZ_SEED) --out build/fuzz.json

lint: setup
	$(VENV)/bin/ruff check .

# the documentation site into build/site (mkdocs.yml): every link, anchor, docstring and
# command's --help checked; tests/test_docs_site.py runs the same build in make test
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf build $(VENV) .pytest_cache .ruff_cache
