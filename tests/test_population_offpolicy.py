"""hydra/launcher=population for the off-policy workhorses: DQN and QR-DQN members, written for a runner
(rlcli/sweeps/population/lockstep.py)."""

import copy
import json
from typing import Any

import numpy
import pytest
import torch
from conftest import RL_TRAIN
from test_population import run
from test_resume import final

from rlcli.collectors.local import CollectStats
from rlcli.contracts import RunClock
from rlcli.registry import ConfigError
from rlcli.run.compose import compose_config
from rlcli.run.state import prepare
from rlcli.run.trainer import Trainer
from rlcli.sweeps.population.collect import collect_together
from rlcli.sweeps.population.lockstep import LockstepPopulation, population_update
from rlcli.sweeps.population.members import Member

TINY = ["env=CartPole-v1", "train.num_envs=4", "train.test_every=512", "train.test_episodes=2",
        "train.stop_reward=null", "log.tensorboard=false", "log.console=false", "algo.learning_starts=64",
        "algo.batch_size=32", "algo.train_freq=4", "algo.gradient_steps=2", "actor.hidden_sizes=[32,32]"]
ALGOS = {"dqn": ["algo=dqn", "algo.double=true"], "qrdqn": ["algo=qrdqn", "algo.n_quantiles=5"],
         "dqn-per": ["algo=dqn", "buffer=per"],  # prioritized replay: each member's own sum tree
         # hindsight relabelling: each member's own episodes, and its relabelled goals from its own stream
         "dqn-her": ["algo=dqn", "env=BitFlipping-v0", "env.kwargs.n_bits=6", "buffer=her"],
         # compile=true: every member's gradient step (vectorized loss, clip, Adam) as one compiled graph
         "dqn-compiled": ["algo=dqn", "algo.double=true", "compile=true"]}


def filled(algo: str, *more: str):
    """A member's components after a few random collect phases, and its torch RNG state then."""
    components, _ = prepare(compose_config([*TINY, *ALGOS[algo], *more]))
    for _ in range(8):
        components.collector.collect(components.learner, random_actions=True)
    return components, torch.get_rng_state()


def assert_first_update_is_each_single_runs(members: list, clocks: list) -> tuple[Any, list]:
    """Each member's single-run update on copies of its algorithm and storage, then the population's update of
    all: every member's RNG stream advanced as its single run's, its weights (targets included) within 1e-6 and
    its metrics within 1e-4 of its single run's; a member without a clock (warming up) is carried, not moved.
    Returns the population and the single runs' (algorithm, storage) for what a kind checks besides."""
    singles = []
    for (components, rng), clock in zip(members, clocks, strict=True):
        alone, its_buffer = copy.deepcopy(components.algo), copy.deepcopy(components.buffer)
        torch.set_rng_state(rng)
        metrics = alone.update(its_buffer, clock) if clock is not None else None
        singles.append((alone, its_buffer, metrics, torch.get_rng_state()))
    population = population_update([c.algo for c, _ in members], [c.buffer for c, _ in members])
    rngs = [rng for _, rng in members]
    results = population.update([clock is not None for clock in clocks], [c.buffer for c, _ in members], rngs,
                                clocks)
    for (components, _), (alone, _, metrics, rng_after), result, rng in zip(members, singles, results, rngs,
                                                                          strict=True):
        assert torch.equal(rng, rng_after)  # the member's draws (samples, noise) were its single run's
        mine, theirs = components.algo.networks.state_dict(), alone.networks.state_dict()
        if metrics is None:  # carried along, never stepped: bit for bit as it was
            assert result is None and all(torch.equal(mine[key], theirs[key]) for key in mine)
            continue
        for key in mine:
            assert torch.allclose(mine[key], theirs[key], atol=1e-6, rtol=0), key
        assert result is not None and set(result) == set(metrics)
        for key in metrics:
            assert float(result[key]) == pytest.approx(float(metrics[key]), rel=1e-4, abs=1e-6), key
        assert components.algo.gradient_updates == alone.gradient_updates
    return population, [(alone, its_buffer) for alone, its_buffer, _, _ in singles]


@pytest.mark.parametrize("algo", list(ALGOS))
def test_a_members_first_update_is_its_single_runs_within_float_tolerance(algo):
    members = [filled(algo, "seed=0"), filled(algo, "seed=1", "algo.lr=1e-3", "algo.max_grad_norm=0.5"),
               filled(algo, "seed=2", "algo.gamma=0.9", "algo.target_update_interval=64"),
               filled(algo, "seed=3")]  # the last is still warming up: carried, not stepped
    clock = RunClock(128, 1024, 16)
    population, singles = assert_first_update_is_each_single_runs(members, [clock, clock, clock, None])
    assert isinstance(population, LockstepPopulation)
    if "compile=true" in ALGOS[algo]:  # the members' steps ran as the population's one compiled graph
        assert population.compiled is not None and population.compiled["train_step"].compile_seconds is not None
    for (components, _), (alone, its_buffer) in zip(members[:3], singles, strict=False):
        assert components.algo.gradient_updates == 2
        assert components.algo.last_target_update == alone.last_target_update
        if algo == "dqn-per":  # its priorities, from its own TD errors
            assert numpy.allclose(components.buffer.tree.tree, its_buffer.tree.tree, rtol=1e-5)
    first, second = (next(c.algo.networks.parameters()) for c, _ in members[:2])
    assert not torch.equal(first, second)  # the members' rows are their own


@pytest.mark.parametrize("unit", ["step", "episode"])
def test_a_members_rollouts_are_its_single_runs_in_warm_up_and_epsilon_greedy(unit, tmp_path):
    """With algo.train_freq_unit=episode each member collects until its own episodes end (at different steps: the
    members' rollouts then differ in length), as its single run does."""
    settings = ["algo=dqn", "algo.exploration_initial_eps=0.5", "algo.exploration_final_eps=0.5",
                f"algo.train_freq_unit={unit}"]

    def components_of(seed: int):
        return prepare(compose_config([*TINY, *settings, f"seed={seed}"]))

    singles = []
    for seed in (0, 1):
        components, _ = components_of(seed)
        components.collector.collect(components.learner, random_actions=True)  # warm-up: uniform actions
        components.collector.collect(components.learner, random_actions=False)  # epsilon-greedy on Q-values
        singles.append(components.buffer)
    members = []
    for seed in (0, 1):
        components, state = components_of(seed)
        run_dir = tmp_path / str(seed)
        members.append(Member(Trainer(components, run_dir, state), run_dir, seed, "", {}))
    population = population_update([m.trainer.c.algo for m in members], [m.trainer.c.buffer for m in members])
    steps = []
    for warming_up in (True, False):
        for member in members:
            member.warming_up = warming_up
        stats = collect_together(members, population)
        assert all(isinstance(s, CollectStats) for s in stats)
        steps.append([(s.steps, s.transitions) for s in stats])
    lengths = [len(single) for single in singles]
    if unit == "step":
        assert lengths == [32, 32] and steps == [[(16, 16), (16, 16)], [(16, 16), (16, 16)]]
    else:  # 4 episodes per phase (train_freq=4): the members' phases end at different steps
        assert steps[0][0][0] != steps[0][1][0] and lengths[0] != lengths[1]
        assert [sum(t for _, t in member) for member in zip(*steps, strict=True)] == lengths
    for member, single, length in zip(members, singles, lengths, strict=True):
        mine = member.trainer.c.buffer
        assert len(mine) == length
        for field in ("obs", "actions", "rewards", "next_obs", "discounts"):
            assert torch.equal(getattr(mine, field)[:length], getattr(single, field)[:length]), field


def test_what_an_off_policy_population_cannot_batch_is_one_line():
    def built(*more: str):
        return prepare(compose_config(["env=CartPole-v1", "algo=dqn", *more]))[0]

    c = built("actor=gru", "buffer=sequence", "env=CartPoleNoVel-v1")
    with pytest.raises(ConfigError, match="a recurrent Q-network"):
        population_update([c.algo, c.algo], [c.buffer, c.buffer])
    differ = [built(f"seed={seed}", f"algo.loss={loss}") for seed, loss in ((0, "huber"), (1, "mse"))]
    with pytest.raises(ConfigError, match=r"^the members differ in loss: DQN members batch when they differ only in "
                                          r"seed, lr, exploration_\*, gamma"):
        population_update([d.algo for d in differ], [d.buffer for d in differ])


@pytest.mark.parametrize("algo", ["dqn", "dqn-her"])
def test_a_dqn_population_sweep_writes_what_the_basic_launcher_writes(algo, tmp_path):
    tiny = [a for a in TINY if not a.startswith("env=")] if algo == "dqn-her" else TINY  # one env= on a command line
    args = ["-m", *tiny, *ALGOS[algo], "seed=0,1,2", "algo.lr=1e-3,3e-4", "train.total_steps=256"]
    population = run(*args, "hydra/launcher=population", "hydra.launcher.n_jobs=1", "hydra.sweep.dir=pop", cwd=tmp_path)
    assert population.returncode == 0, population.stderr[-3000:]
    assert "cannot train in a population" not in population.stdout + population.stderr
    basic = run(*args, "hydra.sweep.dir=basic", cwd=tmp_path)
    assert basic.returncode == 0, basic.stderr[-3000:]
    for job in map(str, range(6)):
        pop, bas = tmp_path / "pop" / job, tmp_path / "basic" / job
        assert sorted(p.name for p in pop.iterdir()) == sorted(p.name for p in bas.iterdir())
        a, b = final(pop), final(bas)
        assert a["state"]["env_steps"] == b["state"]["env_steps"] == 256
        assert a["algo"]["gradient_updates"] == b["algo"]["gradient_updates"]
        nets_a, nets_b = a["algo"]["networks"], b["algo"]["networks"]
        assert all(torch.allclose(nets_a[k], nets_b[k], atol=1e-4) for k in nets_a), job
        # warm-up and epsilon-greedy acts (HER keeps numpy arrays)
        assert numpy.array_equal(numpy.asarray(a["buffer"]["actions"]), numpy.asarray(b["buffer"]["actions"]))
        assert '"status": "completed"' in (pop / "status.json").read_text()
    evaluated = __import__("subprocess").run([str(RL_TRAIN.parent / "rl-eval"), str(tmp_path / "pop" / "1"),
                                              "episodes=2"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr


# the joint-mode multi-agent algorithms: a team's transitions, agents as a batch axis of one network (or stacked
# copies, env.share_params=false), the same runner-written step as DQN's and SAC's, so the same population
JOINT = {"vdn": ["algo=vdn", "env=coop_match"], "qmix": ["algo=qmix", "env=coop_match"],
         # the mixer reading the state rescaled by its bounds (a buffer each member holds, not a parameter)
         "qmix-separate": ["algo=qmix", "env=coop_match", "env.share_params=false", "algo.scale_state=true"],
         "vdn-leaving": ["algo=vdn", "env=coop_match", "+env.kwargs.leave_at=5"],  # agent_1 ends before its team
         "masac": ["algo=masac", "env=coop_reach"], "maddpg": ["algo=maddpg", "env=coop_reach"],
         # compile=true: each loss step of all members one compiled graph, as compiled single runs
         "qmix-compiled": ["algo=qmix", "env=coop_match", "compile=true"]}
# what the members differ in besides the seed: a setting each reads per member
DIFFER = {"vdn": "algo.target_update_interval=64,128", "qmix": "algo.exploration_final_eps=0.05,0.3",
          "masac": "algo.target_entropy=-1,-3", "maddpg": "algo.noise_std=0.1,0.3"}


@pytest.mark.slow
@pytest.mark.parametrize("algo", list(JOINT))
def test_a_joint_multiagent_population_sweep_writes_what_the_basic_launcher_writes(algo, tmp_path):
    tiny = ["train.num_envs=2", "train.test_every=384", "train.test_episodes=2", "train.stop_reward=null",
            "log.tensorboard=false", "log.console=false", "algo.learning_starts=64", "algo.batch_size=32",
            "algo.train_freq=4", "algo.gradient_steps=2", "actor.hidden_sizes=[32,32]"]
    differ = DIFFER[JOINT[algo][0].removeprefix("algo=")]
    args = ["-m", *tiny, *JOINT[algo], "seed=0,1", differ, "algo.lr=1e-3", "train.total_steps=384"]
    population = run(*args, "hydra/launcher=population", "hydra.launcher.n_jobs=1", "hydra.sweep.dir=pop", cwd=tmp_path)
    assert population.returncode == 0, population.stderr[-3000:]
    assert "cannot train in a population" not in population.stdout + population.stderr
    basic = run(*args, "hydra.sweep.dir=basic", cwd=tmp_path)
    assert basic.returncode == 0, basic.stderr[-3000:]
    for job in map(str, range(4)):
        pop, bas = tmp_path / "pop" / job, tmp_path / "basic" / job
        assert "members" in (pop / "train.log").read_text().split("time: ")[-1]  # it trained in the population
        a, b = final(pop), final(bas)
        assert a["state"]["env_steps"] == b["state"]["env_steps"] == 384
        assert a["algo"]["gradient_updates"] == b["algo"]["gradient_updates"] > 0
        nets_a, nets_b = a["algo"]["networks"], b["algo"]["networks"]
        assert all(torch.allclose(nets_a[k], nets_b[k], atol=1e-4) for k in nets_a), job
        acted, alone = numpy.asarray(a["buffer"]["actions"]), numpy.asarray(b["buffer"]["actions"])
        tests = [[json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
                 for run_dir in (pop, bas)]
        assert [t["env_steps"] for t in tests[0]] == [t["env_steps"] for t in tests[1]] == [384]
        if "coop_match" in JOINT[algo][1]:  # Discrete: the same actions and test episodes, bit for bit
            assert numpy.array_equal(acted, alone)
            assert [(t["returns"], t["agent_returns"]) for t in tests[0]] == \
                   [(t["returns"], t["agent_returns"]) for t in tests[1]]
        else:  # Box: the actions of weights equal to float tolerance
            assert numpy.allclose(acted, alone, atol=1e-4)
            for ours, theirs in zip(*tests, strict=True):
                assert ours["returns"] == pytest.approx(theirs["returns"], abs=1e-3)


def test_masac_members_count_an_agent_that_left_at_their_own_target_entropy():
    """MASAC's temperature step counts an agent that has left (its active flag 0) at its share of the target entropy:
    each member's own target (they may differ in it), not the first member's. Half the stored rows have agent_1 gone."""
    def filled(*more: str):
        components, _ = prepare(compose_config(["algo=masac", "env=coop_reach", "train.num_envs=4",
                                                "log.tensorboard=false", "log.console=false", "algo.batch_size=32",
                                                "algo.learning_starts=64", "algo.gradient_steps=2",
                                                "actor.hidden_sizes=[32,32]", *more]))
        for _ in range(8):
            components.collector.collect(components.learner, random_actions=True)
        layout, stored = components.algo.layout, len(components.buffer)
        with torch.no_grad():
            components.buffer.obs[:stored:2, 1, layout.agent_size] = 0.0  # agent_1 left in every other transition
        return components, torch.get_rng_state()

    members = [filled("seed=0", "algo.target_entropy=-1"), filled("seed=0", "algo.target_entropy=-3")]
    clock = RunClock(128, 1024, 16)
    population, singles = assert_first_update_is_each_single_runs(members, [clock, clock])
    alphas = [float(c.algo.networks.log_alpha) for c, _ in members]
    assert alphas[0] != alphas[1]  # the same seed and data: only the targets differ, and they reached the temperature
