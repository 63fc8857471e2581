"""algo.train_freq_unit=episode: SB3's train_freq=(n, "episode"), which RL-Zoo's DDPG entries use. A collect phase
lasts until n episodes have ended (counted over all envs); gradient_steps=-1 then takes one gradient step per
transition the phase stored. gymnasium's vector envs take one reset step after an episode ends (next-step autoreset):
it counts as an env step, as everywhere in rlcli, but stores no transition, so it earns no gradient step."""

from __future__ import annotations

import pytest

from rlcli.algos.offpolicy import collect_phase, gradient_steps_now, resolve_gradient_steps
from rlcli.contracts import RunClock
from rlcli.registry import ConfigError
from rlcli.run.build import build
from rlcli.run.compose import compose_config
from rlcli.services.checkpoint import candidates, load


def test_the_phase_and_gradient_steps_each_unit_gives():
    assert collect_phase(8, "step") == (8, 0)
    assert collect_phase(2, "episode") == (1, 2)
    assert resolve_gradient_steps(-1, 8, 4, "step") == 32  # fixed phases: known before collecting
    assert resolve_gradient_steps(-1, 2, 4, "episode") == -1  # known once collected
    assert resolve_gradient_steps(5, 2, 4, "episode") == 5
    assert gradient_steps_now(-1, RunClock(1000, 5000, transitions=173)) == 173
    assert gradient_steps_now(32, RunClock(1000, 5000, transitions=173)) == 32
    with pytest.raises(ConfigError, match=r"algo.train_freq_unit=.*episodes.*choose from: step, episode"):
        collect_phase(1, "episodes")  # type: ignore[arg-type]


@pytest.mark.parametrize("num_envs", [1, 3])
def test_a_phase_ends_at_the_step_where_the_nth_episode_ends(monkeypatch, tmp_path, num_envs):
    monkeypatch.chdir(tmp_path)
    c = build(compose_config(["algo=dqn", "env=CartPole-v1", f"train.num_envs={num_envs}", "algo.train_freq=2",
                              "algo.train_freq_unit=episode", "algo.gradient_steps=-1", "algo.batch_size=16"]))
    try:
        for phase in range(3):
            before = c.algo.gradient_updates
            stats = c.collector.collect(c.learner, random_actions=True)
            steps_per_env = stats.steps // num_envs
            assert stats.steps == steps_per_env * num_envs and len(stats.episode_returns) >= 2
            # the phase's last step ended an episode, and one step fewer would have held fewer than 2
            assert stats.episode_steps[-1] == steps_per_env - 1
            assert sum(1 for s in stats.episode_steps if s < steps_per_env - 1) < 2
            if num_envs == 1:  # exactly two whole episodes, and the reset step before each but the run's first
                resets = 1 if phase == 0 else 2
                assert len(stats.episode_returns) == 2 and stats.steps == sum(stats.episode_lengths) + resets
                assert stats.transitions == sum(stats.episode_lengths)
            c.algo.update(c.buffer, RunClock(1000, 10_000, transitions=stats.transitions))
            assert c.algo.gradient_updates - before == stats.transitions  # gradient_steps=-1: one per transition
    finally:
        c.close()


def test_a_run_updates_after_each_episode_with_one_gradient_step_per_transition(cli, tmp_path):
    """Pendulum's episodes all last 200 steps. Phases (env steps): [0, 200), then the reset step and the next
    episode each time: [200, 401), [401, 602), [602, 803), [803, 1004): the run ends at 1,004 env steps. With
    learning_starts=400 the last four update, 200 gradient steps each (SB3: one per step of its episode)."""
    common = ["algo=ddpg", "env=Pendulum-v1", "train.total_steps=1000", "algo.learning_starts=400",
              "algo.batch_size=32", "actor.hidden_sizes=[16,16]", "algo.gradient_steps=-1", "deterministic=true",
              "log.console=false", "train.test_every=0", "train.stop_reward=null", "algo.train_freq=1",
              "algo.train_freq_unit=episode"]
    done = cli(*common, "hydra.run.dir=episodic")
    assert done.returncode == 0, done.stderr
    saved = load(next(iter(candidates(tmp_path / "episodic" / "checkpoints"))))
    assert saved["state"]["env_steps"] == 1004 and saved["state"]["episodes"] == 5
    assert saved["algo"]["gradient_updates"] == 800


def test_what_an_episodic_phase_does_not_cover_is_one_line(cli):
    gsde = cli("algo=sac", "env=Pendulum-v1", "algo.use_sde=true", "algo.train_freq_unit=episode",
               "train.total_steps=100")
    assert gsde.returncode != 0 and "Traceback" not in gsde.stderr
    assert "algo.train_freq_unit='episode'" in gsde.stderr and "gSDE" in gsde.stderr
    wrong = cli("algo=td3", "env=Pendulum-v1", "algo.train_freq_unit=episodes", "train.total_steps=100")
    assert wrong.returncode != 0 and "Traceback" not in wrong.stderr
    assert "choose from: step, episode" in wrong.stderr
