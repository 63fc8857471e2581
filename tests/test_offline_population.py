"""Many seeds of an offline algorithm in one process (hydra/launcher=population): the members learn over one copy of
the dataset, and each member's update is its single run's (sweeps/population/lockstep.py; discrete_cql as the
value-based kind)."""

from __future__ import annotations

import json

import forked_cli
import pytest
import torch
from offline_fixtures import dataset_file
from test_population_offpolicy import assert_first_update_is_each_single_runs
from test_resume import final

from rlcli.contracts import RunClock
from rlcli.registry import ConfigError
from rlcli.run.compose import compose_config
from rlcli.run.state import prepare
from rlcli.sweeps.population.lockstep import LockstepPopulation, population_update

TINY = ["actor.hidden_sizes=[32,32]", "algo.batch_size=32", "algo.gradient_steps=2", "log.tensorboard=false",
        "log.console=false", "train.test_episodes=1"]
PENDULUM = f"dataset={dataset_file('pendulum')}"
CARTPOLE = f"dataset={dataset_file('cartpole')}"
ENVS = {PENDULUM: "env=Pendulum-v1", CARTPOLE: "env=CartPole-v1"}  # (rl-train takes it from the dataset)
ALGOS = {"bc": ["algo=bc", PENDULUM], "bc-discrete": ["algo=bc", CARTPOLE],
         "td3_bc": ["algo=td3_bc", PENDULUM],  # two steps a phase: the second also steps the policy and the targets
         "rebrac": ["algo=rebrac", PENDULUM],  # the data's next actions read from the one shared storage
         "iql": ["algo=iql", PENDULUM], "iql-deterministic": ["algo=iql", PENDULUM, "algo.deterministic_actor=true"],
         "awac": ["algo=awac", PENDULUM], "discrete_cql": ["algo=discrete_cql", CARTPOLE],
         "cql": ["algo=cql", PENDULUM, "algo.cql_n_actions=4"],  # alpha and the penalty's weight read per member
         "cql-lagrange": ["algo=cql", PENDULUM, "algo.cql_n_actions=4", "algo.cql_lagrange=true",
                          "algo.ent_coef=0.1"]}


def member(algo: str, *more: str):
    given = [*TINY, *ALGOS[algo], *more]
    components, _ = prepare(compose_config([*given, *(ENVS[a] for a in given if a in ENVS)]))
    return components, torch.get_rng_state()


@pytest.mark.parametrize("algo", list(ALGOS))
def test_an_offline_members_update_is_its_single_runs_over_one_copy_of_the_dataset(algo):
    members = [member(algo, "seed=0"), member(algo, "seed=1", "algo.lr=1e-3", "algo.max_grad_norm=0.5"),
               member(algo, "seed=2")]  # the last is not stepped this phase: carried, not moved
    storages = [c.buffer for c, _ in members]
    assert len({s.obs.data_ptr() for s in storages}) == 1 and len({s.rewards.data_ptr() for s in storages}) == 1
    clock = RunClock(10, 100, 2)
    population, _ = assert_first_update_is_each_single_runs(members, [clock, clock, None])
    assert isinstance(population, LockstepPopulation)


def test_what_an_offline_population_cannot_batch_is_one_line():
    def refusal(algo: str, *configs: list[str]) -> str:
        built = [member(algo, *c)[0] for c in configs]
        with pytest.raises(ConfigError) as error:
            population_update([c.algo for c in built], [c.buffer for c in built])
        assert "\n" not in str(error.value)
        return str(error.value)

    assert "differ in alpha" in refusal("td3_bc", ["seed=0"], ["seed=1", "algo.alpha=3.0"])
    assert "differ in cql_alpha" in refusal("cql", ["seed=0"], ["seed=1", "algo.cql_alpha=3.0"])
    # (SAC's temperature settings are each member's own: cql members that differ in target_entropy batch)
    built = [member("cql", "seed=0")[0], member("cql", "seed=1", "algo.target_entropy=-2")[0]]
    assert isinstance(population_update([c.algo for c in built], [c.buffer for c in built]), LockstepPopulation)


@pytest.mark.slow
def test_an_offline_population_sweep_writes_what_the_basic_launcher_writes(tmp_path):
    args = ["-m", *TINY, "algo=iql", PENDULUM, "seed=0,1", "train.total_steps=60",
            "train.test_every=30"]
    population = forked_cli.run([*args, "hydra/launcher=population", "hydra.launcher.n_jobs=1",
                                 "hydra.sweep.dir=pop"], tmp_path, timeout=600)
    assert population.returncode == 0, population.stderr[-3000:]
    assert "cannot train in a population" not in population.stdout + population.stderr
    basic = forked_cli.run([*args, "hydra.sweep.dir=basic"], tmp_path, timeout=600)
    assert basic.returncode == 0, basic.stderr[-3000:]
    for job in ("0", "1"):
        pop, bas = tmp_path / "pop" / job, tmp_path / "basic" / job
        assert sorted(p.name for p in pop.iterdir()) == sorted(p.name for p in bas.iterdir())
        a, b = final(pop), final(bas)
        assert a["state"]["env_steps"] == b["state"]["env_steps"] == 60  # gradient steps
        assert a["algo"]["gradient_updates"] == b["algo"]["gradient_updates"] == 60
        nets_a, nets_b = a["algo"]["networks"], b["algo"]["networks"]
        assert all(torch.allclose(nets_a[k], nets_b[k], atol=1e-4) for k in nets_a), job
        assert '"status": "completed"' in (pop / "status.json").read_text()
        # the same test episodes (continuous actions from weights equal to float tolerance: returns to 1e-5)
        tests = [[json.loads(line)["returns"] for line in (d / "eval.jsonl").read_text().splitlines()]
                 for d in (pop, bas)]
        assert len(tests[0]) == 2 and tests[0] == [pytest.approx(r, rel=1e-5) for r in tests[1]]
