"""`rl-eval ... export=onnx|torchscript`: write a loaded agent's standalone policy (policy_export.py), then check
the file as its user would run it, against rlcli's own actions and one episode's return."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcli.entry.checked_envs import CheckedEnvs

if TYPE_CHECKING:
    from rlcli.entry.run_loading import Loaded


def export_policy(loaded: Loaded, fmt: str, name: str, seed: int) -> tuple[Path, float, float, float]:
    """Write the standalone policy, then check it as its user would run it: its actions against rlcli's on
    1,000 observations from the env, and one episode's return against rlcli's on the same seed."""
    from omegaconf import OmegaConf

    from rlcli.registry import ConfigError
    from rlcli.services import policy_export as export

    agent = loaded.agent
    if agent.spec.action_masks:
        raise ConfigError(f"export: algo={loaded.cfg.algo.name} acts on the env's action masks, which an exported "
                          "policy (observation in, action out) has no input for yet; evaluate it with rl-eval instead")
    if loaded.cfg.actor.name == "combined":
        raise ConfigError("export: Dict observations with images (actor=combined) have no exported input format yet; "
                          "evaluate with rl-eval, or load the policy in Python: rlcli.load(run).predict(obs)")
    policy = export.StandalonePolicy(agent.algo, agent.obs_dtype, agent.carry_size).cpu()  # exports run on the CPU
    ours = export.numpy_policy(policy)
    dtype = export.input_dtype(policy)
    # checked: an env that fails while the file is checked is one line naming it, not a traceback. Made as rl-eval
    # makes its envs (the run's vector mode, 10 of them), so that the checked episode is rl-eval's episode 0
    mode = loaded.cfg.train.get("vector_mode", "auto")
    envs = CheckedEnvs(loaded.env_factory.make(10, mode, eval=True), loaded.env_factory.spec.id, scored_only=False)
    try:
        observations = _observations(envs, ours, agent.carry_size, seed, steps=100, dtype=dtype)
        path = loaded.path.parent.parent / "export" / f"{name}{export.FORMATS[fmt]}"
        export.export(policy, fmt, path, observations[0])
        exported = export.run_exported(path, fmt)
        difference = export.max_difference(ours, exported, observations, agent.carry_size)
        their_return = _episode_return(envs, exported, agent.carry_size, seed, dtype)
        our_return = _episode_return(envs, ours, agent.carry_size, seed, dtype)
    finally:
        envs.close()
    export.write_metadata(path, export.metadata(policy, fmt, loaded.env_factory.spec.id,
                                                envs.single_observation_space, envs.single_action_space, loaded.path,
                                                OmegaConf.to_container(loaded.cfg.env, resolve=True)))
    return path, difference, their_return, our_return


def _observations(envs: Any, act: Any, carry_size: int, seed: int, steps: int, dtype: Any) -> Any:
    """[steps, envs, ...] observations met by the policy (episodes restart as they end)."""
    import numpy as np

    obs, _ = envs.reset(seed=seed)
    carry = np.zeros((envs.num_envs, carry_size), dtype=np.float32) if carry_size else None
    seen = []
    for _ in range(steps):
        obs = obs.astype(dtype)  # what the exported file takes
        seen.append(obs)
        out = act(obs, carry)
        action, carry = out if carry_size else (out, None)
        obs, *_ = envs.step(action)
    return np.stack(seen)


def _episode_return(envs: Any, act: Any, carry_size: int, seed: int, dtype: Any) -> float:
    """The return of the first env's first episode from `seed` (what rl-eval's episode 0 is)."""
    import numpy as np

    obs, _ = envs.reset(seed=seed)
    carry = np.zeros((envs.num_envs, carry_size), dtype=np.float32) if carry_size else None
    while True:
        out = act(obs.astype(dtype), carry)
        action, carry = out if carry_size else (out, None)
        obs, _, _, _, infos = envs.step(action)
        if "_episode" in infos and infos["_episode"][0]:
            return float(infos["episode"]["r"][0])
