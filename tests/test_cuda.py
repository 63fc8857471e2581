"""device=cuda: every algorithm trains, checkpoints, resumes and evaluates on a GPU, and a population's members
draw their single runs' draws from their own CUDA streams (sweeps/population/streams.py).

CI has no GPU, so every test here is skipped there, by name; on a machine with one, `pytest tests/test_cuda.py`."""

import copy
import subprocess

import pytest
import test_population
import torch
from conftest import RL_TRAIN, run_cli
from offline_fixtures import dataset_file
from test_population import ALGOS, CROSSQ, DQN, PPO, SAC, TESTED
from test_resume import final

from rlcli.contracts import RunClock
from rlcli.run.compose import compose_config
from rlcli.run.state import prepare
from rlcli.run.trainer import Trainer
from rlcli.services import checkpoint
from rlcli.sweeps.population import streams
from rlcli.sweeps.population.collect import collect_together
from rlcli.sweeps.population.lockstep import population_update
from rlcli.sweeps.population.members import Member

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")

QUIET = ["log.tensorboard=false", "log.console=false", "train.stop_reward=null", "train.test_episodes=2",
         "train.num_envs=4", "device=cuda"]
OFF = ["algo.learning_starts=200", "algo.batch_size=32"]
# every algorithm rlcli ships, and the network kinds and options with their own GPU paths, on tiny budgets
RUNS = {
    "ppo": ["algo=ppo", "env=CartPole-v1", "algo.n_steps=64", "algo.batch_size=64"],
    "ppo-sde": ["algo=ppo", "env=Pendulum-v1", "algo.n_steps=64", "algo.batch_size=64", "algo.use_sde=true"],
    "ppo-cnn": ["algo=ppo", "env=PixelGoal-v0", "algo.n_steps=64", "algo.batch_size=64"],
    "ppo-lstm": ["algo=ppo", "env=CartPoleNoVel-v1", "actor=lstm", "algo.n_steps=64", "algo.batch_size=64"],
    "ppo-compiled": ["algo=ppo", "env=CartPole-v1", "algo.n_steps=64", "algo.batch_size=64", "compile=true"],
    "ppo_kl": ["algo=ppo_kl", "env=CartPole-v1", "algo.n_steps=64", "algo.batch_size=64"],
    "maskable_ppo": ["algo=maskable_ppo", "env=ValidMoves-v0", "algo.n_steps=64", "algo.batch_size=64"],
    "rnd_ppo": ["algo=rnd_ppo", "env=MountainCar-v0", "algo.n_steps=64", "algo.batch_size=64"],
    "a2c": ["algo=a2c", "env=CartPole-v1"],
    "pg": ["algo=pg", "env=CartPole-v1", "algo.n_steps=64"],
    "trpo": ["algo=trpo", "env=CartPole-v1", "algo.n_steps=64", "algo.batch_size=64"],
    "pqn": ["algo=pqn", "env=CartPole-v1", "algo.n_steps=32"],
    "dqn": ["algo=dqn", "env=CartPole-v1", *OFF],
    "dqn-per": ["algo=dqn", "env=CartPole-v1", "buffer=per", *OFF],
    "dqn-nstep-host": ["algo=dqn", "env=CartPole-v1", "buffer=nstep", "buffer.storage=cpu", *OFF],  # pending steps
    "dqn-gru": ["algo=dqn", "env=CartPoleNoVel-v1", "actor=gru", "buffer=sequence", *OFF],
    "qrdqn": ["algo=qrdqn", "env=CartPole-v1", *OFF],
    "c51": ["algo=c51", "env=CartPole-v1", *OFF],
    "sac": ["algo=sac", "env=Pendulum-v1", *OFF],
    "sac-her": ["algo=sac", "env=BitFlipping-v0", "env.kwargs.n_bits=6", "env.kwargs.continuous=true", "buffer=her",
                *OFF],
    "sac-compiled": ["algo=sac", "env=Pendulum-v1", "compile=true", *OFF],
    "tqc": ["algo=tqc", "env=Pendulum-v1", *OFF],
    "td3": ["algo=td3", "env=Pendulum-v1", *OFF],
    "ddpg": ["algo=ddpg", "env=Pendulum-v1", "algo.train_freq_unit=step", *OFF],
    "crossq": ["algo=crossq", "env=Pendulum-v1", *OFF],
    # many agents (two agents, so QUIET's 4 rows are 2 copies)
    "ippo-separate": ["algo=ippo", "env=coop_match", "env.share_params=false", "algo.n_steps=64", "algo.batch_size=64"],
    "mappo-vmas": ["algo=mappo", "env=vmas", "env.scenario=navigation", "+env.kwargs.n_agents=2", "algo.n_steps=64",
                   "algo.batch_size=64"],
    "ippo-algo-groups": ["algo=ippo", "env=coop_match", "env.groups={a: [agent_0], b: [agent_1]}",
                         "algo.groups.b.name=a2c", "algo.n_steps=64", "algo.batch_size=64"],
    "vdn": ["algo=vdn", "env=coop_match", *OFF],
    "qmix": ["algo=qmix", "env=coop_match", *OFF],
    "masac": ["algo=masac", "env=coop_reach", *OFF],
    "maddpg": ["algo=maddpg", "env=coop_reach", *OFF],
    # their compiled steps (captured as CUDA graphs on a GPU, as SAC's are)
    "qmix-compiled": ["algo=qmix", "env=coop_match", "compile=true", *OFF],
    "masac-compiled": ["algo=masac", "env=coop_reach", "compile=true", *OFF],
}


def test_vmas_on_cuda_keeps_its_own_seeded_device_generator():
    """VMAS scenarios draw their resets from the device's generator, which VMAS itself does not swap: each env keeps
    its own (envs/vmas.py), so one seed gives one start and an env's resets leave the run's CUDA stream alone."""
    pytest.importorskip("vmas")
    from rlcli.envs.vmas import VmasEnvFactory

    factory = VmasEnvFactory(scenario="navigation", device="cuda")
    first, second = factory.make(4, eval=True), factory.make(4, eval=True)
    torch.cuda.manual_seed(123)
    outside = torch.cuda.get_rng_state()
    a, _ = first.reset(seed=7)
    b, _ = second.reset(seed=7)
    assert (a == b).all()
    assert torch.equal(torch.cuda.get_rng_state(), outside)
    c, _ = second.reset(seed=8)
    assert not (a == c).all()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_every_algorithm_trains_resumes_and_evaluates_on_cuda(name, tmp_path):
    check_trains_resumes_and_evaluates([*RUNS[name], *QUIET], 512, tmp_path)


def check_trains_resumes_and_evaluates(args: list[str], steps: int, tmp_path) -> None:
    """`steps` steps of a run tested at half of them, its checkpoint finite and holding the GPU's generator, a resume
    to 1.5x `steps`, then rl-eval."""
    run_dir = tmp_path / "run"
    first = run_cli(*args, f"train.total_steps={steps}", f"train.test_every={steps // 2}",
                    f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "done: " in (run_dir / "train.log").read_text()
    assert (run_dir / "eval.jsonl").read_text().strip()  # tested (at half the steps, or at the end of a phase)
    saved = final(run_dir)
    assert saved["state"]["env_steps"] >= steps
    assert all(torch.isfinite(t).all() for t in saved["algo"]["networks"].values() if t.is_floating_point())
    assert "cuda" in saved["rng"]  # the GPU's generator is saved, so that resume continues its stream
    resumed = run_cli(f"resume={run_dir}", f"train.total_steps={steps * 3 // 2}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert final(run_dir)["state"]["env_steps"] >= steps * 3 // 2
    evaluated = subprocess.run([str(RL_TRAIN.parent / "rl-eval"), str(run_dir), "episodes=2"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]


# every offline algorithm on the dataset kind it learns from (its env is the dataset's), and one offline-to-online run
OFFLINE = {"bc": ("pendulum", []), "awac": ("pendulum", []), "cql": ("pendulum", []), "iql": ("pendulum", []),
           "rebrac": ("pendulum", []), "td3_bc": ("pendulum", []), "discrete_cql": ("cartpole", []),
           "iql-online": ("pendulum", ["offline.online_steps=256", "algo.learning_starts=0"])}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(OFFLINE))
def test_every_offline_algorithm_learns_resumes_and_evaluates_on_cuda(name, tmp_path):
    kind, extra = OFFLINE[name]
    args = [f"algo={name.split('-')[0]}", f"dataset={dataset_file(kind)}", "actor.hidden_sizes=[32,32]",
            "algo.batch_size=64", *extra, *QUIET]
    check_trains_resumes_and_evaluates(args, 256, tmp_path)


def _stream() -> streams.Stream:
    """The global generators' states now, the GPU's included (as a member on CUDA keeps them)."""
    stream = streams.of_member(checkpoint.rng_state())
    assert isinstance(stream, tuple)  # CUDA is in use: its generator is part of the member's stream
    return stream


def _same(a: streams.Stream, b: streams.Stream) -> bool:
    return torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1], strict=True))


ON = ["env=CartPole-v1", "train.num_envs=4", "algo.n_steps=32", "algo.batch_size=64", "algo.n_epochs=2",
      "train.test_every=256", *QUIET]
ACTOR_CRITIC = ["env=Pendulum-v1", "train.num_envs=2", "algo.learning_starts=64", "algo.batch_size=32",
                "algo.train_freq=2", "algo.gradient_steps=2", "actor.hidden_sizes=[32,32]", "train.test_every=256",
                *QUIET]
UPDATES = {"ppo": (["algo=ppo", *ON], None),
           "pqn": (["algo=pqn", "algo.num_minibatches=2", *(o for o in ON if "batch_size" not in o)], None),
           "dqn": (["algo=dqn", *ON[:1], *ACTOR_CRITIC[1:]], RunClock(96, 1024, 48)),
           "sac": (["algo=sac", *ACTOR_CRITIC], RunClock(96, 1024, 48)),
           "td3": (["algo=td3", *ACTOR_CRITIC], RunClock(96, 1024, 48))}


@pytest.mark.parametrize("algo", list(UPDATES))
def test_a_members_first_update_on_cuda_draws_what_its_single_run_draws(algo):
    overrides, clock = UPDATES[algo]
    members = []
    for more in (["seed=0"], ["seed=1", "algo.lr=1e-3"], ["seed=2", "algo.gamma=0.9"]):
        components, _ = prepare(compose_config([*overrides, *more]))
        for _ in range(1 if clock is None else 40):
            components.collector.collect(components.learner, random_actions=clock is not None)
        members.append((components, _stream()))
    singles = []
    for components, stream in members:
        alone, its_buffer = copy.deepcopy(components.algo), copy.deepcopy(components.buffer)
        streams.use(stream)
        metrics = alone.update(its_buffer, clock if clock is not None else RunClock(128, 1024))
        singles.append((alone, metrics, _stream()))
    population = population_update([c.algo for c, _ in members], [c.buffer for c, _ in members])
    rngs = [stream for _, stream in members]
    if clock is None:
        results = population.update([True] * 3, [c.buffer for c, _ in members], rngs)
    else:
        results = population.update([True] * 3, [c.buffer for c, _ in members], rngs, [clock] * 3)
    for (components, _), (alone, metrics, after), result, rng in zip(members, singles, results, rngs, strict=True):
        assert _same(rng, after)  # its minibatches and noise came from its own CPU and CUDA streams
        mine, theirs = components.algo.networks.state_dict(), alone.networks.state_dict()
        for key in mine:  # batched and single GEMMs round differently on a GPU; Adam's first steps are ~lr each
            assert torch.allclose(mine[key], theirs[key], atol=2e-3, rtol=0), key
        assert result is not None
        for key in metrics:
            assert float(result[key]) == pytest.approx(float(metrics[key]), rel=1e-2, abs=1e-3), key


def test_a_members_first_rollout_on_cuda_is_its_single_runs(tmp_path):
    overrides = ["algo=ppo", *ON]
    singles = []
    for seed in (0, 1):
        components, _ = prepare(compose_config([*overrides, f"seed={seed}"]))
        components.collector.collect(components.learner, random_actions=False)
        singles.append(components.buffer.flat())
    members = []
    for seed in (0, 1):
        components, state = prepare(compose_config([*overrides, f"seed={seed}"]))
        members.append(Member(Trainer(components, tmp_path / str(seed), state), tmp_path / str(seed), seed, "", {}))
    assert all("cuda" in m.rng for m in members)
    population = population_update([m.trainer.c.algo for m in members], [m.trainer.c.buffer for m in members])
    assert all(s is not None for s in collect_together(members, population))
    for member, single in zip(members, singles, strict=True):
        mine = member.trainer.c.buffer.flat()
        # the same CUDA draws through logits equal to rounding: the same actions, so the same observations
        assert torch.equal(mine.actions.cpu(), single.actions.cpu())
        assert torch.equal(mine.obs.cpu(), single.obs.cpu())


@pytest.mark.slow
@pytest.mark.parametrize("family", [PPO, [*PPO, "compile=true"], ["algo=a2c", "algo.n_steps=8", "compile=true"],
                                    ALGOS["pqn"], DQN, SAC, CROSSQ],
                         ids=["ppo", "ppo-compiled", "a2c-compiled", "pqn", "dqn", "sac", "crossq"])
def test_a_population_on_cuda_resumes_after_sigterm_bit_identically(tmp_path, family):
    """deterministic=true on the GPU too: each member's checkpoint holds its own CUDA stream."""
    test_population.test_sigterm_then_resume_auto_is_bit_identical_to_an_uninterrupted_population(
        tmp_path, [*family, "device=cuda"])


@pytest.mark.parametrize("algo", list(TESTED))
def test_due_members_on_cuda_test_together_as_each_would_alone(algo, tmp_path):
    """One forward for all due members per test step on the GPU: each member's episodes are its own test phase's
    (Box actions within the batched products' rounding, which a GPU's kernels may order differently)."""
    test_population.check_testing_together([*TESTED[algo], "device=cuda"], discrete=algo in ("ppo", "pqn", "dqn"),
                                           tmp_path=tmp_path, rtol=1e-3, one_call=algo == "ppo")


@pytest.mark.parametrize("mode", ["1", "capture"])
def test_a_compiled_step_on_cuda_is_a_cuda_graph_whose_kept_outputs_match_the_ungraphed_steps(monkeypatch, mode):
    """compile=true on a GPU replays each compiled step from a CUDA graph: torch.compile's (mode="reduce-overhead",
    the default) or rlcli's captured by hand (RLCLI_CUDA_GRAPHS=capture, algos/cuda_graph.py). The weights after
    seven steps, and the seven losses kept across the steps (copied out of the graph's memory, which each replay
    overwrites), are those of the same steps compiled without graphs (RLCLI_CUDA_GRAPHS=0), within float reordering,
    through an optimizer state loaded anew at step 3 (resume, rollback: new tensors, not replayed over the old
    state's memory), a new learning rate at step 4 (a schedule's: an input of the graph) and a new value at step 5
    of a setting the loss reads from its algorithm (a scheduled reward_scale: a new capture)."""
    from torch._dynamo.utils import counters

    from rlcli.algos.compiled import CUDA_GRAPHS_VARIABLE
    from rlcli.algos.loss_step import LossStep
    from rlcli.algos.optim import FusedAdam

    def run(graphs: str):
        monkeypatch.setenv(CUDA_GRAPHS_VARIABLE, graphs)
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).cuda()
        optimizer = FusedAdam(net.parameters(), lr=1e-2)

        class Algo:
            max_grad_norm = 0.5
            reward_scale = 1.0
            schedulable = ("reward_scale",)

            def loss(self, x, y, scale):
                error = net(x).squeeze(-1) - self.reward_scale * y
                return scale * (error ** 2).mean(), {"max_error": error.abs().max()}

        algo = Algo()
        step = LossStep(net, optimizer, algo.loss, clip_of=algo)
        step.compile()
        kept = []
        generator = torch.Generator(device="cuda").manual_seed(1)
        for i in range(7):
            if i == 3:
                optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
            if i == 4:
                optimizer.param_groups[0]["lr"] = 3e-3
            if i == 5:
                algo.reward_scale = 2.0
            x = torch.randn(64, 4, device="cuda", generator=generator)
            kept.append(step(x, x.sum(-1), 0.5 + (i % 2)))
        return step.compiled, net, kept

    counters.clear()
    graphed, net, kept = run(mode)
    plain, reference, expected = run("0")
    assert plain.graphed is None and plain._step.graphs is False
    if mode == "capture":
        assert graphed.graphed is not None and graphed.graphed.failed is None
        assert graphed.graphed.captures == 3  # the first, the reloaded state's, the new reward_scale's
        assert len(graphed.graphed.graphs) == 2  # the replaced state's graph is gone
    else:
        assert graphed.graphed is None and graphed._step.graphs is True
        assert not counters["inductor"]["cudagraph_skips"]  # recorded, not run eagerly behind a warning
    for (loss, aux), (want, want_aux) in zip(kept, expected, strict=True):
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(aux["max_error"], want_aux["max_error"], rtol=1e-5, atol=1e-6)
    for a, b in zip(net.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_compiled_sac_captured_by_hand_on_cuda_trains_resumes_and_evaluates(tmp_path, monkeypatch):
    """RLCLI_CUDA_GRAPHS=capture through a whole run: SAC's three compiled steps captured, a resume (new optimizer
    state tensors) captured again, and rl-eval, as test_every_algorithm_trains_resumes_and_evaluates_on_cuda."""
    monkeypatch.setenv("RLCLI_CUDA_GRAPHS", "capture")
    test_every_algorithm_trains_resumes_and_evaluates_on_cuda("sac-compiled", tmp_path)
    log = (tmp_path / "run" / "train.log").read_text()
    assert "captured by hand" in log and "could not be captured" not in log
