"""Image observations: the convolutional actor, uint8 storage, PixelGoal-v0, Atari preprocessing."""

import numpy as np
import pytest
import torch
from conftest import at
from test_configs import composed

from rlcli.actors.cnn import NATURE_CONVS, ConvEncoder
from rlcli.envs.pixel_goal import PixelGoalEnv
from rlcli.registry import ConfigError
from rlcli.run.build import build

QUIET = ["log.console=false", "log.tensorboard=false"]


def test_nature_encoder_shapes_and_pixel_scaling():
    torch.manual_seed(0)
    encoder = ConvEncoder((4, 84, 84), NATURE_CONVS, 512, 255.0, "relu")
    pixels = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    out = encoder(pixels)
    assert out.shape == (3, 512)
    # uint8 in, scaled inside: the same as feeding floats in [0, 1] with no scaling
    encoder.pixel_scale = 1.0
    assert torch.allclose(encoder(pixels.float() / 255), out, atol=1e-6)
    # 84 -> 20 -> 9 -> 7: the Nature network's 3,136 features before its linear layer
    assert encoder.linear[0].in_features == 64 * 7 * 7


def test_channels_last_images_give_what_channels_first_give():
    torch.manual_seed(0)
    first = ConvEncoder((3, 10, 10), [[8, 3, 1]], 16, 255.0, "relu")
    last = ConvEncoder((10, 10, 3), [[8, 3, 1]], 16, 255.0, "relu")
    last.load_state_dict(first.state_dict())
    image = torch.randint(0, 256, (2, 3, 10, 10), dtype=torch.uint8)
    assert last.channels_last and not first.channels_last
    assert torch.allclose(last(image.permute(0, 2, 3, 1)), first(image))


def test_pixel_goal_env_draws_what_it_says():
    env = PixelGoalEnv(size=5, max_steps=4)
    obs, _ = env.reset(seed=3)
    assert obs.dtype == np.uint8 and obs.shape == (2, 5, 5)
    assert obs[0].sum() == 255 and obs[1].sum() == 255
    assert tuple(np.argwhere(obs[0])[0]) == tuple(env.agent) and tuple(np.argwhere(obs[1])[0]) == tuple(env.goal)
    # walk straight to the goal: -0.01 per step, +1 and terminated on arrival
    env = PixelGoalEnv(size=5, max_steps=20)
    env.reset(seed=3)
    distance = int(np.abs(env.goal - env.agent).sum())
    rewards, terminated = [], False
    while not terminated:
        delta = env.goal - env.agent
        action = (0 if delta[0] < 0 else 1) if delta[0] != 0 else (2 if delta[1] < 0 else 3)
        _, reward, terminated, truncated, _ = env.step(action)
        rewards.append(reward)
        assert not truncated
    assert rewards == [-0.01] * (distance - 1) + [1.0]
    # a wall stops the agent, and the episode is cut (truncated, not terminated) at max_steps
    env = PixelGoalEnv(size=5, max_steps=3)
    env.reset(seed=0)
    env.agent, env.goal = np.array([0, 0]), np.array([4, 4])
    for _ in range(3):
        _, reward, terminated, truncated, _ = env.step(0)  # up, into the wall
        assert tuple(env.agent) == (0, 0) and reward == -0.01 and not terminated
    assert truncated


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_pixels_are_stored_as_uint8_and_scaled_in_the_network(algo):
    extra = ["algo.learning_starts=64", "algo.batch_size=32", "buffer.capacity=500"] if algo == "dqn" else \
        ["algo.n_steps=16", "algo.batch_size=64"]
    parts = build(composed(f"algo={algo}", "env=PixelGoal-v0", "train.num_envs=4", *extra, *QUIET))
    assert parts.cfg.actor.name == "cnn"  # PixelGoal-v0 picks the small CNN
    buffer, collector = parts.buffer, parts.collector
    assert buffer.obs.dtype == torch.uint8 and collector.obs.dtype == torch.uint8
    for _ in range(4 if algo == "ppo" else 20):
        parts.collector.collect(parts.learner, random_actions=algo == "dqn")
    if algo == "ppo":
        assert buffer.obs.shape == (16, 4, 2, 7, 7)
        assert set(buffer.obs.unique().tolist()) == {0, 255}
    else:
        assert buffer.obs.shape == (500, 2, 7, 7) and buffer.next_obs.dtype == torch.uint8
        assert buffer.obs.nbytes == 500 * 2 * 7 * 7  # one byte per pixel
    metrics = parts.algo.update(buffer, at(0.5))
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in metrics.values())
    parts.close()


@pytest.mark.parametrize(("overrides", "message"), [
    (["env=CartPole-v1", "actor=cnn"], "actor=cnn needs image observations (a Box of shape [C, H, W] or [H, W, C])"),
    (["env=PixelGoal-v0", "actor=cnn"], "actor.convs=[[32, 8, 4], [64, 4, 2], [64, 3, 1]] shrink the 7x7 observation "
                                        "to nothing"),
    (["env=PixelGoal-v0", "env.normalize_obs=true"], "env.normalize_obs=true does not apply to actor=cnn"),
    (["env=PixelGoal-v0", "actor.convs=[[16,3]]"], "actor.convs=[[16, 3]] is invalid: each layer is [out_channels"),
    (["env=CartPole-v1", "env.atari=true"], "env.atari=true applies gymnasium's Atari preprocessing, which needs an "
                                            "ALE/... env id"),
    (["env=CartPole-v1", "env.frame_stack=0"], "env.frame_stack=0 is invalid"),
])
def test_bad_image_settings_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as error:
        build(composed(*overrides, *QUIET))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_atari_preprocessing_and_frame_stacking_shapes():
    pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    parts = build(composed("algo=ppo", "env=ALE/Pong-v5", "train.num_envs=2", "algo.n_steps=8",
                               "algo.batch_size=16", *QUIET))
    space = parts.envs.single_observation_space
    assert space.shape == (4, 84, 84) and space.dtype == np.uint8
    assert parts.cfg.actor.name == "cnn" and parts.cfg.actor.convs == NATURE_CONVS
    parts.collector.collect(parts.learner)
    assert parts.buffer.obs.shape == (8, 2, 4, 84, 84) and parts.buffer.obs.dtype == torch.uint8
    assert parts.buffer.obs.nbytes == 8 * 2 * 4 * 84 * 84
    parts.close()


@pytest.mark.slow
@pytest.mark.parametrize(("algo", "steps", "settings"), [
    ("ppo", 1024, ["algo.n_steps=64"]),  # two updates of 8 envs x 64 steps
    ("dqn", 1200, ["algo.learning_starts=600", "buffer.capacity=2000"]),
])
def test_a_few_thousand_atari_frames_train_with_uint8_storage(algo, steps, settings, cli, tmp_path):
    pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    from rlcli.services import checkpoint

    out = cli(f"algo={algo}", "env=ALE/Pong-v5", f"train.total_steps={steps}", *settings, "train.test_every=0",
              "log.console=false", f"hydra.run.dir={tmp_path / 'run'}", timeout=600)
    assert out.returncode == 0, out.stderr
    data = checkpoint.load(checkpoint.resolve(tmp_path / "run"))
    obs = data["buffer"]["obs"]
    assert obs.dtype == torch.uint8 and tuple(obs.shape[-3:]) == (4, 84, 84)
    assert data["state"]["env_steps"] >= steps and data["state"]["updates"] > 0  # 4 emulator frames per step
