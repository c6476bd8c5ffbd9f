"""Griffe extension: raylog's docstrings, written for Sphinx, read as Markdown.

The docstrings name other objects with reStructuredText roles
(``:class:`raylog.Consumer```, ``:func:`~raylog.read.plan_read```) and
introduce examples with ``::``. For the API reference (mkdocstrings renders
Markdown) a role becomes a code span of its target (``~`` keeps the last
name, as Sphinx shows it) and a ``::`` that ends a paragraph becomes ``:``,
the indented block after it staying a code block. The docstrings themselves
are not changed.
"""

from __future__ import annotations

import re

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(?P<tilde>~?)(?P<target>[^`]+)`")


def markdown(text: str) -> str:
    def role(match: re.Match) -> str:
        target = match.group("target")
        return f"`{target.rsplit('.', 1)[-1] if match.group('tilde') else target}`"

    text = _ROLE.sub(role, text)
    text = re.sub(r"(?m)^(\s*)::\s*$", "", text)       # a "::" line alone
    return re.sub(r"(?m)(\S)::\s*$", r"\1:", text)      # "...example::" ends a paragraph


class RstRoles(griffe.Extension):
    def on_object(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
