"""Install torch's CPU build (or a CUDA build on request) into the Python that runs this script.

    python scripts/install_torch.py [--build cpu|cu126|cu128|...|pypi] [--version 2.13.0] [--index-url URL]

`make train` and `make test` run it once, when they create `.venv` (`make train TORCH=cu128` passes --build).

- cpu (the default): from PyTorch's CPU wheel index (https://download.pytorch.org/whl/cpu), about 200 MB for
  Linux x86_64 (the torch wheel 192 MB, its dependencies 10 MB; 0.86 GB installed). Where that index is not
  reachable (a machine without internet, with a local wheel folder or mirror in pip's settings), torch is installed
  by its plain name from pip's own settings, but only after a dry run shows that this gives a CPU build (no nvidia-*
  packages): on the public PyPI the plain name on Linux is the CUDA build, and this script refuses it in one line.
- cuXXX (cu126, cu128, ...): that CUDA build from https://download.pytorch.org/whl/cuXXX: torch plus its nvidia-*
  CUDA libraries, several GB.
- pypi: whatever pip's configured index gives for the plain name (on Linux from the public PyPI, the CUDA build).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

PYTORCH_INDEX = "https://download.pytorch.org/whl"
DEFAULT_VERSION = "2.13.0"
PROBE_TIMEOUT_S = 10.0


def index_url(build: str, base: str = PYTORCH_INDEX) -> str:
    return f"{base.rstrip('/')}/{build}"


def reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None where `url` answers (its page for torch), else why not, in a few words."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/torch/", timeout=timeout):
            return None
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return str(reason) or type(e).__name__


def cuda_packages(report: dict) -> list[str]:
    """The nvidia-* (CUDA library) packages a `pip install --dry-run --report` would install."""
    names = [item.get("metadata", {}).get("name", "") for item in report.get("install", [])]
    return sorted(n for n in names if n.lower().startswith("nvidia-"))


def torch_version_in(report: dict) -> str:
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        if meta.get("name", "").lower() == "torch":
            return str(meta.get("version", "?"))
    return "already installed"


def pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", *args]


def dry_run_report(requirement: str, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> dict:
    out = run(pip("install", "--quiet", "--dry-run", "--ignore-installed", "--report", "-", requirement),
              capture_output=True, text=True)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise SystemExit(f"install_torch: error: pip cannot resolve {requirement}: {tail}")
    return json.loads(out.stdout)


def plan(build: str, version: str, base: str, probe: Callable[[str], str | None],
         report_for: Callable[[str], dict]) -> tuple[list[str], str]:
    """(pip arguments, the line to print before running them). Raises SystemExit with one line where the asked-for
    build cannot be had."""
    requirement = f"torch=={version}"
    if build == "pypi":
        return (["install", "--quiet", requirement],
                f"install_torch: {requirement} by its plain name from pip's configured index (TORCH=pypi)")
    url = index_url(build, base)
    why = probe(url)
    if why is None:
        size = "about 200 MB" if build == "cpu" else "several GB with its nvidia-* CUDA libraries"
        return (["install", "--quiet", "--index-url", url, requirement],
                f"install_torch: {requirement}, the {build} build, from {url} ({size})")
    if build != "cpu":
        raise SystemExit(f"install_torch: error: {url} is not reachable ({why}), so there is no {build} build of "
                         f"torch to install; check the name (cu126, cu128, ... as PyTorch's install page lists them) "
                         f"and the network, or TORCH=pypi for whatever pip's own index gives")
    report = report_for(requirement)
    cuda = cuda_packages(report)
    if cuda:
        raise SystemExit(f"install_torch: error: PyTorch's CPU index {url} is not reachable ({why}), and "
                         f"{requirement} by its plain name from pip's configured index is a CUDA build "
                         f"(torch {torch_version_in(report)} with {len(cuda)} nvidia-* packages, several GB); "
                         f"make {url} reachable, or run make with TORCH=pypi to install that build anyway")
    return (["install", "--quiet", requirement],
            f"install_torch: PyTorch's CPU index {url} is not reachable ({why}); {requirement} from pip's configured "
            f"index is a CPU build too (torch {torch_version_in(report)}, no CUDA packages): installing that")


def installed_torch() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="install_torch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="cpu", help="cpu (default), a CUDA build such as cu128, or pypi")
    parser.add_argument("--version", default=DEFAULT_VERSION, help=f"torch's version (default {DEFAULT_VERSION})")
    parser.add_argument("--index-url", default=PYTORCH_INDEX,
                        help=f"where PyTorch's per-build indexes live (default {PYTORCH_INDEX}; a mirror of it)")
    args = parser.parse_args(argv)
    build = args.build.strip().lower()
    if build != "pypi" and build != "cpu" and not (build.startswith(("cu", "rocm")) and len(build) > 2):
        parser.exit(2, f"install_torch: error: --build={args.build!r} is not a build: cpu, pypi, or a CUDA build "
                       f"such as cu126 or cu128 (rocm6.4 and the like also work)\n")
    have = installed_torch()
    if have is not None and have.split("+")[0] == args.version:
        label = have.partition("+")[2]
        other = build not in ("pypi", label) and not (build == "cpu" and not label)
        print(f"install_torch: torch {have} is installed already" + (
            f", not the {build} build asked for: for that one, make clean-venv, then make with TORCH={build}"
            if other else ""), flush=True)
        return 0
    pip_args, line = plan(build, args.version, args.index_url, reachable, dry_run_report)
    print(line, flush=True)
    return subprocess.run(pip(*pip_args)).returncode


if __name__ == "__main__":
    sys.exit(main())
