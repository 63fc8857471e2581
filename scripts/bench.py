"""rlcli against Stable-Baselines3, side by side on this machine, plus the floor no framework can beat.

    pip install -e '.[bench]'
    python scripts/bench.py --rows ppo sac dqn --seeds 1 2 3 4 5 --out bench.json

Each measurement is a fresh process (`--worker`), so imports, caches and allocator state never carry
over; rlcli and SB3 alternate (rlcli, SB3, rlcli, SB3, ...) seed by seed, so the machine's drift hits
both alike. Both sides get the same hyperparameters, network sizes, torch thread count and number of
env steps; training time is the training call only (imports, env and network construction
excluded) and the final return is a deterministic test of 10 episodes after training. The floor row
for each algorithm is the same number of env steps with random actions through the same vector env,
plus the same number of gradient steps of the same networks in a bare torch loop on random data.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROWS: dict[str, dict[str, Any]] = {
    # RL-Zoo's ppo.yml CartPole-v1 (rlcli's tuned config is the same, see conf/tuned/ppo/CartPole-v1.yaml)
    "ppo": {"env": "CartPole-v1", "steps": 100_000, "rlcli": ["algo=ppo", "env=CartPole-v1"]},
    "sac": {"env": "Pendulum-v1", "steps": 20_000, "rlcli": [
        "algo=sac", "env=Pendulum-v1", "algo.lr=1e-3", "algo.batch_size=256", "actor.hidden_sizes=[256,256]",
        "algo.learning_starts=256", "train.num_envs=1", "buffer.capacity=1000000"]},
    # RL-Zoo's dqn.yml CartPole-v1 (= conf/tuned/dqn/CartPole-v1.yaml)
    "dqn": {"env": "CartPole-v1", "steps": 50_000, "rlcli": ["algo=dqn", "env=CartPole-v1"]},
    # against sb3-contrib (no floor rows): RL-Zoo's tqc.yml Pendulum (= conf/tuned/tqc/Pendulum-v1.yaml, no gSDE)
    "tqc": {"env": "Pendulum-v1", "steps": 20_000, "floor": False, "rlcli": ["algo=tqc", "env=Pendulum-v1"]},
    # RL-Zoo's qrdqn.yml CartPole-v1 (= conf/tuned/qrdqn/CartPole-v1.yaml)
    "qrdqn": {"env": "CartPole-v1", "steps": 50_000, "floor": False, "rlcli": ["algo=qrdqn", "env=CartPole-v1"]},
    # RL-Zoo's trpo.yml CartPole-v1 (= conf/tuned/trpo/CartPole-v1.yaml)
    "trpo": {"env": "CartPole-v1", "steps": 100_000, "floor": False, "rlcli": ["algo=trpo", "env=CartPole-v1"]},
    # RL-Zoo's crossq.yml Pendulum-v1 (= conf/tuned/crossq/Pendulum-v1.yaml)
    "crossq": {"env": "Pendulum-v1", "steps": 20_000, "floor": False, "rlcli": ["algo=crossq", "env=Pendulum-v1"]},
    # rlcli's masking task with its tuned settings (conf/tuned/maskable_ppo/ValidMoves-v0.yaml), the mask
    # from the env's action_masks() on both sides
    "maskable_ppo": {"env": "ValidMoves-v0", "steps": 20_480, "floor": False,
                     "rlcli": ["algo=maskable_ppo", "env=ValidMoves-v0"]},
    # compile=true (compiled.py) against the same SB3 run as "ppo"; with --cold-cache each rlcli run compiles
    # from an empty torch.compile cache, else the cache of the runs before it is warm
    "ppo_compile": {"env": "CartPole-v1", "steps": 100_000, "floor": False, "sb3": "ppo",
                    "rlcli": ["algo=ppo", "env=CartPole-v1", "compile=true"]},
    "dqn_compile": {"env": "CartPole-v1", "steps": 50_000, "floor": False, "sb3": "dqn",
                    "rlcli": ["algo=dqn", "env=CartPole-v1", "compile=true"]},
    "qrdqn_compile": {"env": "CartPole-v1", "steps": 50_000, "floor": False, "sb3": "qrdqn",
                      "rlcli": ["algo=qrdqn", "env=CartPole-v1", "compile=true"]},
    "sac_compile": {"env": "Pendulum-v1", "steps": 20_000, "floor": False, "sb3": "sac", "rlcli": [
        "algo=sac", "env=Pendulum-v1", "algo.lr=1e-3", "algo.batch_size=256", "actor.hidden_sizes=[256,256]",
        "algo.learning_starts=256", "train.num_envs=1", "buffer.capacity=1000000", "compile=true"]},
    # RL-Zoo's td3.yml Pendulum-v1 (= conf/tuned/td3/Pendulum-v1.yaml: [400, 300], learning_starts 10k)
    "td3": {"env": "Pendulum-v1", "steps": 20_000, "floor": False, "rlcli": ["algo=td3", "env=Pendulum-v1"]},
    "td3_compile": {"env": "Pendulum-v1", "steps": 20_000, "floor": False, "sb3": "td3",
                    "rlcli": ["algo=td3", "env=Pendulum-v1", "compile=true"]},
    "crossq_compile": {"env": "Pendulum-v1", "steps": 20_000, "floor": False, "sb3": "crossq",
                       "rlcli": ["algo=crossq", "env=Pendulum-v1", "compile=true"]},
    "trpo_compile": {"env": "CartPole-v1", "steps": 100_000, "floor": False, "sb3": "trpo",
                     "rlcli": ["algo=trpo", "env=CartPole-v1", "compile=true"]},
    # RL-Zoo's a2c.yml CartPole-v1 (= conf/tuned/a2c/CartPole-v1.yaml: 8 envs, RMSprop, one step per 40 env steps)
    "a2c": {"env": "CartPole-v1", "steps": 100_000, "floor": False, "rlcli": ["algo=a2c", "env=CartPole-v1"]},
    "a2c_compile": {"env": "CartPole-v1", "steps": 100_000, "floor": False, "sb3": "a2c",
                    "rlcli": ["algo=a2c", "env=CartPole-v1", "compile=true"]},
    # train.vector_mode=envpool (EnvPool's C++ envs; pip install -e '.[envpool]') against the same SB3 run
    "ppo_envpool": {"env": "CartPole-v1", "steps": 100_000, "floor": False, "sb3": "ppo",
                    "rlcli": ["algo=ppo", "env=CartPole-v1", "train.vector_mode=envpool"]},
    "ppo_1m": {"env": "CartPole-v1", "steps": 1_000_000, "floor": False, "sb3": "ppo",
               "rlcli": ["algo=ppo", "env=CartPole-v1", "train.total_steps=1000000"]},
    "ppo_1m_compile": {"env": "CartPole-v1", "steps": 1_000_000, "floor": False, "sb3": "ppo",
                       "rlcli": ["algo=ppo", "env=CartPole-v1", "train.total_steps=1000000", "compile=true"]},
}


# ------------------------------------------------------------------------------------------ workers
def run_rlcli(row: str, seed: int, steps: int, threads: int) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir

    from rlcli.run.compose import conf_dir
    from rlcli.run.state import prepare
    from rlcli.run.trainer import Trainer

    spec = ROWS[row]
    overrides = [*spec["rlcli"], f"seed={seed}", f"train.total_steps={steps}", f"torch_threads={threads}",
                 f"train.test_every={steps}", "train.test_episodes=10", "train.stop_reward=null",
                 "log.console=false", "log.tensorboard=false", "device=cpu"]
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3", job_name="bench"):
        cfg = compose("config", overrides=overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        components, state = prepare(cfg)
        trainer = Trainer(components, Path(run_dir), state)
        algo = components.algo
        optimizer = (algo.critic_optimizer if ROWS[row].get("sb3", row) in ("sac", "tqc", "crossq", "td3")
                     else algo.value_optimizer if ROWS[row].get("sb3", row) == "trpo" else algo.optimizer)
        counter = {"n": 0}
        step = optimizer.step

        def counted_step(*args: Any, **kwargs: Any) -> Any:
            counter["n"] += 1
            return step(*args, **kwargs)

        optimizer.step = counted_step
        start = time.perf_counter()
        trainer.run()
        wall = time.perf_counter() - start
        from rlcli.algos.loss_step import loss_steps

        learning = loss_steps(algo)  # the critics' and the policy's steps: the critics' (the first) is counted
        compiled = learning[0] if learning and learning[0].compiled is not None else None
        if compiled is not None:  # the compiled step writes the optimizer's state itself: count its steps
            counter["n"] = int(next(iter(optimizer.state.values()))["step"])
    seconds = components.clock.totals()
    train_s = wall - seconds["test"]  # the final test is timed apart, as for SB3
    return {"train_s": train_s, "env_steps": trainer.state.env_steps, "grad_steps": counter["n"],
            "final_return": trainer.state.last_test_return,
            "compile_s": None if compiled is None else compiled.compile_seconds,
            "phases": {k: round(v, 3) for k, v in seconds.items()}}


def run_sb3(row: str, seed: int, steps: int, threads: int) -> dict[str, Any]:
    import numpy as np
    import torch
    from stable_baselines3 import A2C, DQN, PPO, SAC, TD3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.noise import NormalActionNoise

    if threads > 0:  # 0: torch's default (every core), what an SB3 user gets without setting anything
        torch.set_num_threads(threads)
    env_id = ROWS[row]["env"]
    row = ROWS[row].get("sb3", row)  # rlcli variants of a row run against the same SB3 configuration
    evaluate = evaluate_policy
    if row == "ppo":
        env = make_vec_env(env_id, n_envs=8, seed=seed)
        model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, n_epochs=20, gae_lambda=0.8, gamma=0.98,
                    ent_coef=0.0, learning_rate=lambda f: 1e-3 * f, clip_range=lambda f: 0.2 * f, seed=seed,
                    device="cpu")
    elif row == "sac":
        env = make_vec_env(env_id, n_envs=1, seed=seed)
        model = SAC("MlpPolicy", env, learning_rate=1e-3, batch_size=256, train_freq=1, gradient_steps=1,
                    learning_starts=256, policy_kwargs={"net_arch": [256, 256]}, seed=seed, device="cpu")
    elif row == "td3":
        env = make_vec_env(env_id, n_envs=1, seed=seed)
        noise = NormalActionNoise(mean=np.zeros(1), sigma=0.1 * np.ones(1))
        model = TD3("MlpPolicy", env, gamma=0.98, buffer_size=200_000, learning_starts=10_000, action_noise=noise,
                    gradient_steps=1, train_freq=1, learning_rate=1e-3, policy_kwargs={"net_arch": [400, 300]},
                    seed=seed, device="cpu")
    elif row == "a2c":
        env = make_vec_env(env_id, n_envs=8, seed=seed)
        model = A2C("MlpPolicy", env, ent_coef=0.0, seed=seed, device="cpu")
    elif row == "tqc":
        from sb3_contrib import TQC

        env = make_vec_env(env_id, n_envs=1, seed=seed)
        model = TQC("MlpPolicy", env, learning_rate=1e-3, batch_size=256, train_freq=64, gradient_steps=64,
                    learning_starts=100, top_quantiles_to_drop_per_net=2,
                    policy_kwargs={"net_arch": [64, 64], "n_critics": 2, "n_quantiles": 25}, seed=seed, device="cpu")
    elif row == "qrdqn":
        from sb3_contrib import QRDQN

        env = make_vec_env(env_id, n_envs=1, seed=seed)
        model = QRDQN("MlpPolicy", env, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                      learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                      exploration_fraction=0.16, exploration_final_eps=0.04,
                      policy_kwargs={"net_arch": [256, 256], "n_quantiles": 10}, seed=seed, device="cpu")
    elif row == "trpo":
        from sb3_contrib import TRPO

        env = make_vec_env(env_id, n_envs=2, seed=seed)
        model = TRPO("MlpPolicy", env, n_steps=512, batch_size=512, cg_damping=1e-3, gae_lambda=0.98, gamma=0.99,
                     learning_rate=1e-3, n_critic_updates=20, seed=seed, device="cpu")
    elif row == "crossq":
        from sb3_contrib import CrossQ

        env = make_vec_env(env_id, n_envs=1, seed=seed)
        model = CrossQ("MlpPolicy", env, policy_delay=2, policy_kwargs={"net_arch": [256, 256]}, seed=seed,
                       device="cpu")
    elif row == "maskable_ppo":
        from sb3_contrib import MaskablePPO
        from sb3_contrib.common.maskable.evaluation import evaluate_policy as evaluate

        import rlcli.envs  # noqa: F401  (registers ValidMoves-v0)

        env = make_vec_env(env_id, n_envs=8, seed=seed)
        model = MaskablePPO("MlpPolicy", env, n_steps=128, batch_size=256, n_epochs=4, learning_rate=1e-3,
                            seed=seed, device="cpu")
    else:
        env = make_vec_env(env_id, n_envs=1, seed=seed)
        model = DQN("MlpPolicy", env, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                    learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                    exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs={"net_arch": [256, 256]},
                    seed=seed, device="cpu")
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    train_s = time.perf_counter() - start
    test_env = make_vec_env(env_id, n_envs=1, seed=seed + 100_003)
    mean, _ = evaluate(model, test_env, n_eval_episodes=10, deterministic=True)
    per_update = {"ppo": 32 * 8 // 256, "trpo": 20 * (512 * 2 // 512), "maskable_ppo": 128 * 8 // 256}
    grad_steps = model._n_updates * per_update.get(row, 1)
    return {"train_s": train_s, "env_steps": int(model.num_timesteps), "grad_steps": int(grad_steps),
            "final_return": float(mean)}


def run_floor(row: str, seed: int, steps: int, threads: int, grad_steps: int) -> dict[str, Any]:
    """Random actions through rlcli's vector env + a bare torch loop of the same gradient steps."""
    import numpy as np
    import torch
    from torch import nn

    from rlcli.envs import GymEnvFactory

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    num_envs = 8 if row == "ppo" else 1
    envs = GymEnvFactory(id=ROWS[row]["env"]).make(num_envs, "auto", gamma=0.99)
    envs.reset(seed=seed)
    space = envs.single_action_space
    rng = np.random.default_rng(seed)
    n_vec_steps = steps // num_envs
    if row == "sac":
        actions = rng.uniform(space.low, space.high, size=(n_vec_steps, num_envs, *space.shape)).astype(np.float32)
    else:
        actions = rng.integers(0, space.n, size=(n_vec_steps, num_envs))
    start = time.perf_counter()
    for t in range(n_vec_steps):
        envs.step(actions[t])
    env_s = time.perf_counter() - start
    envs.close()

    obs_dim = int(np.prod(envs.single_observation_space.shape))

    def net(sizes: list[int], act: type[nn.Module]) -> nn.Sequential:
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), act()]
        return nn.Sequential(*layers[:-1])

    if row == "ppo":  # actor and critic 64-64 tanh, clipped surrogate + value loss, batch 256
        pi, v = net([obs_dim, 64, 64, 2], nn.Tanh), net([obs_dim, 64, 64, 1], nn.Tanh)
        params = [*pi.parameters(), *v.parameters()]
        opt = torch.optim.Adam(params, lr=1e-3, eps=1e-5, fused=True)
        obs, act = torch.randn(256, obs_dim), torch.randint(0, 2, (256,))
        old_logp, adv, ret = -torch.rand(256), torch.randn(256), torch.randn(256)

        def step() -> None:
            logp_all = torch.log_softmax(pi(obs), -1)
            logp = logp_all.gather(1, act[:, None]).squeeze(1)
            ratio = (logp - old_logp).exp()
            a = (adv - adv.mean()) / (adv.std() + 1e-8)
            loss = -torch.min(a * ratio, a * ratio.clamp(0.8, 1.2)).mean()
            loss = loss + 0.5 * (v(obs).squeeze(1) - ret).square().mean()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(params, 0.5, foreach=True)
            opt.step()
    elif row == "dqn":  # Q 256-256 relu, batch 64, target net, Huber loss
        q, q_target = net([obs_dim, 256, 256, 2], nn.ReLU), net([obs_dim, 256, 256, 2], nn.ReLU)
        opt = torch.optim.Adam(q.parameters(), lr=2.3e-3, fused=True)
        obs, nxt, act = torch.randn(64, obs_dim), torch.randn(64, obs_dim), torch.randint(0, 2, (64,))
        rew, done = torch.randn(64), torch.zeros(64)

        def step() -> None:
            with torch.no_grad():
                target = rew + 0.99 * (1 - done) * q_target(nxt).max(1).values
            loss = nn.functional.smooth_l1_loss(q(obs).gather(1, act[:, None]).squeeze(1), target)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(q.parameters(), 10.0, foreach=True)
            opt.step()
    else:  # SAC: squashed Gaussian actor, twin critics 256-256 relu, auto entropy, Polyak targets
        act_dim = int(np.prod(space.shape))
        actor = net([obs_dim, 256, 256, 2 * act_dim], nn.ReLU)
        critics = nn.ModuleList(net([obs_dim + act_dim, 256, 256, 1], nn.ReLU) for _ in range(2))
        targets = nn.ModuleList(net([obs_dim + act_dim, 256, 256, 1], nn.ReLU) for _ in range(2))
        targets.load_state_dict(critics.state_dict())
        log_alpha = torch.zeros(1, requires_grad=True)
        opt_pi = torch.optim.Adam(actor.parameters(), lr=1e-3, fused=True)
        opt_q = torch.optim.Adam(critics.parameters(), lr=1e-3, fused=True)
        opt_a = torch.optim.Adam([log_alpha], lr=1e-3, fused=True)
        obs, nxt = torch.randn(256, obs_dim), torch.randn(256, obs_dim)
        act, rew, done = torch.rand(256, act_dim) * 2 - 1, torch.randn(256), torch.zeros(256)

        def sample(o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            mean, log_std = actor(o).chunk(2, -1)
            std = log_std.clamp(-20, 2).exp()
            u = mean + std * torch.randn_like(mean)
            a = torch.tanh(u)
            logp = (-0.5 * ((u - mean) / std).square() - std.log() - 0.9189385).sum(-1)
            return a, logp - (2 * (0.6931472 - u - nn.functional.softplus(-2 * u))).sum(-1)

        def step() -> None:
            alpha = log_alpha.exp().detach()
            with torch.no_grad():
                a2, logp2 = sample(nxt)
                x2 = torch.cat([nxt, a2], -1)
                q2 = torch.min(targets[0](x2), targets[1](x2)).squeeze(-1) - alpha * logp2
                y = rew + 0.99 * (1 - done) * q2
            x = torch.cat([obs, act], -1)
            q_loss = sum(0.5 * (c(x).squeeze(-1) - y).square().mean() for c in critics)
            opt_q.zero_grad()
            q_loss.backward()
            opt_q.step()
            a, logp = sample(obs)
            xa = torch.cat([obs, a], -1)
            pi_loss = (alpha * logp - torch.min(critics[0](xa), critics[1](xa)).squeeze(-1)).mean()
            opt_pi.zero_grad()
            pi_loss.backward()
            opt_pi.step()
            a_loss = -(log_alpha * (logp.detach() - act_dim)).mean()
            opt_a.zero_grad()
            a_loss.backward()
            opt_a.step()
            with torch.no_grad():
                torch._foreach_lerp_(list(targets.parameters()), list(critics.parameters()), 0.005)

    for _ in range(20):
        step()
    start = time.perf_counter()
    for _ in range(grad_steps):
        step()
    update_s = time.perf_counter() - start
    return {"train_s": env_s + update_s, "env_s": env_s, "update_s": update_s, "env_steps": n_vec_steps * num_envs,
            "grad_steps": grad_steps, "final_return": None}


# ------------------------------------------------------------------------------------------ driver
def measure(side: str, row: str, seed: int, steps: int, threads: int, grad_steps: int = 0,
            cold_cache: bool = False) -> dict[str, Any]:
    """One worker process; `process_s` is its whole wall time (imports, building, compiling, training)."""
    cmd = [sys.executable, __file__, "--worker", side, "--row", row, "--seed", str(seed), "--steps", str(steps),
           "--threads", str(threads), "--grad-steps", str(grad_steps)]
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as empty_cache:
        if cold_cache:
            env["TORCHINDUCTOR_CACHE_DIR"] = empty_cache
        started = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        process_s = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"bench: {side} {row} seed {seed} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result.update(side=side, row=row, seed=seed, process_s=process_s)
    result["sps"] = result["env_steps"] / result["train_s"]
    result["grad_steps_per_s"] = result["grad_steps"] / result["train_s"]
    compiled = f"  compile {result['compile_s']:.1f} s" if result.get("compile_s") else ""
    print(f"  {row:4} seed {seed} {side:6} {result['train_s']:7.1f} s (process {process_s:.1f} s){compiled}  "
          f"{result['sps']:8.0f} SPS  "
          f"{result['grad_steps_per_s']:7.0f} grad/s  return {result['final_return']}", file=sys.stderr, flush=True)
    return result


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def versions() -> dict[str, str]:
    import gymnasium
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__, "gymnasium": gymnasium.__version__}
    try:
        import stable_baselines3

        found["stable_baselines3"] = stable_baselines3.__version__
    except ImportError:
        found["stable_baselines3"] = "not installed"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=["ppo", "sac", "dqn"], choices=sorted(ROWS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    parser.add_argument("--steps", type=int, default=0, help="env steps per run (default: each row's own)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, the same for both sides")
    parser.add_argument("--sb3-threads", type=int, default=None,
                        help="torch threads for SB3 only (0: torch's default, SB3's out-of-the-box setting)")
    parser.add_argument("--no-floor", action="store_true", help="skip the floor runs")
    parser.add_argument("--cold-cache", action="store_true",
                        help="every rlcli run starts from an empty torch.compile cache (compile rows)")
    parser.add_argument("--out", type=Path, default=Path("bench.json"))
    parser.add_argument("--worker", choices=["rlcli", "sb3", "floor"], help=argparse.SUPPRESS)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--grad-steps", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        run = {"rlcli": run_rlcli, "sb3": run_sb3}.get(args.worker)
        result = (run(args.row, args.seed, args.steps, args.threads) if run else
                  run_floor(args.row, args.seed, args.steps, args.threads, args.grad_steps))
        print(json.dumps(result))
        return

    results = []
    for seed in args.seeds:
        for row in args.rows:
            steps = args.steps or ROWS[row]["steps"]
            ours = measure("rlcli", row, seed, steps, args.threads, cold_cache=args.cold_cache)
            sb3_threads = args.threads if args.sb3_threads is None else args.sb3_threads
            theirs = measure("sb3", row, seed, steps, sb3_threads)
            results += [ours, theirs]
            if not args.no_floor and ROWS[row].get("floor", True):
                results.append(measure("floor", row, seed, steps, args.threads, grad_steps=ours["grad_steps"]))

    summary = {}
    from rich.console import Console
    from rich.table import Table

    sb3_label = "" if args.sb3_threads is None else f", SB3 threads {args.sb3_threads or 'torch default'}"
    table = Table(title=f"rlcli vs Stable-Baselines3, {len(args.seeds)} seeds, torch threads {args.threads}{sb3_label}",
                  header_style="bold cyan")
    for column in ("row", "side", "train s", "process s", "SPS", "grad steps/s", "final return", "rlcli / SB3",
                   "process rlcli / SB3", "rlcli / floor"):
        table.add_column(column, justify="left" if column in ("row", "side") else "right")
    for row in args.rows:
        by_side = {side: [r for r in results if r["row"] == row and r["side"] == side]
                   for side in ("rlcli", "sb3", "floor")}
        ratio_sb3 = [a["train_s"] / b["train_s"] for a, b in zip(by_side["rlcli"], by_side["sb3"], strict=True)]
        ratio_floor = ([a["train_s"] / b["train_s"] for a, b in zip(by_side["rlcli"], by_side["floor"], strict=True)]
                       if by_side["floor"] else [])
        ratio_process = [a["process_s"] / b["process_s"] for a, b in zip(by_side["rlcli"], by_side["sb3"], strict=True)]
        summary[row] = {"rlcli_over_sb3": ratio_sb3, "process_rlcli_over_sb3": ratio_process,
                        "rlcli_over_floor": ratio_floor}
        for side, runs in by_side.items():
            if not runs:
                continue
            returns = [r["final_return"] for r in runs if r["final_return"] is not None]
            table.add_row(row, side, spread([r["train_s"] for r in runs]), spread([r["process_s"] for r in runs]),
                          f"{statistics.median(r['sps'] for r in runs):,.0f}",
                          f"{statistics.median(r['grad_steps_per_s'] for r in runs):,.0f}",
                          spread(returns) if returns else "-",
                          spread(ratio_sb3) if side == "rlcli" else "",
                          spread(ratio_process) if side == "rlcli" else "",
                          spread(ratio_floor) if side == "rlcli" and ratio_floor else "")
    Console(width=160).print(table)
    print("ratios: median (min-max) over the seed pairs; returns: median (min-max) of 10-episode deterministic tests")
    record = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.platform(), "cpus": _cpus(),
              "versions": versions(), "threads": args.threads, "sb3_threads": args.sb3_threads, "seeds": args.seeds,
              "results": results,
              "summary": summary}
    args.out.write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out}")


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


if __name__ == "__main__":
    main()
