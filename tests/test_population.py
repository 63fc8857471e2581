"""hydra/launcher=population: a sweep's seeds trained as one batched population (rlcli/sweeps/population/)."""

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import forked_cli
import numpy as np
import pytest
import torch
from conftest import RL_TRAIN
from offline_fixtures import dataset_file
from test_resume import assert_equal_state, final

from rlcli.algos.compiled import FAST_TANH_VARIABLE
from rlcli.contracts import RunClock
from rlcli.registry import ConfigError
from rlcli.run.compose import compose_config
from rlcli.run.state import prepare
from rlcli.run.trainer import Trainer
from rlcli.sweeps.population import streams
from rlcli.sweeps.population.collect import collect_together
from rlcli.sweeps.population.launch import group_jobs, split_for_workers
from rlcli.sweeps.population.lockstep import LockstepPopulation, population_update
from rlcli.sweeps.population.members import Member
from rlcli.sweeps.population.numpy_stream import NumpyStream
from rlcli.sweeps.population.stacking import stack_weights

PPO = ["algo=ppo", "algo.n_steps=32", "algo.batch_size=64", "algo.n_epochs=3"]
TINY = ["env=CartPole-v1", "train.num_envs=4", "train.test_every=256", "train.test_episodes=2",
        "train.stop_reward=null", "log.tensorboard=false", "log.console=false"]
ALGOS = {"ppo": PPO, "a2c": ["algo=a2c", "algo.n_steps=8"], "pg": ["algo=pg", "algo.n_steps=32", "algo.baseline=true"],
         "ppo-cnn": [*PPO, "env=PixelGoal-v0"],  # rlcli's tiny image task: actor=cnn_small
         "ppo-shared": [*PPO, "actor.shared=true"],  # one body under two names (policy and value)
         # gSDE: each member explores with its own matrices, resampled from its own stream every 4 steps
         "ppo-sde": [*PPO, "env=Pendulum-v1", "algo.use_sde=true", "algo.sde_sample_freq=4"],
         "a2c-sde": ["algo=a2c", "algo.n_steps=8", "env=Pendulum-v1", "algo.use_sde=true", "algo.sde_sample_freq=4"],
         # algo.target_kl: each member ends its epochs where its single run does (not drawing the later ones)
         "ppo-target-kl": [*PPO, "algo.n_epochs=8", "algo.target_kl=0.0001"],  # members stop after 8, 6, 4
         # the adaptive KL penalty: each member's own coefficient in its loss, adapted after its own update
         "ppo-kl": ["algo=ppo_kl", "algo.n_steps=32", "algo.batch_size=64", "algo.n_epochs=3"],
         # PQN: epsilon-greedy acting on a LayerNorm Q-network, Q(lambda) returns, epochs of minibatches, RAdam
         "pqn": ["algo=pqn", "algo.n_steps=32", "algo.num_minibatches=2", "algo.n_epochs=2",
                 "algo.exploration_initial_eps=0.3"],
         # valid-action masks: each member acts among its own env's valid actions (its act_masked), the masks ride
         # in its rollout to the update
         "maskable-ppo": ["algo=maskable_ppo", "algo.n_steps=32", "algo.batch_size=64", "algo.n_epochs=3",
                          "env=ValidMoves-v0"]}
LINEAR_NETWORKS = ("ppo", "a2c", "pg", "ppo-shared", "ppo-target-kl", "ppo-kl", "pqn", "maskable-ppo")
# categorical heads: each member's uniforms drawn from its own stream, then all members sample in one call (a masked
# member samples in its own act_masked call instead)
DRAWS_APART = ("ppo", "a2c", "pg", "ppo-cnn", "ppo-shared", "ppo-target-kl", "ppo-kl", "maskable-ppo")
# a third member's own loss setting, which the population must batch (PQN's loss has no coefficient: its returns'
# q_lambda)
OWN_SETTING = {"pqn": "algo.q_lambda=0.3"}

# the declared kinds, as refusals list them
ALL_BATCHABLE = ("a2c, awac, bc, c51, cql, crossq, ddpg, discrete_cql, dqn, iql, maddpg, masac, maskable_ppo, pg, ppo, "
                 "ppo_kl, pqn, qmix, qrdqn, rebrac, sac, td3, td3_bc, tqc and vdn")


def overrides(algo: str, *more: str) -> list[str]:
    """TINY with the algorithm's settings (an env there replaces CartPole)."""
    own = ALGOS[algo]
    env = [a for a in own if a.startswith("env=")]
    return [*(a for a in TINY if not (env and a.startswith("env="))), *own, *more]


def collected(*more: str, algo: str = "ppo"):
    """A member's components after its first collect, and its torch RNG state then (as its single run has it)."""
    components, _ = prepare(compose_config(overrides(algo, *more)))
    components.collector.collect(components.learner, random_actions=False)
    return components, torch.get_rng_state()


@pytest.mark.parametrize("algo", list(ALGOS))
def test_a_members_first_update_is_its_single_runs_within_float_tolerance(algo):
    members = [collected("seed=0", algo=algo), collected("seed=1", "algo.lr=1e-3", algo=algo),
               collected("seed=2", OWN_SETTING.get(algo, "algo.ent_coef=0.01"), "algo.gamma=0.9", algo=algo)]
    singles = []
    for components, rng in members:  # each single run's own update, on a copy
        single = copy.deepcopy(components.algo)
        torch.set_rng_state(rng)
        singles.append((single, single.update(components.buffer, RunClock(128, 1024)), torch.get_rng_state()))
    population = population_update([c.algo for c, _ in members], [c.buffer for c, _ in members])
    rngs = [rng for _, rng in members]
    results = population.update([True] * 3, [c.buffer for c, _ in members], rngs)
    for (components, _), (single, metrics, rng_after), result, rng in zip(members, singles, results, rngs,
                                                                          strict=True):
        assert torch.equal(rng, rng_after)  # the member's RNG stream advanced exactly as its single run's
        for mine, theirs in zip(components.algo.networks.parameters(), single.networks.parameters(), strict=True):
            assert torch.allclose(mine, theirs, atol=1e-6, rtol=0)
        assert result is not None
        assert set(result) == set(metrics)
        for key in metrics:
            assert float(result[key]) == pytest.approx(float(metrics[key]), rel=1e-4, abs=1e-6), key
    # the members learned different things: their rows are not shared by mistake
    first, second = (next(c.algo.networks.parameters()) for c, _ in members[:2])
    assert not torch.equal(first, second)
    # networks of linear layers (and layer norms) act in one batched product per layer, vmap's numbers, and their
    # loss runs on the members' stacked rows with per-member means, which the first call checked against vmap bit
    # for bit (losses, logs and gradients); the others (a Gaussian's log std, a convolution) through vmap
    assert (population.acting._act.fast is not None) is (algo in LINEAR_NETWORKS)
    (loss,) = population.direct.values()
    assert (loss.fast is not None) is (algo in LINEAR_NETWORKS)
    # FusedAdam (PPO, PG), RMSprop (A2C) and RAdam (PQN) members can step as one call where they share settings
    # (here they do not: member 1's lr differs, so each steps its own optimizer)
    assert population.stacked_steps["train_step"] is not None


@pytest.mark.parametrize("algo", ["ppo", "a2c", "pqn"])
def test_a_seed_sweeps_members_step_their_optimizers_in_one_call(algo):
    """Members that share their optimizer's settings (a seed sweep) step as one call (StackedStep: PPO's FusedAdam,
    A2C's RMSprop, PQN's RAdam), and still as their single runs do."""
    members = [collected("seed=0", algo=algo), collected("seed=1", algo=algo)]
    singles = []
    for components, rng in members:
        single = copy.deepcopy(components.algo)
        torch.set_rng_state(rng)
        single.update(components.buffer, RunClock(128, 1024))
        singles.append(single)
    population = population_update([c.algo for c, _ in members], [c.buffer for c, _ in members])
    population.update([True, True], [c.buffer for c, _ in members], [rng for _, rng in members])
    stacked = population.stacked_steps["train_step"]
    assert stacked is not None and stacked.counts_equal is True
    for (components, _), single in zip(members, singles, strict=True):
        assert all(p.grad is None for p in components.algo.networks.parameters())  # never handed its rows
        for mine, theirs in zip(components.algo.networks.parameters(), single.networks.parameters(), strict=True):
            assert torch.allclose(mine, theirs, atol=1e-6, rtol=0)
        for key, state in single.optimizer.state_dict()["state"].items():
            assert torch.equal(components.algo.optimizer.state_dict()["state"][key]["step"], state["step"])


@pytest.mark.parametrize("algo", list(ALGOS))
def test_a_members_first_rollout_is_its_single_runs(algo, tmp_path):
    singles = []
    for seed in (0, 1):
        components, _ = collected(f"seed={seed}", algo=algo)
        singles.append(components.buffer.flat())
    members = []
    for seed in (0, 1):
        components, state = prepare(compose_config(overrides(algo, f"seed={seed}")))
        run_dir = tmp_path / str(seed)
        members.append(Member(Trainer(components, run_dir, state), run_dir, seed, "", {}))  # its RNG, as built
    population = population_update([m.trainer.c.algo for m in members], [m.trainer.c.buffer for m in members])
    assert population.acting.draws_apart is (algo in DRAWS_APART)
    stats = collect_together(members, population)
    assert all(s is not None and s.steps == singles[0].mask.shape[0] for s in stats)
    for member, single in zip(members, singles, strict=True):
        mine = member.trainer.c.buffer.flat()
        if mine.actions.is_floating_point():  # Box actions: the batched product's rounding (~1e-7) reaches the env
            assert torch.allclose(mine.obs, single.obs, atol=1e-5) and torch.allclose(mine.actions, single.actions,
                                                                                     atol=1e-5)
        else:  # the same draws, bit for bit
            assert torch.equal(mine.obs, single.obs) and torch.equal(mine.actions, single.actions)
        for field in ("log_probs", "values", "advantages", "returns"):
            assert torch.allclose(getattr(mine, field), getattr(single, field), atol=1e-5), field


def test_a_member_that_has_stopped_is_carried_but_not_stepped():
    members = [collected("seed=0"), collected("seed=1")]
    before = [copy.deepcopy(c.algo.networks.state_dict()) for c, _ in members]
    population = population_update([c.algo for c, _ in members], [c.buffer for c, _ in members])
    results = population.update([True, False], [c.buffer for c, _ in members], [r for _, r in members])
    assert results[1] is None and results[0] is not None
    after = [c.algo.networks.state_dict() for c, _ in members]
    assert all(torch.equal(before[1][k], after[1][k]) for k in before[1])
    assert any(not torch.equal(before[0][k], after[0][k]) for k in before[0])


def test_a_members_stream_draws_from_its_own_state_and_puts_the_global_one_back():
    """The tuple form is a member's stream on a GPU (its CUDA generators' states beside the CPU one; an empty list
    here, where torch sees no GPU); tests/test_cuda.py checks it with a GPU's."""
    member = {"torch": torch.manual_seed(7).get_state(), "cuda": torch.cuda.get_rng_state_all()}
    torch.manual_seed(0)
    outer = torch.get_rng_state()
    for form in (streams.of_member({"torch": member["torch"]}), streams.of_member(member)):
        rows = [form]
        drawn = streams.drawn_with(rows, 0, lambda: torch.rand(3))
        assert torch.equal(torch.get_rng_state(), outer)  # the global stream is as it was
        torch.set_rng_state(member["torch"])
        assert torch.equal(drawn, torch.rand(3))  # the member's own draws
        assert isinstance(rows[0], tuple) == isinstance(form, tuple)
        advanced = rows[0][0] if isinstance(rows[0], tuple) else rows[0]
        assert torch.equal(advanced, torch.get_rng_state())  # advanced past them
        kept = dict(member)
        streams.keep(kept, rows[0])  # back into the member's RNG states
        assert torch.equal(kept["torch"], advanced)
        torch.set_rng_state(outer)


def test_a_members_numpy_stream_is_its_single_runs_across_interleaved_turns():
    """Each member draws from numpy's global functions in its turns exactly what one process seeded as it draws
    alone: uniform draws, an odd number of legacy normals (the cached second of a pair survives the other members'
    turns), a seed call; draws between turns touch no member; get_state in a turn is the member's."""
    def script(k: int):
        """The draws a member makes in its k-th turn."""
        if k == 1:
            return [np.random.standard_normal(3)]  # odd: the pair's second normal stays cached into turn 2
        if k == 2:
            return [np.random.standard_normal(1)]  # that cached normal: the key does not move
        if k == 3:
            return [np.random.standard_normal(1)]  # a new pair: its second is cached again
        if k == 4:
            np.random.seed(99)
        return [np.random.rand(2), np.random.standard_normal(2)] if k % 2 else [np.random.rand(4)]

    def alone(seed: int, turns: int):
        np.random.seed(seed)
        draws = []
        for k in range(turns):
            draws += script(k)
            draws.append(np.random.get_state()[1][:4].copy())  # what a checkpoint in this turn would save
        return draws

    turns = 6
    expected = {seed: alone(seed, turns) for seed in (3, 4)}
    streams_of = {}
    for seed in (3, 4):
        np.random.seed(seed)
        streams_of[seed] = NumpyStream(np.random.get_state())
    got = {3: [], 4: []}
    for k in range(turns):
        for seed in (3, 4):
            streams_of[seed].enter()
            got[seed] += script(k)
            got[seed].append(np.random.get_state()[1][:4].copy())
            streams_of[seed].leave()
            np.random.rand(5)  # between turns: nobody's stream
    for seed in (3, 4):
        assert len(got[seed]) == len(expected[seed])
        for ours, theirs in zip(got[seed], expected[seed], strict=True):
            np.testing.assert_array_equal(ours, theirs)


def test_stacked_weights_are_the_members_own_tensors():
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    weight_a = a.weight
    params, _ = stack_weights([a, b])
    assert a.weight is weight_a  # the same Parameter (an optimizer's reference stays valid)
    with torch.no_grad():
        params["weight"][1].fill_(7.0)
        a.weight.fill_(-1.0)
    assert torch.equal(b.weight, torch.full((2, 3), 7.0)) and torch.equal(params["weight"][0], a.weight)
    with pytest.raises(ConfigError, match="differ in the shape of weight"):
        stack_weights([torch.nn.Linear(3, 2), torch.nn.Linear(4, 2)])
    tied = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    tied[1].weight = tied[0].weight  # one weight in two modules: a member's swap could not reach both
    with pytest.raises(ConfigError, match=r"the network ties 0.weight and 1.weight \(one weight in two modules\)"):
        stack_weights([tied, copy.deepcopy(tied)])
    shared = torch.nn.Linear(3, 3)  # one module under two names: it can
    stack_weights([torch.nn.Sequential(shared, shared), copy.deepcopy(torch.nn.Sequential(shared, shared))])


def test_populations_are_halved_until_every_worker_has_one():
    assert split_for_workers([[0, 1, 2, 3, 4, 5, 6, 7]], 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert split_for_workers([[0, 2, 4], [1]], 3) == [[0, 2], [1], [4]]
    assert split_for_workers([[0], [1]], 4) == [[0], [1]]  # single members are not split further
    assert split_for_workers([[0, 1, 2]], 1) == [[0, 1, 2]]


def test_jobs_that_differ_in_seed_or_batchable_values_share_a_population():
    def cfg(*overrides: str):
        return compose_config(["algo=ppo", "env=CartPole-v1", *overrides])

    configs = [cfg("seed=0"), cfg("seed=1", "algo.lr=1e-3"), cfg("seed=0", "env=Acrobot-v1"),
               cfg("seed=2", "algo.gamma=0.9"), cfg("seed=0", "algo.n_epochs=3"), cfg("seed=1", "env=Acrobot-v1")]
    assert group_jobs(configs, max_members=64) == [[0, 1, 3], [2, 5], [4]]
    assert group_jobs(configs, max_members=2) == [[0, 1], [3], [2, 5], [4]]
    # the losses read reward_scale from the first member's algorithm: members must share it
    sac = [compose_config(["algo=sac", "env=Pendulum-v1", *o]) for o in
           (["seed=0"], ["seed=1", "algo.tau=0.01", "algo.ent_coef=0.2"], ["seed=0", "algo.reward_scale=5"])]
    assert group_jobs(sac, max_members=64) == [[0, 1], [2]]


def test_population_refuses_what_it_cannot_batch_in_one_line():
    trpo, _ = prepare(compose_config(["algo=trpo", "env=CartPole-v1"]))
    with pytest.raises(ConfigError, match=f"TRPO cannot train in a population yet: {ALL_BATCHABLE} can"):
        population_update([trpo.algo, trpo.algo], [trpo.buffer, trpo.buffer])
    gru, _ = prepare(compose_config(["algo=ppo", "env=CartPoleNoVel-v1", "actor=gru"]))
    with pytest.raises(ConfigError, match="a recurrent actor cannot train in a population yet; a2c, maskable_ppo, pg, "
                                          r"ppo, ppo_kl and pqn \(MLP or CNN actors\) without it can"):
        population_update([gru.algo, gru.algo], [gru.buffer, gru.buffer])
    # null turns a step's branch off for all members (the first member's decides): all set it, or none does
    # (a cold review saw target_kl=null,0.0002 train both members without early stops, and kl_coef=null,1.0 end in a
    # traceback at the first update)
    for setting, values in (("target_kl", ("null", "0.0002")), ("kl_coef", ("null", "1.0"))):
        built = [prepare(compose_config(["algo=ppo", "env=CartPole-v1", f"algo.{setting}={v}"]))[0] for v in values]
        with pytest.raises(ConfigError, match=rf"^some members set algo\.{setting} and some leave it null "
                                              rf"\(null, {values[1]}\): members batch when all set it or none does$"):
            population_update([c.algo for c in built], [c.buffer for c in built])
        both = [prepare(compose_config(["algo=ppo", "env=CartPole-v1", f"algo.{setting}={v}"]))[0]
                for v in (values[1], "0.5")]
        assert isinstance(population_update([c.algo for c in both], [c.buffer for c in both]), LockstepPopulation)
    clips = [prepare(compose_config(["algo=ppo", "env=CartPole-v1", f"algo.max_grad_norm={v}"]))[0]
             for v in ("null", "0.5")]  # each member's own clip (none: inf), as before
    assert isinstance(population_update([c.algo for c in clips], [c.buffer for c in clips]), LockstepPopulation)


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return forked_cli.run(args, cwd, timeout=600)  # (a sweep, -m, is a process of its own)


@pytest.mark.parametrize("parallel", [["hydra.launcher.n_jobs=1"], ["hydra.launcher.n_jobs=2"]],
                         ids=["one-process", "n_jobs=2"])
def test_a_population_sweep_writes_what_the_basic_launcher_writes(tmp_path, parallel):
    args = ["-m", *PPO, *TINY, "seed=0,1,2", "train.total_steps=512"]
    population = run(*args, "hydra/launcher=population", *parallel, "hydra.sweep.dir=pop", cwd=tmp_path)
    assert population.returncode == 0, population.stderr[-3000:]
    basic = run(*args, "hydra.sweep.dir=basic", cwd=tmp_path)
    assert basic.returncode == 0, basic.stderr[-3000:]
    for job in ("0", "1", "2"):
        pop, bas = tmp_path / "pop" / job, tmp_path / "basic" / job
        assert sorted(p.name for p in pop.iterdir()) == sorted(p.name for p in bas.iterdir())
        assert sorted(p.name for p in (pop / "checkpoints").iterdir()) == \
            sorted(p.name for p in (bas / "checkpoints").iterdir())
        # the same test episodes: the same actions, from weights equal to float tolerance
        assert [line.split('"returns"')[1] for line in (pop / "eval.jsonl").read_text().splitlines()] == \
               [line.split('"returns"')[1] for line in (bas / "eval.jsonl").read_text().splitlines()]
        a, b = final(pop)["algo"]["networks"], final(bas)["algo"]["networks"]
        assert all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)
        assert '"status": "completed"' in (pop / "status.json").read_text()
        assert "done: 512 env steps" in (pop / "train.log").read_text()
        if job == "0":  # with n_jobs=2 job 2 is a population of one, trained as a single run
            time_line = (pop / "train.log").read_text().split("time: ")[-1]  # the other members' turns, named
            assert re.search(r"\bmembers \d+%", time_line) and not re.search(r"\bothers \d+%", time_line)
    # a member's checkpoint stands alone: member-sized, and rl-eval reads it as any run's
    sizes = [(tmp_path / sweep / "1" / "checkpoints" / "best.pt").stat().st_size for sweep in ("pop", "basic")]
    assert sizes[0] < 1.2 * sizes[1]
    evaluated = forked_cli.run([str(tmp_path / "pop" / "1"), "episodes=2"], tmp_path, timeout=300, program="rl-eval")
    assert evaluated.returncode == 0, evaluated.stderr


def test_a_diverging_member_is_handled_as_its_single_run_and_the_others_train_on(tmp_path):
    """train.on_nonfinite=skip in a population: the member whose learning rate jumps to 1e30 has its updates undone
    at the steps its single run's are, then fails as it does (its own line), while the other member completes with
    its single run's test returns. (An undone update loads the member's optimizer state anew: the stacked state
    follows it, tests/test_stacked_step.py.)"""
    args = ["-m", *PPO, *TINY, "train.total_steps=1024", "train.on_nonfinite=skip", "train.max_nonfinite=2",
            "algo.schedules.lr=step:0.0003:1e30:0.5,step:0.0003:0.0003:0.5"]
    population = run(*args, "hydra/launcher=population", "hydra.launcher.n_jobs=1", "hydra.sweep.dir=pop", cwd=tmp_path)
    basic = run(*args, "hydra.sweep.dir=basic", cwd=tmp_path)
    assert population.returncode == basic.returncode == 1
    assert "job 0 failed: non-finite update result" in population.stdout + population.stderr

    def undone(sweep: str) -> list[str]:
        log = (tmp_path / sweep / "0" / "train.log").read_text()
        return re.findall(r"after the update at ([\d,]+) env steps: the update was undone", log)

    assert undone("pop") == undone("basic") and len(undone("pop")) == 2
    for sweep in ("pop", "basic"):
        assert json.loads((tmp_path / sweep / "0" / "status.json").read_text())["status"] == "failed"
        assert json.loads((tmp_path / sweep / "1" / "status.json").read_text())["status"] == "completed"
    returns = [[line.split('"returns"')[1] for line in (tmp_path / sweep / "1" / "eval.jsonl").read_text().splitlines()]
               for sweep in ("pop", "basic")]
    assert returns[0] == returns[1] and len(returns[0]) == 4


def test_what_cannot_batch_runs_one_job_at_a_time_after_a_warning(tmp_path):
    out = run("-m", "algo=dqn", "actor=gru", "buffer=sequence", "env=CartPoleNoVel-v1", "seed=0,1",
              "train.total_steps=300",
              "algo.learning_starts=100", "train.test_every=300", "train.test_episodes=1", "log.tensorboard=false",
              "log.console=false", "hydra/launcher=population", "hydra.launcher.n_jobs=1", "hydra.sweep.dir=sw",
              cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("population launcher: a recurrent Q-network (actor=gru/lstm) cannot train in a population yet; awac, bc, "
            "c51, cql, crossq, ddpg, discrete_cql, dqn, iql, maddpg, masac, qmix, qrdqn, rebrac, sac, td3, td3_bc, tqc "
            "and vdn (MLP or CNN networks, buffer=replay, nstep, per, ere or her) without it can"
            in out.stderr + out.stdout)
    for job in ("0", "1"):
        assert '"status": "completed"' in (tmp_path / "sw" / job / "status.json").read_text()


def test_n_jobs_auto_is_one_process_per_core_on_a_cpu_and_one_on_a_gpu(monkeypatch, capsys):
    from omegaconf import OmegaConf

    from rlcli.sweeps.population import workers
    from rlcli.sweeps.population.workers import workers_for

    def jobs(count: int, **settings):
        return [OmegaConf.create({"device": "cpu", "torch_threads": 1, **settings}) for _ in range(count)]

    # the machine's available memory is not the test's: a loaded CI machine had 4 GiB free and gave 4, not 8
    monkeypatch.setattr(workers, "available_memory", lambda: 64 * 2**30)
    assert workers_for(3, jobs(8), cores=2) == 3  # a number is the user's
    assert workers_for("auto", jobs(8), cores=2) == 2
    assert workers_for("auto", jobs(8), cores=16) == 8  # at most one per job
    assert workers_for("auto", jobs(8), cores=1) == 1
    assert workers_for("auto", jobs(8, torch_threads=2), cores=4) == 2  # each process's threads count
    assert workers_for("auto", jobs(8, torch_threads=0), cores=4) == 1  # 0: torch's default, every core
    assert workers_for("auto", jobs(8), cores=16, memory=3 * 2**30 + 1) == 3  # a GiB of available memory each
    assert workers_for("auto", jobs(8, device="cuda"), cores=16) == 1  # the members share the GPU in one process
    assert workers_for("auto", jobs(1), cores=16) == 1
    assert capsys.readouterr().err == ""
    monkeypatch.setitem(sys.modules, "joblib", None)  # the base install, without the sweep extra: the population's
    assert workers_for("auto", jobs(8), cores=2) == 2  # own workers need no other launcher's package (issue 56)
    assert capsys.readouterr().err == ""


def test_bad_launcher_options_are_one_line(tmp_path):
    for bad, said in (("hydra.launcher.n_jobs=0", "hydra.launcher.n_jobs=0 must be auto or an integer >= 1"),
                      ("hydra.launcher.n_jobs=all", "hydra.launcher.n_jobs='all' must be auto or an integer >= 1"),
                      ("hydra.launcher.max_members=0", "hydra.launcher.max_members=0 must be an integer >= 1"),
                      ("hydra.launcher.max_members=abc", "hydra.launcher.max_members=abc: Value 'abc' of type 'str' "
                                                         "could not be converted to Integer"),
                      ("hydra.launcher.max_member=3", "unknown key 'hydra.launcher.max_member' (did you mean "
                                                      "'max_members'?); valid keys: max_members, n_jobs")):
        out = run("-m", *PPO, *TINY, "seed=0,1", "hydra/launcher=population", bad, cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.startswith(f"rl-train: error: {said}"), out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "multirun").exists()


# an off-policy population's members: DQN with replay, warm-up and target updates inside the run
DQN = ["algo=dqn", "algo.learning_starts=300", "algo.batch_size=32", "algo.train_freq=4", "algo.gradient_steps=2",
       "algo.target_update_interval=200", "actor.hidden_sizes=[32,32]"]


# a soft actor-critic's: SAC with a learned temperature, Polyak targets and three optimizers per member
SAC = ["algo=sac", "env=Pendulum-v1", "algo.learning_starts=300", "algo.batch_size=32", "algo.train_freq=4",
       "algo.gradient_steps=2", "actor.hidden_sizes=[32,32]"]


# a deterministic actor-critic's: TD3 with each member's own Ornstein-Uhlenbeck noise state and policy delay
TD3 = ["algo=td3", "env=Pendulum-v1", "algo.learning_starts=300", "algo.batch_size=32", "algo.train_freq=4",
       "algo.gradient_steps=3", "algo.noise=ornstein_uhlenbeck", "actor.hidden_sizes=[32,32]"]


# CrossQ's: each member's batch-renorm statistics and policy delay, stopped after its first critic steps
# (renormalizing from its 100th on, after the resume)
CROSSQ = ["algo=crossq", "env=Pendulum-v1", "algo.learning_starts=100", "algo.batch_size=32", "algo.train_freq=4",
          "algo.gradient_steps=3", "algo.critic_hidden_sizes=[32,32]", "actor.hidden_sizes=[32,32]",
          "algo.renorm_warmup_steps=100"]


# many agents' joint transitions: QMIX's team of Q-networks and mixer, each member's target updates and epsilon
QMIX = ["algo=qmix", "env=coop_match", "algo.learning_starts=300", "algo.batch_size=32", "algo.train_freq=4",
        "algo.gradient_steps=2", "algo.target_update_interval=200", "actor.hidden_sizes=[32,32]"]


@pytest.mark.slow
@pytest.mark.parametrize("family", [PPO, [*PPO, "compile=true"], ALGOS["pqn"], DQN, SAC, TD3, CROSSQ, QMIX],
                         ids=["ppo", "ppo-compiled", "pqn", "dqn", "sac", "td3", "crossq", "qmix"])
def test_sigterm_then_resume_auto_is_bit_identical_to_an_uninterrupted_population(tmp_path, family):
    tiny = [a for a in TINY if not (a.startswith("env=") and any(f.startswith("env=") for f in family))]
    # 1,024 steps (2,048 before: the same checks, half the training). The SIGTERM lands after job 1's first checkpoint
    # (256): measured 2026-11-28 the stop came at 272-384 env steps in every family, under a load of 5 on 2 cores. The
    # off-policy members learn from 100-300 steps on, DQN's targets update every 200 from 400, after the stop. CrossQ
    # keeps 2,048: its critics renormalize from their 100th forward pass (~630 steps), its policy from its 100th (~1,500
    # steps; critics 54 and 174 passes, policy 27 and 87, at 384 and 1,024 steps), and both should after the resume.
    steps = 2048 if family is CROSSQ else 1024
    args = ["-m", *family, *tiny, "seed=0,1", f"train.total_steps={steps}", "train.checkpoint_every=256",
            "deterministic=true", "hydra/launcher=population", "hydra.launcher.n_jobs=1"]
    straight = forked_cli.run([*args, "hydra.sweep.dir=straight"], tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    proc = forked_cli.start([*args, "hydra.sweep.dir=stopped"], tmp_path)
    deadline = time.time() + 120
    while not (tmp_path / "stopped" / "1" / "checkpoints" / "latest").exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert err.count("resume=auto (this job alone: rl-train resume=") == 2, err[-3000:]  # each member's line
    stopped_at = [final(tmp_path / "stopped" / job)["state"]["env_steps"] for job in ("0", "1")]
    assert stopped_at[0] == stopped_at[1] and 0 < stopped_at[0] < steps  # both saved at the same safe point
    resumed = forked_cli.run([*args, "hydra.sweep.dir=stopped", "resume=auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for job in ("0", "1"):
        a, b = final(tmp_path / "straight" / job), final(tmp_path / "stopped" / job)
        assert a["state"]["env_steps"] == b["state"]["env_steps"] == steps
        assert_equal_state(a["algo"], b["algo"], "algo")  # weights, Adam state, counters
        assert_equal_state(a["buffer"], b["buffer"], "buffer")


def finish(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`rl-train ...` (command[0] is RL_TRAIN) to its end, forked (tests/forked_cli.py: 2 s less of start-up) where
    the test is about what it trains, not about which process it is (the runs a test signals or kills stay real)."""
    assert command[0] == str(RL_TRAIN), command[0]
    return forked_cli.run(command[1:], cwd)


def _wait_until_saved(proc: subprocess.Popen, sweep: Path, jobs: str = "0123") -> None:
    """Until each of `jobs` in the sweep that `proc` runs has a checkpoint (at most 180 s; `proc` still running)."""
    deadline = time.time() + 180
    while not all((sweep / job / "checkpoints" / "latest").exists() for job in jobs):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)


@pytest.mark.slow
def test_sigterm_stops_populations_in_worker_processes_with_checkpoints_then_resume_auto_is_exact(tmp_path):
    """hydra.launcher.n_jobs=2: a SIGTERM to rl-train goes on to both worker processes, whose populations stop at
    their next safe point with every member's checkpoint (before, joblib was interrupted, killed the workers, and
    their members' records said "running"); resume=auto then ends where one uninterrupted process ends."""
    args = [str(RL_TRAIN), "-m", *PPO, *TINY, "seed=0,1,2,3", "train.total_steps=2048", "train.checkpoint_every=256",
            "deterministic=true", "hydra/launcher=population", "hydra.launcher.n_jobs=1"]
    straight = finish([*args, "hydra.sweep.dir=straight"], tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    two = [*args[:-1], "hydra.launcher.n_jobs=2", "hydra.sweep.dir=stopped"]
    proc = subprocess.Popen(two, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_until_saved(proc, tmp_path / "stopped")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "during start-up" not in err and err.count("rl-train: SIGTERM: stopped at") == 4, err[-3000:]
    for job in "0123":
        assert json.loads((tmp_path / "stopped" / job / "status.json").read_text())["status"] == "interrupted"
    stopped_at = [final(tmp_path / "stopped" / job)["state"]["env_steps"] for job in "0123"]
    # a worker's two members saved at the same step (the halves: jobs 0, 1 and jobs 2, 3), before the end
    assert stopped_at[0] == stopped_at[1] and stopped_at[2] == stopped_at[3] and max(stopped_at) < 2048, stopped_at
    resumed = finish([*two, "resume=auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for job in "0123":
        a, b = final(tmp_path / "straight" / job), final(tmp_path / "stopped" / job)
        assert a["state"]["env_steps"] == b["state"]["env_steps"] == 2048
        assert_equal_state(a["algo"], b["algo"], "algo")


@pytest.mark.slow
def test_a_stopped_parallel_sweep_starts_none_of_its_waiting_populations(tmp_path):
    """Three populations (n_epochs 3, 4, 5; seeds 0, 1) on two workers: the third waits for a worker. A SIGTERM
    stops the two that train, and the third never starts (it trained to its end after the stop before: joblib
    handed it to a worker that had stopped); resume=auto then trains all six members to their end."""
    # 4,096 steps a member (8,192 before): the stop still comes at the first checkpoints (256), and the resume trains
    # half as much
    args = [str(RL_TRAIN), "-m", *PPO, *TINY, "algo.n_epochs=3,4,5", "seed=0,1", "train.total_steps=4096",
            "train.checkpoint_every=256", "hydra/launcher=population", "hydra.launcher.n_jobs=2",
            "hydra.sweep.dir=sweep"]
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_until_saved(proc, tmp_path / "sweep")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert not any((tmp_path / "sweep" / job).exists() for job in "45"), sorted(p.name for p in
                                                                               (tmp_path / "sweep").iterdir())
    resumed = finish([*args, "resume=auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for job in "012345":
        record = json.loads((tmp_path / "sweep" / job / "status.json").read_text())
        assert record["status"] == "completed" and record["env_steps"] == 4096, record


def _worker_pids(parent: int, with_server: bool = False) -> list[int]:
    """The worker processes that `parent` (rl-train) started, from /proc: joblib's loky processes (its children),
    or the population launcher's, which its fork server (its child) forks (`with_server`: that server)."""
    processes = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        processes[int(entry.name)] = (ppid, command)
    servers = {pid for pid, (ppid, command) in processes.items()
               if ppid == parent and "multiprocessing.forkserver" in command}
    if with_server:
        return sorted(servers)
    return [pid for pid, (ppid, command) in processes.items()
            if (ppid == parent and "LokyProcess" in command) or ppid in servers]


def kill_a_worker_then_expect_one_line(proc: subprocess.Popen, what: str) -> None:
    """kill -9 on one of `proc`'s two workers: `proc` (rl-train) then ends with exit 1 and one last line, no
    traceback."""
    workers = _worker_pids(proc.pid)
    assert len(workers) == 2, workers
    os.kill(workers[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        f"rl-train: a {what} worker process was killed (SIGKILL(-9))"), err[-3000:]


def _wait_until_gone(pids: list[int]) -> None:
    """Until none of the processes `pids` runs (at most 60 s)."""
    deadline = time.time() + 60
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        assert time.time() < deadline, "the orphaned workers are still running"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the worker processes through /proc")
def test_a_killed_worker_process_is_one_line_and_resume_auto_finishes_every_member(tmp_path):
    """kill -9 on one worker (what the out-of-memory killer does): joblib stops the other worker too; rl-train says
    so in one line (it was a joblib traceback) and exits 1, and resume=auto takes every member to its end."""
    # 4,096 steps a member (8,192 before): the kill still comes at the first checkpoints (256), the resume trains half
    args = [str(RL_TRAIN), "-m", *PPO, *TINY, "seed=0,1,2,3", "train.total_steps=4096", "train.checkpoint_every=256",
            "hydra/launcher=population", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=sweep"]
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_until_saved(proc, tmp_path / "sweep")
    kill_a_worker_then_expect_one_line(proc, "population")
    resumed = finish([*args, "resume=auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for job in "0123":
        record = json.loads((tmp_path / "sweep" / job / "status.json").read_text())
        assert record["status"] == "completed" and record["env_steps"] == 4096, record


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the worker processes through /proc")
def test_workers_whose_launcher_was_killed_stop_with_checkpoints_and_exit(tmp_path):
    """kill -9 on rl-train: its workers notice within a second, stop as on SIGTERM (every member's checkpoint,
    records `interrupted`) and exit, instead of training on unseen and holding their members' run locks; resume=auto
    then takes every member to its end."""
    # 8,192 steps a member (16,384 before): the kill comes at the first checkpoints (256), leaving the workers thousands
    # of steps to be caught in, and the resume trains half as much
    args = [str(RL_TRAIN), "-m", *PPO, *TINY, "seed=0,1,2,3", "train.total_steps=8192", "train.checkpoint_every=256",
            "hydra/launcher=population", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=sweep"]
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_until_saved(proc, tmp_path / "sweep")
    workers, server = _worker_pids(proc.pid), _worker_pids(proc.pid, with_server=True)
    assert len(workers) == 2 and len(server) == 1, (workers, server)
    proc.kill()
    proc.wait(timeout=30)
    _wait_until_gone(workers + server)  # the fork server exits with rl-train too
    for job in "0123":
        record = json.loads((tmp_path / "sweep" / job / "status.json").read_text())
        assert record["status"] == "interrupted", record
    resumed = finish([*args, "resume=auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for job in "0123":
        record = json.loads((tmp_path / "sweep" / job / "status.json").read_text())
        assert record["status"] == "completed" and record["env_steps"] == 8192, record


def test_a_signal_repeated_within_the_echo_window_is_one_signal(monkeypatch):
    """A population worker gets a terminal's Ctrl-C from its process group and again from the launcher: the repeat
    is the same stop (a checkpoint first); another signal, or the same one after the window, is a second stop."""
    from rlcli.run.stop import StopNow, StopSignals

    monkeypatch.setattr(StopSignals, "echo_seconds", 0.5)
    for repeat, pause, stops_now in ((signal.SIGTERM, 0.0, False), (signal.SIGINT, 0.0, True),
                                     (signal.SIGTERM, 0.6, True)):
        signals = StopSignals()
        restore = signals.catch()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(pause)
            if stops_now:
                with pytest.raises(StopNow):
                    os.kill(os.getpid(), repeat)
                    time.sleep(0.05)  # the handler runs between bytecodes
            else:
                os.kill(os.getpid(), repeat)
                time.sleep(0.05)
        finally:
            restore()
        assert signals.received == signal.SIGTERM


def test_the_outcome_scripts_exact_mann_whitney_test_matches_counts_by_hand():
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    try:
        from population_outcomes import mann_whitney_exact
    finally:
        sys.path.pop(0)
    assert mann_whitney_exact([1, 2, 3], [4, 5, 6]) == (0.0, 2 / 20)  # 2 of the 20 splits are as extreme
    assert mann_whitney_exact([5, 5], [5, 5]) == (2.0, 1.0)  # ties count a half each
    u, p = mann_whitney_exact([3, 1], [2, 4])  # U = 1 (3 > 2); every split of 4 values, |U - 2| >= 1: 4 of 6
    assert (u, p) == (1.0, pytest.approx(4 / 6))


def test_members_with_ray_collectors_run_one_at_a_time_after_a_warning(capsys):
    from types import SimpleNamespace

    from rlcli.sweeps.population.launch import _batched_update

    c, _ = prepare(compose_config(["algo=ppo", "env=CartPole-v1"]))
    remote = SimpleNamespace(trainer=SimpleNamespace(c=SimpleNamespace(collector=object(), algo=c.algo,
                                                                       buffer=c.buffer)), job_num=3)
    assert _batched_update([remote, remote]) is None
    said = capsys.readouterr()
    assert "collector=ray cannot train in a population (its workers step the envs)" in said.out + said.err
    assert "jobs 3, 3 run one at a time" in said.out + said.err


def test_a_declared_kind_without_its_step_is_one_line(monkeypatch):
    """A plugin algorithm that declares a population kind without the step that kind's update calls is refused in
    one line (which the launcher turns into its warning, the jobs then run one at a time), not a traceback at its
    first update."""
    import rlcli.sweeps.population.lockstep as lockstep

    class DeclaresOnly:
        networks = torch.nn.Linear(2, 2)

    for kind, missing in (("on_policy", "_update, act_on"), ("lockstep", "_gradient_step")):
        monkeypatch.setattr(lockstep, "declared_kind", lambda algo, kind=kind: kind)
        with pytest.raises(ConfigError, match=rf"^DeclaresOnly declares population='{kind}' but has no {missing} "):
            population_update([DeclaresOnly(), DeclaresOnly()], [None, None])


def test_the_declared_population_kinds_are_what_batches_and_everything_else_is_refused():
    """`AlgoSpec.population` is where the lists of what can batch come from, so it must not drift from the code:
    every built-in algorithm that declares a kind, built with its defaults, has the shape its kind's update calls
    and no refusal, and two of its runs make a population; every other built-in is refused in one line that names
    the declared ones."""
    from rlcli.registry import ALGOS
    from rlcli.sweeps.population.catalog import can_batch

    steps = {"on_policy": ("_update", "act_on"), "lockstep": ("_gradient_step",)}  # what each kind's update calls
    built_in = [n for n in ALGOS.names() if ALGOS.get(n).__module__.startswith("rlcli.")]
    declared = [n for n in built_in if ALGOS.spec(n).population is not None]
    assert can_batch() == f"{', '.join(declared[:-1])} and {declared[-1]}"
    assert {"ppo", "dqn", "sac", "td3"} <= set(declared)
    for name in built_in:
        spec = ALGOS.spec(name)
        env = ("ValidMoves-v0" if spec.action_masks else "coop_reach" if spec.action_spaces[0] == "JointBox"
               else "coop_match" if "JointActions" in spec.action_spaces
               else "CartPole-v1" if "Discrete" in spec.action_spaces else "Pendulum-v1")
        data = [f"dataset={dataset_file('cartpole' if env == 'CartPole-v1' else 'pendulum')}"] if spec.offline else []
        runs = [prepare(compose_config([f"algo={name}", f"env={env}", f"seed={s}", *data]))[0] for s in (0, 1)]
        if spec.population is None:  # named by its refusal where it has one (rnd_ppo's extra networks)
            own = getattr(runs[0].algo, "population_refusal", lambda: None)()
            said = f"cannot train in a population yet: {re.escape(can_batch())} can" if own is None else \
                f"{re.escape(own)} cannot train in a population yet; {re.escape(can_batch())} without it can"
            with pytest.raises(ConfigError, match=said):
                population_update([c.algo for c in runs], [c.buffer for c in runs])
            continue
        assert all(callable(getattr(runs[0].algo, step, None)) for step in steps[spec.population]), name
        refuses = getattr(runs[0].algo, "population_refusal", lambda: None)
        refusal = refuses()  # a default the kind cannot batch (ddpg: episodic collects)
        if refusal is not None:
            with pytest.raises(ConfigError, match=f"{re.escape(refusal)} cannot train in a population yet; "):
                population_update([c.algo for c in runs], [c.buffer for c in runs])
            continue
        population_update([c.algo for c in runs], [c.buffer for c in runs])


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "pg", "a2c", "pqn"])
def test_a_compiled_population_steps_as_the_eager_one_and_its_members_optimizers_hold_the_result(algo, monkeypatch):
    """compile=true members: the population's whole minibatch step (vectorized loss, gradients, each member's clip
    and optimizer: PPO's and PG's Adam, A2C's RMSprop, PQN's RAdam) is one compiled graph. After one update its
    members' weights match the eager population's within float reordering, a member that has stopped is untouched,
    and each member's own optimizer state (what its checkpoint saves) is what the compiled step wrote. Compiled with
    torch's tanh: compile=true's fast one (within 2e-7 of it) moved one PG weight of 4,096 by 1.08e-5, past the
    bound for reordering alone."""
    monkeypatch.setenv(FAST_TANH_VARIABLE, "0")
    def members(*more: str):
        return [collected("seed=0", *more, algo=algo), collected("seed=1", "algo.lr=1e-3", *more, algo=algo),
                collected("seed=2", OWN_SETTING.get(algo, "algo.ent_coef=0.01"), *more, algo=algo)]

    eager, compiled = members(), members("compile=true")
    active = [True, True, False]
    results = []
    for group in (eager, compiled):
        population = population_update([c.algo for c, _ in group], [c.buffer for c, _ in group])
        results.append(population.update(active, [c.buffer for c, _ in group], [rng for _, rng in group]))
    assert population.compiled is not None and population.compiled["train_step"].compile_seconds is not None
    untouched = members("compile=true")[2][0].algo  # the stopped member, as it was before the update
    for m, ((e, _), (c, _)) in enumerate(zip(eager, compiled, strict=True)):
        for a, b in zip(e.algo.networks.parameters(), c.algo.networks.parameters(), strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
        if active[m]:
            for key in results[0][m]:
                assert float(results[1][m][key]) == pytest.approx(float(results[0][m][key]), rel=1e-4, abs=1e-6), key
            saved, reference = c.algo.optimizer.state_dict()["state"], e.algo.optimizer.state_dict()["state"]
            assert saved.keys() == reference.keys() and reference
            for index, state in reference.items():
                assert float(saved[index]["step"]) == float(state["step"]) > 0
                slots = [k for k in state if k != "step"]
                assert slots == (["square_avg"] if algo == "a2c" else ["exp_avg", "exp_avg_sq"])  # PQN: RAdam's
                for slot in slots:
                    torch.testing.assert_close(saved[index][slot], state[slot], rtol=1e-3, atol=1e-6)
        else:
            assert results[1][m] is None
            for a, b in zip(untouched.networks.parameters(), c.algo.networks.parameters(), strict=True):
                assert torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_members_optimizer_loaded_anew_is_where_its_next_step_starts(compiled, monkeypatch):
    """train.on_nonfinite=skip (and rollback) load a member's state anew, which replaces its optimizer's state
    tensors. The population's stacked optimizer state (the compiled step's, the eager StackedStep's) is read from the
    member again before the next step: after an update, a load of the state before it, and one more update, each
    member's weights and Adam state are its single run's (within float reordering), step counts exactly."""
    monkeypatch.setenv(FAST_TANH_VARIABLE, "0")
    more = ["compile=true"] if compiled else []
    members = [collected("seed=0", *more), collected("seed=1", *more)]
    algos, buffers, rngs = [c.algo for c, _ in members], [c.buffer for c, _ in members], [r for _, r in members]
    singles = [copy.deepcopy(a) for a in algos]
    population = population_update(algos, buffers)
    population.update([True, True], buffers, rngs)
    assert (population.compiled is not None) is compiled
    assert (population.stacked_steps.get("train_step") is None) is compiled
    snapshot = copy.deepcopy(algos[1].state_dict())  # what on_nonfinite=skip keeps before an update
    population.update([True, True], buffers, rngs)
    algos[1].load_state_dict(snapshot)  # the update undone
    population.update([True, True], buffers, rngs)
    for m, (single, (components, rng)) in enumerate(zip(singles, members, strict=True)):
        torch.set_rng_state(rng)  # the member's stream as it began: its single run draws the same minibatches
        single.update(components.buffer, RunClock(128, 1024))
        kept = copy.deepcopy(single.state_dict())
        single.update(components.buffer, RunClock(128, 1024))
        if m == 1:
            single.load_state_dict(kept)
        single.update(components.buffer, RunClock(128, 1024))
        for mine, theirs in zip(algos[m].networks.parameters(), single.networks.parameters(), strict=True):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)
        saved, reference = algos[m].optimizer.state_dict()["state"], single.optimizer.state_dict()["state"]
        for index, state in reference.items():
            assert float(saved[index]["step"]) == float(state["step"]) == (2 if m == 1 else 3) * 6  # 3 epochs of 2
            for slot in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(saved[index][slot], state[slot], rtol=1e-3, atol=1e-6)


def test_compiled_population_members_must_share_their_optimizers_settings():
    """The compiled step applies one formula to every member's rows: members whose optimizers differ in their fixed
    settings are refused in one line (the launcher then runs them one at a time)."""
    members = [collected(f"seed={s}", "compile=true", algo="a2c")[0] for s in (0, 1)]
    for group in members[1].algo.optimizer.param_groups:
        group["alpha"] = 0.9
    with pytest.raises(ConfigError, match=r"compile=true in a population needs one optimizer with the same settings"):
        population_update([c.algo for c in members], [c.buffer for c in members])


def test_the_members_acting_forward_skips_vmap_only_where_it_gives_vmaps_numbers():
    from functools import partial

    from torch.func import functional_call, vmap

    from rlcli.sweeps.population.acting import CheckedFastPath, call_swapped, members_swaps, same

    class PoolsTheBatch(torch.nn.Module):  # reads dim 0 as the batch: on [members, envs, ...] it pools members
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x) - self.layer(x).mean(0)

    def layer_normed() -> torch.nn.Module:  # PQN's shape; its own scale and shift per member
        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 4), torch.nn.LayerNorm(4), torch.nn.ReLU(),
                                  torch.nn.Linear(4, 2))
        torch.nn.init.normal_(net[2].weight)
        torch.nn.init.normal_(net[2].bias)
        return net

    torch.manual_seed(0)
    for make, fast in ((lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 4), torch.nn.Tanh(),
                                                    torch.nn.Linear(4, 2)), True),
                       (layer_normed, True),
                       (PoolsTheBatch, False)):
        nets = [make() for _ in range(3)]
        params, buffers = stack_weights(nets)
        obs = torch.randn(3, 5, 2, 3) if fast else torch.randn(3, 5, 3)
        alone = torch.stack([net(o) for net, o in zip(nets, obs, strict=True)])
        batched = vmap(partial(functional_call, nets[0]), in_dims=(0, 0))
        swaps = members_swaps(nets[0], params)
        assert swaps is not None  # all are built of linear layers (and a layer norm) only
        forward = CheckedFastPath(partial(call_swapped, swaps, nets[0]))
        with torch.no_grad():
            for _ in range(2):
                assert torch.allclose(forward(partial(batched, params, obs), same, obs), alone, atol=1e-6)
        assert (forward.fast is not None) is fast  # the first call kept the fast path only where it agreed
    gaussian = prepare(compose_config(["algo=ppo", "env=Pendulum-v1"]))[0].algo.networks
    assert members_swaps(gaussian, stack_weights([gaussian])[0]) is None  # its log std


# each kind's acting: a categorical and a gSDE Gaussian policy, PQN's and DQN's greedy Q, SAC's squashed mean, TD3's
TESTED = {"ppo": overrides("ppo"), "ppo-sde": overrides("ppo-sde"), "pqn": overrides("pqn"),
          "dqn": [*TINY, "algo=dqn", "algo.learning_starts=64"],
          "sac": ["algo=sac", "env=Pendulum-v1", *TINY[1:], "actor.hidden_sizes=[32,32]"],
          "td3": ["algo=td3", "env=Pendulum-v1", *TINY[1:], "actor.hidden_sizes=[32,32]"]}


@pytest.mark.parametrize("algo", list(TESTED))
def test_due_members_test_together_as_each_would_alone(algo, tmp_path):
    """The members due a test phase run their test episodes in step (one forward for all members per step): each
    gets the episodes its own test phase would give; a member not due runs none."""
    check_testing_together(TESTED[algo], discrete=algo in ("ppo", "pqn", "dqn"), tmp_path=tmp_path,
                           one_call=algo == "ppo")


def check_testing_together(overrides: list[str], discrete: bool, tmp_path, rtol: float = 1e-4,
                           one_call: bool = False) -> None:
    """test_due_members_test_together_as_each_would_alone's check, for one kind's overrides (test_cuda.py's too)."""
    from rlcli.collectors.testing import evaluate
    from rlcli.run.evaluation import test_seed
    from rlcli.sweeps.population.testing import test_together

    members = []
    for seed in (0, 1, 2):
        components, state = prepare(compose_config([*overrides, f"seed={seed}"]))
        run_dir = tmp_path / str(seed)
        members.append(Member(Trainer(components, run_dir, state), run_dir, seed, "", {}))
    population = population_update([m.trainer.c.algo for m in members], [m.trainer.c.buffer for m in members])
    calls = []
    if population.acting is not None:  # on-policy members: which heads act in one call, counted
        together = population.acting.act_deterministically
        population.acting.act_deterministically = lambda *args: calls.append(out := together(*args)) or out
    tested = test_together(members, [True, False, True], population)
    # categorical members (PPO's) take their deterministic actions in one call; off-policy members (DQN's, TD3's,
    # SAC's) each its own act, and the other on-policy heads (PQN's epsilon-greedy) member by member
    assert any(out is not None for out in calls) is one_call
    assert sorted(tested) == [0, 2]
    for index in (0, 2):
        c, state = members[index].trainer.c, members[index].trainer.state
        alone = evaluate(c.test_envs, c.algo, c.algo.networks.normalizer, c.device, seed=test_seed(c, state),
                         obs_dtype=c.obs_dtype)
        assert np.array_equal(tested[index].lengths, alone.lengths)
        if discrete:  # the same argmax, the same episodes
            assert np.array_equal(tested[index].returns, alone.returns)
        else:  # Box actions: the batched product's rounding (~1e-7) reaches the env
            np.testing.assert_allclose(tested[index].returns, alone.returns, rtol=rtol)
        assert c.clock.seconds["test"] > 0
    assert members[1].trainer.c.clock.seconds["test"] == 0


def test_the_launcher_takes_the_sweepers_check_compositions_instead_of_composing_each_job_again():
    """Hydra's sweeper composes each job to check the batch, then the launcher asks again: the second request of
    the same overrides takes the first composition's copy (as it was composed, whatever the check did to its own),
    a third composes anew, and another master config is another key."""
    from omegaconf import OmegaConf

    from rlcli.sweeps.population.launch import compose_each_job_once

    class Loader:
        calls: list = []

        def load_sweep_config(self, master_config, sweep_overrides):
            self.calls.append(list(sweep_overrides))
            return OmegaConf.create({"seed": int(sweep_overrides[0].split("=")[1]), "hydra": {"job": {"id": None}}})

    loader, master, other = Loader(), OmegaConf.create({}), OmegaConf.create({})
    compose_each_job_once(loader)
    compose_each_job_once(loader)  # a second setup does not wrap it twice
    checked = loader.load_sweep_config(master, ["seed=1"])
    checked.hydra.job.id = "changed by the check"
    launched = loader.load_sweep_config(master_config=master, sweep_overrides=["seed=1"])
    assert launched is not checked and launched.seed == 1 and launched.hydra.job.id is None
    assert Loader.calls == [["seed=1"]]
    loader.load_sweep_config(master, ["seed=1"])
    loader.load_sweep_config(other, ["seed=1"])
    assert Loader.calls == [["seed=1"]] * 3


def test_a_seed_sweeps_jobs_are_composed_once_per_other_setting_and_exactly_as_hydra_composes_them():
    """A job that differs from an earlier one only in its plain seed is that job's composition with the seed set:
    its config, hydra node included (the task overrides, the override dirname), is Hydra's own composition's."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from rlcli.run.compose import conf_dir
    from rlcli.sweeps.population.launch import compose_each_job_once

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(conf_dir()))
    master = loader.load_configuration("config", overrides=["hydra/launcher=population", "hydra.launcher.n_jobs=1",
                                                            "hydra.job.config.override_dirname.exclude_keys=[env]"],
                                       run_mode=RunMode.MULTIRUN)
    jobs = [["env=CartPole-v1", f"algo.lr={lr}", "train.num_envs=4", f"seed={seed}"]
            for lr in ("1e-3", "3e-4") for seed in (0, 1, 12, "012")]
    jobs.append(["seed=5", "algo=a2c"])
    hydras = [loader.load_sweep_config(master, job) for job in jobs]
    composed: list[list[str]] = []
    hydra_load = loader.load_sweep_config
    loader.load_sweep_config = lambda master_config, sweep_overrides: (
        composed.append(list(sweep_overrides)) or hydra_load(master_config=master_config,
                                                              sweep_overrides=sweep_overrides))
    compose_each_job_once(loader)
    ours = [loader.load_sweep_config(master, job) for job in jobs]
    for job, theirs, mine in zip(jobs, hydras, ours, strict=True):
        assert OmegaConf.to_yaml(mine) == OmegaConf.to_yaml(theirs), job
        assert mine.hydra.job.override_dirname == theirs.hydra.job.override_dirname
    assert ours[1].seed == 1 and ours[1].hydra.job.override_dirname == "algo.lr=1e-3,seed=1,train.num_envs=4"
    # composed by Hydra: the first of each learning rate, a seed that is not plain (012), another algorithm
    assert composed == [jobs[0], jobs[3], jobs[4], jobs[7], jobs[8]]


def test_population_workers_start_early_only_where_a_sweep_will_start_them(monkeypatch):
    """rl-train starts the workers' fork server before checking the sweep only for hydra/launcher=population that
    will run worker processes (n_jobs > 1, or auto on a CPU with 2+ cores), preloading torch's compiler only for
    compile=true."""
    from rlcli.entry import rl_train
    from rlcli.sweeps.population import workers

    started: list[bool] = []
    monkeypatch.setattr(workers, "start_worker_server", lambda compiled: started.append(compiled))
    monkeypatch.setattr(workers, "usable_cores", lambda: 2)
    for args, expected in ((["seed=0,1", "hydra/launcher=population"], [False]),
                           (["seed=0,1", "hydra/launcher=population", "compile=true"], [True]),
                           (["seed=0,1", "hydra/launcher=population", "hydra.launcher.n_jobs=1"], []),
                           (["seed=0,1", "hydra/launcher=population", "hydra.launcher.n_jobs=3"], [False]),
                           (["seed=0,1", "hydra/launcher=population", "device=cuda"], []),
                           (["seed=0,1", "hydra/launcher=joblib"], []),
                           (["seed=0,1"], [])):
        started.clear()
        rl_train.start_population_workers_early(["-m", *args])
        assert started == expected, args
    monkeypatch.setattr(workers, "usable_cores", lambda: 1)
    started.clear()
    rl_train.start_population_workers_early(["-m", "seed=0,1", "hydra/launcher=population"])
    assert started == []
    monkeypatch.setattr(workers, "usable_cores", lambda: 2)
    monkeypatch.setitem(sys.modules, "joblib", None)  # the base install starts them too (the standard library's pool)
    rl_train.start_population_workers_early(["-m", "seed=0,1", "hydra/launcher=population"])
    assert started == [False]
