# The workshop in three commands:  make run | make test | make lab
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
NPROC   ?= 2

PYTHON  ?= $(BIN)/python
# PYTHON's folder first on PATH (torchrun beside it), only when PYTHON names a path:
# PYTHON=python3 must not put ./ first on PATH
PYTHON_PATH = $(if $(findstring /,$(PYTHON)),PATH=$(dir $(PYTHON)):$$PATH)

.PHONY: run test lab check torch-check venv clean-venv gpu-smoke figures slides my-notebooks participant-notebooks restore-notebooks cluster-up cluster-down prepare

# pip, quiet, with its exit status kept: a failed install stops make with pip's own error
# (only the harmless notes about find-links folders this machine lacks are left out)
PIP = sh -c '{ "$$0" install --quiet --disable-pip-version-check "$$@" 2>&1; echo $$? > $(VENV)/.pip-status; } \
	| grep -v "is ignored: it is neither"; exit $$(cat $(VENV)/.pip-status)' $(BIN)/pip

# TORCH_INDEX: another index for torch/torchvision, e.g. PyTorch's CPU-only wheels on a laptop
# without a GPU (README, "Setting up"); by default the CUDA build a GPU node needs
$(BIN)/.installed: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "installing torch 2.14.1, torchvision, JupyterLab, Lightning, Accelerate, DeepSpeed into $(VENV):"
	@echo "  $(if $(TORCH_INDEX),torch from $(TORCH_INDEX),the CUDA build: about 6.3 GB, about 5 minutes); pip's errors, if any, stop here"
	$(if $(TORCH_INDEX),$(PIP) --index-url $(TORCH_INDEX) $$(grep -E '^torch(vision)?==' requirements.txt))
	$(PIP) -r requirements.txt -e .
	$(BIN)/python -c "import torch, torchvision, source_code; print('environment ready: torch', torch.__version__)"
	touch $@

venv: $(BIN)/.installed

## the main job: DDP training of the small CNN on the embedded digits, 2 processes
run: venv
	$(BIN)/torchrun --standalone --nproc-per-node=$(NPROC) -m source_code.training.ddp $(ARGS)

## the whole suite: unit, parity, fault, Slurm and every notebook (nbval), in TEST_WORKERS
## processes (pytest-xdist; one file to a worker at a time, so a notebook's cells stay in order, and
## every file that submits Slurm jobs on one worker: conftest.py). One worker more than the 2
## cores the suite is sized for: while one waits (for its Slurm jobs, a timeout, a sleeping
## rank), the other two keep both cores busy
## PYTHONDONTWRITEBYTECODE= (empty: unset): where a machine sets it, every process of the suite
## (hundreds: ranks, agents, kernels, jobs) would compile the workshop's modules again, and every
## worker would rewrite the tests' asserts again; __pycache__/ is ignored by git.
## GOMP_SPINCOUNT=1000: a process with more than one OpenMP thread (a kernel, a job's rank with
## 2 cores) spins its idle threads for a while after each operator, which on cores the suite
## keeps oversubscribed on purpose is CPU taken from the other workers; results do not change
TEST_WORKERS ?= 3
test: venv
	PYTHONDONTWRITEBYTECODE= GOMP_SPINCOUNT=1000 PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile \
		--no-loadscope-reorder $(PYTEST_ARGS)

## the GPU paths for real, one line per check (PYTHON=python3 uses a machine's own torch)
gpu-smoke: $(if $(filter $(BIN)/python,$(PYTHON)),venv)
	$(PYTHON_PATH) $(PYTHON) -m source_code.gpu_smoke $(ARGS)

## re-execute every notebook and export its figures to images/ (the tests never write there)
figures: venv
	cd notebooks && for nb in [0-9]*.ipynb; do WORKSHOP_EXPORT_FIGURES=1 PATH=$(CURDIR)/$(BIN):$$PATH \
		../$(BIN)/jupyter nbconvert --to notebook --execute --inplace $$nb || exit 1; done

## JupyterLab with the repository as its root, opening on notebooks/: prints the URL to open
lab: venv
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m source_code.lab

## the day before the course: one row per requirement, ok or the fix (PYTHON=python3 for a site's torch)
check: $(if $(filter $(BIN)/python,$(PYTHON)),venv)
	$(PYTHON_PATH) $(PYTHON) -m source_code.readiness $(ARGS)

## on a machine with internet (a login node): MNIST, CIFAR-10 and WikiText-2 into DATA (default:
## WORKSHOP_DATA, else data), which the jobs then read offline; PYTHON=python3 with a site's
## PyTorch module builds no venv; the download's own cache goes to CACHE (default: a temporary
## directory, removed at the end)
DATA ?= $(or $(WORKSHOP_DATA),data)
prepare: $(if $(filter $(BIN)/python,$(PYTHON)),venv)
	for d in mnist cifar10 wikitext2; do $(PYTHON) -m source_code.data prepare --data-dir $(DATA) \
		--dataset $$d $(if $(CACHE),--cache-dir $(CACHE)) || exit 1; done

## a real two-node Slurm cluster on this machine (nodes n1, n2, partition debug, site `local`) to try
## the notebooks' sbatch lines; needs root, installs Debian's Slurm packages the first time
cluster-up: venv
	$(BIN)/python tests/slurm_cluster.py start

cluster-down:
	$(BIN)/python tests/slurm_cluster.py stop

## your own copy of the notebooks to work in (my-notebooks/, which git ignores); never overwrites
my-notebooks:
	mkdir -p my-notebooks && cp -n notebooks/*.ipynb my-notebooks/ && echo "your copies: my-notebooks/ (open them from the lab)"

## slide decks of the notebooks for presenting from a browser (slides/, which git ignores; no
## network needed); live instead: make lab, open a notebook, Alt+R (RISE)
slides: venv
	$(BIN)/python -m source_code.slides --export slides

## for an instructor: the notebooks to hand out (exercise outputs cleared, reference solutions left out)
participant-notebooks: venv
	$(BIN)/python -m source_code.participant_notebooks $(ARGS)

## put the notebooks back as they came (a pull works again); your edits are kept in my-notebooks/saved-*/
restore-notebooks:
	@changed=$$(git diff --name-only -- notebooks); if [ -n "$$changed" ]; then \
		keep=my-notebooks/saved-$$(date +%Y%m%d-%H%M%S); mkdir -p $$keep && cp $$changed $$keep/ && \
		git checkout -- notebooks && echo "restored notebooks/; your edited versions are in $$keep/"; \
	else echo "notebooks/ is as it came: nothing to restore"; fi

## the entry points under another torch, in a side environment .venv-torch$(TORCH) (e.g. TORCH=2.6.0):
## one row each, ok / refused / FAIL / hangs (the README's support table); torchvision to match
torch-check:
	@test -n "$(TORCH)" || { echo "error: say which torch, e.g. make torch-check TORCH=2.6.0"; exit 2; }
	test -x .venv-torch$(TORCH)/bin/python || $(PY) -m venv .venv-torch$(TORCH)
	$(MAKE) --no-print-directory PIP_VENV=.venv-torch$(TORCH) BIN=.venv-torch$(TORCH)/bin VENV=.venv-torch$(TORCH) \
		side-install SIDE_PKGS="torch==$(TORCH) torchvision==0.$$(( $$(echo $(TORCH) | cut -d. -f2) + 15 )).* numpy scikit-learn matplotlib $(SIDE_EXTRA)"
	PATH=$(CURDIR)/.venv-torch$(TORCH)/bin:$$PATH PYTHONPATH=$(CURDIR) .venv-torch$(TORCH)/bin/python -m source_code.torch_support $(ARGS)

side-install:
	$(PIP) $(SIDE_PKGS)

clean-venv:
	rm -rf $(VENV)
