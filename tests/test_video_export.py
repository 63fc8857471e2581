"""rl-eval video=true / export=onnx|torchscript, and log.video_every during training.

The files are checked the way their users would use them: videos decoded frame by frame, exported
policies run in onnxruntime / torch.jit without rlcli and compared with rlcli's own actions.
"""

import json
import subprocess
from pathlib import Path

import gymnasium as gym
import imageio.v2 as imageio
import numpy as np
import onnxruntime
import pytest
import torch
from conftest import run_cli
from test_rl_eval import TINY, one_line_error, rl_eval

from rlcli.contracts import RecurrentState
from rlcli.entry import rl_eval as rl_eval_module
from rlcli.entry import run_loading

pytestmark = pytest.mark.slow

QUICK_OFF_POLICY = ["algo.learning_starts=200", "algo.batch_size=32", "actor.hidden_sizes=[32,32]",
                    "train.total_steps=400", "train.test_every=0", "log.console=false", "deterministic=true"]
RUNS = {
    "ppo": TINY,
    "ppo_pendulum": ["algo=ppo", "env=Pendulum-v1", "env.normalize_obs=true", "algo.n_steps=64", "algo.batch_size=64",
                     "train.total_steps=1024", "train.test_every=0", "log.console=false"],
    "sac": ["algo=sac", "env=Pendulum-v1", *QUICK_OFF_POLICY],
    # gSDE: the file holds the deterministic action (the mean; tanh of the clipped mean for SAC), no noise
    "ppo_sde": ["algo=ppo", "env=Pendulum-v1", "algo.use_sde=true", "algo.n_steps=64", "algo.batch_size=64",
                "train.total_steps=1024", "train.test_every=0", "log.console=false"],
    "sac_sde": ["algo=sac", "env=Pendulum-v1", "algo.use_sde=true", *QUICK_OFF_POLICY],
    "crossq_sde": ["algo=crossq", "env=Pendulum-v1", "algo.use_sde=true", "algo.critic_hidden_sizes=[32,32]",
                   *QUICK_OFF_POLICY],
    "dqn": ["algo=dqn", "env=CartPole-v1", *QUICK_OFF_POLICY],
    "lstm": ["algo=ppo", "env=CartPole-v1", "actor=lstm", "algo.n_steps=32", "algo.batch_size=64",
             "train.total_steps=512", "train.test_every=0", "log.console=false"],
    "cnn": ["algo=ppo", "env=PixelGoal-v0", "algo.n_steps=32", "algo.batch_size=64", "train.total_steps=512",
            "train.test_every=0", "log.console=false"],
}


class _TrainedRuns(dict):
    """RUNS' run directories, each trained the first time a test asks for it: pytest-xdist spreads this module's
    tests over its workers, and each worker then trains only the runs its own tests read."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> Path:
        out = run_cli(*RUNS[name], f"hydra.run.dir={self.root / name}", cwd=self.root)
        assert out.returncode == 0, out.stderr
        self[name] = self.root / name
        return self[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    return _TrainedRuns(tmp_path_factory.mktemp("after_training"))


def frames_of(path: Path) -> list[np.ndarray]:
    with imageio.get_reader(path) as reader:
        return [np.asarray(frame) for frame in reader]


# ------------------------------------------------------------------------------------------------ video
def test_videos_are_the_evaluations_first_episodes(runs):
    run = runs["ppo"]
    out = rl_eval(str(run), "load=last", "video=true", "video_episodes=2", "episodes=4", cwd=run.parent)
    assert out.returncode == 0, out.stderr
    record = json.loads((run / "eval" / "last.json").read_text())
    videos = sorted((run / "videos").glob("last-ep*.mp4"))
    assert [v.name for v in videos] == [f"last-ep{i}-return{record['returns'][i]:.0f}.mp4" for i in range(2)]
    for i, video in enumerate(videos):
        frames = frames_of(video)
        assert len(frames) == record["lengths"][i] + 1  # the first observation, then one frame per step
        assert frames[0].shape == (400, 600, 3)  # CartPole's own size, not rescaled
        assert np.abs(frames[0].astype(int) - frames[-1].astype(int)).mean() > 0.1  # the pole moved
    assert not list((run / "videos").glob(".*part*"))  # no partial files left


def test_gif_of_several_episodes_in_one_file(runs):
    run = runs["ppo"]
    out = rl_eval(str(run), "load=last", "video=true", "video_format=gif", "video_concat=true", "video_episodes=2",
                  "episodes=2", cwd=run.parent)
    assert out.returncode == 0, out.stderr
    record = json.loads((run / "eval" / "last.json").read_text())
    (gif,) = (run / "videos").glob("last-ep0-1-return*.gif")
    frames = imageio.mimread(gif, memtest=False)
    # Pillow merges identical neighbouring frames, so a gif holds at most one frame per rendered frame
    assert 2 < len(frames) <= sum(record["lengths"]) + 2 and frames[0].shape[:2] == (400, 600)


def test_training_records_a_test_episode_at_its_cadence(tmp_path):
    run = tmp_path / "run"
    out = run_cli(*TINY, "log.video_every=1024", "log.tensorboard=true", f"hydra.run.dir={run}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    videos = sorted((run / "videos").glob("step-*.mp4"))
    assert [v.name.split("-ep0")[0] for v in videos] == ["step-000000001024", "step-000000002048"]
    assert all(len(frames_of(v)) > 5 for v in videos)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"), size_guidance={"images": 0})
    events.Reload()
    images = events.Images("eval/video")
    assert [i.step for i in images] == [1024, 2048] and images[0].encoded_image_string[:6] == b"GIF89a"


def test_video_errors_are_one_line_and_write_nothing(runs, tmp_path):
    run = runs["ppo"]
    line = one_line_error(rl_eval(str(run), "video=true", "video_format=avi", cwd=run.parent))
    assert "video_format='avi'" in line and "mp4, gif" in line
    out = run_cli("algo=dqn", "env=BitFlipping-v0", "log.video_every=100", f"hydra.run.dir={tmp_path / 'bf'}",
                  cwd=tmp_path)
    assert out.returncode != 0 and "BitFlipping-v0 cannot render frames" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "bf").exists()


def test_a_missing_extra_names_it(runs, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("imageio_ffmpeg", "onnxscript")
                        else real(name, *a))
    for args, extra in ((["video=true"], ".[video]"), (["export=onnx"], ".[export]")):
        with pytest.raises(SystemExit) as stop:
            rl_eval_module.main([str(runs["ppo"]), *args])
        assert stop.value.code == 2 and extra in capsys.readouterr().err
    assert not (runs["ppo"] / "export").exists()


# ----------------------------------------------------------------------------------------------- export
def rlcli_actions(run: Path, observations: np.ndarray) -> np.ndarray:
    """rlcli's own deterministic env actions for [steps, envs, ...] observations (a carry runs through the steps)."""
    options = {"device": "cpu", "seed": 0}
    agent = run_loading.load_agent(run_loading.checkpoint_of(run, "last"), options, []).agent
    actions, carry = [], None
    with torch.inference_mode():
        for obs in observations:
            x = agent.algo.networks.normalizer(torch.as_tensor(obs, dtype=agent.obs_dtype))
            state = None
            if agent.carry_size:
                carry = torch.zeros(len(obs), agent.carry_size) if carry is None else carry
                state = RecurrentState(carry, torch.zeros(len(obs)))
            out = agent.algo.act(x, deterministic=True, state=state)
            carry = out.carry
            actions.append(agent.algo.env_actions(out.actions).numpy())
    return np.stack(actions)


def env_observations(env_id: str, dtype: str, steps: int = 100, envs: int = 10) -> np.ndarray:
    """1,000 observations from random play in the env (sync envs, seeded)."""
    import rlcli.envs  # noqa: F401  (registers rlcli's own envs)

    vector = gym.make_vec(env_id, envs, vectorization_mode="sync")
    vector.action_space.seed(0)
    obs, _ = vector.reset(seed=0)
    seen = []
    for _ in range(steps):
        seen.append(np.asarray(obs, dtype=dtype))
        obs, *_ = vector.step(vector.action_space.sample())
    vector.close()
    return np.stack(seen)


def onnx_actions(path: Path, observations: np.ndarray, carry_size: int) -> np.ndarray:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    actions, carry = [], np.zeros((observations.shape[1], carry_size), dtype=np.float32)
    for obs in observations:
        out = session.run(None, {"obs": obs} | ({"carry": carry} if carry_size else {}))
        if carry_size:
            carry = out[1]
        actions.append(out[0])
    return np.stack(actions)


@pytest.mark.parametrize("name", ["ppo", "ppo_pendulum", "sac", "dqn", "lstm", "cnn", "ppo_sde", "sac_sde",
                                  "crossq_sde"])
def test_onnx_policy_acts_as_rlcli_does(runs, name):
    run = runs[name]
    out = rl_eval(str(run), "load=last", "export=onnx", cwd=run.parent)
    assert out.returncode == 0, out.stderr
    assert "actions differ from rlcli's by at most" in out.stdout and "MISMATCH" not in out.stdout
    meta = json.loads((run / "export" / "last.json").read_text())
    carry_size = meta["inputs"][1]["shape"][1] if len(meta["inputs"]) > 1 else 0
    assert (carry_size > 0) == (name == "lstm")
    assert meta["inputs"][0]["dtype"] == ("uint8" if name == "cnn" else "float32")
    observations = env_observations(meta["env"], meta["inputs"][0]["dtype"])
    exported = onnx_actions(run / "export" / "last.onnx", observations, carry_size)
    ours = rlcli_actions(run, observations)
    assert exported.shape == ours.shape and exported.size >= 1000
    if name in ("ppo", "dqn", "lstm", "cnn"):  # discrete actions: exactly the same
        assert exported.dtype == np.int64 and np.array_equal(exported, ours)
    else:  # continuous: clipped (ppo) or rescaled (sac) to Pendulum's [-2, 2] inside the file
        assert np.abs(exported - ours).max() <= 1e-5 and np.abs(exported).max() <= 2.0


def test_exported_policy_plays_rl_evals_episode_without_rlcli(runs):
    run = runs["ppo"]
    # test_onnx_policy_acts_as_rlcli_does[ppo] checks this export; where it ran in this worker, its file is reused
    # (an ONNX export is one of the slowest things rl-eval does: dynamo traces the policy)
    if not (run / "export" / "last.onnx").is_file():
        assert rl_eval(str(run), "load=last", "export=onnx", cwd=run.parent).returncode == 0
    out = rl_eval(str(run), "load=last", "episodes=1", "num_envs=1", "seed=3", cwd=run.parent)
    assert out.returncode == 0, out.stderr
    expected = json.loads((run / "eval" / "last.json").read_text())["returns"][0]
    # a user's loop: plain gymnasium and onnxruntime
    script = f"""
import gymnasium as gym, numpy as np, onnxruntime
session = onnxruntime.InferenceSession({str(run / 'export' / 'last.onnx')!r})
env = gym.make("CartPole-v1")
obs, _ = env.reset(seed=3)
total, done = 0.0, False
while not done:
    action = session.run(None, {{"obs": obs[None].astype(np.float32)}})[0][0]
    obs, reward, terminated, truncated, _ = env.step(int(action))
    total, done = total + reward, terminated or truncated
print(total)
"""
    played = subprocess.run([str(Path(__import__("sys").executable)), "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert played.returncode == 0, played.stderr
    assert "rlcli" not in played.stderr and float(played.stdout) == expected


@pytest.mark.parametrize("name", ["ppo_pendulum", "lstm"])
def test_torchscript_policy_acts_as_rlcli_does(runs, name):
    run = runs[name]
    out = rl_eval(str(run), "load=last", "export=torchscript", cwd=run.parent)
    assert out.returncode == 0, out.stderr
    module = torch.jit.load(str(run / "export" / "last.pt"))
    meta = json.loads((run / "export" / "last.json").read_text())
    observations = env_observations(meta["env"], "float32", steps=20)
    ours = rlcli_actions(run, observations)
    carry = torch.zeros(observations.shape[1], meta["inputs"][1]["shape"][1]) if name == "lstm" else None
    for t, obs in enumerate(observations):
        with torch.no_grad():
            got = module(torch.as_tensor(obs), carry) if carry is not None else module(torch.as_tensor(obs))
        if carry is not None:
            got, carry = got
        assert np.abs(got.numpy() - ours[t]).max() <= 1e-5


def test_export_errors_are_one_line_and_write_nothing(runs):
    run = runs["ppo"]
    line = one_line_error(rl_eval(str(run), "export=tflite", cwd=run.parent))
    assert "export='tflite'" in line and "onnx, torchscript" in line
    one_line_error(rl_eval(str(run.parent / "nowhere"), "export=onnx", cwd=run.parent))
    assert not (run.parent / "nowhere").exists()


def test_the_exported_files_action_dtype_follows_the_action_space():
    """A joint team's MultiDiscrete actions come out of the file as int64, as a Discrete action does (the JSON said
    float32 for every action with a shape); Box actions float32."""
    from types import SimpleNamespace

    import gymnasium as gym

    from rlcli.services.policy_export import metadata

    policy = SimpleNamespace(obs_dtype=torch.float32, carry_size=0)
    obs = gym.spaces.Box(-1, 1, (2, 10))
    for space, dtype in ((gym.spaces.Discrete(3), "int64"), (gym.spaces.MultiDiscrete([5, 5]), "int64"),
                         (gym.spaces.Box(-1, 1, (2,)), "float32")):
        meta = metadata(policy, "onnx", "coop_match", obs, space, Path("best.pt"), {})
        assert meta["outputs"][0]["dtype"] == dtype, space
