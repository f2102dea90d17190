# The workshop in three commands:  make run | make test | make lab
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
NPROC   ?= 2

PYTHON  ?= $(BIN)/python

.PHONY: run test lab check venv clean-venv gpu-smoke figures my-notebooks restore-notebooks

# TORCH_INDEX: another index for torch/torchvision, e.g. PyTorch's CPU-only wheels on a laptop
# without a GPU (README, "Setting up"); by default the CUDA build a GPU node needs
$(BIN)/.installed: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "installing torch 2.14.1, torchvision, JupyterLab, Lightning, Accelerate, DeepSpeed into $(VENV):"
	@echo "  $(if $(TORCH_INDEX),torch from $(TORCH_INDEX),the CUDA build: about 6.3 GB, 2-5 minutes); pip's errors, if any, stop here"
	$(if $(TORCH_INDEX),$(BIN)/pip install --quiet --disable-pip-version-check --index-url $(TORCH_INDEX) \
		$$(grep -E '^torch(vision)?==' requirements.txt))
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt -e .
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

## JupyterLab with the repository as its root, opening on notebooks/: prints the URL to open
lab: venv
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m source_code.lab

## the day before the course: one row per requirement, ok or the fix (PYTHON=python3 for a site's torch)
check: $(if $(filter $(BIN)/python,$(PYTHON)),venv)
	PATH=$(dir $(PYTHON)):$$PATH $(PYTHON) -m source_code.readiness $(ARGS)

## your own copy of the notebooks to work in (my-notebooks/, which git ignores); never overwrites
my-notebooks:
	mkdir -p my-notebooks && cp -n notebooks/*.ipynb my-notebooks/ && echo "your copies: my-notebooks/ (open them from the lab)"

## put the notebooks back as they came (a pull works again); your edits are kept in my-notebooks/saved-*/
restore-notebooks:
	@changed=$$(git diff --name-only -- notebooks); if [ -n "$$changed" ]; then \
		keep=my-notebooks/saved-$$(date +%Y%m%d-%H%M%S); mkdir -p $$keep && cp $$changed $$keep/ && \
		git checkout -- notebooks && echo "restored notebooks/; your edited versions are in $$keep/"; \
	else echo "notebooks/ is as it came: nothing to restore"; fi

clean-venv:
	rm -rf $(VENV)
