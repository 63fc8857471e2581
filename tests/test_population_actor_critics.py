"""hydra/launcher=population for the actor-critics: SAC, TQC, CrossQ, TD3 and DDPG members, each written for a runner
(rlcli/sweeps/population/lockstep.py)."""

import copy

import forked_cli
import pytest
import torch
from test_population import run
from test_population_offpolicy import assert_first_update_is_each_single_runs
from test_resume import final

from rlcli.contracts import RunClock
from rlcli.registry import ConfigError
from rlcli.run.compose import compose_config
from rlcli.run.state import prepare
from rlcli.run.trainer import Trainer
from rlcli.sweeps.population.collect import collect_together
from rlcli.sweeps.population.lockstep import LockstepPopulation, population_update
from rlcli.sweeps.population.members import Member

TINY = ["env=Pendulum-v1", "train.num_envs=2", "train.test_every=256", "train.test_episodes=1",
        "train.stop_reward=null", "log.tensorboard=false", "log.console=false", "algo.learning_starts=64",
        "algo.batch_size=32", "algo.train_freq=2", "algo.gradient_steps=2", "actor.hidden_sizes=[32,32]"]
ALGOS = {"sac": ["algo=sac"],
         "tqc": ["algo=tqc", "algo.n_quantiles=5", "algo.top_quantiles_to_drop_per_net=1", "algo.use_sde=false"],
         # gSDE (RL-Zoo's TQC Pendulum entry): each member's own exploration matrices, acting and training
         "sac-sde": ["algo=sac", "algo.use_sde=true", "algo.sde_sample_freq=2"],
         "tqc-sde": ["algo=tqc", "algo.n_quantiles=5", "algo.top_quantiles_to_drop_per_net=1", "algo.use_sde=true"],
         "sac-ere": ["algo=sac", "buffer=ere", "buffer.c_min=16"],  # ERE: each member's recency window
         # HER: each member's own episodes and relabelled goals, on the continuous bit-flipping task
         "sac-her": ["algo=sac", "env=BitFlipping-v0", "env.kwargs.n_bits=6", "env.kwargs.continuous=true",
                     "buffer=her"],
         "td3-her": ["algo=td3", "env=BitFlipping-v0", "env.kwargs.n_bits=6", "env.kwargs.continuous=true",
                     "buffer=her"],
         # compile=true: the critics' step and the policy's step of all members, one compiled graph each
         "sac-compiled": ["algo=sac", "compile=true"],
         "td3": ["algo=td3", "algo.noise=ornstein_uhlenbeck"],
         "ddpg": ["algo=ddpg", "algo.train_freq_unit=step"],  # per step: the filling below stays short
         "td3-compiled": ["algo=td3", "algo.noise=ornstein_uhlenbeck", "compile=true"],
         # CrossQ: each member's own batch-renorm statistics (renormalizing from its second step on), policy delay
         "crossq": ["algo=crossq", "algo.critic_hidden_sizes=[32,32]", "algo.policy_delay=2",
                    "algo.renorm_warmup_steps=0"],
         "crossq-sde": ["algo=crossq", "algo.critic_hidden_sizes=[32,32]", "algo.policy_delay=2",
                        "algo.renorm_warmup_steps=0", "algo.use_sde=true"]}


def filled(algo: str, *more: str):
    """A member's components after a few random collect phases, and its torch RNG state then."""
    components, _ = prepare(compose_config([*TINY, *ALGOS[algo], *more]))
    for _ in range(24):
        components.collector.collect(components.learner, random_actions=True)
    return components, torch.get_rng_state()


@pytest.mark.parametrize("algo", ["sac", "tqc", "sac-ere", "sac-compiled", "sac-sde", "tqc-sde", "sac-her"])
def test_a_members_first_update_is_its_single_runs_within_float_tolerance(algo):
    members = [filled(algo, "seed=0"),
               filled(algo, "seed=1", "algo.lr=1e-3", "algo.max_grad_norm=0.5", "algo.target_update_interval=2"),
               filled(algo, "seed=2", "algo.ent_coef=0.1", "algo.tau=0.5", "algo.gamma=0.9"),
               filled(algo, "seed=3", "algo.target_entropy=-0.5", "algo.ent_coef_init=0.5"),
               filled(algo, "seed=4")]  # the last is still warming up: carried, not stepped
    clock = RunClock(96, 1024, 48)
    population, singles = assert_first_update_is_each_single_runs(members, [clock, clock, clock, clock, None])
    assert isinstance(population, LockstepPopulation)
    if "compile=true" in ALGOS[algo]:  # the critics', the policy's and the temperature's steps: compiled graphs
        assert population.compiled is not None and len(population.compiled) == 3
        assert all(s.compile_seconds is not None for s in population.compiled.values())
    for (components, _), (alone, _) in zip(members[:4], singles, strict=False):
        assert components.algo.gradient_updates == 2
        for name in ("policy_optimizer", "critic_optimizer"):  # each optimizer stepped as often as its single run's
            ours, single = getattr(components.algo, name).state_dict(), getattr(alone, name).state_dict()
            assert [float(s["step"]) for s in ours["state"].values()] == \
                   [float(s["step"]) for s in single["state"].values()]
    assert float(members[2][0].algo.alpha()) == pytest.approx(0.1)  # a fixed coefficient stays fixed
    assert float(members[0][0].algo.alpha()) != pytest.approx(1.0)  # a learned one moved


@pytest.mark.parametrize("algo", ["sac", "td3", "sac-sde", "crossq", "tqc", "ddpg"])
def test_a_members_rollouts_are_its_single_runs_bit_for_bit(tmp_path, algo):
    """Each member acts with its own `act` on its rows under its own stream: its exploration noise
    (Ornstein-Uhlenbeck's state stepped once; gSDE's matrices drawn at the phase's start) and actions are its single
    run's."""
    def components_of(seed: int):
        return prepare(compose_config([*TINY, *ALGOS[algo], f"seed={seed}"]))

    singles = []
    for seed in (0, 1):
        components, _ = components_of(seed)
        components.collector.collect(components.learner, random_actions=True)  # warm-up: uniform actions
        components.collector.collect(components.learner, random_actions=False)  # the squashed Gaussian policy
        singles.append((components.buffer, components.algo))
    members = []
    for seed in (0, 1):
        components, state = components_of(seed)
        run_dir = tmp_path / str(seed)
        members.append(Member(Trainer(components, run_dir, state), run_dir, seed, "", {}))
    population = population_update([m.trainer.c.algo for m in members], [m.trainer.c.buffer for m in members])
    for warming_up in (True, False):
        for member in members:
            member.warming_up = warming_up
        assert all(s is not None for s in collect_together(members, population))
    for member, (single, alone) in zip(members, singles, strict=True):
        mine = member.trainer.c.buffer
        assert len(mine) == len(single) == 8
        for field in ("obs", "actions", "rewards", "next_obs", "discounts"):
            # the warm-up's uniform draws, then the policy's own act on the member's rows: bit for bit
            assert torch.equal(getattr(mine, field)[:8], getattr(single, field)[:8]), field
        noise = getattr(member.trainer.c.algo, "noise", None)
        if getattr(noise, "state", None) is not None:  # Ornstein-Uhlenbeck's: stepped as its single run's
            assert torch.equal(noise.state, alone.noise.state)


@pytest.mark.parametrize("algo", ["td3", "ddpg", "td3-compiled", "td3-her"])
def test_a_td3_members_first_update_is_its_single_runs_within_float_tolerance(algo):
    members = [filled(algo, "seed=0"),
               filled(algo, "seed=1", "algo.lr=1e-3", "algo.max_grad_norm=0.5", "algo.tau=0.5"),
               filled(algo, "seed=2", "algo.gamma=0.9", "algo.noise_std=0.3"),
               filled(algo, "seed=3")]  # the last is still warming up: carried, not stepped
    clock = RunClock(96, 1024, 48)
    population, _ = assert_first_update_is_each_single_runs(members, [clock, clock, clock, None])
    assert isinstance(population, LockstepPopulation)
    if "compile=true" in ALGOS[algo]:  # both steps ran as the population's compiled graphs
        assert population.compiled is not None and len(population.compiled) == 2
        assert all(s.compile_seconds is not None for s in population.compiled.values())
    for components, _ in members[:3]:  # TD3: two critic steps, one delayed policy step; DDPG: two of each
        assert components.algo.gradient_updates == 2
        assert len(components.algo.policy_optimizer.state) > 0


@pytest.mark.parametrize("algo", ["crossq", "crossq-sde"])
def test_a_crossq_members_first_update_is_its_single_runs_within_float_tolerance(algo):
    """CrossQ members: the critics' joint pass in training mode updates each member's own batch-renorm statistics
    (the warming-up member's stay as they were), the policy steps on every second step. Each member draws its single
    run's batches and noise; its statistics, step counters and metrics are its single run's within float rounding,
    and so are its weights but for the few whose gradient is zero up to rounding (a bias feeding a batch-renorm
    layer), where Adam makes a 1e-8 gradient of either sign a full step of lr (tests/test_compile.py measures the
    same between compiled and eager single runs): those may differ by such steps (2 lr when one step's sign flips;
    the critics take two), and must be few."""
    members = [filled(algo, "seed=0"), filled(algo, "seed=1", "algo.lr=1e-3", "algo.max_grad_norm=0.5"),
               filled(algo, "seed=2", "algo.ent_coef=0.1", "algo.gamma=0.9"),
               filled(algo, "seed=3", "algo.target_entropy=-0.5", "algo.ent_coef_init=0.5"),
               filled(algo, "seed=4")]  # still warming up: carried, not stepped
    clock = RunClock(96, 1024, 48)
    clocks = [clock, clock, clock, clock, None]
    singles = []
    for (components, rng), its_clock in zip(members, clocks, strict=True):
        alone, its_buffer = copy.deepcopy(components.algo), copy.deepcopy(components.buffer)
        torch.set_rng_state(rng)
        metrics = alone.update(its_buffer, its_clock) if its_clock is not None else None
        singles.append((alone, metrics, torch.get_rng_state()))
    population = population_update([c.algo for c, _ in members], [c.buffer for c, _ in members])
    assert isinstance(population, LockstepPopulation)
    rngs = [rng for _, rng in members]
    results = population.update([c is not None for c in clocks], [c.buffer for c, _ in members], rngs, clocks)
    off_by_a_step = 0
    for (components, _), (alone, metrics, rng_after), result, rng in zip(members, singles, results, rngs,
                                                                          strict=True):
        assert torch.equal(rng, rng_after)  # its batches and noise were its single run's draws
        mine, theirs = components.algo.networks.state_dict(), alone.networks.state_dict()
        if metrics is None:  # carried along: bit for bit as it was, statistics included
            assert result is None and all(torch.equal(mine[key], theirs[key]) for key in mine)
            assert int(components.algo.networks.critics[0][0].steps) == 0
            continue
        lr = alone.critic_optimizer.param_groups[0]["lr"]
        for key, ours in mine.items():
            if not ours.is_floating_point():  # the renorm layers' step counters
                assert torch.equal(ours, theirs[key]), key
                continue
            if "running_" in key:  # momentum 0.01 x batch statistics of weights that may be a flipped step apart
                assert torch.allclose(ours, theirs[key], atol=1e-4, rtol=1e-4), key
                continue
            apart = (ours - theirs[key]).abs()
            assert (apart <= 4 * lr).all(), key
            off_by_a_step += int((apart > 1e-5).sum())
        assert result is not None and set(result) == set(metrics) >= {"value_loss", "policy_loss", "entropy"}
        assert components.algo.gradient_updates == alone.gradient_updates == 2
        assert int(components.algo.networks.critics[0][0].steps) == 2  # two joint passes in training mode
        assert len(components.algo.policy_optimizer.state) > 0  # the delayed policy step came
    weights = sum(p.numel() for p in members[0][0].algo.networks.parameters())
    assert off_by_a_step < 0.01 * 4 * weights  # few: the flat-gradient weights only
    assert float(members[2][0].algo.alpha()) == pytest.approx(0.1)  # a fixed coefficient stays fixed


def test_what_a_soft_actor_critic_population_cannot_batch_is_one_line():
    c = prepare(compose_config(["env=Pendulum-v1", "algo=sac", "actor=gru", "buffer=sequence"]))[0]
    with pytest.raises(ConfigError, match=r"a recurrent actor \(actor=gru/lstm\) cannot train"):
        population_update([c.algo, c.algo], [c.buffer, c.buffer])
    crossq = prepare(compose_config(["env=Pendulum-v1", "algo=crossq", "compile=true"]))[0]
    with pytest.raises(ConfigError, match=r"CrossQ with compile=true cannot train in a population yet; "
                                          r"awac, bc, .*crossq.* \(MLP or CNN networks"):
        population_update([crossq.algo, crossq.algo], [crossq.buffer, crossq.buffer])
    differ = [prepare(compose_config(["env=Pendulum-v1", "algo=sac", f"algo.reward_scale={n}"]))[0] for n in (1, 2)]
    with pytest.raises(ConfigError, match=r"^the members differ in reward_scale: SAC members batch when they differ "
                                          r"only in seed, lr, ent_coef, gamma, max_grad_norm, noise_std, target_"):
        population_update([c.algo for c in differ], [c.buffer for c in differ])
    critics = [prepare(compose_config(["env=Pendulum-v1", "algo=sac", f"algo.num_critics={n}"]))[0] for n in (2, 3)]
    with pytest.raises(ConfigError, match=r"^the members' networks differ in which weights they have "
                                          r"\(critics.nets.2.*\): they cannot train as one population$"):
        population_update([c.algo for c in critics], [c.buffer for c in critics])


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_an_actor_critic_population_sweep_writes_what_the_basic_launcher_writes(tmp_path, algo):
    args = ["-m", *TINY, *ALGOS[algo], "seed=0,1", "algo.lr=1e-3,3e-4", "train.total_steps=256"]
    population = run(*args, "hydra/launcher=population", "hydra.launcher.n_jobs=1", "hydra.sweep.dir=pop", cwd=tmp_path)
    assert population.returncode == 0, population.stderr[-3000:]
    assert "cannot train in a population" not in population.stdout + population.stderr
    basic = run(*args, "hydra.sweep.dir=basic", cwd=tmp_path)
    assert basic.returncode == 0, basic.stderr[-3000:]
    for job in map(str, range(4)):
        pop, bas = tmp_path / "pop" / job, tmp_path / "basic" / job
        assert sorted(p.name for p in pop.iterdir()) == sorted(p.name for p in bas.iterdir())
        a, b = final(pop), final(bas)
        assert a["state"]["env_steps"] == b["state"]["env_steps"] == 256
        assert a["algo"]["gradient_updates"] == b["algo"]["gradient_updates"] > 0
        nets_a, nets_b = a["algo"]["networks"], b["algo"]["networks"]
        assert all(torch.allclose(nets_a[k], nets_b[k], atol=1e-4) for k in nets_a), job
        assert torch.allclose(a["buffer"]["actions"], b["buffer"]["actions"], atol=1e-4)
        assert '"status": "completed"' in (pop / "status.json").read_text()
    evaluated = forked_cli.run([str(tmp_path / "pop" / "1"), "episodes=2"], tmp_path, timeout=300, program="rl-eval")
    assert evaluated.returncode == 0, evaluated.stderr


def test_members_whose_step_counters_differ_each_step_as_their_single_runs():
    """A member that stepped alone (a phase the others sat out) has another step counter than the others: the step
    branches on it (SAC's target interval, TD3's policy delay), so each group of equal counters steps in its own
    call, and every member's counter, optimizers and weights stay its single run's."""
    members = [filled("sac", "seed=0", "algo.target_update_interval=3"),
               filled("sac", "seed=1", "algo.target_update_interval=3")]
    clock = RunClock(96, 1024, 48)
    singles = []
    for (components, rng), phases in zip(members, ([False, True], [True, True]), strict=True):
        alone, its_buffer = copy.deepcopy(components.algo), copy.deepcopy(components.buffer)
        torch.set_rng_state(rng)
        for on in phases:
            if on:
                alone.update(its_buffer, clock)
        singles.append(alone)
    population = population_update([c.algo for c, _ in members], [c.buffer for c, _ in members])
    rngs = [rng for _, rng in members]
    for active in ([False, True], [True, True]):
        population.update(active, [c.buffer for c, _ in members], rngs, [clock if on else None for on in active])
    for (components, _), alone in zip(members, singles, strict=True):
        assert components.algo.gradient_updates == alone.gradient_updates  # 2 and 4
        mine, theirs = components.algo.networks.state_dict(), alone.networks.state_dict()
        for key in mine:
            assert torch.allclose(mine[key], theirs[key], atol=1e-5, rtol=0), key
    assert [c.algo.gradient_updates for c, _ in members] == [2, 4]


def test_run_read_takes_what_a_population_can_read_per_member():
    from rlcli.algos.runner import SingleRun

    c = prepare(compose_config([*TINY, *ALGOS["sac"]]))[0]
    run = SingleRun(c.algo, c.buffer)
    assert float(run.read(c.algo.alpha)) == pytest.approx(1.0)
    assert run.read(c.algo.temperature.target) == -1.0  # a method of an object the algorithm holds
    with pytest.raises(TypeError, match=r"takes a method of the algorithm or of an object it holds"):
        run.read(lambda: c.algo.gamma)
