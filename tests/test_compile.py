"""compile=true: the compiled minibatch step learns what the eager one learns, within floating-point tolerance."""

import pytest
import torch

from rlcli.algos.compiled import FAST_TANH_VARIABLE
from rlcli.algos.loss_step import compile_enabled, enable_compile, loss_steps
from rlcli.algos.runner import SingleRun
from rlcli.run.compose import compose_config
from rlcli.run.state import prepare
from rlcli.run.trainer import Trainer

ARGS = ["algo=ppo", "env=CartPole-v1", "algo.n_steps=32", "train.total_steps=2048", "train.test_every=1024",
        "train.test_episodes=2", "log.console=false", "log.tensorboard=false", "deterministic=true"]


def eager_and_compiled(tmp_path, args: list[str], keep: list | None = None):
    """The same fixed-seed run trained eagerly and with compile=true: the two algorithms, in that order (`keep`
    gets the eager run's components)."""
    algos = []
    for compiled in (False, True):
        components, state = prepare(compose_config([*args, f"compile={str(compiled).lower()}"]))
        (tmp_path / str(compiled)).mkdir(parents=True, exist_ok=True)
        Trainer(components, tmp_path / str(compiled), state).run()
        algos.append(components.algo)
        if keep is not None and not compiled:
            keep.append(components)
    return algos[0], algos[1]


def eager_and_compiled_copies(algo):
    """Two copies of a trained eager algorithm, the second compiled: the same state, for comparisons one update
    deep. Over a whole run the two drift apart chaotically wherever rounding decides a branch (a sample on PPO's
    clip boundary, a Huber kink, a weight whose gradient is zero up to rounding, which Adam turns into a full
    step): how far depends on the CPU's vector width (2026-11-26, an AVX-512 machine: QR-DQN's weights 0.75 apart
    after 2k steps, a PPO moment's cosine 0.80), so the whole runs are compared by their weights only where
    they stay close on any CPU."""
    import copy

    compiled = copy.deepcopy(algo)
    enable_compile(compiled)
    return copy.deepcopy(algo), compiled


def assert_weights_one_step_apart(eager: torch.nn.Module, compiled: torch.nn.Module,
                                  grads: dict[str, torch.Tensor], lr: float, atol: float) -> int:
    """After one step each from the same state: the weights agree within `atol`, but for those whose gradient is
    nonzero and yet zero up to rounding (under 1e-6 of the tensor's largest), where Adam turns a tiny gradient of
    either sign into a full step of lr: those may differ by that step (an exact zero, a dead unit's, is the same
    step in both). Parameters without a gradient (a target network, SAC's temperature) must be untouched.
    Returns how many weights had such a flat gradient, which the caller bounds."""
    flat_gradient_weights = 0
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        if name not in grads:
            assert torch.equal(a, b), name
            continue
        g = grads[name].abs()
        flat = (g > 0) & (g <= 1e-6 * g.max())
        flat_gradient_weights += int(flat.sum())
        torch.testing.assert_close(b[~flat], a[~flat], rtol=0, atol=atol, msg=name)
        assert ((a - b)[flat].abs() <= 1.5 * lr).all(), name
    return flat_gradient_weights


@pytest.mark.slow
@pytest.mark.parametrize("tanh", ["torch's", "fast"])
def test_compiled_update_matches_eager_after_2k_steps(tmp_path, monkeypatch, tanh: str):
    """With torch's tanh (TORCHINDUCTOR_CPP_USE_DECOMPOSE_TANH=0) only floating-point reordering separates the
    compiled step from the eager one; with the fast tanh (compile=true's default on a CPU, within 2e-7 of tanh)
    the weights still agree as closely, while the policy's gradient averages move further (a sample on the clip
    boundary; cosine 0.93 seen), so they are compared with torch's tanh only."""
    monkeypatch.setenv(FAST_TANH_VARIABLE, "1" if tanh == "fast" else "0")
    kept: list = []
    eager, compiled = eager_and_compiled(tmp_path, ARGS, keep=kept)
    assert compile_enabled(compiled) and all(s.compile_seconds is not None for s in loss_steps(compiled))
    import torch._inductor.config as inductor

    assert inductor.cpp.use_decompose_tanh == (tanh == "fast")
    # 8 updates x 10 epochs of one 256-step minibatch: the same actions are sampled (same RNG stream)
    for (name, a), b in zip(eager.networks.state_dict().items(), compiled.networks.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
    if tanh == "fast":
        return
    # the optimizer's state, one update (20 epochs) deep from the eager run's end, on its last rollout: Adam's
    # moments as the eager step leaves them. Without the clip: a sample whose ratio sits on the clip boundary may
    # be clipped in one graph and not the other (seen even one update deep on an AVX-512 CPU: clip fractions
    # 0.184 and 0.180), which moves the policy's small first moments by tens of percent
    one, other = eager_and_compiled_copies(eager)
    for algo in (one, other):
        algo.clip_range = None
        torch.manual_seed(0)
        algo.update(kept[0].buffer, None)
    opt_a, opt_b = one.optimizer.state_dict()["state"], other.optimizer.state_dict()["state"]
    assert opt_a.keys() == opt_b.keys() and len(opt_a) > 0
    for key in opt_a:
        assert opt_a[key]["step"] == opt_b[key]["step"] > eager.optimizer.state_dict()["state"][key]["step"]
        for slot in ("exp_avg", "exp_avg_sq"):
            a, b = opt_a[key][slot], opt_b[key][slot]
            torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-6 * float(a.abs().max()), msg=f"{key} {slot}")


def test_the_fast_tanh_is_within_2e_7_of_torchs(monkeypatch):
    """compile=true's CPU tanh (algos/compiled.use_fast_tanh) against torch's, over the range where tanh is not yet
    1 in float32, and torch's own again with the variable at 0."""
    from rlcli.algos.compiled import use_fast_tanh

    x = torch.linspace(-10, 10, 200_001)
    errors = {}
    for setting in ("1", "0"):
        monkeypatch.setenv(FAST_TANH_VARIABLE, setting)
        use_fast_tanh()
        torch._dynamo.reset()
        errors[setting] = (torch.compile(torch.tanh)(x).double() - torch.tanh(x.double())).abs().max().item()
    torch._dynamo.reset()
    # seen here: 1.8e-7 fast, 6.0e-8 (half a float32 ULP at 1) torch's: the setting reaches the compiled kernel
    assert errors["1"] < 2e-7 and errors["0"] < 1e-7 < errors["1"], errors


def test_compile_refuses_what_it_does_not_cover_in_one_line():
    """Every built-in algorithm compiles with every actor (recurrent ones too, since their sequence losses are the
    LossSteps' losses); a plugin's algorithm may name what its step does not cover (`compile_refusal`), and one with
    no LossStep has nothing to compile: both one line."""
    from rlcli.algos.loss_step import enable_compile
    from rlcli.registry import ConfigError

    class Refusing:
        def compile_refusal(self):
            return "compile=true does not cover this plugin's tree search; drop compile=true"

    class Untouched:
        pass

    with pytest.raises(ConfigError, match="does not cover this plugin's tree search"):
        enable_compile(Refusing())
    with pytest.raises(ConfigError, match="Untouched steps no optimizer through a LossStep"):
        enable_compile(Untouched())


DQN_ARGS = ["env=CartPole-v1", "train.total_steps=2048", "algo.learning_starts=512",
            "train.test_every=1024", "train.test_episodes=2", "log.console=false", "log.tensorboard=false",
            "deterministic=true"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["dqn", "qrdqn", "c51", "vdn", "qmix", "dqn-gru"])
def test_compiled_dqn_steps_match_eager_steps_from_the_same_state(algo, tmp_path):
    """The target network is read, not trained: only the optimizer's parameters go through the compiled step.
    QR-DQN and C51 compile through DQN's step over their own transition_loss. A 2k-step run takes as many
    compiled steps as eager ones; then, from the eager run's end (Adam's state 896 steps in), 20 steps each one
    deep on the same batches: TD errors, metrics and weights agree within float reordering, but for the weights
    whose gradient is zero up to rounding, which may take one Adam step of lr. (Whole runs drift apart by
    rounding, CPU-dependently: eager_and_compiled_copies.) A wrong clip or bias correction moves weights by
    many steps. R2D2's (dqn-gru) is the same step on stored sequences, the burn-in a constant of its graph."""
    kept: list = []
    env = ["env=coop_match"] if algo in ("vdn", "qmix") else []  # many agents' joint transitions (their mixer)
    recurrent = ["actor=gru", "actor.rnn_size=16", "buffer=sequence", "buffer.seq_len=6", "buffer.burn_in=2",
                 "algo.batch_size=16"] if algo.endswith("-gru") else []
    args = [a for a in DQN_ARGS if not (env and a.startswith("env="))]
    eager, compiled = eager_and_compiled(tmp_path, [f"algo={algo.removesuffix('-gru')}", *args, *env, *recurrent],
                                         keep=kept)
    assert compile_enabled(compiled) and compiled.gradient_updates == eager.gradient_updates > 0
    buffer = kept[0].buffer
    one, other = eager_and_compiled_copies(eager)
    lr = eager.optimizer.param_groups[0]["lr"]
    flat_gradient_weights = 0
    for step in range(20):  # one gradient step deep each, from the same state, on the same batch
        torch.manual_seed(step)
        batch = buffer.sample(eager.batch_size)
        errors_a, metrics_a = one._gradient_step(batch, SingleRun(one, buffer))
        grads = {name: p.grad.clone() for name, p in one.networks.named_parameters() if p.grad is not None}
        errors_b, metrics_b = other._gradient_step(batch, SingleRun(other, buffer))
        if recurrent:
            assert errors_a is None and errors_b is None  # stored sequences keep no priorities
        else:
            torch.testing.assert_close(errors_b, errors_a, rtol=1e-5, atol=1e-5)
        for key, value in metrics_a.items():
            torch.testing.assert_close(metrics_b[key], value, rtol=1e-5, atol=1e-6, msg=key)
        # the GRU's input weights: measured 2.9e-6 apart at most over the 20 steps (lr 2.3e-3), the rest 7e-8
        atol = 1e-5 if recurrent else 1e-6
        flat_gradient_weights += assert_weights_one_step_apart(one.networks, other.networks, grads, lr, atol=atol)
        other.networks.load_state_dict(one.networks.state_dict())
        other.optimizer.load_state_dict(one.optimizer.state_dict())
    weights = sum(p.numel() for p in eager.networks.q.parameters())
    assert flat_gradient_weights < 0.05 * 20 * weights


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo_kl", "maskable_ppo", "ppo-gru", "a2c-gru"])
def test_compiled_ppo_variants_match_eager(algo, tmp_path):
    """PPO-KL's penalty coefficient changes after every update (the paper's rule), so it enters the compiled graph
    as a tensor, not a constant: the adaptation must not recompile or freeze it. MaskablePPO's masks ride in the
    batch. A recurrent actor's minibatches are whole env sequences unrolled inside the graph (measured after 2,048
    steps: PPO's weights 6e-7 apart, A2C's 6e-7; compiling PPO's 8-step unroll took 17 s here)."""
    env = "env=ValidMoves-v0" if algo == "maskable_ppo" else "env=CartPole-v1"
    recurrent = ["actor=gru", "env=CartPoleNoVel-v1", "algo.n_steps=8", "train.num_envs=4"] \
        if algo.endswith("-gru") else []
    if algo == "ppo-gru":
        recurrent += ["algo.batch_size=16", "algo.n_epochs=2"]
    args = [a for a in ARGS[2:] if not (recurrent and a.startswith("algo.n_steps"))]
    eager, compiled = eager_and_compiled(tmp_path, [f"algo={algo.removesuffix('-gru')}", env, *args, *recurrent])
    assert compile_enabled(compiled)
    assert getattr(compiled, "kl_coef", None) == getattr(eager, "kl_coef", None)  # the same KL adaptations
    for (name, a), b in zip(eager.networks.state_dict().items(), compiled.networks.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=name)


def test_the_shared_losses_compile_into_one_graph():
    """The losses every compiled on-policy step calls trace without a graph break (fullgraph raises on one): a
    ContextVar read in masked_mean (the members' mode) once broke a compiled PPO update into a graph per mean,
    58.6 ms per update against 15.7 ms."""
    from rlcli.algos.base import masked_mean, normalize_masked
    from rlcli.algos.losses import clipped_surrogate_loss, squared_value_loss

    def loss(advantages, ratio, values, returns, mask):
        advantages = normalize_masked(advantages, mask)
        return (clipped_surrogate_loss(advantages, ratio, 0.2, mask) + squared_value_loss(values, returns, mask)
                + masked_mean(ratio, mask))

    args = (torch.randn(16), torch.rand(16) + 0.5, torch.randn(16), torch.randn(16), torch.ones(16))
    torch.testing.assert_close(torch.compile(loss, fullgraph=True)(*args), loss(*args))


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
    assert compile_enabled(compiled) and all(s.compile_seconds is not None for s in loss_steps(compiled))
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
    assert compile_enabled(compiled) and all(s.compile_seconds is not None for s in loss_steps(compiled))
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
    assert compile_enabled(compiled)
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
    assert compile_enabled(compiled) and all(s.compile_seconds is not None for s in loss_steps(compiled))
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
@pytest.mark.parametrize("algo", ["sac", "td3", "sac-gsde", "masac", "maddpg"])
def test_compiled_actor_critic_steps_match_eager(algo, tmp_path):
    """Two compiled steps (critics, then the policy through the critics just stepped), with the policy's noise
    drawn outside the graphs from the run's stream: the same draws as the eager run, so after 200 gradient steps
    only float reordering separates the weights (measured: at most 2e-7; TQC and DDPG take the same code paths).
    Longer runs drift apart as any two float orders do (SAC's policy: 3e-3 after 800 steps, as the actions taken
    and so the data move), so the comparison stops where a wrong clip, formula or draw would still show."""
    gsde = ["algo.use_sde=true"] if algo.endswith("-gsde") else []  # the matrix is the noise (measured: 5e-7)
    env = ["env=coop_reach"] if algo.startswith("ma") else []  # many agents: the centralized critic
    args = [a for a in ACTOR_CRITIC_ARGS if not (env and a.startswith("env="))]
    eager, compiled = eager_and_compiled(tmp_path, [f"algo={algo.removesuffix('-gsde')}", *gsde, *args, *env])
    assert compile_enabled(compiled) and all(step.compile_seconds is not None for step in loss_steps(compiled))
    assert compiled.gradient_updates == eager.gradient_updates > 0
    for (name, a), b in zip(eager.networks.state_dict().items(), compiled.networks.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("gsde", [False, True])
def test_compiled_crossq_steps_match_eager_steps_from_the_same_state(gsde, tmp_path):
    """CrossQ's compiled steps update the batch-renorm running statistics inside the graph (the buffers go in as
    inputs of the differentiated function). From one state and one batch, three critic + policy + temperature
    steps, eager and compiled, with the renormalization switched on after the first: losses, TD errors, running
    statistics and weights agree within float reordering. The exception is the handful of weights whose gradient
    is zero up to rounding (a bias feeding a batch-renorm layer: a constant shift is normalized away), where Adam
    turns a 1e-8 gradient of either sign into a full step of lr (measured: 3e-4 to 5e-4 apart at lr 1e-3, the
    gradient there 1e-8 against 0.4 elsewhere); those are only allowed that step, and must be few. Then each step
    starts again from the eager state, so that the comparison stays one step deep. With gSDE the exploration
    matrix, drawn for each step, is the policy's noise and goes into the graphs as an argument."""
    import copy

    args = ["algo=crossq", "algo.critic_hidden_sizes=[64,64]", "algo.renorm_warmup_steps=1", "algo.policy_delay=1",
            *ACTOR_CRITIC_ARGS, "train.total_steps=400", "train.test_every=400", "compile=false",
            f"algo.use_sde={str(gsde).lower()}"]
    components, state = prepare(compose_config(args))
    Trainer(components, tmp_path, state).run()  # 400 random steps: the replay buffer, no update yet
    eager = components.algo
    compiled = copy.deepcopy(eager)
    enable_compile(compiled)
    lr = eager.critic_optimizer.param_groups[0]["lr"]
    flat_gradient_weights = 0
    for step in range(3):
        torch.manual_seed(100 + step)
        batch = components.buffer.sample(64)
        torch.manual_seed(7 + step)
        errors_a, metrics_a = eager._gradient_step(batch, SingleRun(eager, components.buffer))
        grads = {name: p.grad.clone() for name, p in eager.networks.named_parameters() if p.grad is not None}
        torch.manual_seed(7 + step)  # the compiled step draws the same noise outside its graphs
        errors_b, metrics_b = compiled._gradient_step(batch, SingleRun(compiled, components.buffer))
        assert set(metrics_a) == set(metrics_b) >= {"value_loss", "policy_loss", "entropy", "alpha"}
        for key, value in metrics_a.items():
            torch.testing.assert_close(metrics_b[key], value, rtol=1e-5, atol=1e-6, msg=key)
        torch.testing.assert_close(errors_b, errors_a, rtol=1e-5, atol=1e-5)
        for (name, a), b in zip(eager.networks.named_buffers(), compiled.networks.buffers(), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
        # (log_alpha's step is compiled too: the temperature's LossStep)
        flat_gradient_weights += assert_weights_one_step_apart(eager.networks, compiled.networks, grads, lr,
                                                               atol=1e-5)
        compiled.networks.load_state_dict(eager.networks.state_dict())
        for opt in ("critic_optimizer", "policy_optimizer"):
            getattr(compiled, opt).load_state_dict(getattr(eager, opt).state_dict())
        compiled.temperature.optimizer.load_state_dict(eager.temperature.optimizer.state_dict())
    assert eager.networks.critics[0][0].steps > 1  # past the warm-up: renormalized steps were compared too
    weights = sum(p.numel() for p in eager.networks.parameters())
    assert flat_gradient_weights < 0.05 * 3 * weights  # measured: 610 of 3 x 11,003 (1.8%)
    assert all(step.compile_seconds is not None for step in loss_steps(compiled))


@pytest.mark.slow
def test_compiled_recurrent_sac_steps_match_eager_steps_from_the_same_state(tmp_path):
    """SAC with a recurrent actor goes through the same two LossSteps as the feed-forward one, on its stored
    sequences' losses (burn-in, padding masks; the batch's burn_in is a number, a constant of the graph). From one
    state and one batch of sequences, three critic + policy + temperature steps, eager and compiled, one step deep
    (the compiled state reset to the eager one after each): losses and weights agree within float reordering, but
    for weights whose gradient is zero up to rounding (Adam's full step, as CrossQ's above). Over a whole 600-step
    run the policy's weights drift 5e-4 apart, the critics' 2e-6. The steps compile whole: no graph break (the
    policy's step once fell back to eager on a selection of the real steps, whose size is the data's)."""
    import copy

    from torch._dynamo.utils import counters

    args = ["algo=sac", "actor=gru", "actor.rnn_size=16", "buffer=sequence", "buffer.seq_len=6", "buffer.burn_in=2",
            *ACTOR_CRITIC_ARGS, "algo.batch_size=16", "train.total_steps=400", "train.test_every=400",
            "compile=false"]
    components, state = prepare(compose_config(args))
    Trainer(components, tmp_path, state).run()  # 400 random steps: sequences stored, no update yet
    eager = components.algo
    compiled = copy.deepcopy(eager)
    enable_compile(compiled)
    lr = eager.critic_optimizer.param_groups[0]["lr"]
    flat_gradient_weights = 0
    counters.clear()
    for step in range(3):
        torch.manual_seed(100 + step)
        batch = components.buffer.sample(16)
        torch.manual_seed(7 + step)
        errors_a, metrics_a = eager._gradient_step(batch, SingleRun(eager, components.buffer))
        grads = {name: p.grad.clone() for name, p in eager.networks.named_parameters() if p.grad is not None}
        torch.manual_seed(7 + step)
        errors_b, metrics_b = compiled._gradient_step(batch, SingleRun(compiled, components.buffer))
        # the target critics follow the critics by Polyak averaging: compared within the same tolerance
        grads.update({name: torch.zeros_like(p) for name, p in eager.networks.named_parameters()
                      if name.startswith("critics_target.")})
        assert errors_a is None and errors_b is None  # stored sequences keep no priorities
        assert set(metrics_a) == set(metrics_b) >= {"value_loss", "policy_loss", "entropy", "alpha"}
        for key, value in metrics_a.items():
            torch.testing.assert_close(metrics_b[key], value, rtol=1e-5, atol=1e-6, msg=key)
        flat_gradient_weights += assert_weights_one_step_apart(eager.networks, compiled.networks, grads, lr,
                                                               atol=1e-5)
        compiled.networks.load_state_dict(eager.networks.state_dict())
        for opt in ("critic_optimizer", "policy_optimizer"):
            getattr(compiled, opt).load_state_dict(getattr(eager, opt).state_dict())
        compiled.temperature.optimizer.load_state_dict(eager.temperature.optimizer.state_dict())
    weights = sum(p.numel() for p in eager.networks.parameters())
    assert flat_gradient_weights < 0.05 * 3 * weights
    assert all(step.compile_seconds is not None for step in loss_steps(compiled))
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_a_process_compiles_many_configurations_not_just_torchs_eight():
    """Each distinct configuration of a compiled step is another graph of the same function; torch keeps 8 per
    function and runs the 9th eagerly (a basic-launcher sweep of 10 compile=true jobs differing in max_grad_norm
    ran its last two eagerly). A compiled step's first call makes room for many (building it sets nothing up:
    the next test). (torch's own `patch` puts its limits back after; pytest's monkeypatch would delete them from
    torch's config module, for every later test.)"""
    import torch._dynamo.config as dynamo

    from rlcli.algos.compiled import ACCUMULATED_RECOMPILE_LIMIT, RECOMPILE_LIMIT, LazilyCompiled

    with dynamo.patch(recompile_limit=8, accumulated_recompile_limit=256):
        step = LazilyCompiled(lambda x: x * 2 + 1)
        assert dynamo.recompile_limit == 8
        assert torch.equal(step(torch.ones(3)), torch.full((3,), 3.0))
        assert dynamo.recompile_limit == RECOMPILE_LIMIT >= 64
        assert dynamo.accumulated_recompile_limit == ACCUMULATED_RECOMPILE_LIMIT
    assert dynamo.recompile_limit >= 8  # still there for the next test


def test_deterministic_runs_set_torchs_flag_without_importing_the_compiler_and_compiled_ones_set_inductors():
    """deterministic=true used to cost every run 1.2 s of start-up: torch.use_deterministic_algorithms imports
    torch._inductor (and torch._dynamo) to set a flag only compiled code reads. An eager run sets torch's flag
    alone. Building a compile=true run's step imports no compiler either (rl-train's pre-check of a compile=true
    sweep builds one job and discards it: 2 s of the sweep's start-up, before any job began); its first call
    sets inductor's flag from torch's, as torch's call would have."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from rlcli.run.compose import compose_config\n"
            "from rlcli.run.state import prepare\n"
            "prepare(compose_config(['algo=ppo', 'deterministic=true']))\n"
            "print(torch.are_deterministic_algorithms_enabled(), 'torch._dynamo' in sys.modules)\n"
            "components, _ = prepare(compose_config(['algo=ppo', 'deterministic=true', 'compile=true']))\n"
            "from rlcli.algos.loss_step import compile_enabled\n"
            "print(compile_enabled(components.algo), 'torch._dynamo' in sys.modules)\n"
            "from rlcli.algos.compiled import LazilyCompiled\n"
            "LazilyCompiled(lambda x: x + 1)(torch.ones(2))\n"
            "import torch._inductor.config as inductor\n"
            "print(inductor.deterministic)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "False", "True", "False", "True"]


def test_a_compiled_step_on_the_cpu_is_no_cuda_graph():
    """LazilyCompiled captures a CUDA graph (mode="reduce-overhead") when its arguments are on a GPU; on the CPU it
    compiles as before and `owned` hands back the outputs themselves (tests/test_cuda.py checks the GPU side and
    RLCLI_CUDA_GRAPHS=0)."""
    from rlcli.algos.compiled import LazilyCompiled, cuda_graphs_wanted

    cpu = (torch.ones(2), [torch.zeros(1)], {"a": torch.ones(3)}, 1.5)
    assert cuda_graphs_wanted(cpu) is False
    step = LazilyCompiled(lambda x: x * 3)
    assert step.graphs is None  # chosen at the first call
    out = step(torch.ones(2))
    assert step.graphs is False and step.owned(out) is out
    assert torch.equal(out, torch.full((2,), 3.0))


def test_a_step_through_the_hand_capture_path_computes_what_the_compiled_step_computes():
    """RLCLI_CUDA_GRAPHS=capture hands CompiledStep's tensors to the graph as one flat list (weights, each optimizer
    slot, step counters, buffers) and the graph's body takes them apart again (`_fixed_step`). On the CPU (no graph),
    the same path with a pass-through in place of the capture: three steps of a network with batch-norm buffers
    updated in the loss are bit-identical to the plain compiled steps'."""
    from rlcli.algos.loss_step import LossStep
    from rlcli.algos.optim import FusedAdam

    def build(through_the_capture_path: bool):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(),
                                  torch.nn.Linear(16, 1))
        optimizer = FusedAdam(net.parameters(), lr=1e-2)

        def loss(x, y):
            error = net(x).squeeze(-1) - y
            return (error ** 2).mean(), error.detach().abs().max()

        step = LossStep(net, optimizer, loss, updates_buffers=True)
        step.compile()
        if through_the_capture_path:
            compiled = step.compiled
            compiled._buffer_names = [f"networks.{n}" for n, _ in net.named_buffers()]
            contexts = []

            def replay(fixed, moving, context):  # what GraphedStep replays, called directly
                contexts.append(context)
                return compiled._fixed_step(fixed, moving)

            compiled.graphed = replay
        generator = torch.Generator().manual_seed(1)
        outputs = [step(x, x.sum(-1)) for x in (torch.randn(32, 4, generator=generator) for _ in range(3))]
        if through_the_capture_path:  # the key's context: every tensor the networks hold, by address
            assert contexts == [((), tuple(t.data_ptr() for t in [*net.parameters(), *net.buffers()]))] * 3
        return net, optimizer, outputs

    net, optimizer, outputs = build(True)
    reference, reference_optimizer, expected = build(False)
    for (loss, error), (want, want_error) in zip(outputs, expected, strict=True):
        assert torch.equal(loss, want) and torch.equal(error, want_error)
    for a, b in zip(net.state_dict().values(), reference.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # weights and batch-norm statistics
    for p, q in zip(net.parameters(), reference.parameters(), strict=True):
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(optimizer.state[p][name], reference_optimizer.state[q][name])


def test_a_bad_cuda_graphs_setting_is_one_line_before_the_run_starts(cli, tmp_path, monkeypatch):
    """RLCLI_CUDA_GRAPHS takes 1, 0 or capture; another value is named in one line when a compile=true run is built
    (it was a traceback at the first compiled update), and leaves no run directory behind."""
    monkeypatch.setenv("RLCLI_CUDA_GRAPHS", "off")
    out = cli("algo=ppo", "compile=true", "train.total_steps=256", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 2
    assert out.stderr.strip() == ("rl-train: error: RLCLI_CUDA_GRAPHS='off': choose 1 (torch.compile's CUDA graphs, "
                                  "the default), 0 (none) or capture (rlcli's, by hand)")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_compiled_algo_groups_match_eager(tmp_path):
    """algo.groups (a PPO group beside an A2C one): compile=true compiles each group's own steps, and the groups'
    weights and optimizer steps agree with the eager run's within float reordering."""
    pytest.importorskip("pettingzoo")
    args = ["algo=ippo", "env=coop_match", "env.groups={a: [agent_0], b: [agent_1]}", "++algo.groups.b.name=a2c",
            "algo.n_steps=16", "algo.batch_size=32", "algo.n_epochs=2", "train.total_steps=512",
            "train.test_every=512", "train.test_episodes=2", "log.console=false", "log.tensorboard=false",
            "deterministic=true"]
    eager, compiled = eager_and_compiled(tmp_path, args)
    assert compile_enabled(compiled) and not compile_enabled(eager)
    assert {type(s.loss.__self__).__name__ for s in loss_steps(compiled)} == {"PPO", "A2C"}
    assert all(s.compile_seconds is not None for s in loss_steps(compiled))
    for (name, a), b in zip(eager.networks.state_dict().items(), compiled.networks.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=name)
    for part_a, part_b in zip(eager.sub_algorithms(), compiled.sub_algorithms(), strict=True):
        steps_a = [s["step"] for s in part_a.optimizer.state_dict()["state"].values()]
        assert steps_a and steps_a == [s["step"] for s in part_b.optimizer.state_dict()["state"].values()]
