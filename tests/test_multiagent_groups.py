"""env.groups: agents grouped as TorchRL groups them (by name prefix, or listed), a network per group, each group's
return reported; agents observing different sizes padded into one row layout (mpe2's simple_tag: adversaries 16
inputs, the prey 14). A row goes through its group's copy and no other; one group per agent trains bit for bit as
env.share_params=false, one group of all as shared parameters; the competitive task trains, rl-eval and predict read
it, and it resumes exactly; bad groupings are one line."""

import copy
import json

import forked_cli
import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")
from test_multiagent import QUIET, train  # noqa: E402
from test_resume import assert_equal_state, assert_sigterm_then_resume_is_exact, final, scalars  # noqa: E402

from rlcli.actors.per_agent import PerAgentActorCritic, per_agent  # noqa: E402
from rlcli.envs.multiagent import (  # noqa: E402
    ParallelVectorEnv,
    SeparateAgents,
    group_returns,
    resolve_groups,
)
from rlcli.envs.pz_toys import CoopMatch  # noqa: E402
from rlcli.registry import ACTORS, ENVS, ConfigError  # noqa: E402

OWN, N, ROWS = 4, 4, 32
COPY_OF = (0, 0, 0, 1)  # simple_tag's layout: three adversaries, one prey
FAST = ["train.num_envs=8", "algo.n_steps=16", "algo.batch_size=32", "algo.n_epochs=2", "train.test_episodes=4",
        "actor.hidden_sizes=[16,16]", "torch_threads=1"]
TAG = ["algo=ippo", "env=simple_tag_v3", "env.kwargs.max_cycles=10"]


# ------------------------------------------------------------------------------------------------- the grouping

def test_prefix_groups_agents_by_their_names_stem_and_a_mapping_is_taken_in_row_order():
    names = ["leadadversary_0", "adversary_0", "adversary_1", "agent_0", "agent_1", "eve"]
    assert resolve_groups("prefix", names, "x") == {"leadadversary": ["leadadversary_0"],
                                                    "adversary": ["adversary_0", "adversary_1"],
                                                    "agent": ["agent_0", "agent_1"], "eve": ["eve"]}
    assert resolve_groups(None, names, "x") == {}
    # a group lists its agents in any order; rows keep the env's order
    assert resolve_groups({"b": ["agent_1", "adversary_0"], "a": ["leadadversary_0", "adversary_1", "agent_0", "eve"]},
                          names, "x") == {"b": ["adversary_0", "agent_1"],
                                          "a": ["leadadversary_0", "adversary_1", "agent_0", "eve"]}


@pytest.mark.parametrize(("groups", "message"), [
    ("bogus", "env.groups='bogus': choose from: null (one group), prefix, or a mapping {group: [agents]}"),
    ({"a": ["agent_0"], "b": ["agent_7"]},
     "env.groups.b: 'agent_7' is not a learning agent of env; its learning agents (env.agents): agent_0, agent_1"),
    ({"a": ["agent_0", "agent_1"], "b": ["agent_1"]},
     "env.groups: agent 'agent_1' is in both 'a' and 'b'; each agent belongs to one group"),
    ({"a": ["agent_0"]}, "env.groups: agent 'agent_1' of env is in no group; list every learning agent (agent_0, "
                         "agent_1) in one group, or name the learners in env.agents"),
    ({"a": []}, "env.groups.a=[]: list the group's agents (e.g. [agent_0])"),
    (3, "env.groups=3: choose from: null (one group), prefix, or a mapping"),
    ({"a": {"agents": ["agent_0", "agent_1"], "share": False}},
     "env.groups.a: unknown key 'share'; a group is a list of agents or {agents: [...], share_params: false}"),
    ({"a": {"agents": ["agent_0", "agent_1"], "share_params": "no"}}, "env.groups.a.share_params='no': true or false"),
])
def test_a_bad_grouping_is_one_line_naming_the_value(groups, message):
    with pytest.raises(ConfigError) as error:
        resolve_groups(groups, ["agent_0", "agent_1"], "env")
    assert message in str(error.value)


def test_group_returns_are_the_sums_of_their_agents_returns():
    agents = {"a0": np.array([1.0, 2.0]), "a1": np.array([3.0, -1.0]), "p": np.array([-5.0, 0.5])}
    sums = group_returns(agents, {"a": ["a0", "a1"], "p": ["p"]})
    assert sums.keys() == {"a", "p"}
    np.testing.assert_array_equal(sums["a"], [4.0, 1.0])
    np.testing.assert_array_equal(sums["p"], [-5.0, 0.5])
    assert group_returns(agents, {"all": ["a0", "a1", "p"]}) == {}  # one group: the run's return already is its sum


# ------------------------------------------------------------------------------- agents observing different sizes

def test_simple_tag_rows_pad_the_prey_and_replay_the_env():
    """The prey's 14 inputs start its row and the 2 after them stay 0, before the one-hot; the bounds hold every
    agent's values (0 included in the padded columns); each row replays PettingZoo's own observation."""
    tag = pytest.importorskip("mpe2.simple_tag_v3")
    make = lambda: tag.parallel_env(max_cycles=10)  # noqa: E731
    vec = ParallelVectorEnv([make(), make()], "tag", None, agent_id=True, critic_state=False)
    assert vec.own_sizes == [16, 16, 16, 14] and vec.own_size == 16
    assert vec.single_observation_space.shape == (16 + 4,)
    low = vec.single_observation_space.low
    assert (low[14:16] <= 0).all() and (vec.single_observation_space.high[14:16] >= 0).all()
    direct = make()
    obs, _ = vec.reset(seed=5)
    expected, _ = direct.reset(seed=5 + 4)  # copy 1
    rng = np.random.default_rng(0)
    for _ in range(8):
        for i, name in enumerate(vec.agent_names):
            row = obs[4 + i]
            own = np.asarray(expected[name], np.float32)
            assert np.array_equal(row[:own.size], own)
            assert not row[own.size:16].any()
            assert np.array_equal(row[16:], np.eye(4)[i])
        acting = {a: int(rng.integers(5)) for a in direct.agents}
        expected, *_ = direct.step(acting)
        obs, *_ = vec.step(np.array([acting[a] for a in vec.agent_names] * 2))
    vec.close()


def test_env_groups_put_a_copy_index_per_agent_on_the_observation_space():
    pytest.importorskip("mpe2")
    vec = ENVS.build({"name": "pz", "id": "mpe2.simple_tag_v3", "groups": "prefix"}).make(8)
    assert vec.agent_groups == {"adversary": ["adversary_0", "adversary_1", "adversary_2"], "agent": ["agent_0"]}
    assert vec.single_observation_space.separate_agents == SeparateAgents(4, 16, False, COPY_OF)
    vec.close()
    separate = ENVS.build({"name": "pz", "id": "mpe2.simple_tag_v3", "groups": "prefix", "share_params": False})
    vec = separate.make(4)  # each agent its own copy; the groups still report their returns
    assert vec.single_observation_space.separate_agents == SeparateAgents(4, 16, False, None)
    assert len(vec.agent_groups) == 2
    vec.close()
    adversaries = ["adversary_0", "adversary_1", "adversary_2"]
    for groups, copy_of in (({"adversary": {"agents": adversaries, "share_params": False}, "agent": ["agent_0"]},
                             (0, 1, 2, 3)),  # a group of separate networks beside a shared one
                            ({"agent": ["agent_0"], "adversary": {"agents": adversaries}}, (1, 1, 1, 0)),
                            ({"all": {"agents": [*adversaries, "agent_0"], "share_params": False}}, (0, 1, 2, 3))):
        vec = ENVS.build({"name": "pz", "id": "mpe2.simple_tag_v3", "groups": groups}).make(4)
        assert vec.single_observation_space.separate_agents.copy_of == copy_of, groups
        vec.close()
    one = ENVS.build({"name": "pz", "id": "mpe2.simple_tag_v3", "groups": {"all": ["adversary_0", "adversary_1",
                                                                                  "adversary_2", "agent_0"]}})
    vec = one.make(4)  # one group: one network, nothing attached
    assert getattr(vec.single_observation_space, "separate_agents", None) is None
    vec.close()


# ---------------------------------------------------------------------------------------- a network per group

def row_space(joint: bool = False) -> gym.spaces.Box:
    shape = (N, OWN + N) if joint else (OWN + N,)
    space = gym.spaces.Box(-np.inf, np.inf, shape, np.float32)
    space.separate_agents = SeparateAgents(N, None if joint else OWN, joint, COPY_OF)
    return space


def test_each_row_goes_through_its_groups_copy_and_no_other():
    """Two copies for four agents; agents 0-2's rows are the adversary copy's standalone outputs and gradients,
    agent 3's the prey copy's; a loss over the prey's rows leaves the adversaries' copy exactly zero gradient."""
    torch.manual_seed(0)
    net = ACTORS.build({"name": "mlp", "hidden_sizes": [8, 8]}, observation_space=row_space(),
                       action_space=gym.spaces.Discrete(5), heads="actor_critic")
    assert isinstance(net, PerAgentActorCritic) and len(net.members) == 2
    assert "route.copy_of" not in net.state_dict()  # the env's layout, not a weight
    standalone = [copy.deepcopy(member) for member in net.members]
    g = torch.Generator().manual_seed(1)
    agent = torch.randperm(ROWS, generator=g) % N
    obs = torch.cat([torch.randn(ROWS, OWN, generator=g), torch.nn.functional.one_hot(agent, N).float()], -1)
    group = torch.tensor(COPY_OF)[agent]
    actions = torch.randint(5, (ROWS,), generator=g)
    out = net.evaluate(obs, actions)
    (out.log_probs + out.values.square()).sum().backward()
    for c, ref in enumerate(standalone):
        mine = group == c
        want = ref.evaluate(obs[mine], actions[mine])
        torch.testing.assert_close(out.log_probs[mine], want.log_probs, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.values[mine], want.values, rtol=1e-5, atol=1e-6)
        (want.log_probs + want.values.square()).sum().backward()
        for got, expected in zip(net.members[c].parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(got.grad, expected.grad, rtol=1e-5, atol=1e-6)
    net.zero_grad(set_to_none=True)
    out = net.evaluate(obs, actions)
    out.values[group == 1].sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in net.members[0].parameters())


def test_joint_mode_gives_each_agents_line_to_its_groups_copy():
    lines = per_agent(SeparateAgents(N, None, True, COPY_OF), lambda: torch.nn.Linear(OWN, 3))
    assert len(lines.members) == 2
    x = torch.randn(7, N, OWN)
    out = lines(x)
    for i, c in enumerate(COPY_OF):
        assert torch.equal(out[:, i], lines.members[c](x[:, i]))


@pytest.mark.slow
@pytest.mark.parametrize(("groups", "same_as"), [
    ("{a: [agent_0], b: [agent_1]}", "env.share_params=false"),
    ("{team: [agent_1, agent_0]}", "env.share_params=true"),
], ids=["one-per-agent", "one-of-all"])
def test_groups_that_match_a_known_layout_train_bit_identically_to_it(groups, same_as, tmp_path):
    """A group per agent builds the copies share_params=false builds, from the same random numbers; one group of
    everyone is the shared network: the same weights, optimizer state and scalars, bit for bit."""
    common = ["algo=ippo", "env=coop_match", "train.total_steps=256", "train.test_every=128", *FAST]
    train([*common, f"env.groups={groups}"], tmp_path / "groups")
    train([*common, same_as], tmp_path / "known")
    grouped, known = final(tmp_path / "groups")["algo"], final(tmp_path / "known")["algo"]
    assert_equal_state(known["networks"], grouped["networks"], "networks")
    assert_equal_state(known["optimizer"], grouped["optimizer"], "optimizer")
    strip = lambda s: {k: v for k, v in s.items() if "group_return" not in k}  # noqa: E731
    assert strip(scalars(tmp_path / "groups")) == scalars(tmp_path / "known")


def bad_reset(**kwargs):
    class BadReset(CoopMatch):
        def reset(self, seed=None, options=None):
            raise RuntimeError("the simulator is not running")

    return BadReset()


# ------------------------------------------------------------------------------------------- the competitive run

@pytest.mark.slow
def test_ippo_trains_both_sides_of_simple_tag_and_reports_each_groups_return(tmp_path):
    """Adversaries and prey, each side its own network (two copies in the checkpoint), trained at once; eval.jsonl
    and TensorBoard carry each group's return (its agents' sum); rl-eval prints them; predict takes PettingZoo's dict
    with the prey's 14 inputs and the adversaries' 16."""
    pytest.importorskip("mpe2")
    run_dir = tmp_path / "tag"
    train([*TAG, "train.total_steps=1024", "train.test_every=512", *FAST], run_dir)
    networks = final(run_dir)["algo"]["networks"]
    assert {key.split(".")[1] for key in networks if key.startswith("members.")} == {"0", "1"}
    record = json.loads((run_dir / "eval.jsonl").read_text().splitlines()[-1])
    agents, groups = record["agent_returns"], record["group_returns"]
    assert groups.keys() == {"adversary", "agent"}
    np.testing.assert_allclose(groups["adversary"], np.sum([agents[f"adversary_{i}"] for i in range(3)], axis=0))
    assert groups["agent"] == agents["agent_0"]
    tags = scalars(run_dir)
    assert {"rollout/group_return_adversary", "eval/group_return_agent"} <= set(tags)
    done = forked_cli.run([str(run_dir), "episodes=2"], tmp_path, program="rl-eval")
    assert done.returncode == 0, done.stderr
    assert "per group (mean of the sum of its agents' returns): adversary " in done.stdout
    done = forked_cli.run([str(run_dir), "--csv", str(tmp_path / "r.csv")], tmp_path, program="rl-report")
    assert done.returncode == 0, done.stderr
    import csv

    (row,) = csv.DictReader((tmp_path / "r.csv").open())
    assert row["final_per_group"] == f"adversary={np.mean(groups['adversary']):g} agent={np.mean(groups['agent']):g}"
    play_simple_tag(run_dir)
    # scripts/multiagent_crossplay.py plays each side trained or random: four pairings
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[1] / "scripts" / "multiagent_crossplay.py"
    done = subprocess.run([sys.executable, str(script), str(run_dir), "2"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    pairings = [line for line in done.stdout.splitlines() if "->" in line]
    assert len(pairings) == 4 and "adversary trained, agent random" in pairings[1], done.stdout


def play_simple_tag(run_dir) -> None:
    """A trained simple_tag run plays one episode through predict, on PettingZoo's dicts (the prey's 14 inputs and
    the adversaries' 16): an action in range for every agent at every step."""
    from mpe2 import simple_tag_v3

    import rlcli

    policy, env = rlcli.load(run_dir), simple_tag_v3.parallel_env(max_cycles=10)
    obs, _ = env.reset(seed=3)
    while env.agents:
        actions, _ = policy.predict({a: obs[a] for a in env.agents}, deterministic=True)
        assert set(actions) == set(env.agents) and all(0 <= int(a) < 5 for a in actions.values())
        obs, *_ = env.step(actions)


@pytest.mark.slow
def test_a_grouped_run_with_padded_rows_stopped_after_a_checkpoint_resumes_bit_identically(tmp_path):
    pytest.importorskip("mpe2")
    args = [*TAG, "algo=mappo", "train.total_steps=1024", "train.checkpoint_every=256", "train.test_every=512",
            "train.log_every=128", *FAST, *QUIET]
    assert_sigterm_then_resume_is_exact(args, 1024, tmp_path)


@pytest.mark.parametrize(("args", "message"), [
    (["algo=ippo", "env=coop_match", "env.groups=bogus"],
     "env.groups='bogus': choose from: null (one group), prefix, or a mapping {group: [agents]}"),
    (["algo=ippo", "env=coop_match", "env.groups={a: [agent_0], b: [agent_1]}", "env.agent_id=false"],
     "env.groups (a, b) gives agents networks of their own, found by a row's one-hot index: set env.agent_id=true "
     "(or env.groups=null)"),
    (["algo=maskable_ppo", "env=tictactoe", "env.groups=prefix"],
     "env.groups=prefix: env pettingzoo.classic.tictactoe_v3 is a turn-based (AEC) env"),
    (["algo=ippo", "env=vmas", "env.scenario=simple_speaker_listener", "env.continuous_actions=false"],
     "env=vmas env.scenario=simple_speaker_listener: its learners choose among different numbers of Discrete "
     "actions (27, 9), which env=vmas cannot mask to each one's own; use env.continuous_actions=true"),
    (["algo=pqn", "env=simple_tag_v3"],  # the env's yaml sets env.groups: the message names it, not share_params
     "env.groups: algo=pqn builds its own networks, which have no per-agent version; use env.groups=null"),
    (["algo=ippo", "env=simple_tag_v3", "actor=lstm"],
     "env.groups gives each group its own actor=mlp network; actor=lstm has no per-agent version: use actor=mlp, "
     "or env.groups=null"),
    (["algo=ippo", "env=pz", "env.id=test_multiagent_groups:bad_reset"],
     "env test_multiagent_groups:bad_reset raised RuntimeError at reset: the simulator is not running"),
])
def test_bad_group_settings_are_one_line(args, message, tmp_path):
    if any("vmas" in a for a in args):
        pytest.importorskip("vmas")
    done = forked_cli.run([*args, "train.total_steps=64", *QUIET, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


# ------------------------------------------------------- Dict observations, masks and different numbers of actions

class MaskedMatch(CoopMatch):
    """coop_match with agent_0 choosing among 3 actions and agent_1 among 4, a Dict observation {'observation':
    the cue, 'action_mask'} for agent_0 (action 2 forbidden at even steps) and for agent_1 a Dict {'cue', 'step'}
    (Box, Discrete) with its mask in its info (action 3 always forbidden). Taking a forbidden action raises."""

    def __init__(self, max_cycles: int = 10) -> None:
        super().__init__(max_cycles)
        self._spaces = {
            "agent_0": gym.spaces.Dict({"observation": gym.spaces.Box(0.0, 1.0, (3,), np.float32),
                                        "action_mask": gym.spaces.MultiBinary(3)}),
            "agent_1": gym.spaces.Dict({"cue": gym.spaces.Box(0.0, 1.0, (3,), np.float32),
                                        "step": gym.spaces.Discrete(max_cycles + 1)})}

    def observation_space(self, agent):
        return self._spaces[agent]

    def action_space(self, agent):
        return gym.spaces.Discrete(3 if agent == "agent_0" else 4)

    def _mask0(self):
        return np.array([1, 1, self.t % 2], np.int8)

    def _observations(self):
        cue = np.eye(3, dtype=np.float32)[self.cue]
        obs = {"agent_0": {"observation": cue, "action_mask": self._mask0()}, "agent_1": {"cue": cue, "step": self.t}}
        return {a: obs[a] for a in self.agents}

    def _infos(self):
        return {a: ({"action_mask": np.array([1, 1, 1, 0], bool)} if a == "agent_1" else {}) for a in self.agents}

    def reset(self, seed=None, options=None):
        obs, _ = super().reset(seed, options)
        return obs, self._infos()

    def step(self, actions):
        if not self._mask0()[int(actions["agent_0"])] or int(actions["agent_1"]) == 3:
            raise ValueError(f"a forbidden action: {actions}")
        hit = int(actions["agent_0"]) == self.cue and int(actions["agent_1"]) == (self.cue + 1) % 3
        rewards = {a: float(hit) for a in self.agents}
        self.t += 1
        self.cue = int(self.np_random.integers(3))
        done = {a: self.t >= self.max_cycles for a in self.agents}
        obs = self._observations()
        infos = self._infos()
        if self.t >= self.max_cycles:
            self.agents = []
        return obs, rewards, {a: False for a in done}, done, infos


def masked_match(**kwargs):
    return MaskedMatch(**kwargs)


def test_dict_observations_and_masks_from_the_observation_and_the_info_become_rows_and_row_masks():
    """agent_0's row is its cue; agent_1's its Dict flattened as gymnasium flattens it (the cue, then the step's
    one-hot); rows act among 4 actions, agent_0's fourth never valid, and each mask as its env gives it."""
    vec = ENVS.build({"name": "pz", "id": "test_multiagent_groups:masked_match"}).make(4, masks=True)
    inner = vec
    assert inner.own_sizes == [3, 3 + 11] and inner.action_sizes == [3, 4] and inner.info_masks
    assert vec.single_action_space == gym.spaces.Discrete(4)
    obs, infos = vec.reset(seed=0)
    masks = infos["action_mask"].reshape(2, 2, 4)
    assert masks[:, 0].tolist() == [[True, True, False, False]] * 2  # step 0: action 2 forbidden, 3 not its own
    assert masks[:, 1].tolist() == [[True, True, True, False]] * 2
    assert obs[1, 3 + 0] == 1.0 and not obs[1, 4:14].any()  # agent_1: its step (0) one-hot after the cue
    obs, _, _, _, infos = vec.step(np.array([0, 0, 1, 1]))
    assert infos["action_mask"].reshape(2, 2, 4)[:, 0].tolist() == [[True, True, True, False]] * 2
    assert obs[1, 3 + 1] == 1.0
    vec.close()


@pytest.mark.parametrize(("algo", "message"), [
    ("ippo", "env test_multiagent_groups:masked_match: its learners choose among different numbers of actions, which "
             "rows mask to each one's own; use algo=maskable_ppo"),
    ("vdn", "env.agents: agent 'agent_1' of test_multiagent_groups:masked_match has the action space Discrete(4), "
            "'agent_0' has Discrete(3); the learning agents act in one action space (or in Discrete ones of different "
            "sizes, in row mode;"),
])
def test_masks_need_a_masking_algorithm_in_rows(algo, message, tmp_path):
    done = forked_cli.run([f"algo={algo}", "env=pz", "env.id=test_multiagent_groups:masked_match",
                           "train.total_steps=64", *QUIET, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and message in lines[0], done.stderr


@pytest.mark.slow
def test_maskable_ppo_never_takes_a_forbidden_action_learns_the_masked_toy_and_predict_reads_dicts(tmp_path):
    """The env raises on a forbidden action, so a run that finishes took none; two groups give each agent its own
    network. Team return (2 per hit, 10 steps): random legal play 20/9 = 2.2 expected, the best 16.7 (agent_0 cannot
    say cue 2 at even steps); measured 17.2 at the test after 2,048 env steps (seed 3)."""
    run_dir = tmp_path / "masked"
    train(["algo=maskable_ppo", "env=pz", "env.id=test_multiagent_groups:masked_match",
           "env.groups={a: [agent_0], b: [agent_1]}",
           "train.total_steps=2048", "train.test_every=2048", "seed=3", "algo.lr=1e-3", "algo.gamma=0.5", *FAST,
           "algo.n_epochs=4", "train.test_episodes=10", "actor.hidden_sizes=[64,64]"], run_dir)
    record = json.loads((run_dir / "eval.jsonl").read_text().splitlines()[-1])
    assert np.mean(record["returns"]) >= 14, record
    assert record["group_returns"]["a"] == record["group_returns"]["b"]  # both rewarded for a hit
    import rlcli

    policy, env = rlcli.load(run_dir), MaskedMatch()
    obs, infos = env.reset(seed=11)
    while env.agents:
        masks = {a: infos[a]["action_mask"] for a in env.agents if "action_mask" in infos[a]}
        actions, _ = policy.predict({a: obs[a] for a in env.agents}, deterministic=True, action_mask=masks)
        obs, _, _, _, infos = env.step(actions)  # raises on a forbidden action
    with pytest.raises(TypeError, match="with a dict of observations, give a dict {agent: mask}"):
        policy.predict(dict(obs), action_mask=np.ones(4, bool))
    with pytest.raises(Exception, match="agent 'agent_1''s valid actions are in its info: pass action_mask="):
        policy.predict({a: obs[a] for a in ("agent_0", "agent_1")} if obs else env.reset(seed=1)[0])
    obs, infos = env.reset(seed=1)
    masks = {a: infos[a]["action_mask"] for a in env.agents if "action_mask" in infos[a]}
    with pytest.raises(ValueError, match="action_mask has the key 'player_9', which obs does not"):
        policy.predict(dict(obs), action_mask={**masks, "player_9": np.ones(4, bool)})  # (it was ignored)


# ------------------------------------------------------------------- agents that join late, states that end

class JoinLate(CoopMatch):
    """coop_match where agent_1 is absent at the reset and joins after `join_at` steps; every agent terminates at
    the end, after which state() raises (as multiwalker's, whose termination destroys the bodies it reads)."""

    def __init__(self, max_cycles: int = 6, join_at: int = 2) -> None:
        super().__init__(max_cycles)
        self.join_at, self.taken = join_at, []

    def reset(self, seed=None, options=None):
        super().reset(seed, options)
        self.agents = ["agent_0"]
        return self._observations(), {a: {} for a in self.agents}

    def state(self):
        if not self.agents:
            raise AttributeError("'NoneType' object has no attribute 'position'")
        return super().state()

    def step(self, actions):
        self.taken.append(dict(actions))
        hit = int(actions["agent_0"]) == self.cue and ("agent_1" not in actions
                                                       or int(actions["agent_1"]) == (self.cue + 1) % 3)
        rewards = {a: float(hit) for a in self.agents}
        self.t += 1
        self.cue = int(self.np_random.integers(3))
        if self.t == self.join_at:
            self.agents.append("agent_1")
        end = self.t >= self.max_cycles
        obs = self._observations()
        flags = {a: end for a in self.agents}
        if end:
            self.agents = []
        return obs, rewards, flags, {a: False for a in flags}, {a: {} for a in flags}


def join_late(**kwargs):
    return JoinLate(**kwargs)


def test_an_agent_that_joins_mid_episode_gets_rows_from_its_first_observation_and_ended_states_are_not_read():
    env = JoinLate()
    vec = ParallelVectorEnv([env], "join", None, agent_id=True, critic_state=True)
    obs, _ = vec.reset(seed=0)
    assert not obs[1, :3].any()  # not there yet: its row holds nothing of its own
    _, r, te, tr, _ = vec.step(np.array([0, 0]))
    assert tr[1] and not te[1] and not (te[0] or tr[0]) and r[1] == 0.0  # absent: flagged, nothing stored
    obs, r, te, tr, _ = vec.step(np.array([0, 0]))  # t = 2: agent_1 joins
    assert not (te[1] or tr[1]) and r[1] == 0.0 and obs[1, :3].sum() == 1.0  # a reset step: its first observation
    assert "agent_1" not in env.taken[-1]
    earned = 0.0
    for _ in range(4):  # t = 3..6: both act; at 6 every agent terminates and state() would raise
        obs, r, te, tr, infos = vec.step(np.array([1, 2]))
        assert "agent_1" in env.taken[-1]
        earned += r[1]
    assert te.all() and "_episode" in infos
    assert infos["agent_episode"]["r"][1] == earned  # its return counts from its join
    obs, *_ = vec.step(np.array([0, 0]))  # the copy's reset step
    assert not obs[1, :3].any()
    vec.close()


@pytest.mark.slow
def test_mappo_trains_on_an_env_whose_agents_join_late(tmp_path):
    run_dir = tmp_path / "join"
    train(["algo=mappo", "env=pz", "env.id=test_multiagent_groups:join_late", "train.total_steps=512",
           "train.test_every=512", *FAST], run_dir)
    record = json.loads((run_dir / "eval.jsonl").read_text().splitlines()[-1])
    assert record["env_steps"] == 512 and len(record["returns"]) == 4


@pytest.mark.slow
def test_a_shared_run_warm_starts_every_groups_copy_and_a_run_with_groups_trains_from_it(tmp_path):
    """actor.init_from of a shared-parameter run into a run with a network per group: each copy starts as the
    shared network (its weights and observation statistics), and the run trains from there."""
    import rlcli
    from rlcli.actors.weights import load_network_weights

    shared_dir = tmp_path / "shared"
    train(["algo=ippo", "env=coop_match", "train.total_steps=256", "train.test_every=256", *FAST], shared_dir)
    shared = rlcli.load(shared_dir).networks.state_dict()
    space = gym.spaces.Box(-np.inf, np.inf, (3 + 2,), np.float32)
    space.separate_agents = SeparateAgents(2, 3, False, (0, 1))
    grouped = ACTORS.build({"name": "mlp", "hidden_sizes": [16, 16]}, observation_space=space,
                           action_space=gym.spaces.Discrete(3), heads="actor_critic")
    load_network_weights(grouped, shared_dir)
    for member in grouped.members:
        assert member.state_dict().keys() == shared.keys()
        assert all(torch.equal(v, shared[k]) for k, v in member.state_dict().items())
    train(["algo=ippo", "env=coop_match", "env.groups={a: [agent_0], b: [agent_1]}", f"actor.init_from={shared_dir}",
           "train.total_steps=256", "train.test_every=256", *FAST], tmp_path / "grouped")
    assert json.loads((tmp_path / "grouped" / "eval.jsonl").read_text().splitlines()[-1])["env_steps"] == 256


@pytest.mark.slow
def test_a_multiagent_run_saved_before_env_groups_existed_resumes(tmp_path):
    """A checkpoint of an rlcli without env.groups has no such key: resuming it is not 'a changed env.groups'."""
    from test_faults_resume_overrides import drop_config_key

    run_dir = tmp_path / "old"
    train(["algo=ippo", "env=coop_match", "env.share_params=false", "train.total_steps=256",
           "train.checkpoint_every=128", "train.test_every=256", *FAST], run_dir)
    drop_config_key(run_dir, "env", "groups")
    done = forked_cli.run([f"resume={run_dir}", "train.total_steps=384"], tmp_path)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("scenario", ["simple_speaker_listener_v4", "simple_adversary_v3"])
def test_mpe_worlds_whose_entities_point_at_one_another_are_restored_exactly(scenario):
    """A speaker's goal is one of the world's landmarks (simple_adversary's agents' too): restored by index, so a
    copy restored into an env whose goal pointed elsewhere plays on as the saved one does, past the episode's end."""
    from rlcli.envs.state import get_env_state, set_env_state
    from rlcli.services.plain_state import decode, encode

    pytest.importorskip("mpe2")
    env_id = f"mpe2.{scenario}"
    make = lambda: ENVS.build({"name": "pz", "id": env_id, "groups": "prefix"}).make(4 * 2, masks=True)  # noqa: E731
    try:
        vec, other = make(), make()
    except ConfigError:  # equal action spaces: no masks
        make = lambda: ENVS.build({"name": "pz", "id": env_id, "groups": "prefix"}).make(3 * 2)  # noqa: E731
        vec, other = make(), make()
    vec.reset(seed=1)
    other.reset(seed=2)
    rng = np.random.default_rng(0)
    actions = rng.integers(3, size=(40, vec.num_envs))
    for a in actions[:12]:
        vec.step(a)
    set_env_state(other, decode(encode(get_env_state(vec))))
    for a in actions[12:]:
        for x, y in zip(vec.step(a), other.step(a), strict=True):
            assert str(x) == str(y) if isinstance(x, dict) else np.array_equal(x, y)


def test_an_observation_layout_flattens_scalars_discretes_and_dicts_and_takes_a_mask_out():
    from rlcli.envs.multiagent import ObservationLayout

    scalar = ObservationLayout(gym.spaces.Box(-1.0, 1.0, (), np.float32), "a", "env")
    assert scalar.size == 1 and scalar.split(np.float32(0.5))[0].tolist() == [0.5]
    discrete = ObservationLayout(gym.spaces.Discrete(3), "a", "env")
    assert discrete.size == 3 and discrete.split(2)[0].tolist() == [0.0, 0.0, 1.0]
    masked = ObservationLayout(gym.spaces.Dict({"observation": gym.spaces.Box(0, 1, (2, 2)),
                                                "action_mask": gym.spaces.MultiBinary(4)}), "a", "env")
    flat, mask = masked.split({"observation": np.eye(2), "action_mask": np.array([1, 0, 1, 1])})
    assert masked.size == 4 and flat.tolist() == [1.0, 0.0, 0.0, 1.0] and mask.tolist() == [True, False, True, True]
    with pytest.raises(ConfigError, match="agent 'a' has Sequence.*which do not flatten into a vector"):
        ObservationLayout(gym.spaces.Sequence(gym.spaces.Discrete(2)), "a", "env")
