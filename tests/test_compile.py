"""compile=true: the compiled minibatch step learns what the eager one learns, within floating-point tolerance."""

import pytest
import torch

from rlcli.run.compose import compose_config
from rlcli.run.state import prepare
from rlcli.run.trainer import Trainer

ARGS = ["algo=ppo", "env=CartPole-v1", "algo.n_steps=32", "train.total_steps=2048", "train.test_every=1024",
        "train.test_episodes=2", "log.console=false", "log.tensorboard=false", "deterministic=true"]


def eager_and_compiled(tmp_path, args: list[str]):
    """The same fixed-seed run trained eagerly and with compile=true: the two algorithms, in that order."""
    algos = []
    for compiled in (False, True):
        components, state = prepare(compose_config([*args, f"compile={str(compiled).lower()}"]))
        Trainer(components, tmp_path / str(compiled), state).run()
        algos.append(components.algo)
    return algos[0], algos[1]


@pytest.mark.slow
def test_compiled_update_matches_eager_after_2k_steps(tmp_path):
    eager, compiled = eager_and_compiled(tmp_path, ARGS)
    assert compiled._compiled is not None and compiled._compiled.compile_seconds is not None
    # 8 updates x 10 epochs of one 256-step minibatch: the same actions are sampled (same RNG stream), so
    # only floating-point reordering in the fused graph separates the two
    for (name, a), b in zip(eager.networks.state_dict().items(), compiled.networks.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
    opt_a = eager.optimizer.state_dict()["state"]
    opt_b = compiled.optimizer.state_dict()["state"]
    for key in opt_a:
        assert opt_a[key]["step"] == opt_b[key]["step"]
        # Adam's first moment is mostly the last minibatches' gradients: the weights agree to ~1e-7, but a sample
        # whose ratio sits on the clip boundary may be clipped in one graph and not the other, which moves the
        # policy's small gradient averages by a few percent (seen here: up to 17% in norm, cosine >= 0.997, while
        # the value network's agree to 1e-8); so the policy's moments are compared by direction
        a, b = opt_a[key]["exp_avg"].flatten(), opt_b[key]["exp_avg"].flatten()
        assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.99, key


def test_compile_refuses_what_it_does_not_cover_in_one_line():
    from rlcli.registry import ConfigError

    able = ("compile=true is not implemented for algo=crossq yet; "
            "it is for: a2c, c51, ddpg, dqn, maskable_ppo, pg, ppo, ppo_kl, pqn, qrdqn, rnd_ppo, sac, td3, tqc, trpo")
    for args, expected in ((["algo=crossq", "env=Pendulum-v1"], able),
                           (["algo=pg", "actor=gru", "env=CartPoleNoVel-v1"], "does not cover a recurrent actor"),
                           (["algo=sac", "algo.use_sde=true", "env=Pendulum-v1"], "does not cover gSDE"),
                           (["algo=sac", "actor=gru", "buffer=sequence", "env=Pendulum-v1"],
                            "does not cover a recurrent actor"),
                           (["algo=ppo", "actor=lstm", "env=CartPoleNoVel-v1"], "does not cover a recurrent actor")):
        with pytest.raises(ConfigError, match=expected):
            prepare(compose_config([*args, "compile=true"]))


DQN_ARGS = ["env=CartPole-v1", "train.total_steps=2048", "algo.learning_starts=512",
            "train.test_every=1024", "train.test_episodes=2", "log.console=false", "log.tensorboard=false",
            "deterministic=true"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["dqn", "qrdqn", "c51"])
def test_compiled_dqn_update_matches_eager_after_2k_steps(algo, tmp_path):
    """The target network is read, not trained: only the optimizer's parameters go through the compiled step.
    QR-DQN and C51 compile through DQN's step over their own transition_loss. DQN's 896 Adam steps at lr 2.3e-3
    let float reordering grow to ~1e-4 (measured: 9.8e-5 on the first layer); the tolerance, 1e-3, is under half
    of one Adam step, while a wrong clip or bias correction moves weights by many."""
    eager, compiled = eager_and_compiled(tmp_path, [f"algo={algo}", *DQN_ARGS])
    assert compiled._compiled is not None and compiled.gradient_updates == eager.gradient_updates > 0
    for (name, a), b in zip(eager.networks.state_dict().items(), compiled.networks.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-3, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo_kl", "maskable_ppo"])
def test_compiled_ppo_variants_match_eager(algo, tmp_path):
    """PPO-KL's penalty coefficient changes after every update (the paper's rule), so it enters the compiled graph
    as a tensor, not a constant: the adaptation must not recompile or freeze it. MaskablePPO's masks ride in the
    batch."""
    env = "env=ValidMoves-v0" if algo == "maskable_ppo" else "env=CartPole-v1"
    eager, compiled = eager_and_compiled(tmp_path, [f"algo={algo}", env, *ARGS[2:]])  # ARGS less algo and env
    assert compiled._compiled is not None
    assert compiled.kl_coef == eager.kl_coef  # the same sequence of KL adaptations
    for (name, a), b in zip(eager.networks.state_dict().items(), compiled.networks.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=name)


OWN_OPTIMIZER_ARGS = {
    "pqn": ["algo=pqn", "env=CartPole-v1", "algo.n_steps=32", *ARGS[3:]],
    "rnd_ppo": ["algo=rnd_ppo", "env=MountainCar-v0", "train.num_envs=4", "algo.n_steps=32", "algo.batch_size=64",
                "algo.obs_norm_warmup_steps=256", *ARGS[3:]],
}


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(OWN_OPTIMIZER_ARGS))
def test_compiled_pqn_and_rnd_match_eager(algo, tmp_path):
    """PQN's RAdam (by hand in the graph: its rectification switches on after a few steps, and 256 steps cover
    both sides) and RND-PPO's two modules in one step (the actor-critic and the predictor, whose minibatch share
    is drawn outside the graph where the eager step draws it). Measured: weights within 5e-6 (PQN) and 2e-7 (RND);
    the optimizers' layouts and step counts are the eager ones, so a checkpoint loads in either."""
    eager, compiled = eager_and_compiled(tmp_path, OWN_OPTIMIZER_ARGS[algo])
    assert compiled._compiled is not None and compiled._compiled.compile_seconds is not None
    modules = [("networks", eager.networks, compiled.networks)]
    if algo == "rnd_ppo":
        modules.append(("rnd", eager.rnd, compiled.rnd))
    for prefix, a_module, b_module in modules:
        for (name, a), b in zip(a_module.state_dict().items(), b_module.state_dict().values(), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=f"{prefix}.{name}")
    opt_a, opt_b = eager.optimizer.state_dict(), compiled.optimizer.state_dict()
    assert opt_a["param_groups"] == opt_b["param_groups"]
    every_param = sum(len(group["params"]) for group in opt_a["param_groups"])  # RND's predictor's group too
    assert len(opt_a["state"]) == len(opt_b["state"]) == every_param
    for key, state in opt_a["state"].items():
        assert set(state) == set(opt_b["state"][key])
        assert state["step"] == opt_b["state"][key]["step"] > 0


@pytest.mark.slow
def test_compiled_trpo_value_steps_match_eager_and_leave_the_policy_step_alone(tmp_path):
    """TRPO compiles its value function's Adam steps only (its natural-gradient step decides in Python). After one
    update (RL-Zoo CartPole: 20 epochs of 2 minibatches), the policy's weights are bit-identical and the value
    function's within float reordering. Later updates are not compared: the conjugate gradient amplifies the value
    function's 1e-7 differences, through the advantages, into the policy's (measured: 1.5e-4 after two updates,
    then the sampled actions part and the runs with them), as it would any change of float order."""
    eager, compiled = eager_and_compiled(tmp_path, ["algo=trpo", "env=CartPole-v1", "algo.n_steps=64",
                                                    "algo.batch_size=64", "train.total_steps=128", *ARGS[4:]])
    assert compiled._compiled is not None and compiled._compiled.compile_seconds is not None
    for (name, a), b in zip(eager.networks.state_dict().items(), compiled.networks.state_dict().values(), strict=True):
        if name.startswith(("pi_body", "head")):
            assert torch.equal(a, b), name
        else:
            torch.testing.assert_close(b, a, rtol=0, atol=1e-6, msg=name)
    opt_a, opt_b = eager.value_optimizer.state_dict(), compiled.value_optimizer.state_dict()
    assert [s["step"] for s in opt_a["state"].values()] == [s["step"] for s in opt_b["state"].values()]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["a2c", "ppo"])
def test_compiled_gsde_updates_match_eager(algo, tmp_path):
    """gSDE's update is pure: the log-probs come from the features and the noise's log std, not from the
    exploration matrices (drawn while acting, outside the graph). Measured after 2k Pendulum steps: weights within
    1e-5 (A2C) and 2.2e-5 (PPO), the matrices equal."""
    ppo = ["algo.n_steps=64", "algo.batch_size=64"] if algo == "ppo" else []
    eager, compiled = eager_and_compiled(tmp_path, [f"algo={algo}", "env=Pendulum-v1", "algo.use_sde=true", *ppo,
                                                    *ARGS[3:]])
    assert compiled._compiled is not None
    for (name, a), b in zip(eager.networks.named_parameters(), compiled.networks.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-4, msg=name)
    assert torch.equal(eager.networks.head.noise.eps, compiled.networks.head.noise.eps)


ONE_STEP_ARGS = ["env=CartPole-v1", "train.total_steps=2048", "train.test_every=1024", "train.test_episodes=2",
                 "log.console=false", "log.tensorboard=false", "deterministic=true"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["a2c", "pg"])
def test_compiled_one_step_update_matches_eager_after_2k_steps(algo, tmp_path):
    """A2C's RMSprop (by hand in the compiled graph: torch.optim.RMSprop's formula, state and layout) and PG's Adam:
    the compiled runs' weights and optimizer states agree with the eager runs' within float reordering."""
    eager, compiled = eager_and_compiled(tmp_path, [f"algo={algo}", *ONE_STEP_ARGS])
    assert compiled._compiled is not None and compiled._compiled.compile_seconds is not None
    for (name, a), b in zip(eager.networks.state_dict().items(), compiled.networks.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=name)
    opt_a, opt_b = eager.optimizer.state_dict(), compiled.optimizer.state_dict()
    assert opt_a["param_groups"] == opt_b["param_groups"]
    for key, state in opt_a["state"].items():
        assert set(state) == set(opt_b["state"][key])  # the same layout: a checkpoint loads in either
        assert state["step"] == opt_b["state"][key]["step"]


ACTOR_CRITIC_ARGS = ["env=Pendulum-v1", "train.total_steps=600", "algo.learning_starts=400", "algo.batch_size=64",
                     "actor.hidden_sizes=[32,32]", "train.test_every=600", "train.test_episodes=1",
                     "log.console=false", "log.tensorboard=false", "deterministic=true"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_compiled_actor_critic_steps_match_eager(algo, tmp_path):
    """Two compiled steps (critics, then the policy through the critics just stepped), with the policy's noise
    drawn outside the graphs from the run's stream: the same draws as the eager run, so after 200 gradient steps
    only float reordering separates the weights (measured: at most 2e-7; TQC and DDPG take the same code paths).
    Longer runs drift apart as any two float orders do (SAC's policy: 3e-3 after 800 steps, as the actions taken
    and so the data move), so the comparison stops where a wrong clip, formula or draw would still show."""
    eager, compiled = eager_and_compiled(tmp_path, [f"algo={algo}", *ACTOR_CRITIC_ARGS])
    assert compiled._compiled is not None and all(step.compile_seconds is not None for step in compiled._compiled)
    assert compiled.gradient_updates == eager.gradient_updates > 0
    for (name, a), b in zip(eager.networks.state_dict().items(), compiled.networks.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=name)
