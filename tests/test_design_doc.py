"""docs/design.md is the project's copy of the shared design contract: below
its header note it is the shared DESIGN.md word for word, and every
citation of the design in the code and docs points at it."""

from __future__ import annotations

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "design.md"
SHARED = REPO.parent / "shared" / "DESIGN.md"


def _body(text: str) -> str:
    """The contract without the header note (an HTML comment) before it."""
    return re.sub(r"\A<!--.*?-->\s*", "", text, count=1, flags=re.S)


def test_the_design_doc_has_the_sections_the_code_cites():
    text = DOC.read_text()
    assert text.startswith("<!--") and "kept in step" in text.split("-->")[0]
    for number in range(1, 11):
        assert re.search(rf"^## {number}\. ", text, re.M), f"section {number} missing"


@pytest.mark.skipif(not SHARED.exists(), reason="the shared DESIGN.md is not beside the checkout")
def test_the_design_doc_is_in_step_with_the_shared_contract():
    assert _body(DOC.read_text()) == SHARED.read_text(), (
        "docs/design.md differs from the shared DESIGN.md: make the change in both"
    )


def test_every_citation_of_the_design_names_the_doc_in_the_repository():
    stale = []
    for path in REPO.rglob("*"):
        if path.suffix not in {".py", ".md", ".java", ".yaml", ".toml"} or not path.is_file():
            continue
        if {".venv", ".git", "build", "dist"} & set(path.relative_to(REPO).parts) or "egg-info" in str(path):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if re.search(r"\bDESIGN(\.md| §| section)", line) and path != DOC and path.name != "test_design_doc.py":
                stale.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not stale, "citations of a DESIGN outside the repository:\n" + "\n".join(stale)
