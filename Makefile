# The workshop in three commands:  make run | make test | make lab
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
NPROC   ?= 2

PYTHON  ?= $(BIN)/python

.PHONY: run test lab venv clean-venv gpu-smoke figures

$(BIN)/.installed: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt -e . 2>&1 | grep -v "is ignored: it is neither" || true
	$(BIN)/python -c "import torch, torchvision, source_code; print('environment ready: torch', torch.__version__)"
	touch $@

venv: $(BIN)/.installed

## the main job: DDP training of the small CNN on the embedded digits, 2 processes
run: venv
	$(BIN)/torchrun --standalone --nproc-per-node=$(NPROC) -m source_code.training.ddp $(ARGS)

## the whole suite: unit, parity, fault, Slurm and every notebook (nbval)
test: venv
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest $(PYTEST_ARGS)

## the GPU paths for real, one line per check (PYTHON=python3 uses a machine's own torch)
gpu-smoke: $(if $(filter $(BIN)/python,$(PYTHON)),venv)
	PATH=$(dir $(PYTHON)):$$PATH $(PYTHON) -m source_code.gpu_smoke $(ARGS)

## re-execute every notebook and export its figures to images/ (the tests never write there)
figures: venv
	cd notebooks && for nb in [0-9]*.ipynb; do WORKSHOP_EXPORT_FIGURES=1 PATH=$(CURDIR)/$(BIN):$$PATH \
		../$(BIN)/jupyter nbconvert --to notebook --execute --inplace $$nb || exit 1; done

## JupyterLab on the notebooks: prints the URL to open (LAB_PORT=8888 by default)
lab: venv
	@token=$$($(BIN)/python -c "import secrets; print(secrets.token_hex(16))"); \
	echo "JupyterLab: open http://127.0.0.1:$(or $(LAB_PORT),8888)/lab?token=$$token"; \
	PATH=$(CURDIR)/$(BIN):$$PATH exec $(BIN)/jupyter lab --no-browser --ip=127.0.0.1 \
		--port=$(or $(LAB_PORT),8888) --ServerApp.port_retries=0 --IdentityProvider.token=$$token \
		--ServerApp.root_dir=$(CURDIR)/notebooks $$([ "$$(id -u)" = 0 ] && echo --allow-root)

clean-venv:
	rm -rf $(VENV)
