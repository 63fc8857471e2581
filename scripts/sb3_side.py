"""Stable-Baselines3 (and sb3-contrib) on a stored RL-Zoo entry, for a row next to rlcli's at the same budget and
seeds: the entry's hyperparameters exactly as RL-Zoo gives them (tests/data/rl_zoo_entries.yaml, the same file the
translation test checks conf/tuned/ against), then 10 deterministic test episodes, as rlcli's last test phase.

    python scripts/sb3_side.py ppo/MountainCarContinuous-v0 --seeds 1 2 3
    python scripts/sb3_side.py sac/MountainCarContinuous-v0 --seeds 1 --steps 20000
    python scripts/sb3_side.py a2c/HalfCheetahBulletEnv-v0 --entries benchmark/rl_zoo_applied.yaml \
        --env HalfCheetah-v5 --steps 100000        # an entry RL-Zoo gives for another env, applied to this one

Prints one line per seed and a summary line (final test return mean ± std over seeds, wall seconds).
"""

from __future__ import annotations

import argparse
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ENTRIES = Path(__file__).resolve().parent.parent / "tests" / "data" / "rl_zoo_entries.yaml"
RUN_KEYS = ("source", "n_timesteps", "n_envs", "policy", "normalize", "policy_kwargs", "env_wrapper")


def sb3_class(algo: str) -> Any:
    import sb3_contrib
    import stable_baselines3

    return {"ppo": stable_baselines3.PPO, "a2c": stable_baselines3.A2C, "sac": stable_baselines3.SAC,
            "dqn": stable_baselines3.DQN, "tqc": sb3_contrib.TQC, "trpo": sb3_contrib.TRPO,
            "crossq": sb3_contrib.CrossQ, "td3": stable_baselines3.TD3, "ddpg": stable_baselines3.DDPG}[algo]


def hyperparameters(entry: dict[str, Any], action_dim: int = 1) -> dict[str, Any]:
    """The entry's keys as SB3's constructor arguments: `sb3_defaults` (an older SB3's defaults the entry ran
    with) under the entry's own keys, RL-Zoo's noise_type / noise_std as an action noise object, and
    [n, "episode"] train frequencies as SB3's tuple."""
    import numpy as np
    from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise
    from torch import nn

    entry = {**entry.get("sb3_defaults", {}), **{k: v for k, v in entry.items() if k != "sb3_defaults"}}
    kwargs = {k: v for k, v in entry.items() if k not in RUN_KEYS}
    noise_type, noise_std = kwargs.pop("noise_type", None), kwargs.pop("noise_std", 0.1)
    if noise_type in ("normal", "ornstein-uhlenbeck"):
        kind = NormalActionNoise if noise_type == "normal" else OrnsteinUhlenbeckActionNoise
        kwargs["action_noise"] = kind(np.zeros(action_dim), noise_std * np.ones(action_dim))
    if isinstance(kwargs.get("train_freq"), list):
        kwargs["train_freq"] = tuple(kwargs["train_freq"])
    lr = kwargs.get("learning_rate")
    if isinstance(lr, str) and lr.startswith("lin_"):
        start = float(lr[4:])
        kwargs["learning_rate"] = lambda progress_remaining: progress_remaining * start
    if "policy_kwargs" in entry:
        names = types.SimpleNamespace(ReLU=nn.ReLU, Tanh=nn.Tanh, GELU=nn.GELU, ELU=nn.ELU)
        kwargs["policy_kwargs"] = eval(entry["policy_kwargs"], {"__builtins__": {}, "dict": dict, "nn": names})  # noqa: S307
    return kwargs


def wrapper(entry: dict[str, Any]) -> Any:
    """The entry's env_wrapper: RL-Zoo's TimeFeatureWrapper is the one the stored entries use."""
    name = entry.get("env_wrapper")
    if name is None:
        return None
    if not name.endswith("TimeFeatureWrapper"):
        raise SystemExit(f"sb3_side: env_wrapper {name!r} is not one this script knows (TimeFeatureWrapper)")
    from sb3_contrib.common.wrappers import TimeFeatureWrapper

    return TimeFeatureWrapper


def run(name: str, seed: int, steps: int | None, entries: Path = ENTRIES, env_id: str | None = None
        ) -> tuple[float, float]:
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    algo, entry_env = name.split("/")
    env_id = env_id or entry_env
    entry = yaml.safe_load(entries.read_text())[name]
    env = make_vec_env(env_id, n_envs=entry.get("n_envs", 1), seed=seed, wrapper_class=wrapper(entry))
    if entry.get("normalize"):
        env = VecNormalize(env, gamma=entry.get("gamma", 0.99))
    action_dim = int(np.prod(env.action_space.shape or (1,)))
    model = sb3_class(algo)(entry.get("policy", "MlpPolicy"), env, seed=seed, device="cpu",
                            **hyperparameters(entry, action_dim))
    start = time.time()
    model.learn(steps or int(entry["n_timesteps"]))
    seconds = time.time() - start
    test_env = make_vec_env(env_id, n_envs=1, seed=seed + 10_000, wrapper_class=wrapper(entry))
    if entry.get("normalize"):
        test_env = VecNormalize(test_env, training=False, norm_reward=False)
        test_env.obs_rms = env.obs_rms
    returns, _ = evaluate_policy(model, test_env, n_eval_episodes=10, deterministic=True, return_episode_rewards=True)
    return float(np.mean(returns)), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entry", help="algo/env, a key of the entries file")
    parser.add_argument("--entries", type=Path, default=ENTRIES, help="default: tests/data/rl_zoo_entries.yaml")
    parser.add_argument("--env", default=None, help="apply the entry to this env id instead of its own")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=None, help="a reduced budget (default: RL-Zoo's n_timesteps)")
    args = parser.parse_args()
    finals, total = [], 0.0
    for seed in args.seeds:
        final, seconds = run(args.entry, seed, args.steps, args.entries, args.env)
        finals.append(final)
        total += seconds
        print(f"SB3 {args.entry} seed {seed}: final test return {final:.1f} ({seconds:.0f} s)", flush=True)
    print(f"SB3 {args.entry}: {np.mean(finals):.1f} ± {np.std(finals):.1f} over seeds {args.seeds} "
          f"({', '.join(f'{f:.1f}' for f in finals)}); {total:.0f} s of training")


if __name__ == "__main__":
    main()
