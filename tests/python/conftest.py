"""pytest setup for kiln's Python tests (offline, CPU only)."""

import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for p in (os.path.join(ROOT, "clients", "python"), os.path.join(ROOT, "tests", "data")):
    if p not in sys.path:
        sys.path.insert(0, p)

CORPUS_DIR = os.path.join(ROOT, "tests", "data", "graphs")


def kilnc_path():
    build = os.environ.get("KILN_BUILD_DIR") or os.path.join(ROOT, "build")
    return os.path.join(build, "compiler", "kilnc")


@pytest.fixture(scope="session")
def corpus_dir():
    return CORPUS_DIR


@pytest.fixture(scope="session")
def kilnc():
    path = kilnc_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kilnc not built: {path} is missing (set KILN_BUILD_DIR)")
    return path
