"""The README's front page and the pages of docs/: every link and image resolves, every page is reachable from the
front page, and the front page stays short enough to read in two minutes."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRONT_PAGE_LINES = 120
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target) and ![alt](target)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def targets(page: Path) -> list[str]:
    """The link and image targets of a Markdown page, outside code blocks."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return LINK.findall(text)


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_and_image_resolves():
    broken = []
    for page in pages():
        for target in targets(page):
            if re.match(r"[a-z]+:", target):  # a web address: not checked here (no network)
                continue
            path, _, fragment = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif fragment and resolved.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", resolved.read_text(encoding="utf-8"), flags=re.M)
                if fragment not in {anchor(h) for h in headings}:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_every_page_is_reached_from_the_front_page():
    reached, waiting = set(), [ROOT / "README.md"]
    while waiting:
        page = waiting.pop()
        if page in reached:
            continue
        reached.add(page)
        for target in targets(page):
            path = target.partition("#")[0]
            if path.endswith(".md") and not re.match(r"[a-z]+:", path):
                waiting.append((page.parent / path).resolve())
    unreached = [str(p.relative_to(ROOT)) for p in pages() if p.resolve() not in reached]
    assert not unreached, unreached


def test_the_front_page_is_short_and_names_every_mode_and_command():
    import kvviz.cli.main as cli
    from kvviz.qt.modes import MODES

    front = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(front.splitlines()) < FRONT_PAGE_LINES
    for mode in MODES:
        assert f"[{mode.title}](docs/modes/" in front, mode.title
    for command in cli.COMMANDS:
        assert f"[`kvviz {command}`](docs/commands/{command}.md)" in front, command
