"""From a command line to a composed config, with one-line errors: where the configs are, which group
options exist (rlcli's conf/, the search path, plugins), and what Hydra's composition errors mean."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlcli.registry import ConfigError, did_you_mean, sb3_hint

GROUPS = ("env", "algo", "actor", "buffer")


def conf_dir() -> str:
    """Absolute path of the configs: inside the wheel, else the source checkout's top-level conf/."""
    package = Path(__file__).resolve().parents[1]  # src/rlcli (or site-packages/rlcli), above run/
    for candidate in (package / "conf", package.parents[1] / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError("rlcli's conf/ directory is missing from this installation")


@contextmanager
def hydra_context(job_name: str = "train") -> Iterator[None]:
    """Hydra's global state for the Compose API: the one already set up, else rlcli's config dir."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        yield
        return
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3", job_name=job_name):
        yield


def group_options(group: str, search_path_args: list[str] | None = None) -> list[str]:
    """Options of a config group as Hydra finds them: rlcli's conf/, `hydra.searchpath` overrides and the
    search-path plugins of installed packages. Ids with a slash (ALE/Pong-v5) are nested groups."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    with hydra_context():
        # one repository for the whole walk: Hydra's ConfigLoader.get_group_options makes a new one at each call
        # (config.yaml's search path processed again: ~0.1 s of CPU each, most of a compose_config's time)
        _, repo = GlobalHydra.instance().config_loader()._parse_overrides_and_create_caching_repo(  # type: ignore[attr-defined]
            "config", list(search_path_args or []))

        def walk(name: str) -> list[str]:
            found = list(repo.get_group_options(name, ObjectType.CONFIG))
            for sub in repo.get_group_options(name, ObjectType.GROUP):
                found += [f"{sub}/{option}" for option in walk(f"{name}/{sub}")]
            return found

        return sorted(set(walk(group)))


def search_path_args(args: list[str]) -> list[str]:
    return [a for a in args if key_of(a) == "hydra.searchpath"]


# Groups whose choice is checked too: a value that is no option (`collector=../../x`) would load a yaml file from
# anywhere, and such a file can set Hydra's callbacks (code to run).
OTHER_GROUPS = ("collector", "hparams_search")


def check_group_choices(args: list[str]) -> None:
    """Every config group's choice is one of its options (rlcli's conf/, the search path, plugins), also in the
    `group@package` form: one line naming the value and the options otherwise."""
    search_path = search_path_args(args)
    known: dict[str, list[str]] = {}  # a sweep's jobs repeat their group choices: walk each group once
    for arg in args:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~").split("@", 1)[0]  # `+algo@_global_=x` chooses from algo's options too
        if sep and (key in GROUPS or key in OTHER_GROUPS or key == "tuned") and key not in known:
            known[key] = group_options(key, search_path)
        none = value.strip("'\"") in ("null", "")
        if sep and key in OTHER_GROUPS and not arg.startswith("~") and not none and value not in known[key]:
            raise ConfigError(f"unknown {key} '{value}'{did_you_mean(value, known[key])}; choose from: "
                              f"{', '.join(known[key])}" + (" (or null for none)" if key == "hparams_search" else ""))
        if sep and key == "tuned" and not arg.startswith("~"):
            check_tuned_choice(value, known[key])
        if sep and key in GROUPS:
            options = known[key]
            if value not in options:
                if key == "env" and _is_gymnasium_id(value):
                    raise ConfigError(f"env={value} has no shipped config; any gymnasium id runs with: "
                                      f"env=gym env.id={value}")
                raise ConfigError(
                    f"unknown {key} '{value}'{did_you_mean(value, options)}; choose from: {', '.join(options)}"
                    + ("; any other gymnasium id: env=gym env.id=<id>" if key == "env" else "")
                )


def check_tuned_choice(value: str, options: list[str]) -> None:
    """`tuned` is an optional group that algo and env choose (conf/tuned/<algo>/<env>.yaml): a value that names no
    file there would be skipped without a word, and true/false/null stop Hydra with a message about its types."""
    if value in options:
        return
    if value.lower() in ("true", "false", "null", "none", "yes", "no", "on", "off", "0", "1", ""):
        raise ConfigError(f"tuned={value}: the tuned settings follow algo and env by themselves "
                          f"(conf/tuned/<algo>/<env>.yaml, where one is shipped); to train without them: ~tuned")
    raise ConfigError(f"unknown tuned '{value}'{did_you_mean(value, options)}; choose from: {', '.join(options)} "
                      f"(or ~tuned for none)")


def default_choice(group: str) -> str:
    """A group's default option in rlcli's config.yaml (env: CartPole-v1, algo: ppo)."""
    defaults = OmegaConf.load(Path(conf_dir()) / "config.yaml").get("defaults", [])
    return next(str(d[group]) for d in defaults if isinstance(d, DictConfig) and group in d)


def check_env_id_has_its_config(args: list[str]) -> None:
    """`env.id=FrozenLake-v1` without `env=` would train FrozenLake with the default env's config (CartPole's
    settings, its tuned hyperparameters, its run directory): refused in one line naming the command that trains
    FrozenLake (env=gym env.id=..., or env=<id> where rlcli ships a config for it). A typed `env=` keeps the user's
    choice: a shipped config may be meant for another id (env=ALE/Pong-v5 env.id=ALE/Breakout-v5)."""
    ids = [value_of(a) for a in args if key_of(a) == "env.id" and not a.startswith("~")]
    if not ids or any(key_of(a).split("@", 1)[0] == "env" for a in args):
        return
    choice, env_id = default_choice("env"), ids[-1]
    if env_id == str(OmegaConf.load(Path(conf_dir()) / "env" / f"{choice}.yaml").get("id")):
        return
    algo = next((value_of(a) for a in reversed(args) if key_of(a) == "algo"), default_choice("algo"))
    shipped = env_id in group_options("env", search_path_args(args))
    fix = (f"env={env_id} (its shipped config) or env=gym env.id={env_id} (gymnasium's defaults)" if shipped
           else f"env=gym env.id={env_id}")
    raise ConfigError(f"env.id={env_id} without env= would train it with the default env={choice}'s config "
                      f"({choice}'s settings and tuned hyperparameters, filed under runs/{algo}/{choice}/); "
                      f"write {fix}")


def _is_gymnasium_id(value: str) -> bool:
    import gymnasium as gym

    return value in gym.registry


def _closest_key(cfg: DictConfig, key: str, leaf: str) -> str:
    """`total_steps` -> ` (did you mean 'train.total_steps'?)`: the same or a close name in any section."""
    paths: list[str] = []

    def walk(node: object, prefix: str) -> None:
        for name, value in node.items_ex(resolve=False) if isinstance(node, DictConfig) else []:
            path = f"{prefix}{name}"
            paths.append(path)
            if isinstance(value, DictConfig) and len(path.split(".")) < 3:
                walk(value, path + ".")

    walk(cfg, "")
    paths = [p for p in paths if p != key and not p.startswith("hydra")]
    leaves: dict[str, str] = {}
    for path in sorted(paths, key=lambda p: p.count(".")):
        leaves.setdefault(path.rsplit(".", 1)[-1], path)
    if leaf in leaves and leaves[leaf] != leaf:
        return f" (did you mean '{leaves[leaf]}'?)"
    close = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.8)
    return f" (did you mean '{leaves[close[0]]}'?)" if close and "." in leaves[close[0]] else ""


def unparsable(error: Exception, args: list[str]) -> str:
    """An override Hydra's grammar cannot read, named, with Hydra's reason and how to quote a value."""
    bad = next((a for a in args if not parses(a)), None)
    lines = [line for line in str(error).strip().splitlines()
             if line.strip() and not line.startswith("See https://hydra.cc") and set(line.strip()) != {"^"}]
    why = lines[-1] if lines else type(error).__name__
    why = why.removeprefix("LexerNoViableAltException: ")
    if bad is None or " while evaluating " in why:  # each parses alone: a sweep function's values, not the grammar
        return f"cannot parse {bad or ' '.join(args)!r}: {why}"
    if why == bad:  # the lexer's reason is the override itself
        why = "a character Hydra's override grammar reads as syntax"
    return (f"cannot parse {bad!r}: {why}; check its brackets and quotes (a string value holding quotes, brackets, "
            f"braces or commas is quoted for Hydra: {key_of(bad)}='...', a quote inside as \\')")


def explain_composition_error(error: Exception, args: list[str]) -> str:
    """Hydra's composition errors, cut down to one line that names the key and the valid ones."""
    from hydra.errors import OverrideParseException

    if isinstance(error, OverrideParseException):
        return unparsable(error, args)
    text, cause = str(error), str(error.__cause__ or "")
    present = re.search(r"An item is already at '([^']+)'", text)
    if present:  # `+key=value` for a key the config has: Hydra's `+` adds only new keys
        key = present.group(1)
        given = next((a for a in args if key_of(a) == key and a.startswith("+")), f"+{key}=<value>")
        return f"{given}: {key} is already in the config, so it takes no '+': {given.lstrip('+')}"
    ambiguous = re.match(r"Ambiguous value for argument '(([^=']+)=(.*))'", text)
    if ambiguous:  # `algo.lr=3e-4,1e-3` without -m: Hydra's three-line answer, as one
        arg, key, value = ambiguous.groups()
        return (f"{arg} gives several values: add -m for a sweep (rl-train -m {arg}, one run per value); for one "
                f"run with a list write {key}=[{value}], for a string quote it: {key}='{value}'")
    bad_key = re.search(r"Could not override '([^']+)'", text)
    if bad_key and bad_key.group(1).startswith("hydra.") and " not in " in cause:  # a launcher's or sweeper's key
        from hydra import compose

        key = bad_key.group(1)
        parent = key.rpartition(".")[0]
        base = compose("config", overrides=[a for a in args if "/" in a.split("=", 1)[0]], return_hydra_config=True)
        node = OmegaConf.select(base, parent)
        valid = sorted(str(k) for k in node if k != "_target_") if isinstance(node, DictConfig) else []
        return f"unknown key '{key}'{did_you_mean(key.rpartition('.')[2], valid)}; valid keys: {', '.join(valid)}"
    merging = re.match(r"Error merging override (\S+)", text)
    if merging and cause:  # a value of the wrong type: the cause says which
        return f"{merging.group(1)}: {cause.strip().splitlines()[0]}"
    if bad_key and "not in struct" in cause:
        key = bad_key.group(1)
        parent, _, leaf = key.rpartition(".")
        if parent.endswith("kwargs"):  # a free-form mapping (env.kwargs): new keys need Hydra's `+`
            value = next((a.split("=", 1)[1] for a in args if a.split("=", 1)[0] == key), "<value>")
            return (f"'{key}' is not in the config yet; {parent} is passed to the env as given, so add the key "
                    f"with +{key}={value}")
        from hydra import compose

        base = compose("config", overrides=[a for a in args if a.split("=", 1)[0] in GROUPS])
        node = OmegaConf.select(base, parent) if parent else base
        valid = sorted(node.keys()) if isinstance(node, DictConfig) else []
        across = _closest_key(base, key, leaf) if not parent else ""  # a top-level typo: every section's keys
        hint = sb3_hint(key) or across or _owners_hint(base, parent, leaf) \
            or did_you_mean(leaf, [str(v) for v in valid], prefix=parent)
        return f"unknown key '{key}'{hint}; valid keys: {', '.join(map(str, valid))}"
    return text.strip().splitlines()[0]


def _owners_hint(base: DictConfig, parent: str, leaf: str) -> str:
    """" (a setting of algo=qmix, not of algo=vdn)" for an algorithm's key that the chosen one lacks."""
    name = OmegaConf.select(base, "algo.name")
    if parent != "algo" or not isinstance(name, str):
        return ""
    from rlcli.registry import owners_phrase
    from rlcli.run.algo_defaults import algo_defaults  # read from the sources: no algorithm (nor torch) imported

    return owners_phrase("algo", name, sorted(n for n, settings in algo_defaults().items()
                                              if n != name and leaf in settings))


def compose_config(args: list[str]) -> DictConfig:
    """The job's config for these overrides, as Hydra's run will compose it; a ConfigError (one line) if not."""
    from hydra import compose

    check_group_choices(args)
    check_env_id_has_its_config(args)
    if any(key_of(a) in PLUGIN_PACKAGES for a in args):  # a launcher or sweeper named without -m: checked too
        check_plugins(args)
    with hydra_context():
        try:
            return compose("config", overrides=args)
        except Exception as error:  # Hydra raises several unrelated types for bad overrides
            raise ConfigError(explain_composition_error(error, args)) from None


# pip packages of Hydra plugins a user may name without having installed them
PLUGIN_PACKAGES = {
    "hydra/launcher": {"joblib": "hydra-joblib-launcher (or pip install -e '.[sweep]')",
                       "ray": "hydra-ray-launcher (or pip install -e '.[ray]')",
                       "submitit_local": "hydra-submitit-launcher", "submitit_slurm": "hydra-submitit-launcher",
                       "rq": "hydra-rq-launcher"},
    "hydra/sweeper": {"optuna": "hydra-optuna-sweeper (rlcli ships its own, with pruning: hydra/sweeper=rlcli_optuna)",
                      "nevergrad": "hydra-nevergrad-sweeper", "ax": "hydra-ax-sweeper"},
}


def check_plugins(args: list[str]) -> None:
    """Name the pip package of a launcher or sweeper that is not installed, before composing."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    Plugins.instance()  # imports the installed plugins, which register their configs
    for arg in args:
        key, _, value = arg.lstrip("+~").partition("=")
        if key in PLUGIN_PACKAGES:
            ours = [p.name for p in (Path(conf_dir()) / key).glob("*.yaml")]
            installed = sorted({n.removesuffix(".yaml") for n in [*ConfigStore.instance().list(key), *ours]})
            if value not in installed:
                package = PLUGIN_PACKAGES[key].get(value)
                if package is None:  # no plugin of that name that we know of: a typo, most likely
                    raise ConfigError(f"unknown {key} '{value}'{did_you_mean(value, installed)}; installed: "
                                      f"{', '.join(installed)}")
                raise ConfigError(f"{key}={value} is not installed: pip install {package}; installed: "
                                  f"{', '.join(installed)}")
    if any(key_of(a) in ("hydra/sweeper", "hparams_search") for a in args):
        import importlib.util

        if importlib.util.find_spec("optuna") is None:
            raise ConfigError("the rlcli_optuna sweeper needs optuna: pip install optuna "
                              "(or pip install -e '.[sweep]')")


def parses(arg: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        OverridesParser.create().parse_override(arg)
    except Exception:
        return False
    return True


def key_of(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+~")


def value_of(arg: str) -> str:
    return arg.split("=", 1)[1].strip().strip("'\"") if "=" in arg else ""


# Hydra's own flags; those in the first set take the next argument as their value.
HYDRA_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                          "--config-dir", "-cd", "--experimental-rerun", "--shell-completion", "-sc", "--info", "-i"}
HYDRA_FLAGS = {*HYDRA_FLAGS_WITH_VALUE, "--multirun", "-m", "--help", "-h", "--hydra-help", "--version",
               "--resolve", "--run", "-r"}


def as_key_value(arg: str, following: str | None) -> str:
    """What `--key value`, `--key=value` or `key value` (argparse habits) are written as here: `key=value`."""
    key, _, value = arg.lstrip("-").partition("=")
    if not value and following is not None and not following.startswith("-") and "=" not in following:
        value = following
    return f"{key}={value or '<value>'}"


def check_argument_style(args: list[str], tool: str, flags: set[str], flags_with_value: set[str],
                         group_of: Callable[[str], str | None] | None = None) -> None:
    """A flag the tool does not have, or a word without `=`, is one line that shows the `key=value` form
    (`group_of` names the config group a bare word is an option of: `ppo` -> `algo=ppo`)."""
    i = 0
    while i < len(args):
        arg, following = args[i], args[i + 1] if i + 1 < len(args) else None
        name = arg.split("=", 1)[0]
        if name in flags_with_value:
            i += 1 if "=" in arg else 2
            continue
        if arg.startswith("-") and name not in flags:
            raise ConfigError(f"unknown flag {arg!r}: {tool} takes key=value arguments, e.g. "
                              f"{as_key_value(arg, following)}")
        if not arg.startswith(("-", "~")) and "=" not in arg:
            bare_value_follows = following is not None and "=" not in following and not following.startswith("-")
            group = None if bare_value_follows or group_of is None else group_of(arg)
            hint = f"{group}={arg}" if group else as_key_value(arg, following)
            raise ConfigError(f"{arg!r} is not a key=value argument: write {hint}")
        i += 1


def group_with_option(word: str) -> str | None:
    """The config group that has `word` as an option (`ppo` -> `algo`), if one has."""
    for group in ("algo", "env", "actor", "buffer", "collector"):
        if word in group_options(group):
            return group
    return None


def with_config_dirs(args: list[str]) -> list[str] | None:
    """The overrides of a command line, with `--config-dir DIR` (`-cd DIR`) turned into a search-path entry
    the way Hydra adds it; None when another flag is present (those commands do not train)."""
    overrides, dirs, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg in ("--config-dir", "-cd") and i + 1 < len(args):
            dirs.append(args[i + 1])
            i += 2
            continue
        if arg.startswith("--config-dir="):
            dirs.append(arg.split("=", 1)[1])
        elif arg.startswith("-"):
            return None
        else:
            overrides.append(arg)
        i += 1
    if dirs:
        entries = [f"file://{Path(d).expanduser().resolve()}" for d in dirs]
        given = [value_of(a).strip("[]") for a in overrides if key_of(a) == "hydra.searchpath"]
        entries += [e.strip() for text in given for e in text.split(",") if e.strip()]
        overrides = [a for a in overrides if key_of(a) != "hydra.searchpath"]
        overrides.append(f"hydra.searchpath=[{','.join(entries)}]")
    return overrides


# Keys of dicts that configs leave empty or do not have: given as typed, they are made `++` for Hydra
ADDED_KEYS = ("algo.schedules.", "algo.policy_loss_addons.", "algo.groups.", "algo.groups=")


def schedule_args(args: list[str]) -> list[str]:
    """`algo.schedules.X=...` (and `algo.policy_loss_addons.X...`, `algo.groups.X...`) add keys to dicts that
    configs leave empty or do not have: make them `++`."""
    return [f"++{a}" if a.startswith(ADDED_KEYS) else a for a in args]
