"""Networks for off-policy algorithms, built from the actor config's torso settings.

The actor config (`actor=mlp`) describes the torso (sizes, activation, init); each off-policy
algorithm asks for the heads it needs: Q-values per discrete action (optionally dueling), a
deterministic tanh policy, a tanh-squashed Gaussian policy, and N critics Q(s, a).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from rlcli.actors.layers import Activation, mlp, orthogonal_init
from rlcli.actors.normalizer import RunningNorm
from rlcli.actors.per_agent import per_agent, setting_of
from rlcli.actors.sde import SdeOptions, StateDependentSquashedPolicy
from rlcli.registry import ConfigError

if TYPE_CHECKING:
    from rlcli.envs.multiagent import SeparateAgents

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # SAC's usual clamp of the policy's log std


@dataclass
class NetworkRecipe:
    """How to build the agent's networks; `normalizer` is shared by all of them.

    As in reference 000's off-policy actor: an observation feature extractor (`obs_extractor`, used by
    every network), an action feature extractor (`act_extractor`, used by the critics), and the common
    layers (`hidden_sizes`) over their concatenation. Empty extractors pass their input through.
    """

    obs_dim: int
    hidden_sizes: list[int]
    activation: Activation
    ortho_init: bool
    normalizer: RunningNorm
    obs_extractor: list[int] = field(default_factory=list)
    act_extractor: list[int] = field(default_factory=list)
    # actor=cnn: makes a fresh image encoder (module, output width) for each network that sees observations
    encoder: Callable[[], tuple[nn.Module, int]] | None = None
    uint8_input: bool = False  # observations are stored and passed as uint8 pixels
    log_std_init: float | None = None  # gSDE's initial log std (None: SB3's -3)
    sde: SdeOptions = field(default_factory=SdeOptions)
    # env.share_params=false: the networks that `make` and QNetwork / Critics build get a copy per agent
    # (actors/per_agent.py); `features` and `mlp` build one network, as for a shared group
    agents: SeparateAgents | None = None
    # the per-agent networks built from this recipe and the copies `dataclasses.replace` makes of it (one list, shared
    # by them): an algorithm that builds its networks itself from the settings has none (`check_per_agent`)
    per_agent_built: list[str] = field(default_factory=list, repr=False, compare=False)

    def shared(self) -> NetworkRecipe:
        """This recipe for one network (an agent's copy)."""
        return dataclasses.replace(self, agents=None, per_agent_built=[])

    def check_per_agent(self, algo: str) -> None:
        """After the algorithm is built: with env.share_params=false, one line where it built no per-agent network
        (it makes its networks itself from the settings, e.g. algo=pqn, crossq), rather than silently sharing."""
        if self.agents is not None and not self.per_agent_built:
            setting, undo = setting_of(self.agents)
            raise ConfigError(f"{setting}: algo={algo} builds its own networks, which have no per-agent version; use "
                              f"{undo}, or algo=ppo, ippo, mappo, dqn, sac, td3, vdn, qmix, masac, maddpg")

    def mlp(self, in_features: int, sizes: list[int]) -> tuple[nn.Sequential, int]:
        body = mlp(in_features, sizes, self.activation)
        if self.ortho_init:
            orthogonal_init(body, math.sqrt(2))
        return body, (sizes[-1] if sizes else in_features)

    def features(self, extra_in: int = 0) -> tuple[nn.Module, nn.Module, int]:
        """Observation extractor and common layers (with `extra_in` action features joining them)."""
        if self.encoder is None:
            obs_net, width = self.mlp(self.obs_dim, self.obs_extractor)
        else:
            encoder, width = self.encoder()
            extractor, width = self.mlp(width, self.obs_extractor)
            obs_net = nn.Sequential(encoder, extractor)
        common, width = self.mlp(width + extra_in, self.hidden_sizes)
        return obs_net, common, width

    def head(self, in_features: int, out_features: int, gain: float) -> nn.Linear:
        layer = nn.Linear(in_features, out_features)
        if self.ortho_init:
            orthogonal_init(layer, gain)
        return layer

    def make(self, out_features: int, out_gain: float = 1.0) -> nn.Module:
        """obs -> obs extractor -> common layers -> linear(out_features); a copy per agent with `agents`."""
        if self.agents is not None:
            one = self.shared()
            self.per_agent_built.append("make")
            return per_agent(self.agents, lambda: one.make(out_features, out_gain))
        obs_net, common, width = self.features()
        return nn.Sequential(obs_net, common, self.head(width, out_features, out_gain))


class QNetwork(nn.Module):
    """Q-values of every discrete action; dueling splits them into V(s) + A(s, a) - mean A."""

    def __init__(self, torso: NetworkRecipe, n_actions: int, dueling: bool):
        super().__init__()
        self.dueling = dueling
        self.agents: nn.Module | None = None
        if torso.agents is not None:  # env.share_params=false: a whole Q-network per agent
            one = torso.shared()
            torso.per_agent_built.append("QNetwork")
            self.agents = per_agent(torso.agents, lambda: QNetwork(one, n_actions, dueling))
        elif dueling:
            obs_net, common, width = torso.features()
            self.body = nn.Sequential(obs_net, common)
            self.value = torso.head(width, 1, 1.0)
            self.advantage = torso.head(width, n_actions, 1.0)
        else:
            self.q = torso.make(n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.agents is not None:
            q: torch.Tensor = self.agents(obs)
            return q
        if not self.dueling:
            return self.q(obs)
        h = self.body(obs)
        adv = self.advantage(h)
        return self.value(h) + adv - adv.mean(-1, keepdim=True)


class QValue(nn.Module):
    """Q(s, a) = head(common([obs_extractor(s), act_extractor(a)])): [batch], or [batch, outputs] for
    several outputs (TQC's quantiles)."""

    def __init__(self, torso: NetworkRecipe, action_dim: int, outputs: int = 1):
        super().__init__()
        self.act_net, act_width = torso.mlp(action_dim, torso.act_extractor)
        self.obs_net, self.common, width = torso.features(extra_in=act_width)
        self.head = torso.head(width, outputs, 1.0)
        self.outputs = outputs

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.obs_net(obs), self.act_net(actions)], -1)
        out = self.head(self.common(x))
        return out.squeeze(-1) if self.outputs == 1 else out


class Critics(nn.Module):
    """N independent Q(s, a) networks evaluated together: returns [N, batch] (or [N, batch, outputs])."""

    def __init__(self, torso: NetworkRecipe, action_dim: int, n: int, outputs: int = 1):
        super().__init__()
        agents = torso.agents
        one = torso.shared()
        if agents is None or agents.joint:  # joint mode: a centralized critic of the team, one network
            self.nets = nn.ModuleList(QValue(one, action_dim, outputs) for _ in range(n))
        else:  # row mode with env.share_params=false: each critic a copy per agent
            torso.per_agent_built.append("Critics")
            self.nets = nn.ModuleList(per_agent(agents, lambda: QValue(one, action_dim, outputs)) for _ in range(n))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return torch.stack([net(obs, actions) for net in self.nets])


class DeterministicPolicy(nn.Module):
    """a = tanh(f(s)) in [-1, 1]; the algorithm rescales to the env's bounds."""

    def __init__(self, torso: NetworkRecipe, action_dim: int):
        super().__init__()
        self.net = torso.make(action_dim, out_gain=0.01)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs))


class SquashedGaussianPolicy(nn.Module):
    """a = tanh(u), u ~ N(mean(s), std(s)); log-probs include the tanh change of variables."""

    def __init__(self, torso: NetworkRecipe, action_dim: int):
        super().__init__()
        self.net = torso.make(2 * action_dim, out_gain=0.01)
        self.action_dim = action_dim

    def forward(self, obs: torch.Tensor, deterministic: bool = False,
                noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return squashed_gaussian(self.net(obs), deterministic, noise)

    def gradient_step_draws(self, rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """A gradient step's standard-normal draws for the next actions, then for the policy's actions."""
        shape = (rows, self.action_dim)
        return torch.randn(shape, device=device), torch.randn(shape, device=device)


def sde_squashed_policy(torso: NetworkRecipe, action_dim: int) -> StateDependentSquashedPolicy:
    """SAC / TQC's policy with gSDE (algo.use_sde=true), on the same torso as SquashedGaussianPolicy."""
    if torso.agents is not None:
        setting, undo = setting_of(torso.agents)
        raise ConfigError(f"algo.use_sde=true has no per-agent version ({setting}): use algo.use_sde=false, or "
                          f"{undo}")
    obs_net, common, width = torso.features()
    log_std_init = -3.0 if torso.log_std_init is None else torso.log_std_init
    return StateDependentSquashedPolicy(nn.Sequential(obs_net, common), width, torso.head(width, action_dim, 0.01),
                                        action_dim, log_std_init, torso.sde.full_std, torso.sde.use_expln)


def squashed_gaussian(params: torch.Tensor, deterministic: bool = False,
                      noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Actions and log-probs from [..., 2 * action_dim] network outputs (means, then log stds). `noise`: the
    standard-normal draws, when the caller drew them (a population, each member from its own RNG stream)."""
    mean, log_std = params.chunk(2, -1)
    log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
    if deterministic:
        return torch.tanh(mean), torch.zeros(mean.shape[:-1], device=mean.device)
    if noise is None:
        noise = torch.randn_like(mean)
    u = mean + log_std.exp() * noise
    action = torch.tanh(u)
    log_prob = (-0.5 * noise.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    # log|d tanh(u)/du| = 2 (log 2 - u - softplus(-2u)), numerically stable
    log_prob = log_prob - (2 * (math.log(2) - u - nn.functional.softplus(-2 * u))).sum(-1)
    return action, log_prob
