"""Level-Based Foraging as a BenchMARL 1.5.2 task (issue #58): BenchMARL's MAPPO and IPPO (with
benchmarl_compare.py's on-policy settings) and its VDN and QMIX (with the settings of rlcli's conf/tuned/vdn/lbf.yaml,
as far as BenchMARL has them) on rlcli's env=lbf (Foraging-8x8-2p-2f-coop-v3: 8x8 grid, 2 players,
2 foods that each need both players, 50 steps; team return 1.0 when every food is eaten). Runs under BenchMARL's own
venv (see benchmarl_compare.py's docstring, plus lbforaging 2.0.0 as in rlcli's venv); it does not import rlcli.

    /tmp/bm-venv/bin/pip install -c /tmp/bm-constraints.txt lbforaging==2.0.0
    nice -n 10 /tmp/bm-venv/bin/python scripts/benchmarl_lbf.py --algo mappo --seed 0 --frames 6400 --work /tmp/bml
    nice -n 10 /tmp/bm-venv/bin/python scripts/benchmarl_lbf.py --algo vdn --seed 0 --frames 2000000 --work /tmp/bmv

VDN and QMIX (`run_benchmarl_lbf_value`): 16 copies x 50 steps an iteration, then 100 optimizer steps on batches of
256 team steps from a replay of 250,000, MLP [64, 64] ReLU shared by the agents (QMIX: torchrl's QMixer, embed 32),
lr 5e-4, gradient norm clipped at 10, gamma 0.99, the target network copied every 1,250 optimizer steps
(`delay_value`: torchrl's QMixerLoss has no double Q, which rlcli's preset uses), epsilon 1.0 -> 0.05 over the first
quarter of the frames, the agents' mean reward (BenchMARL's), tests at half and at the end.

The env is rlcli's TupleAgentsEnv (src/rlcli/envs/ma_gym.py) rebuilt here: agents agent_0..agent_{n-1} (one group,
"agent"), each its flat Box observation and Discrete(6) actions, per-agent rewards, the team's end `terminated` when
every food is eaten and `truncated` at the step limit, state() the agents' observations concatenated, and players
hashed by their index (which player LBF rewards first does not depend on memory addresses). It is wrapped in torchrl's
PettingZooWrapper as BenchMARL's PettingZooClass wraps its tasks (categorical actions, return_state, parallel, done
when any agent is done), so MAPPO's critic sees the state. Like BenchMARL's own tasks, every env copy gets the run's
seed, so all 16 copies deal the same sequence of layouts; --distinct-copy-seeds gives them seeds apart (rlcli's copy c
gets seed + c x n_agents). torch runs on one thread throughout (torchrl's SerialEnv.close() after the last batch would
set it back to the number of cores for the last training step and test).

Settings (benchmarl_compare.py's for MAPPO/IPPO): one policy shared on each agent's own observation (no agent index),
MLPs [256, 256] tanh for actor and critic, critic parameters shared, 16 copies x 50 steps = 800 frames an iteration,
minibatches of 400, 20 minibatch iterations (10 epochs), lr 7e-4, Adam eps 1e-5, gamma 0.99, lambda 0.95, clip 0.2,
entropy 0.01, critic coefficient 1 on the l2 error, gradient norm clipped at 5, one torch thread, tests with the
argmax policy after the first iteration, at half and at the end (--test-episodes 20, as scripts/lbf_runs.py).
Frames are team steps (one frame = both agents' step); --frames must be a multiple of 1,600.

Returns: a callback sums each test episode's rewards over steps and agents (the team return, 0..1). BenchMARL's own
eval episode_reward is the mean over the group's agents; x n_agents (2) it is the same sum (each test carries
both: `logged_x_n` is BenchMARL's figure x 2).
Prints one JSON line last and writes it to <work>/result.json.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from benchmarl.algorithms import IppoConfig, MappoConfig, QmixConfig, VdnConfig
from benchmarl.environments import PettingZooClass, Task
from benchmarl.experiment import Experiment, ExperimentConfig
from benchmarl.experiment.callback import Callback
from benchmarl.models.mlp import MlpConfig
from pettingzoo import ParallelEnv
from torchrl.envs import PettingZooWrapper

TASK_ID = "Foraging-8x8-2p-2f-coop-v3"


class LbfParallelEnv(ParallelEnv):
    """An LBF gymnasium env (Tuple spaces, one entry per agent) as a PettingZoo ParallelEnv, as rlcli's
    TupleAgentsEnv."""

    metadata = {"name": "lbf_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, task: str = TASK_ID, max_episode_steps: int = 50) -> None:
        import lbforaging  # noqa: F401  (registers the Foraging-* ids)

        self._env = gym.make(task, max_episode_steps=max_episode_steps, disable_env_checker=True)
        raw = self._env.unwrapped
        player_type = type(raw.players[0])  # rlcli's _index_players: a player hashes by its index
        indexed = type(f"Indexed{player_type.__name__}", (player_type,), {"__hash__": lambda self: self._index})
        for index, player in enumerate(raw.players):
            player.__class__, player._index = indexed, index
        self.possible_agents = [f"agent_{i}" for i in range(len(raw.action_space))]
        self.agents: list[str] = []
        self._obs = dict(zip(self.possible_agents, raw.observation_space, strict=True))
        self._act = dict(zip(self.possible_agents, raw.action_space, strict=True))
        lows = [np.broadcast_to(s.low, s.shape).reshape(-1) for s in self._obs.values()]
        highs = [np.broadcast_to(s.high, s.shape).reshape(-1) for s in self._obs.values()]
        self.state_space = gym.spaces.Box(np.concatenate(lows).astype(np.float32),
                                          np.concatenate(highs).astype(np.float32), dtype=np.float32)
        self._last = [np.zeros(s.shape, np.float32) for s in self._obs.values()]

    def observation_space(self, agent: str) -> gym.Space:
        return self._obs[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self._act[agent]

    def state(self) -> np.ndarray:
        return np.concatenate([o.reshape(-1) for o in self._last])

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, _ = self._env.reset(seed=seed)
        self.agents = list(self.possible_agents)
        self._last = [np.asarray(o, np.float32) for o in obs]
        return dict(zip(self.agents, self._last, strict=True)), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, ...]:
        joint = tuple(int(np.asarray(actions.get(a, 0)).reshape(-1)[0]) for a in self.possible_agents)
        obs, rewards, done, truncated, _ = self._env.step(joint)
        self._last = [np.asarray(o, np.float32) for o in obs]
        terminal = bool(done) and bool(self._env.unwrapped.field.sum() == 0)  # every food eaten
        by_limit = (bool(done) or bool(truncated)) and not terminal  # LBF's done at its step limit
        names = self.agents
        out = (dict(zip(names, self._last, strict=True)), {a: float(r) for a, r in zip(names, rewards, strict=True)},
               dict.fromkeys(names, terminal), dict.fromkeys(names, by_limit), {a: {} for a in names})
        if terminal or by_limit:
            self.agents = []
        return out

    def close(self) -> None:
        self._env.close()


class LbfClass(PettingZooClass):
    """BenchMARL's PettingZooClass (its specs, group_map, state_spec) with the env built here."""

    def get_env_fun(self, num_envs: int, continuous_actions: bool, seed: int | None, device: Any) -> Any:
        config = dict(self.config)
        distinct, calls = config.pop("distinct_copy_seeds", False), itertools.count()

        def make() -> PettingZooWrapper:  # BenchMARL's way: every copy the same seed; distinct: seed + a count
            s = seed + next(calls) if distinct and seed is not None else seed
            return PettingZooWrapper(LbfParallelEnv(**config), return_state=True, categorical_actions=True, seed=s,
                                     device=device)

        return make

    def supports_continuous_actions(self) -> bool:
        return False

    def supports_discrete_actions(self) -> bool:
        return True

    def has_state(self) -> bool:
        return True

    def has_render(self, env: Any) -> bool:
        return False

    def max_steps(self, env: Any) -> int:
        return int(self.config["max_episode_steps"])

    @staticmethod
    def env_name() -> str:
        return "lbf"


class LbfTask(Task):
    """BenchMARL's Task enum for LBF (one member; its config is given, there is no yaml)."""

    FORAGING_8X8_2P_2F_COOP_V3 = None

    @staticmethod
    def associated_class() -> type[LbfClass]:
        return LbfClass


class TeamReturns(Callback):
    """Each test's team returns: every episode's rewards summed over steps and agents; one torch thread."""

    def __init__(self) -> None:
        super().__init__()
        self.tests: list[dict[str, Any]] = []

    def on_batch_collected(self, batch: Any) -> None:
        # the collector closes its SerialEnv once it has the last batch, and that close sets torch's threads back to
        # the cores' count: the last training step and test would run on 2 threads (10x slower on a busy machine)
        torch.set_num_threads(1)

    def on_evaluation_end(self, rollouts: list) -> None:
        returns = [float(r.get(("next", "agent", "reward")).sum()) for r in rollouts]
        eaten = [bool(r.get(("next", "terminated"))[-1].item()) for r in rollouts]
        self.tests.append({"frames": self.experiment.total_frames, "iteration": self.experiment.n_iters_performed,
                           "team_return_mean": float(np.mean(returns)), "returns": returns,
                           "all_food_eaten": sum(eaten), "lengths": [r.batch_size[0] for r in rollouts]})


def run_experiment(task: Any, algo_config: Any, model: Any, critic: Any, c: Any, seed: int, work_dir: str,
                   frames: int, test_episodes: int) -> tuple[Any, TeamReturns]:
    """The experiment run with tests at half and at the end, csv logs under `work_dir`, no checkpoints; its tests."""
    c.evaluation, c.render, c.evaluation_interval = True, False, frames // 2
    c.evaluation_episodes, c.evaluation_deterministic_actions = test_episodes, True
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    c.loggers, c.create_json, c.save_folder = ["csv"], False, work_dir
    c.checkpoint_interval, c.checkpoint_at_end = 0, False
    returns = TeamReturns()
    exp = Experiment(task=task, algorithm_config=algo_config, model_config=model, critic_model_config=critic,
                     seed=seed, config=c, callbacks=[returns])
    exp.run()
    return exp, returns


def run_benchmarl_lbf(algo: str, seed: int, frames: int, work_dir: str, *, n_envs: int = 16, n_steps: int = 50,
                      minibatch: int = 400, epochs: int = 10, hidden: tuple[int, ...] = (256, 256), lr: float = 7e-4,
                      gamma: float = 0.99, gae_lambda: float = 0.95, clip: float = 0.2, ent_coef: float = 0.01,
                      test_episodes: int = 20, task: str = TASK_ID, max_episode_steps: int = 50,
                      distinct_copy_seeds: bool = False) -> dict[str, Any]:
    """One BenchMARL run of `algo` (mappo, ippo) on LBF for `frames` team steps; its tests' team returns."""
    start = time.perf_counter()
    batch = n_envs * n_steps
    if frames % (2 * batch) or batch % minibatch:
        raise SystemExit(f"frames must be a multiple of 2 x {batch} (n_envs x n_steps) and {batch} of minibatch")
    torch.set_num_threads(1)
    lbf = LbfTask.FORAGING_8X8_2P_2F_COOP_V3.get_task({"task": task, "max_episode_steps": max_episode_steps,
                                                        "distinct_copy_seeds": distinct_copy_seeds})
    algo_config = {"mappo": MappoConfig, "ippo": IppoConfig}[algo].get_from_yaml()
    algo_config.clip_epsilon, algo_config.entropy_coef, algo_config.critic_coef = clip, ent_coef, 1.0
    algo_config.lmbda, algo_config.loss_critic_type, algo_config.share_param_critic = gae_lambda, "l2", True
    model, critic = MlpConfig.get_from_yaml(), MlpConfig.get_from_yaml()
    for m in (model, critic):
        m.num_cells, m.activation_class = list(hidden), torch.nn.Tanh
    c = ExperimentConfig.get_from_yaml()
    c.sampling_device = c.train_device = c.buffer_device = "cpu"
    c.share_policy_params, c.prefer_continuous_actions = True, False
    c.gamma, c.lr, c.adam_eps, c.clip_grad_norm, c.clip_grad_val = gamma, lr, 1e-5, True, 5.0
    c.max_n_iters, c.max_n_frames = None, frames
    c.on_policy_collected_frames_per_batch, c.on_policy_n_envs_per_worker = batch, n_envs
    c.on_policy_minibatch_size, c.on_policy_n_minibatch_iters = minibatch, epochs * batch // minibatch
    exp, returns = run_experiment(lbf, algo_config, model, critic, c, seed, work_dir, frames, test_episodes)
    n_agents = len(exp.group_map["agent"])
    scalars = next(p for p in Path(exp.folder_name).rglob("scalars") if p.is_dir())  # the csv logger's, nested
    with open(scalars / "eval_agent_reward_episode_reward_mean.csv") as f:
        logged = [n_agents * float(row[1]) for row in csv.reader(f) if row]
    for test, value in zip(returns.tests, logged, strict=True):
        test["logged_x_n"] = value
    final = returns.tests[-1]
    return {"algo": algo, "seed": seed, "frames": exp.total_frames, "task": task, "n_agents": n_agents,
            "final_team_return": final["team_return_mean"], "seconds": time.perf_counter() - start,
            "tests": returns.tests, "folder": str(exp.folder_name)}


def run_benchmarl_lbf_value(algo: str, seed: int, frames: int, work_dir: str, *, n_envs: int = 16,
                            n_steps: int = 50, gradient_steps: int = 100, batch: int = 256,
                            hidden: tuple[int, ...] = (64, 64), lr: float = 5e-4, gamma: float = 0.99,
                            eps_init: float = 1.0, eps_end: float = 0.05, anneal_fraction: float = 0.25,
                            memory: int = 250_000, target_every: int = 1250, grad_norm: float = 10.0,
                            test_episodes: int = 20, task: str = TASK_ID, max_episode_steps: int = 50,
                            distinct_copy_seeds: bool = False) -> dict[str, Any]:
    """One BenchMARL run of `algo` (qmix, vdn) on LBF for `frames` team steps; its tests' team returns. Each
    iteration collects n_envs x n_steps team steps, then takes `gradient_steps` optimizer steps on batches of `batch`
    team steps from a replay of `memory`; the target network is copied every `target_every` optimizer steps
    (`delay_value`, no double Q); epsilon per agent from eps_init to eps_end over anneal_fraction of the frames."""
    start = time.perf_counter()
    per_batch = n_envs * n_steps
    if frames % (2 * per_batch):
        raise SystemExit(f"frames must be a multiple of 2 x {per_batch} (n_envs x n_steps)")
    torch.set_num_threads(1)
    lbf = LbfTask.FORAGING_8X8_2P_2F_COOP_V3.get_task({"task": task, "max_episode_steps": max_episode_steps,
                                                        "distinct_copy_seeds": distinct_copy_seeds})
    algo_config = {"qmix": QmixConfig, "vdn": VdnConfig}[algo].get_from_yaml()  # l2, delay_value, QMIX embed 32
    model, critic = MlpConfig.get_from_yaml(), MlpConfig.get_from_yaml()
    for m in (model, critic):
        m.num_cells, m.activation_class = list(hidden), torch.nn.ReLU
    c = ExperimentConfig.get_from_yaml()
    c.sampling_device = c.train_device = c.buffer_device = "cpu"
    c.share_policy_params, c.prefer_continuous_actions = True, False
    c.gamma, c.lr, c.clip_grad_norm, c.clip_grad_val = gamma, lr, True, grad_norm
    c.max_n_iters, c.max_n_frames = None, frames
    c.off_policy_collected_frames_per_batch, c.off_policy_n_envs_per_worker = per_batch, n_envs
    c.off_policy_n_optimizer_steps, c.off_policy_train_batch_size = gradient_steps, batch
    c.off_policy_memory_size, c.off_policy_init_random_frames = memory, 0
    c.exploration_eps_init, c.exploration_eps_end = eps_init, eps_end
    c.exploration_anneal_frames = int(anneal_fraction * frames)
    c.soft_target_update, c.hard_target_update_frequency = False, target_every
    exp, returns = run_experiment(lbf, algo_config, model, critic, c, seed, work_dir, frames, test_episodes)
    n_agents = len(exp.group_map["agent"])
    final = returns.tests[-1]
    return {"algo": algo, "seed": seed, "frames": exp.total_frames, "task": task, "n_agents": n_agents,
            "final_team_return": final["team_return_mean"], "seconds": time.perf_counter() - start,
            "tests": returns.tests, "folder": str(exp.folder_name)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=["mappo", "ippo", "qmix", "vdn"], default="mappo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--frames", type=int, default=6400, help="team steps (a multiple of 1,600)")
    p.add_argument("--work", default="/tmp/benchmarl_lbf")
    p.add_argument("--test-episodes", type=int, default=20)
    p.add_argument("--ent-coef", type=float, default=0.01, help="the entropy coefficient (BenchMARL's own default: 0)")
    p.add_argument("--anneal-fraction", type=float, default=0.25, help="vdn, qmix: epsilon's share of the frames "
                   "(0.5 of 1,000,000: the first 500,000, as rlcli's 2,000,000-step preset)")
    p.add_argument("--distinct-copy-seeds", action="store_true", help="seed the env copies apart (as rlcli does; "
                   "BenchMARL gives every copy the run's seed, so every copy sees the same layouts)")
    args = p.parse_args()
    if args.algo in ("qmix", "vdn"):
        result = run_benchmarl_lbf_value(args.algo, args.seed, args.frames, args.work,
                                         test_episodes=args.test_episodes, anneal_fraction=args.anneal_fraction,
                                         distinct_copy_seeds=args.distinct_copy_seeds)
    else:
        result = run_benchmarl_lbf(args.algo, args.seed, args.frames, args.work, test_episodes=args.test_episodes,
                                   ent_coef=args.ent_coef, distinct_copy_seeds=args.distinct_copy_seeds)
    for t in result["tests"]:
        logged = t.get("logged_x_n", float("nan"))  # (the value-decomposition runs' tests carry the team return only)
        print(f"frames {t['frames']:>8,}  team return {t['team_return_mean']:.3f} (logged x n {logged:.3f}) "
              f" all food eaten {t['all_food_eaten']}/{len(t['returns'])}")
    (Path(args.work) / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "tests"}))


if __name__ == "__main__":
    main()
