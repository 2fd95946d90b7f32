"""Sphinx configuration for the ember documentation (pydata-sphinx-theme + MyST).

Built offline with warnings as errors: ``sphinx-build -W -b html docs docs/_build/html``.
"""

import sys
from importlib import metadata
from pathlib import Path

# docs/_ext: the ember-distributions directive (the Install page's tables, generated from the pyproject files)
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "ember"
author = "The ember developers"
copyright = "the ember developers"

try:
    release = metadata.version("ember-core")
except metadata.PackageNotFoundError:  # building from a checkout without the packages installed
    release = "0.1.0"
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "ember_distributions",
    "ember_ops",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**/README.md"]

# MyST: fenced ```{directive} blocks, plus a few conveniences.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# autodoc / napoleon (docstrings in Google or NumPy style).
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# Members are listed per page (docs/api.md): the top-level ember namespace re-exports hundreds of names.
autodoc_default_options: dict[str, object] = {}
napoleon_google_docstring = True
napoleon_numpy_docstring = True

# HTML: pydata-sphinx-theme, nothing fetched from the network at build time.
html_theme = "pydata_sphinx_theme"
html_title = f"ember {release}"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "navbar_align": "left",
    "icon_links": [],
    "footer_start": ["copyright"],
    "footer_end": ["theme-version"],
}
html_show_sourcelink = False
