"""train.vector_mode=envpool: the same episode semantics as the gymnasium path (NEXT_STEP autoreset, truncation
flags, episode statistics), and one line for what EnvPool does not cover."""

import numpy as np
import pytest
from conftest import run_cli

from rlcli.envs import GymEnvFactory
from rlcli.registry import ConfigError

pytest.importorskip("envpool", reason="the [envpool] extra (in [dev]) is not installed")


def rollout(env_id: str, mode: str, action: int, steps: int, num_envs: int = 2):
    """Raw rewards and flags, and the finished episodes' (return, length), under one fixed action."""
    envs = GymEnvFactory(id=env_id).make(num_envs, mode, eval=True)
    envs.reset(seed=3)
    rewards, flags, episodes = [], [], []
    for _ in range(steps):
        _, reward, terminated, truncated, infos = envs.step(np.full(num_envs, action))
        rewards.append(reward.copy())
        flags.append((terminated.copy(), truncated.copy()))
        if "_episode" in infos:
            done = infos["_episode"]
            episodes += list(zip(infos["episode"]["r"][done].tolist(), infos["episode"]["l"][done].tolist(),
                                 strict=True))
    envs.close()
    return np.array(rewards), flags, episodes


def test_truncation_and_the_reset_step_are_the_same_as_gymnasiums():
    """MountainCar pushed right from any start never reaches the flag: every episode is truncated at 200 steps,
    whatever the start state (which EnvPool draws with its own RNG), so both paths must agree step for step."""
    ours, theirs = rollout("MountainCar-v0", "envpool", 2, 450), rollout("MountainCar-v0", "sync", 2, 450)
    np.testing.assert_array_equal(ours[0], theirs[0])  # -1 per step, 0 on each reset step
    for (term_a, trunc_a), (term_b, trunc_b) in zip(ours[1], theirs[1], strict=True):
        np.testing.assert_array_equal(term_a, term_b)
        np.testing.assert_array_equal(trunc_a, trunc_b)
    assert ours[2] == theirs[2] == [(-200.0, 200)] * 4  # two per env: steps 200 and 401 (after a reset step)


def test_terminations_end_episodes_and_the_next_step_is_a_reset_step():
    """CartPole pushed left falls in 8-11 steps from any start; after each termination comes one reset step
    (reward 0, no flag), which the episode statistics do not count, on both paths."""
    for mode in ("envpool", "sync"):
        rewards, flags, episodes = rollout("CartPole-v1", mode, 0, 100, num_envs=4)
        assert episodes and all(8 <= length <= 11 and ret == length for ret, length in episodes), (mode, episodes)
        for t, (terminated, _) in enumerate(flags[:-1]):
            after = flags[t + 1]
            assert not after[0][terminated].any() and (rewards[t + 1][terminated] == 0).all(), mode


def test_atari_preprocessing_gives_the_shipped_configs_observations():
    ours = GymEnvFactory(id="ALE/Pong-v5", atari=True, frame_stack=4).make(2, "envpool", eval=True)
    theirs = GymEnvFactory(id="ALE/Pong-v5", atari=True, frame_stack=4).make(2, "sync", eval=True)
    assert ours.single_observation_space == theirs.single_observation_space  # Box(0, 255, (4, 84, 84), uint8)
    assert ours.single_action_space == theirs.single_action_space
    obs, _ = ours.reset(seed=1)
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    ours.close()
    theirs.close()


@pytest.mark.parametrize(("env_kwargs", "expected"), [
    ({"id": "BitFlipping-v0"}, "EnvPool has no 'BitFlipping-v0'"),
    ({"id": "CartPole-v1", "kwargs": {"sutton_barto_reward": True}}, "does not take env.kwargs"),
    ({"id": "ALE/Pong-v5"}, "set env.atari=true"),
])
def test_what_envpool_does_not_cover_is_one_config_error(env_kwargs, expected):
    with pytest.raises(ConfigError, match=expected):
        GymEnvFactory(**env_kwargs).make(2, "envpool")


@pytest.mark.slow
def test_ppo_trains_on_envpool_from_the_command_line(tmp_path):
    out = run_cli("algo=ppo", "env=CartPole-v1", "train.vector_mode=envpool", "train.total_steps=4096",
                  "train.test_every=2048", "train.test_episodes=4", "log.console=false",
                  f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "budget reached" in (tmp_path / "r" / "train.log").read_text()
    out = run_cli("algo=maskable_ppo", "env=ValidMoves-v0", "train.vector_mode=envpool", cwd=tmp_path)
    assert out.returncode == 2 and "envpool does not pass valid-action masks" in out.stderr
