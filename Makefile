# Two commands from a fresh clone: `make demo` and `make test`. Only python3 (3.10+), pip and make needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,mpi,torch]'
	$(BIN)/python -m hccl_py.torch.device
	touch $@

install: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/hccl-launch -n 4 examples/infer.py

test: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n 2

clean:
	rm -rf $(VENV) build *.egg-info
