import os
import shutil

import pytest


@pytest.fixture(scope="session")
def converted_copy():
    """The converted default model in the user's cache (the one the suite loads anyway)."""
    from kvviz.engine import model_cache

    return model_cache.ensure_default_model()


WEIGHTS = "model.safetensors"


@pytest.fixture
def cache_copy(tmp_path, monkeypatch, converted_copy):
    """A private KVVIZ_CACHE_DIR holding the converted model to damage, file times kept: the small files copied,
    the 540 MB of weights a hard link to the suite's own copy (a test that changes them calls `own` first)."""
    target = tmp_path / "models" / converted_copy.name
    shutil.copytree(converted_copy, target, ignore=shutil.ignore_patterns(WEIGHTS))  # copy2 keeps the times
    os.link(converted_copy / WEIGHTS, target / WEIGHTS)
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    yield target
    shutil.rmtree(tmp_path, ignore_errors=True)


def own(path):
    """Make `path` a file of its own (a copy with the same times) where it is a hard link, so that changing it
    in place cannot change the file it was linked to."""
    if path.stat().st_nlink > 1:
        part = path.with_name(path.name + ".own")
        shutil.copy2(path, part)
        os.replace(part, path)
