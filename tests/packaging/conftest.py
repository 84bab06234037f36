"""Packaging tests. The fast ones run in `make test`; the slow ones are opt-in:

- ``install``: `pip install .` (not editable) into a fresh venv, then run the installed kvviz.
  Runs only with KVVIZ_TEST_INSTALL=1 (`make test-install`): it installs torch and the rest,
  a few minutes and about 2 GB of disk.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "install: slow; pip install . into a fresh venv (make test-install)")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("KVVIZ_TEST_INSTALL") == "1":
        return
    skip = pytest.mark.skip(reason="slow install test: run `make test-install` (KVVIZ_TEST_INSTALL=1)")
    for item in items:
        if item.get_closest_marker("install") is not None:
            item.add_marker(skip)
