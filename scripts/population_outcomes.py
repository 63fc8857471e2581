"""Do a population's members learn what single runs learn? The same seeds trained as one population and as single
runs (Hydra's basic launcher), both sweeps at once, then their final test returns side by side with an exact
Mann-Whitney U test (a permutation test of U over every split of the pooled returns, so ties are handled exactly).

    python scripts/population_outcomes.py --algo sac --steps 10000 --seeds 8
    python scripts/population_outcomes.py --algo ppo --steps 20000 --seeds 8 -- train.num_envs=8
    python scripts/population_outcomes.py --algo ppo --env Pendulum-v1 --steps 100000   # RL-Zoo's: gSDE

Every run uses the algorithm's RL-Zoo settings on its benchmark env (population_bench.py's choice: CartPole-v1, or
Pendulum-v1 for the continuous-control algorithms; `--env` for another), no early stop; anything after `--` is
added to both sweeps.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from population_bench import final_returns

RL_TRAIN = str(Path(sys.executable).parent / "rl-train")
CONTINUOUS = {"sac", "tqc", "td3", "ddpg"}  # on Pendulum-v1, with RL-Zoo's settings (gSDE, per-episode training)


def mann_whitney_exact(a: list[float], b: list[float]) -> tuple[float, float]:
    """U of `a` (ties count a half) and the exact two-sided p-value: the share of all splits of the pooled values
    into groups of len(a) and len(b) whose U is at least as far from its mean as the observed one."""
    pooled = a + b

    def u_of(first: tuple[int, ...]) -> float:
        chosen = set(first)
        xs = [pooled[i] for i in first]
        ys = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in xs for y in ys)

    observed = u_of(tuple(range(len(a))))
    centre = len(a) * len(b) / 2
    splits = list(itertools.combinations(range(len(pooled)), len(a)))
    extreme = sum(1 for split in splits if abs(u_of(split) - centre) >= abs(observed - centre) - 1e-9)
    return observed, extreme / len(splits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--env", default=None, help="default: Pendulum-v1 for sac, tqc, td3, ddpg, else CartPole-v1")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("population_outcomes.json"))
    parser.add_argument("extra", nargs="*", help="overrides for both sweeps (after --)")
    args = parser.parse_args()
    env = args.env or ("Pendulum-v1" if args.algo in CONTINUOUS else "CartPole-v1")
    common = [RL_TRAIN, "-m", f"algo={args.algo}", f"env={env}",
              f"train.total_steps={args.steps}", "train.stop_reward=null", "log.console=false",
              "log.tensorboard=false", f"seed={','.join(map(str, range(args.seeds)))}", *args.extra]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        procs = {name: subprocess.Popen([*common, *launcher, f"hydra.sweep.dir={work / name}"], cwd=work,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for name, launcher in (("population", ["hydra/launcher=population", "hydra.launcher.n_jobs=1"]),
                                                ("single runs", []))}
        for name, proc in procs.items():
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"population_outcomes: the {name} sweep failed:\n{err[-3000:]}")
        seconds = time.perf_counter() - started
        returns = {name: final_returns(work / name) for name in procs}
    u, p = mann_whitney_exact(returns["population"], returns["single runs"])
    print(f"{args.algo} {env}, {args.steps:,} env steps, seeds 0-{args.seeds - 1} ({seconds:.0f} s for both sweeps)")
    for name, values in returns.items():
        print(f"  {name:12} {[round(v, 1) for v in values]}")
    print(f"  Mann-Whitney U = {u:g} of {args.seeds * args.seeds}, exact two-sided p = {p:.2f}")
    args.out.write_text(json.dumps({"algo": args.algo, "env": env, "steps": args.steps, "returns": returns,
                                    "u": u, "p": p}, indent=1) + "\n")


if __name__ == "__main__":
    main()
