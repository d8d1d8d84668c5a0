"""mkdocs hooks for cortex's documentation site (mkdocs.yml ``hooks:``).

Two rewrites, so the same Markdown reads well on GitHub and on the site:

- A link from a page to a repository file outside ``docs/`` (an example, a
  benchmark's result file, SECURITY.md) is a working link on GitHub and in a
  checkout, but the site has no copy of the file: there it becomes the
  file's path, in code. A link to a file that does not exist is left alone,
  so mkdocs's strict build still fails on it.
- Docstrings cross-reference with Sphinx roles (``:class:`Store```); the
  site shows the name alone.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# [label](../path) or ![alt](../path), with an optional #anchor.
_LINK = re.compile(r"(!?)\[([^\]\n]*)\]\((\.\./[^)\s#]+)(#[^)\s]*)?\)")
_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):(<code>)")


def on_page_markdown(markdown: str, page: Any, config: Any, **_: Any) -> str:
    """Turn links that leave ``docs/`` into the path of the file they name."""
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    here = (docs / page.file.src_uri).parent

    def path_of(found: re.Match[str]) -> str:
        target = (here / found.group(3)).resolve()
        if target.is_relative_to(docs) or not target.is_relative_to(root):
            return found.group(0)
        if not target.exists():
            return found.group(0)  # mkdocs reports it: a broken link fails the build
        path = target.relative_to(root).as_posix()
        label = found.group(2).strip().strip("`")
        if not label or label in (path, Path(path).name):
            return f"`{path}`"
        return f"{found.group(2)} (`{path}`)"

    return _LINK.sub(path_of, markdown)


def on_page_content(html: str, **_: Any) -> str:
    """Drop the Sphinx role before a cross-reference in a rendered docstring."""
    return _ROLE.sub(r"\1", html)
