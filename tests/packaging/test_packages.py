"""Fast checks that the wheel will hold every kvviz package, kvviz.resources included.

setuptools' packages.find cannot see kvviz.resources: it lives in the top-level resources/
folder, mapped by package-dir, and find only walks kvviz/. So pyproject lists the packages, and
this test fails as soon as a new subpackage is missing from that list (the slow `make
test-install` checks the real wheel).
"""

from __future__ import annotations

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _source_packages() -> set[str]:
    found = set()
    for py in (ROOT / "kvviz").rglob("*.py"):
        if "__pycache__" in py.parts:
            continue
        found.add(".".join(py.parent.relative_to(ROOT).parts))
    return found | {"kvviz.resources"}


def test_resources_mapped_with_package_data():
    st = _setuptools()
    assert st.get("package-dir", {}).get("kvviz.resources") == "resources"
    assert "**/*" in st.get("package-data", {}).get("kvviz.resources", [])
    assert (ROOT / "resources" / "__init__.py").is_file()


def test_pyproject_lists_every_package():
    packages = _setuptools().get("packages")
    assert isinstance(packages, list), (
        "pyproject finds its packages with [tool.setuptools.packages.find], which never sees "
        "kvviz.resources (resources/ is outside kvviz/): wheels and editable installs then ship no "
        "icons, stylesheets or prompts. List the packages instead: "
        '[tool.setuptools] packages = ["kvviz", ..., "kvviz.resources"] (see packaging/README.md)'
    )
    missing = sorted(_source_packages() - set(packages))
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"


def test_kvviz_resources_importable():
    """In this environment (the dev venv's editable install) kvviz.resources is the checkout's
    resources/ folder, so the app's lookups and the tests see the same files as a wheel would."""
    import kvviz
    from kvviz import resources  # ImportError when pyproject does not ship kvviz.resources

    root = resources.path().resolve()
    if ROOT in pathlib.Path(kvviz.__file__).resolve().parents:
        assert root == (ROOT / "resources").resolve()
    assert resources.icon_path().is_file()
    assert resources.icon_path(16).is_file()
