"""env=pz with PettingZoo AEC (turn-based) envs: self-play with one shared policy and action masks
(envs/turn_based.py). The adapter's rows against a hand-written reference on a tiny game (a win, the loser's final
reward though the winner moved last, a truncation, the rewards a player receives while it waits), the rollout's GAE
across waiting steps against hand-computed advantages, masked acting never illegal on tic-tac-toe, and runs of
rl-train (the shipped env=tictactoe, an exact resume, one-line errors)."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import forked_cli
import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")
from pettingzoo import AECEnv  # noqa: E402
from pettingzoo.utils import AgentSelector  # noqa: E402
from test_multiagent import QUIET, train  # noqa: E402
from test_resume import assert_sigterm_then_resume_is_exact  # noqa: E402

from rlcli.actors.mlp import ActorCritic  # noqa: E402
from rlcli.actors.normalizer import RunningNorm  # noqa: E402
from rlcli.buffers.rollout import RolloutBuffer, compute_gae, compute_gae_turns  # noqa: E402
from rlcli.collectors.local import Collector  # noqa: E402
from rlcli.contracts import ActOutput, OffPolicyLearner, OnPolicyLearner  # noqa: E402
from rlcli.envs.masks import masks_from_infos  # noqa: E402
from rlcli.envs.multiagent import PettingZooEnvFactory  # noqa: E402
from rlcli.envs.turn_based import ACTING_KEY, TurnBasedVectorEnv  # noqa: E402
from rlcli.registry import ConfigError  # noqa: E402

GAMMA, LAMBDA = 0.9, 0.8


class Turns(AECEnv):  # type: ignore[misc]
    """Players a and b move in turn, a first; the observation is [moves so far]. A move of action k pays the mover k
    and the other player -0.5 (it arrives while that one waits); action 2 wins: +10 to the mover, -10 to the other,
    both terminated. After `max_moves` moves both are truncated. Action 1 is legal only at an even move count; an
    illegal move fails the test. The mask comes in the observation ({'observation', 'action_mask'}), in info, or
    (`none`) not at all, and then every move is legal."""

    metadata = {"name": "turns_v0", "render_modes": [], "is_parallelizable": False}

    def __init__(self, max_moves: int = 4, mask_in: str = "obs") -> None:
        super().__init__()
        self.possible_agents = ["a", "b"]
        self.max_moves, self.mask_in = max_moves, mask_in
        box = gym.spaces.Box(0.0, 100.0, (1,), np.float32)
        self._obs_space = box if mask_in in ("info", "none") else gym.spaces.Dict(
            {"observation": box, "action_mask": gym.spaces.Box(0, 1, (3,), np.int8)})
        self._act_space = gym.spaces.Discrete(3)
        self.t = 0

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def _mask(self, agent):
        legal = np.array([1, self.t % 2 == 0, 1], np.int8)
        return legal if agent == self.agent_selection else np.zeros(3, np.int8)

    def observe(self, agent):
        obs = np.array([self.t], np.float32)
        return obs if self.mask_in in ("info", "none") else {"observation": obs, "action_mask": self._mask(agent)}

    def _set_infos(self):
        self.infos = {a: ({"action_mask": self._mask(a)} if self.mask_in == "info" else {}) for a in self.agents}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.t = 0
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.next()
        self._set_infos()

    def step(self, action):
        if self.terminations[self.agent_selection] or self.truncations[self.agent_selection]:
            self._was_dead_step(action)
            return
        mover = self.agent_selection
        other = "b" if mover == "a" else "a"
        assert self.mask_in == "none" or self._mask(mover)[action], f"illegal move {action} by {mover} at {self.t}"
        self._cumulative_rewards[mover] = 0.0
        self._clear_rewards()
        self.rewards[mover] += float(action)
        self.rewards[other] -= 0.5
        self.t += 1
        if action == 2:
            self.rewards[mover] += 10.0
            self.rewards[other] -= 10.0
            self.terminations = {a: True for a in self.agents}
        elif self.t >= self.max_moves:
            self.truncations = {a: True for a in self.agents}
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()
        self._set_infos()


def turns(max_moves: int = 4, mask_in: str = "obs") -> Turns:
    return Turns(max_moves, mask_in)


# The two episodes the reference plays, one vector step each (a row's action is ignored while it waits: 1, illegal
# at odd moves, shows it): a plays 0, b 0, a 2 (a wins at move 3); the reset step; a 1, b 0, a 0, b 0 (truncated
# after 4 moves). Rows: [a, b].
ACTIONS = [[0, 1], [1, 0], [2, 1], [1, 1], [1, 1], [1, 0], [0, 1], [1, 0]]
REWARDS = [[0, -0.5], [-0.5, 0], [12, -10.5], [0, 0], [1, -0.5], [-0.5, 0], [0, -0.5], [-0.5, 0]]
TERMINATED = [[0, 0], [0, 0], [1, 1], [0, 0], [0, 0], [0, 0], [0, 0], [0, 0]]
TRUNCATED = [[0, 0], [0, 0], [0, 0], [0, 0], [0, 0], [0, 0], [0, 0], [1, 1]]
MOVES = [1, 2, 3, 0, 1, 2, 3, 4]  # the observation each step returns (both rows: the board they both see)
ACTING = [[0, 1], [1, 0], [1, 1], [1, 0], [0, 1], [1, 0], [0, 1], [1, 1]]  # at the observation each step returns
RESET_MASK = [[1, 1, 1], [0, 0, 0]]


@pytest.mark.parametrize("mask_in", ["obs", "info"])
def test_the_adapters_rows_match_a_hand_written_game_with_a_win_the_losers_reward_and_a_truncation(mask_in):
    envs = TurnBasedVectorEnv([Turns(4, mask_in)], "turns", agent_id=True)
    assert envs.num_envs == 2 and envs.single_observation_space.shape == (3,) and envs.has_masks
    obs, infos = envs.reset(seed=0)
    assert obs.tolist() == [[0, 1, 0], [0, 0, 1]]  # [moves | one-hot of the player]
    assert infos[ACTING_KEY].tolist() == [True, False] and infos["action_mask"].astype(int).tolist() == RESET_MASK
    for step, actions in enumerate(ACTIONS):
        obs, rewards, terminated, truncated, infos = envs.step(np.array(actions))
        assert rewards.tolist() == REWARDS[step], step
        assert terminated.astype(int).tolist() == TERMINATED[step], step
        assert truncated.astype(int).tolist() == TRUNCATED[step], step
        assert obs[:, 0].tolist() == [MOVES[step]] * 2 and obs[:, 1:].tolist() == [[1, 0], [0, 1]], step
        assert infos[ACTING_KEY].astype(int).tolist() == ACTING[step], step
        mover = [i for i in range(2) if ACTING[step][i]] if sum(ACTING[step]) == 1 else []
        for i in range(2):  # the player to move has its mask; a waiting row (and a final observation) none
            expected = [1, MOVES[step] % 2 == 0, 1] if i in mover else [0, 0, 0]
            assert infos["action_mask"][i].astype(int).tolist() == expected, step
        if step == 2:  # a won; b's -10.5 is the -0.5 and -10 of a's winning move. Returns: a 0-0.5+12, b -0.5-10.5
            assert infos["agent_episode"]["r"].tolist() == [11.5, -11.0]
            assert infos["episode"]["r"].tolist() == [0.5, 0.0] and infos["episode"]["l"].tolist() == [3, 0]
            assert infos["_episode"].tolist() == [True, False]
        elif step == 7:
            assert infos["agent_episode"]["r"].tolist() == [0.0, -1.0]
        else:
            assert "episode" not in infos, step
    envs.close()


def test_the_toy_passes_pettingzoos_aec_api_test():
    from pettingzoo.test import api_test

    api_test(Turns(6, "obs"), num_cycles=20)


def test_rewards_that_arrive_while_waiting_add_up_to_what_last_says_at_the_players_next_turn():
    """PettingZoo's own loop (last() at each turn) against the rows' rewards summed from one turn to the next."""
    env = Turns(6, "obs")
    env.reset(seed=0)
    seen: dict[str, list[float]] = {"a": [], "b": []}
    for agent in env.agent_iter():
        _, reward, term, trunc, _ = env.last()
        seen[agent].append(reward)
        env.step(None if term or trunc else 0)
    envs = TurnBasedVectorEnv([Turns(6, "obs")], "turns", agent_id=False)
    envs.reset(seed=0)
    rows: dict[str, list[float]] = {"a": [], "b": []}
    pending = np.zeros(2)
    acting = np.array([True, False])
    for _ in range(6):
        _, rewards, terminated, truncated, infos = envs.step(np.zeros(2, np.int64))
        pending += rewards
        for i, name in enumerate("ab"):
            if infos[ACTING_KEY][i]:  # its next turn (or the end): what it received since its last one
                rows[name].append(float(pending[i]))
                pending[i] = 0.0
        acting = infos[ACTING_KEY]
    assert acting.all() and truncated.all()
    # a's first last() is at the game's start, before any step; b's first comes after a's first move
    assert rows["a"] == seen["a"][1:] and rows["b"] == seen["b"]


# ------------------------------------------------------------------------------------- the rollout across turns


class Scripted:
    """Acting enough for the collector: ACTIONS' actions in turn; a row's value is 10 * moves + its player index."""

    steps_per_collect = len(ACTIONS)

    def __init__(self):
        self.step = 0

    def value(self, obs):
        return 10 * obs[:, 0] + obs[:, 2]

    def act_masked(self, obs, action_mask, deterministic=False):
        actions = torch.as_tensor(ACTIONS[self.step % len(ACTIONS)])
        self.step += 1
        return ActOutput(actions, torch.zeros(len(obs)), self.value(obs))

    def env_actions(self, actions):
        return actions

    def finish_rollout(self, buffer, last_obs, state):
        buffer.compute_returns(self.value(last_obs), GAMMA, LAMBDA)


def test_a_players_gae_runs_from_turn_to_turn_across_the_steps_where_it_waits():
    """Hand-computed: V = 10 * moves + player index at each stored observation; a waiting step stores nothing, its
    rewards join the transition before it, and the bootstrap is the value at the player's next turn, one discount
    away; a terminal reward the loser receives while waiting ends its transition with no bootstrap."""
    envs = TurnBasedVectorEnv([Turns(4, "obs")], "turns", agent_id=True)
    buffer = RolloutBuffer(len(ACTIONS), 2, (3,), (), True, torch.device("cpu"), mask_size=3)
    collector = Collector(envs, RunningNorm((3,), enabled=False), torch.device("cpu"), seed=0, masks=True)
    collector.collect(OnPolicyLearner(Scripted(), buffer))  # type: ignore[arg-type]
    g, gl = GAMMA, GAMMA * LAMBDA
    # stored step t sees the observation before ACTIONS[t]: moves 0, 1, 2, 3 (final; the reset step), 0, 1, 2, 3
    va = [0, 10, 20, 30, 0, 10, 20, 30]  # a's values (index 0)
    vb = [1, 11, 21, 31, 1, 11, 21, 31]
    last_a, last_b = 40, 41  # the final observation after the truncation (every row acts there: the bootstrap)
    a2 = 12 - va[2]  # a's winning move: terminated
    a0 = (0 - 0.5) + g * va[2] - va[0] + gl * a2  # a's 0, then b's move pays it -0.5 while it waits
    a6 = (0 - 0.5) + g * last_a - va[6]  # truncated while a waits: bootstraps from its final observation
    a4 = (1 - 0.5) + g * va[6] - va[4] + gl * a6
    b1 = (0 - 10.5) - vb[1]  # b's move 0, then a wins while b waits: -10.5, terminated, no bootstrap
    b7 = 0 + g * last_b - vb[7]  # b's last move: truncated at once
    b5 = (0 - 0.5) + g * vb[7] - vb[5] + gl * b7
    expected_a = [a0, 0, a2, 0, a4, 0, a6, 0]
    expected_b = [0, b1, 0, 0, 0, b5, 0, b7]
    kept = [0, 1, 2, 4, 5, 6, 7]  # not the reset step (stored, as ever, with valid 0 and an advantage no loss reads)
    assert torch.allclose(buffer.advantages[kept, 0], torch.tensor(expected_a)[kept]), buffer.advantages[:, 0]
    assert torch.allclose(buffer.advantages[kept, 1], torch.tensor(expected_b)[kept]), buffer.advantages[:, 1]
    assert buffer.valid[:, 0].tolist() == [1, 0, 1, 0, 1, 0, 1, 0]  # waiting steps and the reset step store nothing
    assert buffer.valid[:, 1].tolist() == [0, 1, 0, 0, 0, 1, 0, 1]
    assert torch.equal(buffer.returns, buffer.advantages + buffer.values)


def test_a_transition_whose_next_turn_lies_past_the_rollout_is_left_out_and_the_one_before_bootstraps_from_it():
    values = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    rewards = torch.tensor([[1.0], [0.5], [2.0], [0.25]])
    zeros = torch.zeros(4, 1)
    acting = torch.tensor([[True], [False], [True], [False]])
    adv, ret, complete = compute_gae_turns(rewards, values, zeros, zeros, torch.tensor([9.0]), GAMMA, LAMBDA,
                                           acting, torch.tensor([False]))
    assert complete[:, 0].tolist() == [1, 0, 0, 0]  # step 2's next turn is in the next rollout
    assert torch.allclose(adv[:, 0], torch.tensor([1.5 + GAMMA * 3.0 - 1.0, 0, 0, 0]))
    # every step acting: the usual GAE, number for number
    torch.manual_seed(0)
    r, v, last = torch.randn(6, 3), torch.randn(6, 3), torch.randn(3)
    term = (torch.rand(6, 3) < 0.2).float()
    done = torch.maximum(term, (torch.rand(6, 3) < 0.2).float())
    plain = compute_gae(r, v, term, done, last, GAMMA, LAMBDA)
    turned = compute_gae_turns(r, v, term, done, last, GAMMA, LAMBDA, torch.ones(6, 3, dtype=torch.bool),
                               torch.ones(3, dtype=torch.bool))
    assert torch.allclose(plain[0], turned[0]) and torch.allclose(plain[1], turned[1]) and turned[2].all()


def test_a_masked_policy_never_plays_an_illegal_move_on_tictactoe_and_the_test_envs_play_it_against_random(
        monkeypatch):
    from pettingzoo.utils.env_logger import EnvLogger

    def illegal():
        raise AssertionError("an illegal move")

    monkeypatch.setattr(EnvLogger, "warn_on_illegal_move", staticmethod(illegal))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny network's act: many threads on a busy machine cost 50x
    try:
        _illegal_moves_and_test_envs()
    finally:
        torch.set_num_threads(threads)


def _illegal_moves_and_test_envs():
    factory = PettingZooEnvFactory("pettingzoo.classic.tictactoe_v3")
    envs = factory.make(8, masks=True)
    net = ActorCritic(envs.single_observation_space, envs.single_action_space, [16], "tanh", shared=False,
                       ortho_init=True, log_std_init=0.0, normalize_obs=False, clip_obs=10.0)
    torch.manual_seed(0)
    obs, infos = envs.reset(seed=0)
    ended = 0
    for _ in range(200):
        mask = torch.as_tensor(masks_from_infos(infos, 8, 9))
        with torch.no_grad():
            actions = net.act(torch.as_tensor(obs), False, action_mask=mask).actions
        obs, _, terminated, truncated, infos = envs.step(actions.numpy())
        ended += int(terminated.sum() + truncated.sum())
    assert ended > 50
    # the check is live: an unmasked move into an occupied square is caught
    with pytest.raises(AssertionError, match="illegal"):
        obs, infos = envs.reset(seed=0)
        envs.step(np.zeros(8, np.int64))
        envs.step(np.zeros(8, np.int64))
    tests = factory.make(4, eval=True, masks=True)  # one row per copy: the policy's seat, c mod 2
    assert tests.num_envs == 4 and list(tests.seats) == [0, 1, 0, 1]
    obs, infos = tests.reset(seed=3)
    assert obs[:, -2:].tolist() == [[1, 0], [0, 1], [1, 0], [0, 1]]
    assert infos["action_mask"][1].sum() == 8  # the random player moved first in the copies where the policy is O
    returns = {}
    while len(returns) < 4:
        mask = torch.as_tensor(masks_from_infos(infos, 4, 9))
        obs, _, _, _, infos = tests.step(net.act(torch.as_tensor(obs), True, action_mask=mask).actions.numpy())
        for c in np.flatnonzero(infos.get("_episode", [])):
            returns.setdefault(int(c), float(infos["episode"]["r"][c]))
    assert set(returns.values()) <= {-1.0, 0.0, 1.0}


def test_an_env_without_masks_takes_plain_ppo_and_refuses_a_masked_algorithm_and_off_policy_ones():
    factory = PettingZooEnvFactory("test_multiagent_turns:turns", kwargs={"mask_in": "none"})
    assert factory.turn_based and not factory.turn_masks and factory.n_agents == 2
    with pytest.raises(ConfigError, match="needs valid-action masks, and the turn-based env test_multiagent_turns:"
                                          "turns gives none"):
        factory.make(2, masks=True)
    envs = factory.make(2)
    _, infos = envs.reset(seed=0)
    assert infos[ACTING_KEY].tolist() == [True, False]
    learner = OffPolicyLearner(SimpleNamespace(act=lambda obs, state=None: ActOutput(  # type: ignore[arg-type]
        torch.zeros(2, dtype=torch.long), torch.zeros(2), torch.zeros(2)), env_actions=lambda a: a,
        steps_per_collect=1, episodes_per_collect=0), None)
    collector = Collector(envs, RunningNorm((3,), enabled=False), torch.device("cpu"), seed=0)
    with pytest.raises(ConfigError, match="turn-based: its players' transitions span the other players' moves"):
        collector.collect(learner)
    with pytest.raises(ConfigError, match="env.agents=.'a'.: env test_multiagent_turns:turns is a turn-based"):
        PettingZooEnvFactory("test_multiagent_turns:turns", agents=["a"])
    # test envs: the policy (action 0 here) against random play, in seat a of copy 0 and b of copy 1; a random a
    # that wins with its opening move ends b's episode before b could move (a return of -10.5, one move long)
    tests = factory.make(2, eval=True)
    tests.reset(seed=0)
    episodes: list[tuple[int, float, int]] = []
    for _ in range(12):
        _, _, terminated, truncated, infos = tests.step(np.zeros(2, np.int64))
        for c in np.flatnonzero(infos.get("_episode", [])):
            assert terminated[c] != truncated[c]
            episodes.append((int(c), float(infos["episode"]["r"][c]), int(infos["episode"]["l"][c])))
    assert (1, -10.5, 1) in episodes and {c for c, _, _ in episodes} == {0, 1}
    assert all(r in (-10.5, -1.0, -0.5, 0.0, 10.0) for _, r, _ in episodes), episodes


# ----------------------------------------------------------------------------------------------- rl-train runs

TINY = ["algo=maskable_ppo", "env=tictactoe", "train.num_envs=4", "algo.n_steps=16", "algo.batch_size=32",
        "algo.n_epochs=2", "actor.hidden_sizes=[16]", "torch_threads=1"]


def test_maskable_ppo_self_play_on_tictactoe_logs_each_players_return_and_tests_against_random(tmp_path):
    run_dir = tmp_path / "run"
    train([*TINY, "train.total_steps=256", "train.test_every=256", "train.test_episodes=6"], run_dir)
    record = json.loads((run_dir / "eval.jsonl").read_text().splitlines()[-1])
    assert len(record["returns"]) == 6 and set(record["returns"]) <= {-1.0, 0.0, 1.0}  # the policy's own, vs random
    log = (run_dir / "train.log").read_text()
    assert "player_1" in log and "player_2" in log
    out = forked_cli.run([str(run_dir), "episodes=4"], tmp_path, program="rl-eval")
    assert out.returncode == 0 and "pettingzoo.classic.tictactoe_v3" in out.stdout, out.stderr
    from pettingzoo.classic import tictactoe_v3

    import rlcli

    # predict plays a seat of the AEC game: the acting player's observation (its legal moves inside) -> its move;
    # a uniformly random opponent in the other seat, every game to its end, no illegal move (PettingZoo would end
    # the game with a -1 for an illegal one, and say so in its log)
    policy, rng = rlcli.load(run_dir), np.random.default_rng(0)
    for seat, seed in ((0, 0), (1, 1), (0, 2), (1, 3)):
        game = tictactoe_v3.env()
        game.reset(seed=seed)
        mover = game.possible_agents[seat]
        for agent in game.agent_iter():
            obs, _, terminated, truncated, _ = game.last()
            if terminated or truncated:
                game.step(None)
                continue
            if agent == mover:
                actions, _ = policy.predict({agent: obs}, deterministic=True)
                move = int(actions[agent])
            else:
                move = int(rng.choice(np.flatnonzero(obs["action_mask"])))
            assert obs["action_mask"][move], (agent, move, obs["action_mask"])
            game.step(move)
        assert all(-1 <= r <= 1 for r in game.rewards.values())


@pytest.mark.parametrize(("args", "message"), [
    (["algo=ppo", "env=tictactoe"], "env pettingzoo.classic.tictactoe_v3 is a turn-based (AEC) env with action "
                                    "masks, which this algorithm cannot take (it would play illegal moves): use "
                                    "algo=maskable_ppo"),
    (["algo=dqn", "env=tictactoe"], "algo=dqn is off-policy; env pettingzoo.classic.tictactoe_v3 is turn-based, "
                                    "whose players' transitions span the other players' moves"),
    (["algo=rnd_ppo", "env=pz", "env.id=test_multiagent_turns:turns", "+env.kwargs.mask_in=none"],
     "algo=rnd_ppo computes its own returns from the rollout, which on turn-based env test_multiagent_turns:turns "
     "would not span the other players' moves"),
    (["algo=pqn", "env=pz", "env.id=test_multiagent_turns:turns", "+env.kwargs.mask_in=none"],
     "algo=pqn computes its own returns"),
    (["algo=ppo", "env=gym", "env.id=pettingzoo.classic.tictactoe_v3"],
     "env.id='pettingzoo.classic.tictactoe_v3' is a PettingZoo AEC (turn-based) env (many agents); use env=pz "
     "env.id=pettingzoo.classic.tictactoe_v3"),
    (["algo=ppo", "actor=lstm", "env=pz", "env.id=test_multiagent_turns:turns", "+env.kwargs.mask_in=none"],
     "actor=lstm is recurrent; env test_multiagent_turns:turns is turn-based"),
    (["algo=maskable_ppo", "env=tictactoe", "env.critic_state=true"], "env.critic_state=True: env "
                                                                      "pettingzoo.classic.tictactoe_v3 is a "
                                                                      "turn-based (AEC) env"),
    (["algo=maskable_ppo", "env=tictactoe", "train.num_envs=3"], "train.num_envs=3: env "
                                                                 "pettingzoo.classic.tictactoe_v3 has 2 agents"),
])
def test_bad_turn_based_configs_are_one_line(args, message, tmp_path):
    tests = str(Path(__file__).parent)  # the toy's module
    done = forked_cli.run([*args, "train.total_steps=100", *QUIET, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])))
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert not (tmp_path / "run").exists()


def test_a_self_play_run_stopped_after_its_first_checkpoint_resumes_bit_identically(tmp_path):
    args = [*TINY, "train.total_steps=256", "train.checkpoint_every=64", "train.test_every=128",
            "train.test_episodes=2", "train.log_every=64", *QUIET]
    assert_sigterm_then_resume_is_exact(args, 256, tmp_path)
