"""Texts a model reads: the documents shipped with kvviz and the user's own files, as documents or as prompts.

Stdlib only (no torch, no Qt), so that the command line and the window can list and check documents
before loading a model. Tokenizing is the engine's business (`kvviz.engine.evaluate`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from kvviz import resources

EXTENSIONS = (".txt", ".md")
# One limit for every text a user gives (a prompt, a document): about a million tokens, more than the context of any
# model that runs here, and still a prompt the window's editor and settings hold without a pause (16 MiB took a
# second to show and a quarter of a second to read back at each key)
MAX_FILE_BYTES = 4 * 2**20


class DocumentError(ValueError):
    """A document that cannot be read or used; the message names it and says what is accepted."""


@dataclass(frozen=True)
class Document:
    name: str  # what the user sees: the built-in name or the file name
    source: str  # "builtin:NAME" or the file's path
    text: str
    title: str | None = None  # built-in texts only
    author: str | None = None

    def describe(self) -> dict:
        """What an evaluation file records about its document (the text itself is not kept)."""
        return {"name": self.name, "source": self.source, "title": self.title, "author": self.author}


def _catalogue() -> dict[str, dict]:
    with resources.path("texts", "texts.json").open(encoding="utf-8") as f:
        return json.load(f)


def builtin_names() -> list[str]:
    """The names `--builtin` accepts, in the catalogue's order."""
    return list(_catalogue())


def builtin(name: str) -> Document:
    entries = _catalogue()
    if name not in entries:
        raise DocumentError(f"no built-in document named {name!r}; accepted: {', '.join(entries)}")
    entry = entries[name]
    text = resources.path("texts", entry["file"]).read_text(encoding="utf-8")
    return Document(name, f"builtin:{name}", text, entry.get("title"), entry.get("author"))


def read_text(path: str | os.PathLike) -> str:
    """The text of a user's .txt or .md file, whatever it is for (the window's prompt file, a document to evaluate or
    choose on): it must exist, be UTF-8 text of at most MAX_FILE_BYTES (a leading byte-order mark is dropped), and
    hold no NUL character and more than white space. Raises DocumentError naming the file and what is accepted."""
    path = Path(path)
    if path.suffix.lower() not in EXTENSIONS:
        raise DocumentError(f"{path} is not a .txt or .md file: kvviz reads texts from UTF-8 .txt and .md files")
    if path.is_dir():
        raise DocumentError(f"{path} is a folder; give a .txt or .md file")
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise DocumentError(
                f"{path} is {size / 2**20:.1f} MiB; kvviz reads texts of at most {MAX_FILE_BYTES // 2**20} MiB "
                "(about a million tokens, more than a model's context holds)"
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(
            f"{path} is not UTF-8 text (undecodable byte at offset {exc.start}); save it as UTF-8"
        ) from None
    text = text.removeprefix("\ufeff")  # a byte-order mark is not part of the text
    if "\x00" in text:
        raise DocumentError(f"{path} holds NUL characters: it is not a text file")
    if not text.strip():
        raise DocumentError(f"{path} is empty; give a text with something in it")
    return text


def from_file(path: str | os.PathLike) -> Document:
    """A user's .txt or .md file as a document (`read_text`)."""
    return Document(Path(path).name, str(path), read_text(path))


def from_conversation(path: str | os.PathLike) -> Document:
    """A kept conversation (`kvviz chat --trace`, a kvviz-conversation file) as one text: its system prompt and
    messages in order, each as "role: content" on its own paragraph (the words said, not a chat template)."""
    from kvviz.files.conversation import FILE_FORMAT
    from kvviz.files.jsonfile import KeptFileError

    try:
        conversation = FILE_FORMAT.read(path)
    except KeptFileError as exc:
        raise DocumentError(str(exc)) from None
    said = [f"{m.role}: {m.content}" for m in conversation.messages]
    if not said:
        raise DocumentError(f"{path} is a conversation with no messages; give one with at least one turn")
    return Document(Path(path).name, str(path), "\n\n".join(said))
