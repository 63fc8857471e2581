"""`rl-dataset`: make, combine and inspect datasets for offline runs.

    rl-dataset make (--from-run RUN | --random --env ID) --steps N --out OUT [--noise gaussian:S | epsilon:P]
                    [--deterministic] [--load best|last|STEPS] [--seed S] [--root DIR] [--overwrite]
                    [--ref-min-score X] [--ref-max-score Y]
    rl-dataset make --from-buffer RUN --out OUT [--root DIR] [--overwrite] [--ref-min-score X] [--ref-max-score Y]
    rl-dataset concat A B [C ...] --out OUT [--root DIR] [--overwrite] [--download]
    rl-dataset info SOURCE [--download]

OUT is a Minari dataset id (name-v<N>, e.g. pendulum/medium-v0), written under the local Minari root (--root,
else MINARI_DATASETS_PATH, else ~/.minari/datasets) and readable by minari.load_dataset, or a path ending in .npz.
A SOURCE (or A, B) is such an id, a Minari dataset directory, a .npz file or a D4RL-style .hdf5 file; an id that
is not local is one line, unless --download lets Minari fetch it (a machine with network).

Reference scores (D4RL's normalized score is 100 * (R - ref_min) / (ref_max - ref_min)) come from
--ref-min-score / --ref-max-score, else they are measured and recorded: ref_min as a uniform random policy's mean
return over 10 episodes in the env, ref_max as the source run's deterministic mean return over 10 episodes
(--from-run, --from-buffer; a --random dataset has none); concat takes the parts' lowest ref_min and highest
ref_max. The output says which was used.

Bad input is one line and exit code 2, with nothing written; Minari datasets need pip install -e '.[offline]'.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NoReturn

USAGE = __doc__.split("\n\n")[1]


def _fail(message: str, code: int = 2) -> NoReturn:
    print(f"rl-dataset: error: {message}", file=sys.stderr)
    raise SystemExit(code)


class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes are one line (its default prints the usage block first)."""

    def error(self, message: str) -> NoReturn:
        _fail(f"{message}; see rl-dataset --help")


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="rl-dataset", description=__doc__.split("\n\n")[0] + "\n\n" + USAGE,
                  formatter_class=argparse.RawDescriptionHelpFormatter, epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    commands = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    make = commands.add_parser("make", help="roll out a run's policy or a random one, or take a run's replay buffer")
    source = make.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-run", metavar="RUN", help="a run directory or checkpoint file: roll out its policy")
    source.add_argument("--random", action="store_true", help="a uniform random policy in --env")
    source.add_argument("--from-buffer", metavar="RUN", help="the replay buffer of a run's last checkpoint")
    make.add_argument("--env", help="the gymnasium id for --random")
    make.add_argument("--steps", type=int, help="transitions to record (--from-run, --random)")
    make.add_argument("--noise", help="gaussian:<std> (half-range units) or epsilon:<p> on the run's actions")
    make.add_argument("--deterministic", action="store_true", help="the policy's deterministic action (else sampled)")
    make.add_argument("--load", default="best", help="which checkpoint of --from-run: best (default), last, or steps")
    make.add_argument("--seed", type=int, default=0, help="the first episode's reset seed, the actions' seed")
    for command in (make, commands.add_parser("concat", help="datasets one after another (medium-expert)")):
        if command is not make:
            command.add_argument("sources", nargs="+", metavar="SOURCE")
        command.add_argument("--out", required=True, help="a Minari id (name-v<N>) or a .npz path")
        command.add_argument("--root", help="the Minari root to write under (default: MINARI_DATASETS_PATH)")
        command.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
        command.add_argument("--ref-min-score", type=float, help="the normalized score's 0 (else measured)")
        command.add_argument("--ref-max-score", type=float, help="the normalized score's 100 (else measured)")
    info = commands.add_parser("info", help="size, episodes, returns, env and reference scores of a dataset")
    info.add_argument("source", metavar="SOURCE")
    for command in commands.choices.values():
        if command is not make:
            command.add_argument("--download", action="store_true",
                                 help="let Minari fetch a remote id that is not local (needs a network)")
    return top


# ------------------------------------------------------------------------------------------------ output
def _check_out(out: str, root: str | None, overwrite: bool) -> None:
    """Refuse a bad or existing output before any rollout is spent on it."""
    from rlcli.offline import _minari
    from rlcli.registry import ConfigError

    if out.endswith(".npz"):
        if Path(out).expanduser().exists() and not overwrite:
            raise ConfigError(f"{out!r} exists already; choose another name or pass --overwrite")
        return
    if not _minari.ID_PATTERN.fullmatch(out):
        raise ConfigError(f"--out {out!r} is neither a .npz path nor a Minari dataset id (name-v<N>, e.g. "
                          "pendulum/medium-v0)")
    _minari.require_minari()
    where = _minari.root(root)
    if (where / out).exists() and not overwrite:
        raise ConfigError(f"Minari dataset {out!r} exists already in {where}; choose another id (or version) or pass "
                          "--overwrite")


def _write(dataset: Any, out: str, root: str | None, overwrite: bool) -> str:
    from rlcli.offline.save import save_minari, save_npz

    if out.endswith(".npz"):
        return str(save_npz(dataset, out, overwrite=overwrite))
    return f"{out} (Minari, {save_minari(dataset, out, root=root, overwrite=overwrite)})"


def _progress(total: int, description: str) -> Any:
    """A rich progress bar on a terminal; nothing when stdout is piped or redirected."""
    if not sys.stdout.isatty():
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    transient=True)


def _run_with_progress(total: int, description: str, work: Any) -> Any:
    bar = _progress(total, description)
    if bar is None:
        return work(None)
    with bar:
        task = bar.add_task(description, total=total)
        return work(lambda n: bar.advance(task, n))


def _scores(args: argparse.Namespace, dataset: Any, policy: Any) -> list[str]:
    """Set the reference scores from the flags or measure them; say which was used."""
    from rlcli.entry.dataset_making import REFERENCE_EPISODES, random_score, run_score

    said = []
    if args.ref_min_score is not None:
        dataset.ref_min_score, how = args.ref_min_score, "given"
    elif dataset.env_id is not None:
        dataset.ref_min_score = random_score(dataset.env_id, seed=args.seed)
        how = f"a random policy's mean return over {REFERENCE_EPISODES} episodes"
    else:
        how = "none"
    said.append(f"ref_min_score {_number(dataset.ref_min_score)} ({how})")
    if args.ref_max_score is not None:
        dataset.ref_max_score, how = args.ref_max_score, "given"
    elif policy is not None:
        dataset.ref_max_score = run_score(policy, seed=args.seed)
        how = f"the run's deterministic mean return over {REFERENCE_EPISODES} episodes, {policy.checkpoint.name}"
    else:
        how = "none: a random policy's dataset has no expert; give --ref-max-score"
    said.append(f"ref_max_score {_number(dataset.ref_max_score)} ({how})")
    dataset.metadata["reference_scores"] = "; ".join(said)
    if None not in (dataset.ref_min_score, dataset.ref_max_score) and dataset.ref_max_score <= dataset.ref_min_score:
        said.append("note: ref_max_score <= ref_min_score (the run does no better than random here), so normalized "
                    "scores mean little; give --ref-max-score from a better policy")
    return said


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _describe(dataset: Any) -> str:
    from rlcli.entry.dataset_making import summarize

    s = summarize(dataset)
    return (f"{s.transitions:,} transitions, {s.episodes} episodes, return mean {s.mean_return:.2f} "
            f"(min {s.min_return:.2f}, max {s.max_return:.2f})")


# ------------------------------------------------------------------------------------------------ commands
def make(args: argparse.Namespace) -> None:
    from rlcli.entry import dataset_making as making
    from rlcli.registry import ConfigError

    noise = making.parse_noise(args.noise)
    if args.from_buffer is not None:
        for flag, value in (("--steps", args.steps), ("--noise", args.noise), ("--env", args.env)):
            if value is not None:
                raise ConfigError(f"{flag} does not apply to --from-buffer (it takes the whole buffer)")
    elif args.steps is None:
        raise ConfigError("--steps is required with --from-run and --random")
    if args.random and args.env is None:
        raise ConfigError("--random needs --env <gymnasium id>, e.g. --env Pendulum-v1")
    if args.env is not None and not args.random and args.from_buffer is None:
        raise ConfigError("--env applies to --random only (a run's env is its own)")
    if args.random:
        making.make_env(args.env).close()  # an unknown id is named now, before anything is written
    run = args.from_run or args.from_buffer
    if run is not None and not Path(run).expanduser().exists():
        raise ConfigError(f"run {run!r}: no such run directory or checkpoint file")
    _check_out(args.out, args.root, args.overwrite)
    policy = None
    if args.random:
        if noise is not None:
            raise ConfigError("--noise applies to --from-run (a random policy has nothing to perturb)")
        dataset = _run_with_progress(args.steps, f"random on {args.env}",
                                     lambda p: making.make_random(args.env, args.steps, args.seed, p))
    elif args.from_run is not None:
        dataset, policy = _run_with_progress(
            args.steps, "rolling out", lambda p: making.make_from_run(args.from_run, args.steps, noise,
                                                                     args.deterministic, args.seed, args.load, p))
    else:
        dataset, policy = making.make_from_buffer(args.from_buffer)
    said = _scores(args, dataset, policy)
    written = _write(dataset, args.out, args.root, args.overwrite)
    print(f"wrote {written}: {_describe(dataset)}, env {dataset.env_id}")
    for line in said:
        print(f"  {line}")


def concat(args: argparse.Namespace) -> None:
    from rlcli.entry.dataset_making import concat as join
    from rlcli.offline.load import load_dataset
    from rlcli.registry import ConfigError

    if len(args.sources) < 2:
        raise ConfigError("concat needs at least two datasets")
    _check_out(args.out, args.root, args.overwrite)
    parts = [load_dataset(source, download=args.download) for source in args.sources]
    dataset = join(parts, name=args.out)
    said = []
    for key, flag in (("ref_min_score", args.ref_min_score), ("ref_max_score", args.ref_max_score)):
        if flag is not None:
            setattr(dataset, key, flag)
        how = "given" if flag is not None else (f"the parts' {'lowest' if key == 'ref_min_score' else 'highest'}"
                                                if getattr(dataset, key) is not None else "none: no part has one")
        said.append(f"{key} {_number(getattr(dataset, key))} ({how})")
    dataset.metadata["reference_scores"] = "; ".join(said)
    written = _write(dataset, args.out, args.root, args.overwrite)
    print(f"wrote {written}: {_describe(dataset)}, env {dataset.env_id}, from {', '.join(args.sources)}")
    for line in said:
        print(f"  {line}")


def info(args: argparse.Namespace) -> None:
    from rlcli.entry.dataset_making import summarize
    from rlcli.offline.load import load_dataset

    dataset = load_dataset(args.source, download=args.download)
    s = summarize(dataset)
    fits = _fits_env(dataset)
    print(f"dataset      {s.name}")
    print(f"env          {s.env_id or '- (unknown)'}{fits}")
    print(f"transitions  {s.transitions:,}")
    print(f"episodes     {s.episodes}")
    print(f"return       mean {s.mean_return:.2f}, min {s.min_return:.2f}, max {s.max_return:.2f}")
    print(f"ref scores   min {_number(s.ref_min_score)}, max {_number(s.ref_max_score)}")
    normalized = dataset.normalized_score(s.mean_return)
    if normalized is not None:
        print(f"normalized   {normalized:.1f} (mean return)")
    for key in ("source", "run", "algo", "noise", "deterministic", "parts", "reference_scores"):
        if key in s.metadata and s.metadata[key] is not None:
            print(f"{key:<12} {s.metadata[key]}")


def _fits_env(dataset: Any) -> str:
    """' (spaces checked)' when the env can be made here and the dataset fits it; the mismatch is an error."""
    if dataset.env_id is None:
        return ""
    from rlcli.entry.dataset_making import make_env
    from rlcli.offline.checks import check_against_env
    from rlcli.registry import ConfigError

    try:
        env = make_env(dataset.env_id)
    except ConfigError:
        return " (not available here: spaces not checked)"
    try:
        check_against_env(dataset, env.observation_space, env.action_space)
    finally:
        env.close()
    return " (its spaces fit the dataset)"


def main(argv: list[str] | None = None) -> None:
    """Console entry point of `rl-dataset`."""
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from rlcli.registry import ConfigError

    try:
        {"make": make, "concat": concat, "info": info}[args.command](args)
    except ConfigError as error:
        _fail(str(error))
    except OSError as error:  # a read-only or full disk
        from rlcli.services.os_errors import describe_os_error

        _fail(describe_os_error(error), code=1)


def cli() -> None:
    """`rl-dataset`, as the other tools: a Ctrl-C or a closed pipe ends it in one line (or none), not a traceback."""
    from rlcli.entry.cli import print_version, quit_quietly_on_closed_stdout

    if print_version("rl-dataset"):
        return
    try:
        main()
    except BrokenPipeError as error:
        quit_quietly_on_closed_stdout(error)
    except KeyboardInterrupt:
        print("rl-dataset: stopped (SIGINT); nothing was written unless a line above says so", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    cli()
