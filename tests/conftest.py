"""Shared fixtures. Tests never reach the Hugging Face Hub."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def default_model():
    from kvviz.engine import models

    return models.load_model("default")


@pytest.fixture(scope="session")
def tiny_model():
    from kvviz.engine import models

    return models.load_model("tiny")
