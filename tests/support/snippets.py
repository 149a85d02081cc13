"""The code snippets of README.md and docs/, read from their fences: each
with its document, line, language and, when it is marked not to run, why."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```",
                   re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r"<!-- not run: (?P<why>[^>]*\S)\s*-->")
RUNNERS = {"python": "py", "sh": "sh", "bash": "sh", "js": "mjs", "toml": "toml"}


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    lang: str
    code: str
    not_run: str | None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def snippets() -> list[Snippet]:
    """Every snippet in a language ``RUNNERS`` knows, in document order."""
    found = []
    for path in DOCUMENTS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            lang = m["lang"].lower()
            if lang not in RUNNERS:
                continue
            line = text.count("\n", 0, m.start()) + 1
            before = "\n".join(text[:m.start()].splitlines()[-2:])
            marked = NOT_RUN.search(before)
            body = "\n".join(ln[len(m["indent"]):] for ln in m["body"].splitlines())
            found.append(Snippet(path, line, lang, body + "\n", marked["why"] if marked else None))
    return found


SNIPPETS = snippets()
