"""MkDocs hook: the reference pages' tables are made from the code at build time, so they cannot drift.

A page asks for a table with a marker line: `<!-- rlcli:algorithms -->` (every algorithm's config keys
with type, default and meaning from its constructor: the comment beside each parameter, or the yaml's beside a
value it states) or `<!-- rlcli:usage rl-eval -->` (a command's usage text, from the command itself).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- rlcli:(\w+)(?: ([\w-]+))? -->$", re.M)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return MARKER.sub(lambda m: _generate(m.group(1), m.group(2)), markdown)


def _generate(kind: str, argument: str | None) -> str:
    if kind == "algorithms":
        return algorithm_reference()
    if kind == "usage" and argument in ("rl-train", "rl-eval", "rl-report"):
        return "```text\n" + usage(argument).strip() + "\n```\n"
    raise ValueError(f"unknown reference marker rlcli:{kind} {argument}")


def usage(command: str) -> str:
    """What `<command> --help` prints, run from this interpreter's environment."""
    module = {"rl-train": "rlcli.entry.cli:train", "rl-eval": "rlcli.entry.cli:evaluate",
              "rl-report": "rlcli.entry.cli:report"}[command]
    target, function = module.split(":")
    code = f"import sys; sys.argv = [{command!r}, '--help']; from {target} import {function}; {function}()"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{command} --help failed: {out.stderr.strip()[-500:]}")
    return out.stdout


def yaml_comments(path: Path) -> dict[str, str]:
    """`key: value  # meaning` -> {key: meaning}, for the keys an algo's yaml states (a value that differs from the
    constructor's, with the reason)."""
    comments: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^\s*(\w+):[^#]*#\s*(.+)$", line)
        if match:
            comments.setdefault(match.group(1), match.group(2).strip())
    return comments


def algorithm_reference() -> str:
    from rlcli.registry import ALGOS, _accepted_parameters
    from rlcli.run.algo_defaults import setting_comments
    from rlcli.run.build import ALGO_CONTEXT
    from rlcli.run.compose import compose_config

    sections = []
    for name in ALGOS.names():
        spec = ALGOS.spec(name)
        cfg = compose_config([f"algo={name}", "env=gym"])  # no tuned file applies to env=gym
        params, hints = _accepted_parameters(ALGOS.get(name), ALGO_CONTEXT)
        comments = {**setting_comments(name), **yaml_comments(ROOT / "conf" / "algo" / f"{name}.yaml")}
        factory = ALGOS.get(name)
        summary = (factory.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        kind = "on-policy" if spec.on_policy else "off-policy"
        rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for key, parameter in params.items():
            type_name = _type_name(hints.get(key, parameter.annotation))
            default = parameter.default if parameter.default is not parameter.empty else "(required)"
            rows.append(f"| `{key}` | {type_name} | `{_value(default)}` | {comments.get(key, '').replace('|', '/')} |")
        sections.append(f"## `algo={name}`\n\n{summary}\n\n{kind}; storage `buffer={cfg.buffer.name}`; network "
                        f"`actor={cfg.actor.name}` unless you choose another.\n\n" + "\n".join(rows) + "\n")
    return "\n".join(sections)


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).replace("|", "/")


def _type_name(hint: Any) -> str:
    text = hint if isinstance(hint, str) else getattr(hint, "__name__", None) or str(hint)
    text = str(text).replace("typing.", "").replace("NoneType", "None")
    return text.replace("|", "or")
