"""Files shipped with kvviz: icons, stylesheets, example prompts, desktop metadata.

This folder is the top-level ``resources/`` of the repository; pyproject.toml maps it to the
package ``kvviz.resources``, so the same code finds the files in a source checkout, an editable
install, a wheel install and a PyInstaller bundle::

    from kvviz import resources
    resources.path("icons", "hicolor", "scalable", "apps", "io.github.kvviz.KVViz.svg")

Only this ``__init__.py`` is code; everything else here is data (package-data "**/*").
"""

from __future__ import annotations

import pathlib
from importlib.resources import as_file, files

__all__ = ["APP_ID", "icon_path", "path"]

#: Reverse-DNS application id: the .desktop file, the AppStream component and the icon share it.
APP_ID = "io.github.kvviz.KVViz"


def path(*parts: str) -> pathlib.Path:
    """Return the file (or folder) ``parts`` under the installed resources as a real path.

    Raises FileNotFoundError when it is not there, so a missing resource fails where it is asked
    for rather than later inside Qt, which takes a missing file silently.
    """
    ref = files(__name__).joinpath(*parts)
    # The package is always a plain folder on disk (sdist, wheel, editable, PyInstaller onedir),
    # so as_file() hands back the file itself; it would only extract for a zipped install.
    with as_file(ref) as p:
        result = pathlib.Path(p)
    if not result.exists():
        raise FileNotFoundError(f"kvviz resource not found: {'/'.join(parts)} (looked in {result})")
    return result


def icon_path(size: int | None = None) -> pathlib.Path:
    """The application icon: the SVG when ``size`` is None, else the ``size`` px PNG."""
    if size is None:
        return path("icons", "hicolor", "scalable", "apps", f"{APP_ID}.svg")
    return path("icons", "hicolor", f"{size}x{size}", "apps", f"{APP_ID}.png")
