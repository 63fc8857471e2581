"""Fingerprints of fixed-seed runs, to show that a refactoring changed no arithmetic.

    python scripts/fingerprint.py --out before.json          # on the old code
    python scripts/fingerprint.py --out after.json --compare before.json

Each case runs `rl-train` on the CPU with deterministic=true and a small budget, then records a
SHA-256 of every tensor the final checkpoint holds for the networks and optimizers, and every
TensorBoard scalar except the wall-clock ones (time/*). `--compare` prints, per case, whether the
weights and the scalars are bit-identical to the earlier file, and the first differences.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

QUIET = ["log.console=false", "deterministic=true", "device=cpu", "train.stop_reward=null",
         "train.test_every=1024", "train.test_episodes=2", "train.log_every=512", "train.total_steps=4096"]
SMALL_OFF_POLICY = ["algo.learning_starts=512", "algo.batch_size=64", "actor.hidden_sizes=[32,32]",
                    "train.num_envs=2", "algo.train_freq=8", "algo.gradient_steps=4"]
CASES = {
    "ppo-CartPole": ["algo=ppo", "env=CartPole-v1", "algo.n_steps=64"],
    "ppo-Pendulum-norm": ["algo=ppo", "env=Pendulum-v1", "algo.n_steps=64", "env.normalize_obs=true",
                          "env.normalize_reward=true", "train.num_envs=2"],
    "ppo-gru-CartPoleNoVel": ["algo=ppo", "actor=gru", "env=CartPoleNoVel-v1", "algo.n_steps=32", "algo.n_epochs=2"],
    "a2c-CartPole": ["algo=a2c", "env=CartPole-v1", "algo.n_steps=8"],
    "rnd_ppo-MountainCar": ["algo=rnd_ppo", "env=MountainCar-v0", "train.num_envs=4", "algo.n_steps=32",
                            "algo.batch_size=64", "algo.n_epochs=2", "algo.obs_norm_warmup_steps=256"],
    "dqn-CartPole": ["algo=dqn", "env=CartPole-v1", *SMALL_OFF_POLICY, "algo.target_update_interval=256"],
    "dqn-gru-MemoryCue": ["algo=dqn", "actor=gru", "buffer=sequence", "env=MemoryCue-v0", *SMALL_OFF_POLICY,
                          "algo.batch_size=16", "buffer.seq_len=8", "buffer.burn_in=4"],
    "sac-Pendulum-norm": ["algo=sac", "env=Pendulum-v1", "env.normalize_obs=true", *SMALL_OFF_POLICY],
    "td3-Pendulum-per": ["algo=td3", "env=Pendulum-v1", "buffer=per", *SMALL_OFF_POLICY],
    # values over the run: TD3's noise decay, ERE's eta and PER's beta, A2C's tuned linear learning rate
    "td3-Pendulum-noise-decay": ["algo=td3", "env=Pendulum-v1", "algo.noise_decay=linear", *SMALL_OFF_POLICY],
    "sac-Pendulum-ere-per": ["algo=sac", "env=Pendulum-v1", "buffer=ere", "buffer.c_min=128", "buffer.alpha=0.6",
                             *SMALL_OFF_POLICY],
    "a2c-Pendulum-tuned": ["algo=a2c", "env=Pendulum-v1", "train.num_envs=2", "algo.n_steps=16"],
    # the entropy coefficient: learned (SAC's recurrent path, CrossQ's beta1=0.5 Adam, TQC's quantiles), and fixed
    "sac-gru-Pendulum": ["algo=sac", "actor=gru", "actor.rnn_size=16", "buffer=sequence", "env=Pendulum-v1",
                         *SMALL_OFF_POLICY, "algo.batch_size=16", "buffer.seq_len=6", "buffer.burn_in=2"],
    "crossq-Pendulum": ["algo=crossq", "env=Pendulum-v1", *SMALL_OFF_POLICY, "algo.critic_hidden_sizes=[32,32]",
                        "algo.renorm_warmup_steps=256"],
    "crossq-Pendulum-fixed-alpha": ["algo=crossq", "env=Pendulum-v1", *SMALL_OFF_POLICY,
                                    "algo.critic_hidden_sizes=[32,32]", "algo.ent_coef=0.05"],
    "tqc-Pendulum": ["algo=tqc", "env=Pendulum-v1", *SMALL_OFF_POLICY, "algo.n_quantiles=5"],
    "sac-Pendulum-fixed-alpha": ["algo=sac", "env=Pendulum-v1", *SMALL_OFF_POLICY, "algo.ent_coef=0.1"],
    # the shared minibatch order and epsilon-greedy
    "pg-CartPole-baseline": ["algo=pg", "env=CartPole-v1", "algo.n_steps=64"],
    "pg-CartPole-no-baseline": ["algo=pg", "env=CartPole-v1", "algo.n_steps=64", "algo.baseline=false"],
    "pqn-CartPole": ["algo=pqn", "env=CartPole-v1", "algo.n_steps=32", "algo.num_minibatches=2"],
    "trpo-Pendulum": ["algo=trpo", "env=Pendulum-v1", "algo.n_steps=64", "algo.batch_size=32", "train.num_envs=2"],
    "ddpg-Pendulum": ["algo=ddpg", "env=Pendulum-v1", "algo.learning_starts=256", "train.num_envs=2"],
    "qrdqn-CartPole-per": ["algo=qrdqn", "env=CartPole-v1", "buffer=per", "algo.learning_starts=256"],
    "ppo_kl-CartPole": ["algo=ppo_kl", "env=CartPole-v1"],
}


def digest(obj: Any, h: Any) -> None:
    """Feed every tensor (and number) of a nested state dict into `h`, in key order."""
    if isinstance(obj, torch.Tensor):
        h.update(obj.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            h.update(str(key).encode())
            digest(obj[key], h)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            digest(item, h)
    elif isinstance(obj, (int, float, bool)) or obj is None:
        h.update(repr(obj).encode())


def scalars(run_dir: Path) -> dict[str, list[list[float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in sorted(acc.Tags()["scalars"])
            if not tag.startswith("time/")}


def run_case(name: str, args: list[str], rl_train: str) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from rlcli.services import checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        done = subprocess.run([rl_train, *args, *QUIET, f"hydra.run.dir={run_dir}"], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{name}: rl-train failed:\n{done.stderr[-2000:]}")
        data = checkpoint.load(checkpoint.resolve(run_dir))
        algo = dict(data["algo"])
        if "actor" in algo:  # checkpoint layout 1 (before the contracts redesign) named the networks `actor` and
            algo["networks"] = algo.pop("actor")  # kept copies of the run's clock, which layout 2 passes in
            algo.pop("progress", None)
            algo.pop("env_steps", None)
        weights = hashlib.sha256()
        digest(algo, weights)
        return {"weights": weights.hexdigest(), "scalars": scalars(run_dir)}


def compare(name: str, now: dict[str, Any], before: dict[str, Any]) -> bool:
    same_weights = now["weights"] == before["weights"]
    diffs = []
    for tag in sorted(set(now["scalars"]) | set(before["scalars"])):
        a, b = now["scalars"].get(tag), before["scalars"].get(tag)
        if a != b:
            diffs.append(f"{tag}: {'missing now' if a is None else 'new' if b is None else 'values differ'}")
    print(f"{name:26s} weights {'identical' if same_weights else 'DIFFER'}, scalars "
          f"{'identical' if not diffs else 'DIFFER: ' + '; '.join(diffs[:4])}")
    return same_weights and not diffs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="where to write this run's fingerprints (JSON)")
    parser.add_argument("--compare", help="an earlier fingerprint file to compare with")
    parser.add_argument("--cases", nargs="*", default=list(CASES), help=f"default: all of {', '.join(CASES)}")
    parser.add_argument("--rl-train", default=str(Path(sys.executable).parent / "rl-train"))
    options = parser.parse_args()
    results = {name: run_case(name, CASES[name], options.rl_train) for name in options.cases}
    Path(options.out).write_text(json.dumps(results, indent=1))
    if options.compare:
        before = json.loads(Path(options.compare).read_text())
        ok = all([compare(name, results[name], before[name]) for name in results if name in before])
        raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
