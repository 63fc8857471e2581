"""One off-policy gradient phase of a population against a single run's, in one process: where a population's
update time goes as members are added, without the envs, tests and logs of scripts/population_bench.py.

    python scripts/population_step.py --algo sac --members 1 2 8 16                 # RL-Zoo's SAC Pendulum nets
    python scripts/population_step.py --algo sac --hidden 16 16 --profile           # per-call overhead, cProfiled
    python scripts/population_step.py --algo sac --members 8 --device cuda --compiled

Each member is a real run's state (`prepare` on its composed config, seed = its index) whose replay holds
`--warmup` random transitions (PPO, A2C, PQN: one rollout); a population `update` is what the population launcher's
loop calls once per iteration (for RL-Zoo's SAC Pendulum: one gradient step per member; for its PPO CartPole:
20 epochs of one 256-step minibatch). Times are per update, after `--updates`
untimed ones (a compiled step compiles in those); on CUDA each timing ends with a synchronize.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from typing import Any

import torch

from rlcli.contracts import RunClock
from rlcli.run.compose import compose_config
from rlcli.run.state import prepare
from rlcli.services import checkpoint
from rlcli.sweeps.population import streams
from rlcli.sweeps.population.lockstep import population_update

ENVS = {"sac": "Pendulum-v1", "tqc": "Pendulum-v1", "td3": "Pendulum-v1", "ddpg": "Pendulum-v1",
        "dqn": "CartPole-v1", "qrdqn": "CartPole-v1", "ppo": "CartPole-v1", "a2c": "CartPole-v1",
        "pqn": "CartPole-v1"}
ON_POLICY = ("ppo", "a2c", "pqn")


def members_of(args: argparse.Namespace, count: int) -> list[tuple[Any, streams.Stream]]:
    overrides = [f"algo={args.algo}", f"env={ENVS[args.algo]}", f"device={args.device}", "log.tensorboard=false",
                 "log.console=false"]
    if args.algo not in ON_POLICY:
        overrides.append(f"algo.learning_starts={args.warmup // 2}")
    if args.hidden:
        overrides.append(f"actor.hidden_sizes=[{','.join(str(h) for h in args.hidden)}]")
    if args.compiled:
        overrides.append("compile=true")
    members = []
    for seed in range(count):
        components, _ = prepare(compose_config([*overrides, f"seed={seed}"]))
        if args.algo in ON_POLICY:  # one rollout, updated on again and again
            components.collector.collect(components.learner)
        while args.algo not in ON_POLICY and len(components.buffer) < args.warmup:
            components.collector.collect(components.learner, random_actions=True)
        members.append((components, streams.of_member(checkpoint.rng_state())))
    return members


def per_call(call: Any, repeats: int, device: str) -> float:
    """Seconds per call, the GPU's queue drained before and after."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    sync()
    return (time.perf_counter() - started) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="sac", choices=sorted(ENVS))
    parser.add_argument("--members", type=int, nargs="+", default=[1, 2, 8])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compiled", action="store_true", help="compile=true for the single run and the members")
    parser.add_argument("--hidden", type=int, nargs="*", default=None, help="actor.hidden_sizes (default: RL-Zoo's)")
    parser.add_argument("--warmup", type=int, default=400, help="random transitions in each member's replay")
    parser.add_argument("--updates", type=int, default=200, help="timed updates (and as many untimed first)")
    parser.add_argument("--profile", action="store_true", help="cProfile the largest population's updates")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = RunClock(args.warmup, 10**9, 0)
    single, _ = members_of(args, 1)[0]

    def single_update() -> None:
        single.algo.update(single.buffer, clock)

    per_call(single_update, args.updates, args.device)
    unit = per_call(single_update, args.updates, args.device)
    print(f"{args.algo} on {args.device}{' compiled' if args.compiled else ''}: a single run's update "
          f"{unit * 1e3:.2f} ms", flush=True)
    print("| members | ms per update | per member | x a single run's | member updates/s |")
    print("| --- | --- | --- | --- | --- |")
    for count in args.members:
        members = members_of(args, count)
        population = population_update([c.algo for c, _ in members], [c.buffer for c, _ in members])
        rngs = [stream for _, stream in members]
        buffers = [c.buffer for c, _ in members]

        def update(population: Any = population, rngs: list = rngs, buffers: list = buffers, n: int = count) -> None:
            population.update([True] * n, buffers, rngs, [clock] * n)

        per_call(update, args.updates, args.device)
        seconds = per_call(update, args.updates, args.device)
        print(f"| {count} | {seconds * 1e3:.2f} | {seconds / count * 1e3:.2f} | {seconds / unit:.2f} | "
              f"{count / seconds:.0f} |", flush=True)
        if args.profile and count == max(args.members):
            profile = cProfile.Profile()
            profile.runcall(per_call, update, args.updates, args.device)
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
