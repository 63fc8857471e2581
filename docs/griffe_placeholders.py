"""Griffe extension for the API reference (mkdocs.yml): a docstring's `<placeholder>` outside code spans, as in
runs/<algo>/<env>/<time stamp>, is shown as written; the Markdown renderer would take it for an HTML tag and drop it
(the page said "runs/// under the current directory")."""

from __future__ import annotations

import re
from typing import Any

import griffe

_CODE = re.compile(r"(`+).+?\1", re.S)  # code spans and fenced blocks stay as they are
_PLACEHOLDER = re.compile(r"<([A-Za-z][A-Za-z0-9_ .-]*)>")


def escape_placeholders(text: str) -> str:
    out, last = [], 0
    for code in _CODE.finditer(text):
        out += [_PLACEHOLDER.sub(r"&lt;\1&gt;", text[last:code.start()]), code.group(0)]
        last = code.end()
    out.append(_PLACEHOLDER.sub(r"&lt;\1&gt;", text[last:]))
    return "".join(out)


class Placeholders(griffe.Extension):
    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = escape_placeholders(obj.docstring.value)
