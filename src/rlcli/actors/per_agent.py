"""Separate parameters per agent (`env.share_params=false`, PettingZoo envs: envs/multiagent.py).

A group whose agents share parameters is a batch dimension: one network computes every agent's rows. With
separate parameters each agent has its own copy of the network, built exactly as the shared one would be (so a copy
is what a standalone network of the same recipe is), and each row (row mode) or each agent's line (joint mode) goes
through its agent's copy:

- row mode: a row's agent is read from the one-hot index the env appends to its observation (`env.agent_id=true`;
  the largest of those columns, so it holds under `env.normalize_obs` as well). Every copy computes the rows and each
  row keeps its own agent's output (`pick`, a gather): another agent's copy gets exactly zero gradient from it, and
  rows can be shuffled into minibatches freely. The copies are held as modules of their own (`members.<i>.*` in the
  state dict), so the optimizer, checkpoints, resume and export treat them as any other weights.
- joint mode ([..., agents, inputs]): agent i's line goes through copy i, stacked back on the agent axis.

On-policy networks (`PerAgentActorCritic`): each agent has its own policy and its own value network (MAPPO's
centralized critic too: every agent its own value function of the global state), and its own Gaussian log std.
Off-policy networks (actors/offpolicy.py): Q-networks and policies per agent, and in row mode the critics of SAC and
TD3 too; algo=masac and maddpg's centralized critics stay one network (they read the team's state and joint action,
which has no agent axis). An algorithm that builds its networks from the recipe's settings itself (algo=pqn, crossq)
gets no copies, which `NetworkRecipe.check_per_agent` says in one line after it is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from rlcli.actors.heads import GaussianHead, diag_gaussian_kl
from rlcli.contracts import ActOutput, EvalOutput, RecurrentState
from rlcli.envs.multiagent import SeparateAgents
from rlcli.registry import ConfigError

_LOG_2PI = math.log(2 * math.pi)


def separate_agents(observation_space: gym.spaces.Space[Any]) -> SeparateAgents | None:
    """The env's word that each agent of the group has its own parameters (env.share_params=false), or None."""
    layout = getattr(observation_space, "separate_agents", None)
    return layout if isinstance(layout, SeparateAgents) else None


def setting_of(layout: SeparateAgents) -> tuple[str, str]:
    """The setting that asked for copies and the one that undoes it, for messages: env.share_params=false (one copy
    per agent) or env.groups (one per group)."""
    if layout.copy_of is None:
        return "env.share_params=false", "env.share_params=true"
    return "env.groups", "env.groups=null"


def refuse_separate(observation_space: gym.spaces.Space[Any], actor: str) -> None:
    """One line for an actor that cannot hold separate parameters per agent."""
    layout = separate_agents(observation_space)
    if layout is not None:
        setting, undo = setting_of(layout)
        raise ConfigError(f"{setting} gives each {'agent' if layout.copy_of is None else 'group'} its own actor=mlp "
                          f"network; actor={actor} has no per-agent version: use actor=mlp, or {undo}")


def pick(outs: Sequence[Any], agent: torch.Tensor) -> Any:
    """Each row's output from its agent's copy: `outs[i]` is copy i's output for every row (a tensor whose leading
    dims are the rows', or a tuple of them), `agent` each row's agent index. A gather, so a copy gets exactly zero
    gradient from the other agents' rows (not 0 * its output, which an infinite output would turn to NaN)."""
    first = outs[0]
    if isinstance(first, tuple):
        picked = [pick([o[k] for o in outs], agent) for k in range(len(first))]
        return tuple(picked) if type(first) is tuple else type(first)(*picked)
    if len(outs) == 1:
        return first
    dim = agent.dim()
    stacked = torch.stack(list(outs), dim)  # [*rows, agents, *rest]
    rest = stacked.shape[dim + 1:]
    index = agent.reshape(*agent.shape, 1, *([1] * len(rest))).expand(*agent.shape, 1, *rest)
    return stacked.gather(dim, index).squeeze(dim)


class CopyRouting(nn.Module):
    """Which copy computes a row: its agent's (one-hot index from `id_start`), or with groups its agent's group's
    (`copy_of`, kept out of the state dict: it is the env's layout, not a weight)."""

    def __init__(self, id_start: int, n_agents: int, copy_of: Sequence[int] | None) -> None:
        super().__init__()
        self.id_start, self.n_agents = id_start, n_agents
        self.copy_of: torch.Tensor | None
        self.register_buffer("copy_of", None if copy_of is None else torch.tensor(copy_of), persistent=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        agent = agent_index(obs, self.id_start, self.n_agents)
        return agent if self.copy_of is None else self.copy_of[agent]


class AgentRows(nn.Module):
    """Row mode: one copy of a network per agent (or per group of agents); `forward(obs, *args)` routes each row to
    its copy (the arguments after `obs`, e.g. a critic's actions, are the rows' own)."""

    def __init__(self, members: Sequence[nn.Module], layout: SeparateAgents) -> None:
        super().__init__()
        assert layout.id_start is not None
        self.members = nn.ModuleList(members)
        self.route = CopyRouting(layout.id_start, layout.n_agents, layout.copy_of)

    def agent_of(self, obs: torch.Tensor) -> torch.Tensor:
        return self.route(obs)  # type: ignore[no-any-return]

    def forward(self, obs: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        agent = self.agent_of(obs)
        return pick([member(obs, *args, **kwargs) for member in self.members], agent)


class AgentLines(nn.Module):
    """Joint mode: one copy of a network per agent (or per group); `forward(obs)` takes [..., agents, inputs] and
    gives each agent's line to its copy: [..., agents, outputs]."""

    def __init__(self, members: Sequence[nn.Module], layout: SeparateAgents) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)
        self.n_agents = layout.n_agents
        self.copy_of = list(range(layout.n_agents)) if layout.copy_of is None else list(layout.copy_of)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if obs.shape[-2] != self.n_agents:
            raise ValueError(f"expected [..., {self.n_agents} agents, inputs], got {tuple(obs.shape)}")
        return torch.stack([self.members[c](obs[..., i, :]) for i, c in enumerate(self.copy_of)], obs.dim() - 2)


def agent_index(obs: torch.Tensor, id_start: int, n_agents: int) -> torch.Tensor:
    """Each row's agent: the largest of its one-hot columns (raw 1 vs 0; normalized, the own column is the only
    one above its running mean)."""
    return obs[..., id_start:id_start + n_agents].argmax(-1)


def per_agent(layout: SeparateAgents, build: Callable[[], nn.Module]) -> nn.Module:
    """`layout.copies` copies from `build` (each initialized as a standalone network would be), routed by rows
    (row mode) or by the agent axis (joint mode)."""
    members = [build() for _ in range(layout.copies)]
    return AgentLines(members, layout) if layout.joint else AgentRows(members, layout)


class RowGaussianHead(nn.Module):
    """The Gaussian head of per-agent policies: its parameters are each row's `[mean | log std]` (the row's agent's
    own log std), with GaussianHead's arithmetic otherwise, so sampling draws the same numbers."""

    def __init__(self, action_dim: int) -> None:
        super().__init__()
        self.action_dim = action_dim

    def split(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return params[..., :self.action_dim], params[..., self.action_dim:]

    def sample(self, params: torch.Tensor, deterministic: bool) -> torch.Tensor:
        mean, log_std = self.split(params)
        if deterministic:
            return mean
        return mean + log_std.exp() * torch.randn_like(mean)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.split(params)
        z = (actions - mean) * torch.exp(-log_std)
        return (-0.5 * z.square() - log_std - 0.5 * _LOG_2PI).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        _, log_std = self.split(params)
        return (0.5 + 0.5 * _LOG_2PI + log_std).sum(-1)

    def kl(self, p_params: torch.Tensor, q_params: torch.Tensor, p_head: nn.Module | None = None) -> torch.Tensor:
        p_mean, p_log_std = self.split(p_params)
        q_mean, q_log_std = self.split(q_params)
        return diag_gaussian_kl(p_mean, p_log_std, q_mean, q_log_std)


class PerAgentActorCritic(nn.Module):
    """An on-policy actor-critic (actors/mlp.py's ActorCritic) per agent or per group, in row mode: the same methods,
    each row computed by its copy. One observation normalizer for the group (callers apply and update it)."""

    def __init__(self, members: Sequence[Any], layout: SeparateAgents) -> None:
        super().__init__()
        assert layout.id_start is not None
        self.members = nn.ModuleList(members)
        self.route = CopyRouting(layout.id_start, layout.n_agents, layout.copy_of)
        first = members[0]
        for member in members[1:]:
            member.normalizer = first.normalizer  # one set of statistics, which the collector updates
        gaussian = isinstance(first.head, GaussianHead)
        self._row_head = RowGaussianHead(first.head.mean.out_features) if gaussian else None

    def _copies(self) -> list[Any]:
        """The copies, as the ActorCritics they are (a ModuleList gives them as plain Modules)."""
        return list(self.members)

    # what the algorithms and the collector read of an ActorCritic
    @property
    def normalizer(self) -> nn.Module:
        normalizer: nn.Module = self._copies()[0].normalizer
        return normalizer

    @property
    def head(self) -> Any:
        return self._row_head if self._row_head is not None else self._copies()[0].head

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in ("discrete", "action_bounds", "action_start", "obs_shape", "value_outputs", "policy_size"):
                return getattr(self._copies()[0], name)
            raise

    def agent_of(self, obs: torch.Tensor) -> torch.Tensor:
        return self.route(obs)  # type: ignore[no-any-return]

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        groups: dict[str, list[nn.Parameter]] = {"shared": [], "pi": [], "v": []}
        for member in self._copies():
            for name, params in member.param_groups().items():
                groups[name] += params
        return groups

    def _head_params(self, member: Any, params: torch.Tensor) -> torch.Tensor:
        if self._row_head is None:
            return params
        return torch.cat([params, member.head.log_std.expand_as(params)], -1)

    def policy_and_values(self, obs: torch.Tensor, action_mask: torch.Tensor | None = None,
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        outs = []
        for member in self._copies():
            params, values = member.policy_and_values(obs, action_mask)
            outs.append((self._head_params(member, params), values))
        return pick(outs, self.agent_of(obs))  # type: ignore[no-any-return]

    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None,
            action_mask: torch.Tensor | None = None) -> ActOutput:
        params, values = self.policy_and_values(obs, action_mask)
        return self.sampled(params, values, deterministic)

    def sampled(self, params: torch.Tensor, values: torch.Tensor, deterministic: bool = False,
                uniforms: torch.Tensor | None = None) -> ActOutput:
        head = self.head
        actions = head.sample(params, deterministic) if uniforms is None else head.sample(params, False, uniforms)
        return ActOutput(actions, head.log_prob(params, actions), values)

    def draw(self, params: torch.Tensor) -> torch.Tensor | None:
        draw = getattr(self.head, "draw", None)
        return None if draw is None else draw(params)

    def policy_params(self, obs: torch.Tensor) -> torch.Tensor:
        outs = [self._head_params(member, member.policy_params(obs)) for member in self._copies()]
        return pick(outs, self.agent_of(obs))  # type: ignore[no-any-return]

    def value(self, obs: torch.Tensor, state: RecurrentState | None = None) -> torch.Tensor:
        return pick([member.value(obs) for member in self._copies()], self.agent_of(obs))  # type: ignore[no-any-return]

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor, action_mask: torch.Tensor | None = None) -> EvalOutput:
        params, values = self.policy_and_values(obs, action_mask)
        head = self.head
        return EvalOutput(head.log_prob(params, actions), head.entropy(params), values)
