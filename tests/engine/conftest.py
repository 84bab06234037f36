import shutil

import pytest


@pytest.fixture(scope="session")
def converted_copy():
    """The converted default model in the user's cache (the one the suite loads anyway)."""
    from kvviz.engine import model_cache

    return model_cache.ensure_default_model()


@pytest.fixture
def cache_copy(tmp_path, monkeypatch, converted_copy):
    """A private KVVIZ_CACHE_DIR holding a copy of the converted model, file times kept, to damage."""
    target = tmp_path / "models" / converted_copy.name
    shutil.copytree(converted_copy, target)  # copy2: modification times stay as the manifest records them
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    yield target
    shutil.rmtree(tmp_path, ignore_errors=True)  # half a gigabyte per test
