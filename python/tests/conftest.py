"""pytest set-up: the tests use the heuristic tile policy (tuning every shape would make them slow)
unless the environment names one. Markers (torch, gpu) are declared in pyproject.toml."""

import os

os.environ.setdefault("LADLE_AUTOTUNE", "heuristic")
