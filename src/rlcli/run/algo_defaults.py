"""Each algorithm's settings and their defaults, as its constructor states them, for Hydra to compose.

An algorithm's constructor keywords are the one place its defaults are written: `register()` puts one config node
of them per algorithm in Hydra's ConfigStore (`algo_defaults_<name>`, a root config rather than a group, so no
`algo_defaults=` choice shows in `--help` or in error messages), and each conf/algo/<name>.yaml pulls its node into
its own package first (`defaults: [/algo_defaults_<name>@_here_, _self_]`, or `@algo` in a `_global_` file), then
states only its name, the trainer's keys and what differs. `rl-train algo=<name> --cfg job` shows every setting.

The defaults are read from the constructors' source (Python's `ast`), not by importing the algorithms: composing a
config, and answering a typo in it, does not wait for torch to import. What is read follows what
`registry._accepted_parameters` sees at build time (a subclass's `__init__`, then its base's while the subclass
passes `**kwargs` on); tests/test_registry.py checks the two agree for every algorithm. A plugin algorithm
(entry-point group `rlcli.algos`) whose source cannot be read that way is imported to read its signature.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import re
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

# The objects the build passes to an algorithm besides its settings (run/build.py's ALGO_CONTEXT).
CONTEXT = ("networks", "recipe", "num_envs", "action_space", "policy_addons")
PREFIX = "algo_defaults_"


def node_name(algo: str) -> str:
    """The ConfigStore name of an algorithm's defaults: `algo_defaults_ppo`."""
    return PREFIX + algo


@dataclass
class _Class:
    name: str
    bases: list[str]
    init: ast.FunctionDef | None
    imports: dict[str, str] = field(default_factory=dict)  # local alias -> imported name


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _registered_name(decorator: ast.expr) -> str | None:
    """`@ALGOS.register("ppo", spec=...)` -> "ppo"."""
    if isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute) \
            and decorator.func.attr == "register" and decorator.args:
        owner = decorator.func.value
        owner_name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
        if owner_name == "ALGOS" and isinstance(decorator.args[0], ast.Constant):
            return str(decorator.args[0].value)
    return None


def _base_name(base: ast.expr) -> str:
    return base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else "?"


def _read_module(tree: ast.Module) -> tuple[dict[str, _Class | ast.FunctionDef], dict[str, str]]:
    """A module's top-level classes and functions by name, and which of them it registers under which name."""
    imports = {a.asname or a.name: a.name for node in tree.body if isinstance(node, ast.ImportFrom) for a in node.names}
    found: dict[str, _Class | ast.FunctionDef] = {}
    registered: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            found[node.name] = _Class(node.name, [_base_name(b) for b in node.bases], init, imports)
        elif isinstance(node, ast.FunctionDef):
            found[node.name] = node
        else:
            continue
        for decorator in node.decorator_list:
            name = _registered_name(decorator)
            if name is not None:
                registered[name] = node.name
    return found, registered


def _linearize(name: str, classes: dict[str, _Class], module: dict[str, _Class | ast.FunctionDef]) -> list[_Class]:
    """The class and its bases in method resolution order (C3), as far as their source is known."""

    def lookup(base: str, imports: dict[str, str]) -> _Class | None:
        local = module.get(base)
        if isinstance(local, _Class):
            return local
        found = classes.get(imports.get(base, base))
        if found is None and base not in ("object", "Generic", "Protocol"):
            raise LookupError(f"base class {base} is not in a module read")
        return found

    def mro(cls: _Class) -> list[_Class]:
        bases = [b for b in (lookup(n, cls.imports) for n in cls.bases) if b is not None]
        sequences = [mro(b) for b in bases] + [bases]
        result = [cls]
        while any(sequences):
            for seq in sequences:
                if not seq:
                    continue
                head = seq[0]
                if not any(head in s[1:] for s in sequences):
                    break
            else:
                raise LookupError(f"no consistent method resolution order for {cls.name}")
            result.append(head)
            sequences = [s[1:] if s and s[0] is head else s for s in sequences]
        return result

    start = module[name]
    assert isinstance(start, _Class)
    return mro(start)


def _defaults_of(function: ast.FunctionDef, settings: dict[str, Any]) -> bool:
    """Add a signature's keywords with defaults (not the build's context objects); True if it takes **kwargs."""
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
    required = [a.arg for a in positional[:len(positional) - len(args.defaults)]]
    required += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    for name in required:
        if name not in ("self", *CONTEXT) and name not in settings:
            raise LookupError(f"{function.name} takes {name} without a default")
    for arg, default in pairs:
        if arg.arg in CONTEXT or arg.arg in settings:
            continue
        value = ast.literal_eval(default)  # ValueError for anything but a literal
        settings[arg.arg] = list(value) if isinstance(value, tuple) else value
    return args.kwarg is not None


def _settings(target: _Class | ast.FunctionDef, classes: dict[str, _Class],
              module: dict[str, _Class | ast.FunctionDef]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    if isinstance(target, ast.FunctionDef):
        _defaults_of(target, settings)
        return settings
    for cls in _linearize(target.name, classes, module):
        if cls.init is not None and not _defaults_of(cls.init, settings):
            break
    return settings


def _builtin_paths() -> list[Path]:
    return sorted((Path(__file__).resolve().parents[1] / "algos").glob("*.py"))


def _builtin_modules() -> Iterable[tuple[str, ast.Module]]:
    for path in _builtin_paths():
        yield f"rlcli.algos.{path.stem}", _tree(path)


def _line_comment(lines: list[str], lineno: int) -> str:
    """The comment after a parameter (`n_steps: int = 2048,  # meaning`), with the comment-only lines under it."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(lines[lineno - 1] + "\n").readline))
    except (tokenize.TokenError, SyntaxError):
        return ""
    found = next((t for t in tokens if t.type == tokenize.COMMENT), None)
    if found is None:
        return ""
    text = re.sub(r"^#\s*type:\s*ignore\S*\s*", "#", found.string)
    indent = len(lines[lineno - 1]) - len(lines[lineno - 1].lstrip())
    parts = [text.lstrip("#").strip()]
    for line in lines[lineno:]:  # the comment goes on, under itself
        if not line.strip().startswith("#") or len(line) - len(line.lstrip()) <= indent:
            break
        parts.append(line.strip().lstrip("#").strip())
    return " ".join(p for p in parts if p)


def setting_comments(algo: str) -> dict[str, str]:
    """A built-in algorithm's settings' meanings: the comment beside each constructor parameter (the nearest class
    in its method resolution order that has one), for the docs' key reference."""
    trees = {path: _tree(path) for path in _builtin_paths()}
    modules = {path: _read_module(tree) for path, tree in trees.items()}
    classes = {n: c for found, _ in modules.values() for n, c in found.items() if isinstance(c, _Class)}
    where = {c.init: path for path, (found, _) in modules.items() for c in found.values()
             if isinstance(c, _Class) and c.init is not None}
    for found, registered in modules.values():
        if algo in registered and isinstance(found[registered[algo]], _Class):
            comments: dict[str, str] = {}
            for cls in _linearize(registered[algo], classes, found):
                if cls.init is None:
                    continue
                lines = where[cls.init].read_text(encoding="utf-8").splitlines()
                for arg in [*cls.init.args.args, *cls.init.args.kwonlyargs]:
                    text = "" if arg.arg in comments else _line_comment(lines, arg.lineno)
                    if text:
                        comments[arg.arg] = text
            return comments
    return {}


@cache
def algo_defaults() -> dict[str, dict[str, Any]]:
    """Every registered algorithm's settings with their constructor defaults (tuples as lists), by name."""
    modules: dict[str, tuple[dict[str, _Class | ast.FunctionDef], dict[str, str]]] = {
        name: _read_module(tree) for name, tree in _builtin_modules()
    }
    classes = {n: c for found, _ in modules.values() for n, c in found.items() if isinstance(c, _Class)}
    result: dict[str, dict[str, Any]] = {}
    for found, registered in modules.values():
        for algo, target in registered.items():
            result[algo] = _settings(found[target], classes, found)
    for ep in entry_points(group="rlcli.algos"):
        with contextlib.suppress(Exception):  # a plugin that cannot be read or imported: its yaml states its settings
            result.update(_plugin_defaults(ep, classes, result))
    return result


def _plugin_defaults(ep: Any, classes: dict[str, _Class], known: dict[str, Any]) -> dict[str, dict[str, Any]]:
    module_name, _, attr = ep.value.partition(":")
    try:
        spec = importlib.util.find_spec(module_name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            raise LookupError(f"no source for {module_name}")
        found, registered = _read_module(_tree(Path(spec.origin)))
        names = {**registered, **({ep.name: attr.split(".")[0]} if attr and ep.name not in known else {})}
        return {algo: _settings(found[target], classes, found) for algo, target in names.items() if algo not in known}
    except (LookupError, ValueError, KeyError, SyntaxError, OSError):
        return _imported_defaults(ep.name)


def _imported_defaults(name: str) -> dict[str, dict[str, Any]]:
    """A plugin whose source says too little: import it and read its signature (as the build will)."""
    from rlcli.registry import ALGOS, _accepted_parameters

    params, _ = _accepted_parameters(ALGOS.get(name), CONTEXT)
    settings = {k: list(p.default) if isinstance(p.default, tuple) else p.default for k, p in params.items()
                if p.default is not p.empty}
    return {name: settings}


def register() -> None:
    """Store every algorithm's defaults in Hydra's ConfigStore (once a process; Hydra's launchers carry the store
    to their workers). Called by the search-path plugin hydra_plugins/rlcli_algo_defaults whenever Hydra sets up
    rlcli's config directory, so that every way of composing (rl-train, -m, launchers, rlcli.train, rl-eval, the
    Compose API) finds them."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for algo, settings in algo_defaults().items():
        if f"{node_name(algo)}.yaml" not in store.repo:  # `name` first: where `--cfg job` shows it
            store.store(name=node_name(algo), node={"name": algo, **settings}, provider="rlcli")
