"""Multi-agent head-to-head (issue #58): rlcli's MAPPO and IPPO against BenchMARL 1.5.2's on PettingZoo's
simple_spread (3 agents, 25-step episodes, discrete actions), its MASAC and MADDPG on simple_spread with
continuous actions (--algos masac maddpg), and its QMIX, VDN and IQL on discrete simple_spread (--algos qmix vdn iql),
on the same machine, budget, network sizes and settings, over seeds. docs/results/multiagent.md shows what it gave.

    python scripts/benchmarl_compare.py --quick --bm-python /tmp/bm-venv/bin/python      # a smoke run
    nice -n 10 python scripts/benchmarl_compare.py --work /tmp/bmc_main --team-steps 40000 \\
        --seeds 0 1 2 3 --bm-python /tmp/bm-venv/bin/python                               # docs/results/multiagent.md
    nice -n 5 python scripts/benchmarl_compare.py --work /tmp/bmc_off --team-steps 60000 --seeds 0 1 2 \\
        --algos masac maddpg --bm-python /tmp/bm-venv/bin/python                          # its last section
    python scripts/benchmarl_compare.py --quick --algos qmix vdn iql --bm-python /tmp/bm-venv/bin/python
    nice -n 5 python scripts/benchmarl_compare.py --work /tmp/bmc_q --team-steps 60000 --seeds 0 1 2 \\
        --algos qmix vdn iql --bm-python /tmp/bm-venv/bin/python                          # QMIX, VDN, IQL
The last is 18 runs, one at a time: 53 minutes on a 2-core machine whose other core was partly busy (2026-11-29; its
figures are in docs/results/multiagent.md, last section).

BenchMARL's venv (its own; torch pinned so that pip keeps the CPU build):
    python3 -m venv /tmp/bm-venv && echo torch==2.13.0 > /tmp/bm-constraints.txt
    /tmp/bm-venv/bin/pip install torch==2.13.0
    /tmp/bm-venv/bin/pip install -c /tmp/bm-constraints.txt benchmarl==1.5.2 'pettingzoo[mpe]==1.24.3'
(benchmarl 1.5.2 brings torchrl 0.11.1 and tensordict 0.11.0; torchrl's PettingZooEnv imports pettingzoo.mpe, which
pettingzoo 1.25+ moved out to mpe2, hence pettingzoo 1.24.3 there; rlcli's side runs mpe2's simple_spread_v3.)

Units. BenchMARL counts frames as steps of the whole team (one frame = the 3 agents' step); rlcli's row mode
counts agent steps (3 per team step). --team-steps is in team steps: rlcli gets train.total_steps = 3 x that.
Returns: rlcli's eval.jsonl `returns` are the team sum over the 3 agents; BenchMARL's eval episode_reward is the
mean over the group's agents of each agent's summed reward (logger.log_evaluation: reward.sum(0).mean()), so it is
multiplied by the number of agents (3, one group) to give the team sum. Both are reported as team sums.

Matched settings (both sides): one policy shared by the agents on each agent's own observation (no agent index:
BenchMARL gives none, so env.agent_id=false); MLPs [256, 256] tanh (BenchMARL's default), torch's default init on
both (actor.ortho_init=false); separate policy and value networks; 16 copies of the env, 50 steps each per update
(800 team steps = 2,400 agent rows); minibatches of 400 team steps (1,200 rows), 10 epochs (BenchMARL: 20
minibatch iterations drawn without replacement); lr 7e-4, Adam eps 1e-5, gamma 0.99, GAE lambda 0.95, clip 0.2,
entropy 0.01 (rlcli's tuned preset, the MAPPO paper's MPE values), value loss coefficient 1 on the squared error,
no advantage normalization (BenchMARL hard-codes none), gradient norm clipped at 5; tests of 10 episodes with the
deterministic (argmax) policy at the middle and the end (BenchMARL also tests after its first iteration; that test is
kept in the JSON, apart). What stays different is in docs/results/multiagent.md.

MASAC and MADDPG (rlcli's joint mode: a row is a copy of the env, so rlcli's steps are team steps): BenchMARL's
off-policy defaults (10 copies, 6,000 team steps collected then 1,000 gradient steps of 128, no random warm-up,
replay of 1M, tau 0.005, MADDPG's Gaussian noise 0.8 -> 0.01 over a third of the run, in the env's [0, 1] units)
but lr 3e-4 on both sides (--off-lr), MLPs [256, 256] tanh, gradient norm clipped at 5.

QMIX, VDN and IQL (discrete simple_spread, BenchMARL's off-policy defaults as above, lr 3e-4 on both sides):
BenchMARL's QMIX/VDN (torchrl's QMixerLoss with delay_value) learn the mean of the agents' rewards with a target
network that picks and values the next actions (no double Q), l2 loss, soft target updates (tau 0.005 after every
optimizer step), epsilon-greedy per agent from 0.8 to 0.01 over the first third of the frames (stepped after each
iteration), the mixer torchrl's QMixer (embed 32, one linear layer per weights' hypernetwork). rlcli's side: algo=qmix
/ vdn in joint mode (a row is a copy of the env; the team reward is the sum, so algo.reward_scale=1/3 gives the mean),
algo.double=false, algo.loss=mse, algo.tau=0.005 algo.target_update_interval=1
algo.target_update_unit=gradient_step, algo.exploration_initial_eps=0.8 exploration_final_eps=0.01
exploration_fraction=1/3 (rlcli sets epsilon before each collect phase: the same values at the same frames),
algo.mixer_embed_dim=32 algo.hypernet_layers=1. IQL is BenchMARL's independent DQN (each agent its own reward, one
network shared); rlcli's is algo=dqn in row mode (a row an agent: 3 x the copies, steps and batch in rows; rlcli's
algo=iql is offline implicit Q-learning, another algorithm). What stays different: Adam eps (rlcli 1e-8, BenchMARL
1e-6), rlcli's reset steps (1 step in 26 of a copy's budget stores no transition: 57,700 of 60,000 team steps are
learned from), IQL's batches (rlcli samples 384 agent rows, BenchMARL 128 team steps of 3 agents each), initial
weights, sampling and env seeds.

Timing of the --quick smoke (1,200 team steps: 2 collect phases of 10 copies x 60 steps, 100 gradient steps of 128
after each; seed 0, nice 10, 2026-11-29 with the other core busy, load average 2.8). Whole processes: rlcli QMIX 6.4 s,
VDN 6.1 s, IQL 5.4 s (start-up about 3 s each); BenchMARL 12.7, 9.5 and 10.3 s (start-up 3-6 s). Per gradient step:
rlcli 9.3 ms (QMIX), 6.7 (VDN), 5.0 (IQL); BenchMARL 10.5, 8.3 and 11.5 ms; per team step collected: rlcli 0.3-0.4 ms,
BenchMARL 1.4-1.8 ms. At 60,000 team steps (10,000 gradient steps) a seed is about 120 + 100 + 75 s of rlcli and
210 + 180 + 230 s of BenchMARL: 15 minutes, 45 for three seeds.

Every run is a subprocess, one at a time, on one torch thread. A run whose result is already under --work is not
run again (delete it to redo it). Prints markdown tables and writes every figure to <work>/benchmarl_compare.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BIN = Path(sys.executable).parent
ALGOS = ("mappo", "ippo")
OFF_POLICY = ("masac", "maddpg")  # on simple_spread with continuous actions (mpe2's Box(0, 1, (5,)) an agent)
VALUE = ("qmix", "vdn", "iql")  # on simple_spread with discrete actions, BenchMARL's off-policy settings as OFF_POLICY
RLCLI_ALGO = {"iql": "dqn"}  # BenchMARL's IQL is rlcli's algo=dqn in row mode (rlcli's algo=iql is offline IQL)
N_AGENTS = 3

# The BenchMARL side, run by --bm-python with one JSON argument; prints one JSON line last.
BENCHMARL_SIDE = r'''
import csv, json, sys, time
t_start = time.perf_counter()
a = json.loads(sys.argv[1])
import torch
torch.set_num_threads(1)
import benchmarl, torchrl, tensordict, pettingzoo
from benchmarl.algorithms import IppoConfig, IqlConfig, MaddpgConfig, MappoConfig, MasacConfig, QmixConfig, VdnConfig
from benchmarl.environments import PettingZooTask
from benchmarl.experiment import Experiment, ExperimentConfig
from benchmarl.models.mlp import MlpConfig
task = PettingZooTask.SIMPLE_SPREAD.get_from_yaml()
task.config.update({"max_cycles": 25, "N": 3, "local_ratio": 0.5})
off = a["algo"] in ("masac", "maddpg", "qmix", "vdn", "iql")
continuous = a["algo"] in ("masac", "maddpg")
configs = {"mappo": MappoConfig, "ippo": IppoConfig, "masac": MasacConfig, "maddpg": MaddpgConfig,
           "qmix": QmixConfig, "vdn": VdnConfig, "iql": IqlConfig}
# masac, maddpg: their yamls' own (l2, one critic shared, alpha from 1); qmix, vdn, iql: theirs (l2, delay_value,
# qmix's mixing_embed_dim 32)
algo = configs[a["algo"]].get_from_yaml()
if not off:
    algo.clip_epsilon, algo.entropy_coef, algo.critic_coef, algo.lmbda = a["clip"], a["ent_coef"], 1.0, a["gae_lambda"]
    algo.loss_critic_type, algo.share_param_critic = "l2", True
model = MlpConfig.get_from_yaml()
model.num_cells, model.activation_class = list(a["hidden"]), torch.nn.Tanh
critic = MlpConfig.get_from_yaml()
critic.num_cells, critic.activation_class = list(a["hidden"]), torch.nn.Tanh
c = ExperimentConfig.get_from_yaml()
c.sampling_device = c.train_device = c.buffer_device = "cpu"
c.share_policy_params, c.prefer_continuous_actions = True, continuous
c.gamma, c.lr, c.clip_grad_norm, c.clip_grad_val = a["gamma"], a["lr"], True, 5.0
c.adam_eps = c.adam_eps if off else 1e-5
c.max_n_iters, c.max_n_frames = None, a["team_steps"]
if off:
    c.off_policy_collected_frames_per_batch = a["frames_per_batch"]
    c.off_policy_n_envs_per_worker = a["n_envs"]
    c.off_policy_n_optimizer_steps = a["gradient_steps"]
    c.off_policy_train_batch_size = a["batch"]
    c.off_policy_memory_size, c.off_policy_init_random_frames = 1_000_000, 0
    # MADDPG's Gaussian sigma, or QMIX/VDN/IQL's epsilon; annealed over max_n_frames / 3 (None)
    c.exploration_eps_init, c.exploration_eps_end, c.exploration_anneal_frames = a["sigma"], a["sigma_end"], None
    c.soft_target_update, c.polyak_tau = True, 0.005  # its defaults, stated: after every optimizer step
else:
    c.on_policy_collected_frames_per_batch = a["frames_per_batch"]
    c.on_policy_n_envs_per_worker = a["n_envs"]
    c.on_policy_minibatch_size = a["minibatch"]
    c.on_policy_n_minibatch_iters = a["minibatch_iters"]
c.evaluation, c.render, c.evaluation_interval = True, False, a["eval_interval"]
c.evaluation_episodes, c.evaluation_deterministic_actions = a["test_episodes"], True
c.loggers, c.create_json, c.save_folder = ["csv"], False, a["folder"]
c.checkpoint_interval, c.checkpoint_at_end = 0, False
exp = Experiment(task=task, algorithm_config=algo, model_config=model, critic_model_config=critic,
                 seed=a["seed"], config=c)
t_run = time.perf_counter()
exp.run()
end = time.perf_counter()
scalars = next(p for p in __import__("pathlib").Path(a["folder"]).rglob("scalars") if p.is_dir())
def col(name):
    with open(scalars / f"{name}.csv") as f:
        return [float(row[1]) for row in csv.reader(f) if row]
print(json.dumps({
    "process_s": end - t_start, "run_s": end - t_run,
    "collection_s": sum(col("timers_collection_time")), "training_s": sum(col("timers_training_time")),
    "evaluation_s": sum(col("timers_evaluation_time")), "iterations": len(col("counters_total_frames")),
    "versions": {"benchmarl": benchmarl.__version__ if hasattr(benchmarl, "__version__") else None,
                 "torchrl": torchrl.__version__, "tensordict": tensordict.__version__, "torch": torch.__version__,
                 "pettingzoo": pettingzoo.__version__}}))
'''


def benchmarl_tests(folder: Path, eval_interval: int) -> tuple[list[dict[str, Any]], float]:
    """BenchMARL's test phases from its csv logger: rows are (iteration, value). It tests after the first iteration
    too (n_iters_performed == 0), then at every multiple of evaluation_interval; the first is kept, marked. Its
    eval episode_reward is the mean over the group's 3 agents of each agent's summed reward: x 3 is the team sum.
    Also the team return of the last ~100 training episodes (its collection episode_reward, the same mean x 3; an
    off-policy iteration has 240 episodes, the fewest it gives)."""
    scalars = next(p for p in folder.rglob("scalars") if p.is_dir())

    def rows(name: str) -> dict[int, float]:
        lines = (scalars / f"{name}.csv").read_text().split()
        return {int(float(line.split(",")[0])): float(line.split(",")[1]) for line in lines if line}

    frames = rows("counters_total_frames")
    collection = rows("collection_agent_reward_episode_reward_mean")
    episodes = frames[min(frames)] / 25  # episodes an iteration (25 steps each)
    iterations = max(1, round(100 / episodes))  # the last ~100 episodes as rlcli's (on-policy 3 x 32; off-policy 240)
    last = [collection[it] for it in sorted(collection)[-iterations:]]
    tests = []
    for it, per_agent in sorted(rows("eval_agent_reward_episode_reward_mean").items()):
        tests.append({"iteration": it, "team_steps": frames[it], "per_agent_mean": per_agent,
                      "team_sum_mean": N_AGENTS * per_agent, "scheduled": frames[it] % eval_interval == 0})
    return tests, N_AGENTS * float(np.mean(last))


def rlcli_train_return(run_dir: Path) -> float:
    """rlcli's last `rollout/return_mean` in train.log: the team sum over the last 100 training episodes."""
    lines = [line for line in (run_dir / "train.log").read_text().splitlines() if "| return " in line]
    return float(lines[-1].split("| return ")[1].split()[0])


def run(cmd: list[str], log: Path) -> float:
    """Run one command (its output to `log`), return its wall seconds; a failure stops the script."""
    print("$", " ".join("<BENCHMARL_SIDE>" if arg == BENCHMARL_SIDE else arg for arg in cmd), flush=True)
    start = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"exit code {code} after {wall:.0f} s: {' '.join(cmd[:3])} ... (see {log})")
    print(f"  {wall:.1f} s", flush=True)
    return wall


def t_half(values: list[float]) -> float:
    """95% CI half-width with Student's t."""
    t975 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}
    n = len(values)
    return t975.get(n, 1.96) * float(np.std(values, ddof=1)) / math.sqrt(n) if n > 1 else 0.0


def ci(values: list[float]) -> dict[str, Any]:
    return {"mean": float(np.mean(values)), "ci95": t_half(values), "values": list(values)}


def fmt(c: dict[str, Any] | None, digits: int = 1) -> str:
    return "-" if c is None else f"{c['mean']:.{digits}f} ± {c['ci95']:.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/benchmarl_compare"))
    p.add_argument("--bm-python", help="a python with benchmarl 1.5.2 (its own venv); without it rlcli only")
    p.add_argument("--team-steps", type=int, default=40000, help="steps of the whole team per run (a multiple of "
                                                                "--copies x --n-steps)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--algos", nargs="+", default=list(ALGOS))
    p.add_argument("--sides", nargs="+", default=["rlcli", "benchmarl"])
    p.add_argument("--copies", type=int, default=16, help="copies of the env (rlcli: 3 x this rows)")
    p.add_argument("--n-steps", type=int, default=50, help="steps of each copy per update")
    p.add_argument("--minibatch", type=int, default=400, help="team steps a minibatch (rlcli: 3 x this rows)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    p.add_argument("--lr", type=float, default=7e-4)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--clip", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--test-episodes", type=int, default=10)
    off = p.add_argument_group("masac, maddpg (continuous simple_spread), qmix, vdn, iql (discrete): BenchMARL's "
                               "off-policy defaults but lr")
    off.add_argument("--off-copies", type=int, default=10, help="copies of the env (rlcli: one row each in joint mode, "
                                                                     "3 for iql's rows)")
    off.add_argument("--off-steps", type=int, default=600, help="steps of each copy between update phases")
    off.add_argument("--off-gradient-steps", type=int, default=1000, help="gradient steps an update phase")
    off.add_argument("--off-batch", type=int, default=128, help="team transitions a gradient step")
    off.add_argument("--off-lr", type=float, default=3e-4, help="both sides (BenchMARL's default 5e-5 is for "
                                                                 "millions of frames)")
    off.add_argument("--off-sigma", type=float, nargs=2, default=[0.8, 0.01],
                     help="MADDPG's exploration std in action units ([0, 1]), annealed over the first third")
    off.add_argument("--eps", type=float, nargs=2, default=[0.8, 0.01],
                     help="QMIX, VDN and IQL's epsilon, annealed over the first third (BenchMARL's defaults)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run, one seed: 1,600 team steps; with off-policy algorithms 1,200 (2 phases of "
                        "--off-copies x 60 steps, 100 gradient steps each: the full run's ratio), 4,800 with both")
    args = p.parse_args()
    if unknown := sorted(set(args.algos) - set(ALGOS) - set(OFF_POLICY) - set(VALUE)):
        raise SystemExit(f"--algos: {unknown} unknown; choose from {ALGOS + OFF_POLICY + VALUE}")
    off_algos = [a for a in args.algos if a in OFF_POLICY + VALUE]
    if args.quick:
        args.seeds = [0]
        if off_algos:
            args.off_steps, args.off_gradient_steps = 60, 100
        args.team_steps = 4800 if off_algos and len(off_algos) < len(args.algos) else 1200 if off_algos else 1600
        if args.work == Path("/tmp/benchmarl_compare"):
            args.work = Path("/tmp/benchmarl_compare_quick")
    batch = args.copies * args.n_steps  # team steps per update
    off_batch = args.off_copies * args.off_steps
    if any(a in ALGOS for a in args.algos) and (args.team_steps % (2 * batch) or batch % args.minibatch):
        raise SystemExit(f"--team-steps must be a multiple of 2 x {batch} and {batch} of --minibatch")
    if off_algos and args.team_steps % (2 * off_batch):
        raise SystemExit(f"--team-steps must be a multiple of 2 x {off_batch} (--off-copies x --off-steps)")
    eval_interval = args.team_steps // 2
    work = args.work
    (work / "logs").mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                       "load_at_start": list(os.getloadavg())},
                           "units": "team steps (one step of all 3 agents); returns are team sums", "runs": {}}
    hidden = "[" + ",".join(map(str, args.hidden)) + "]"

    def rlcli(algo: str, seed: int) -> dict[str, Any]:
        res_path = work / "rlcli" / f"{algo}_seed{seed}.json"
        if not res_path.exists():
            d = work / "rlcli" / f"{algo}_seed{seed}"
            shutil.rmtree(d, ignore_errors=True)
            common = [str(BIN / "rl-train"), f"algo={RLCLI_ALGO.get(algo, algo)}", "env=simple_spread_v3",
                      f"seed={seed}",
                      "torch_threads=1", "log.tensorboard=false", "log.console=false", "env.agent_id=false",
                      f"actor.hidden_sizes={hidden}", "actor.activation=tanh", "actor.ortho_init=false",
                      f"train.test_episodes={args.test_episodes}", "train.stop_reward=null",
                      f"algo.gamma={args.gamma}", "algo.max_grad_norm=5.0", f"hydra.run.dir={d}"]
            if algo in OFF_POLICY:  # joint mode: a row is a copy of the env, a step of the team
                rows = 1
                sigma, sigma_end = args.off_sigma
                cmd = [*common, "env.kwargs.continuous_actions=true", f"train.num_envs={args.off_copies}",
                       f"train.total_steps={args.team_steps}", f"train.test_every={eval_interval}",
                       "algo.learning_starts=0", f"algo.train_freq={args.off_steps}",
                       f"algo.gradient_steps={args.off_gradient_steps}", f"algo.batch_size={args.off_batch}",
                       f"algo.lr={args.off_lr}", "buffer.capacity=1000000"]
                if algo == "maddpg":  # BenchMARL's additive Gaussian noise: sigma in [0, 1] units is 2 x in rlcli's
                    cmd += [f"algo.noise_std={2 * sigma}",  # [-1, 1], annealed linearly over a third of the run
                            f"algo.schedules.noise_scale=linear:1.0:{sigma_end / sigma}:0.3333333"]
            elif algo in VALUE:  # qmix, vdn: joint mode (a row a copy of the env); iql: rlcli's dqn in row mode
                rows = N_AGENTS if algo == "iql" else 1
                eps, eps_end = args.eps
                cmd = [*common, f"train.num_envs={rows * args.off_copies}",
                       f"train.total_steps={rows * args.team_steps}", f"train.test_every={rows * eval_interval}",
                       "algo.learning_starts=0",
                       f"algo.train_freq={args.off_steps}", f"algo.gradient_steps={args.off_gradient_steps}",
                       f"algo.batch_size={rows * args.off_batch}", f"algo.lr={args.off_lr}",
                       f"buffer.capacity={rows * 1_000_000}",
                       # torchrl's target: the target network picks and values the next actions; squared error
                       "algo.double=false", "algo.loss=mse",
                       # its soft update after every optimizer step
                       "algo.tau=0.005", "algo.target_update_interval=1", "algo.target_update_unit=gradient_step",
                       # its epsilon per agent, annealed over a third of the frames, set after each iteration (rlcli:
                       # before each collect phase, at the progress then: the same values at the same frames)
                       f"algo.exploration_initial_eps={eps}", f"algo.exploration_final_eps={eps_end}",
                       f"algo.exploration_fraction={1 / 3}"]
                if algo != "iql":  # BenchMARL's QMIX and VDN learn the mean of the agents' rewards; rlcli's the sum
                    cmd.append(f"algo.reward_scale={1 / N_AGENTS}")
                if algo == "qmix":  # torchrl's QMixer: embed 32, one linear layer per weights' hypernetwork
                    cmd += ["algo.mixer_embed_dim=32", "algo.hypernet_layers=1"]
            else:  # row mode: a row is an agent
                rows = N_AGENTS
                cmd = [*common, "actor.shared=false", f"train.num_envs={N_AGENTS * args.copies}",
                       f"train.total_steps={N_AGENTS * args.team_steps}",
                       f"train.test_every={N_AGENTS * eval_interval}",
                       f"algo.n_steps={args.n_steps}", f"algo.batch_size={N_AGENTS * args.minibatch}",
                       f"algo.n_epochs={args.epochs}", f"algo.lr={args.lr}",
                       f"algo.gae_lambda={args.gae_lambda}", f"algo.clip_range={args.clip}",
                       f"algo.ent_coef={args.ent_coef}", "algo.vf_coef=1.0",
                       "algo.normalize_advantage=false", "algo.lr_schedule=constant", "algo.target_kl=null"]
            wall = run(cmd, work / "logs" / f"rlcli_{algo}_seed{seed}.log")
            records = [json.loads(line) for line in (d / "eval.jsonl").read_text().splitlines() if line.strip()]
            tests = [{"team_steps": r["env_steps"] / rows, "team_sum_mean": float(np.mean(r["returns"])),
                      "returns": r["returns"]} for r in records]
            res_path.write_text(json.dumps({"tests": tests, "process_s": wall, "cmd": cmd}))
        result = json.loads(res_path.read_text())
        result["train_return_last"] = rlcli_train_return(work / "rlcli" / f"{algo}_seed{seed}")
        return result

    def benchmarl(algo: str, seed: int) -> dict[str, Any]:
        res_path = work / "benchmarl" / f"{algo}_seed{seed}.json"
        if not res_path.exists():
            folder = work / "benchmarl" / f"{algo}_seed{seed}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            spec = {"algo": algo, "seed": seed, "team_steps": args.team_steps, "frames_per_batch": batch,
                    "n_envs": args.copies, "minibatch": args.minibatch, "gradient_steps": args.off_gradient_steps,
                    "batch": args.off_batch, "sigma": (args.eps if algo in VALUE else args.off_sigma)[0],
                    "sigma_end": (args.eps if algo in VALUE else args.off_sigma)[1],
                    "minibatch_iters": args.epochs * batch // args.minibatch, "hidden": args.hidden, "lr": args.lr,
                    "gamma": args.gamma, "gae_lambda": args.gae_lambda, "clip": args.clip,
                    "ent_coef": args.ent_coef, "eval_interval": eval_interval,
                    "test_episodes": args.test_episodes, "folder": str(folder)}
            if algo in OFF_POLICY + VALUE:
                spec.update(frames_per_batch=off_batch, n_envs=args.off_copies, lr=args.off_lr)
            log = work / "logs" / f"benchmarl_{algo}_seed{seed}.log"
            wall = run([args.bm_python, "-c", BENCHMARL_SIDE, json.dumps(spec)], log)
            result = json.loads(log.read_text().strip().splitlines()[-1])
            result.update(wall_s=wall, spec=spec)
            res_path.write_text(json.dumps(result))
        result = json.loads(res_path.read_text())
        folder = work / "benchmarl" / f"{algo}_seed{seed}"
        all_tests, result["train_return_last"] = benchmarl_tests(folder, eval_interval)
        result["first_iteration_test"] = all_tests[0]
        result["tests"] = [t for t in all_tests if t["scheduled"]]  # the middle and the end, as rlcli's
        return result

    (work / "rlcli").mkdir(exist_ok=True)
    (work / "benchmarl").mkdir(exist_ok=True)
    for seed in args.seeds:  # seeds outside: a budget cut short still has every algorithm's first seeds
        for algo in args.algos:
            if "rlcli" in args.sides:
                out["runs"][f"rlcli/{algo}/{seed}"] = rlcli(algo, seed)
            if "benchmarl" in args.sides and args.bm_python:
                out["runs"][f"benchmarl/{algo}/{seed}"] = benchmarl(algo, seed)
    out["machine"]["load_at_end"] = list(os.getloadavg())

    table: dict[str, Any] = {}
    for algo in args.algos:
        for side in ("rlcli", "benchmarl"):
            per = [out["runs"][k] for k in (f"{side}/{algo}/{s}" for s in args.seeds) if k in out["runs"]]
            if not per:
                continue
            walls = [r.get("wall_s", r["process_s"]) for r in per]
            table[f"{side}/{algo}"] = {
                "final_team_return": ci([r["tests"][-1]["team_sum_mean"] for r in per]),
                "mid_team_return": ci([r["tests"][0]["team_sum_mean"] for r in per]),
                "train_team_return": ci([r["train_return_last"] for r in per]),
                "final_team_steps": [r["tests"][-1]["team_steps"] for r in per],
                "wall_s": ci(walls)}
    out["table"] = table

    print(f"\nsimple_spread, {args.team_steps:,} team steps a run ({N_AGENTS * args.team_steps:,} agent steps), "
          f"seeds {args.seeds}; returns are team sums over the 3 agents, mean ± 95% t-interval over seeds\n")
    print("| algorithm | side | test at half | final test | per seed (final) | last ~100 training episodes |"
          " wall s a run |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for key, row in table.items():
        side, algo = key.split("/")
        seeds = ", ".join(f"{v:.1f}" for v in row["final_team_return"]["values"])
        print(f"| {algo} | {side} | {fmt(row['mid_team_return'])} | {fmt(row['final_team_return'])} | {seeds} |"
              f" {fmt(row['train_team_return'])} | {fmt(row['wall_s'], 0)} |")
    for algo in args.algos:
        a, b = table.get(f"rlcli/{algo}"), table.get(f"benchmarl/{algo}")
        if a and b:
            print(f"\n{algo}: wall time rlcli / BenchMARL = {a['wall_s']['mean'] / b['wall_s']['mean']:.2f}")
    (work / "benchmarl_compare.json").write_text(json.dumps(out, indent=1, default=str))
    print(f"\n{work / 'benchmarl_compare.json'}")


if __name__ == "__main__":
    main()
