"""The documentation: the site builds with every link and reference resolved, and every rl-train command
it shows composes (as `rl-train ... --cfg job` would)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rlcli.registry import ConfigError
from rlcli.run.compose import compose_config, schedule_args

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FLAGS_WITHOUT_VALUE = ("-m", "--multirun", "--cfg", "--info", "--help", "-h", "--resolve")


def shown_commands():
    """(page, command) of every `rl-train ...` command in a code block of the README and the docs pages (lines
    ending in a backslash continue)."""
    found = []
    for page in PAGES:
        in_fence, pending = False, ""
        for line in page.read_text().splitlines():
            if line.strip().startswith("```"):
                in_fence = not in_fence
                continue
            if not (in_fence or line.startswith("    ")):
                pending = ""
                continue
            text = pending + " " + line.strip() if pending else line.strip()
            if text.endswith("\\"):
                pending = text[:-1].strip()
                continue
            pending = ""
            command = text.split("  #")[0].split(" # ")[0].strip()
            if command.startswith("rl-train ") or command == "rl-train":
                found.append((page.relative_to(REPO), command))
    return found


def composable(command):
    """The overrides of a shown command, or None when it needs something only a real run has (a run directory
    `<run>`, a resume target, an env id from a plugin package)."""
    args = shlex.split(command)[1:]
    if any("<" in a or a == "..." or a.startswith(("resume=", "--config-dir", "-cd")) for a in args):
        return None
    if any("my_pkg" in a or "my_plugin" in a or "hydra.searchpath" in a for a in args):
        return None
    args = [a for a in args if a not in FLAGS_WITHOUT_VALUE and not a.startswith("--cfg")]
    args = [a for a in args if a not in ("job", "hydra", "all", "defaults", "config")
            and not a.startswith(("hydra.", "hydra/"))]  # Hydra's own settings: composed by Hydra, not by rlcli
    # a sweep: each comma list composes with its first value (Hydra's sweep syntax is checked by the sweep tests)
    return [re.sub(r"=([^=\[\]]+?),[^\[\]]*$", r"=\1", a) if "," in a and "[" not in a else a for a in args]


def test_the_docs_show_many_commands():
    assert len(shown_commands()) >= 60


@pytest.mark.parametrize("page,command", shown_commands(), ids=lambda v: str(v)[:60])
def test_every_command_in_the_docs_composes(page, command):
    args = composable(command)
    if args is None:
        return  # needs a run directory or a plugin package: those paths are exercised by the CLI tests
    try:
        compose_config(schedule_args(args))
    except ConfigError as error:
        pytest.fail(f"{page}: `{command}` does not compose: {error}")


def test_the_site_builds_strictly(tmp_path):
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mkdocs"), "build", "--strict", "-q",
                          "-d", str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    reference = (tmp_path / "site" / "reference" / "algorithms" / "index.html").read_text()
    from rlcli.registry import ALGOS

    for name in ALGOS.names():  # every registered algorithm has its generated table
        assert f"algo={name}" in reference
    assert "rlcli.train" in (tmp_path / "site" / "reference" / "python" / "index.html").read_text()
