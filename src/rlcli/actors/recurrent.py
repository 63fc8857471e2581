"""Recurrent actor-critics (`actor=gru`, `actor=lstm`) for the on-policy algorithms.

An MLP encoder feeds one recurrent cell whose output drives the policy and value heads. The
recurrent state (the *carry*: h for a GRU, [h, c] for an LSTM, one tensor either way) is zeroed
at every episode start, so nothing flows from one episode into the next. Acting steps the cell
once; training unrolls whole rollouts per env (`evaluate_sequence`) from the carry each env had
when the rollout began, resetting at the same episode starts as during collection.

With NEXT_STEP autoreset, the step after an episode's last step shows the final observation and
is masked out of the losses; the carry is reset on the step after that, the new episode's first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlcli.actors.layers import Activation, mlp, orthogonal_init
from rlcli.actors.mlp import action_conversions, policy_head
from rlcli.actors.normalizer import RunningNorm
from rlcli.actors.per_agent import refuse_separate
from rlcli.contracts import ActOutput, EvalOutput, NetworkSpec, RecurrentState
from rlcli.registry import ACTORS, ConfigError, require


def cell_step(cell: nn.GRUCell | nn.LSTMCell, x: torch.Tensor, carry: torch.Tensor,
              starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the cell: (output h, next carry). The carry is zeroed where an episode starts."""
    carry = carry * (1.0 - starts).unsqueeze(-1)
    if isinstance(cell, nn.GRUCell):
        h = cell(x, carry)
        return h, h
    size = cell.hidden_size
    h, c = cell(x, (carry[:, :size], carry[:, size:]))
    return h, torch.cat([h, c], -1)


def state_or_zeros(state: RecurrentState | None, obs: torch.Tensor, carry_size: int) -> RecurrentState:
    """The acting state passed in, or a zero carry with no episode starts (a call outside the collector)."""
    if state is not None:
        return state
    n, device = obs.shape[0], obs.device
    return RecurrentState(torch.zeros(n, carry_size, device=device), torch.zeros(n, device=device))


class RecurrentActorCritic(nn.Module):
    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Space, cell: Literal["gru", "lstm"],
                 hidden_sizes: list[int], rnn_size: int, activation: Activation, ortho_init: bool,
                 log_std_init: float, normalize_obs: bool, clip_obs: float) -> None:
        super().__init__()
        obs_dim = int(np.prod(observation_space.shape))
        self.obs_shape = tuple(observation_space.shape)
        self.normalizer = RunningNorm(self.obs_shape, clip=clip_obs, enabled=normalize_obs)
        self.encoder = mlp(obs_dim, hidden_sizes, activation)
        features = hidden_sizes[-1] if hidden_sizes else obs_dim
        self.cell_type, self.rnn_size = cell, rnn_size
        self.cell: nn.GRUCell | nn.LSTMCell = (nn.GRUCell(features, rnn_size) if cell == "gru"
                                               else nn.LSTMCell(features, rnn_size))
        self.carry_size = rnn_size * (2 if cell == "lstm" else 1)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_bounds, self.action_start = action_conversions(action_space)
        self.head = policy_head(rnn_size, action_space, log_std_init)
        self.value_head = nn.Linear(rnn_size, 1)
        if ortho_init:
            orthogonal_init(self.encoder, math.sqrt(2))
            orthogonal_init(self.head, 0.01)
            orthogonal_init(self.value_head, 1.0)

    def initial_carry(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(n, self.carry_size, device=device)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """The encoder and cell feed both heads: they are shared."""
        shared = list(self.encoder.parameters()) + list(self.cell.parameters())
        return {"shared": shared, "pi": list(self.head.parameters()), "v": list(self.value_head.parameters())}

    def _step(self, x: torch.Tensor, carry: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return cell_step(self.cell, x, carry, starts)

    def _features(self, obs: torch.Tensor, state: RecurrentState | None) -> tuple[torch.Tensor, torch.Tensor]:
        carry, starts = state_or_zeros(state, obs, self.carry_size)
        return self._step(self.encoder(obs.flatten(1)), carry, starts)

    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        h, carry = self._features(obs, state)
        params = self.head(h)
        actions = self.head.sample(params, deterministic)
        return ActOutput(actions, self.head.log_prob(params, actions), self.value_head(h).squeeze(-1), carry)

    def value(self, obs: torch.Tensor, state: RecurrentState | None = None) -> torch.Tensor:
        """V of the observation after the rollout, from the carry in `state`."""
        h, _ = self._features(obs, state)
        return self.value_head(h).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor) -> EvalOutput:
        raise RuntimeError("a recurrent actor evaluates whole sequences: use evaluate_sequence")

    def evaluate_sequence(self, obs: torch.Tensor, actions: torch.Tensor, starts: torch.Tensor,
                          carry0: torch.Tensor) -> EvalOutput:
        """obs [T, B, ...], actions [T, B, ...], starts [T, B], carry0 [B, carry]: outputs flat [T * B]."""
        steps, envs = starts.shape
        x = self.encoder(obs.reshape(steps * envs, -1)).reshape(steps, envs, -1)
        carry, outputs = carry0, []
        for t in range(steps):
            h, carry = self._step(x[t], carry, starts[t])
            outputs.append(h)
        h = torch.stack(outputs).reshape(steps * envs, -1)
        params = self.head(h)
        flat_actions = actions.reshape(steps * envs, *actions.shape[2:])
        return EvalOutput(self.head.log_prob(params, flat_actions), self.head.entropy(params),
                          self.value_head(h).squeeze(-1))


@dataclass
class RecurrentRecipe:
    """What off-policy algorithms build recurrent networks from (only dqn so far: R2D2-style)."""

    obs_dim: int
    hidden_sizes: list[int]
    rnn_size: int
    cell: Literal["gru", "lstm"]
    activation: Activation
    ortho_init: bool
    normalizer: RunningNorm

    @property
    def carry_size(self) -> int:
        return self.rnn_size * (2 if self.cell == "lstm" else 1)


class RecurrentBody(nn.Module):
    """MLP encoder -> recurrent cell: stepped while acting, unrolled over stored sequences to learn."""

    def __init__(self, torso: RecurrentRecipe) -> None:
        super().__init__()
        self.encoder = mlp(torso.obs_dim, torso.hidden_sizes, torso.activation)
        features = torso.hidden_sizes[-1] if torso.hidden_sizes else torso.obs_dim
        self.cell: nn.GRUCell | nn.LSTMCell = (nn.GRUCell(features, torso.rnn_size) if torso.cell == "gru"
                                               else nn.LSTMCell(features, torso.rnn_size))
        if torso.ortho_init:
            orthogonal_init(self.encoder, math.sqrt(2))

    def step(self, obs: torch.Tensor, carry: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return cell_step(self.cell, self.encoder(obs.flatten(1)), carry, starts)

    def unroll(self, obs: torch.Tensor, starts: torch.Tensor,
               carry: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [T, B, ...], starts [T, B], carry [B, C] -> (outputs [T, B, H], the carry after T steps)."""
        steps, batch = starts.shape
        x = self.encoder(obs.reshape(steps * batch, -1)).reshape(steps, batch, -1)
        outputs = []
        for t in range(steps):
            h, carry = cell_step(self.cell, x[t], carry, starts[t])
            outputs.append(h)
        return torch.stack(outputs), carry


class RecurrentNet(nn.Module):
    """A recurrent body with a linear head: DQN's Q-values, or SAC's policy parameters."""

    def __init__(self, torso: RecurrentRecipe, out_features: int, out_gain: float = 1.0) -> None:
        super().__init__()
        self.body = RecurrentBody(torso)
        self.head = nn.Linear(torso.rnn_size, out_features)
        if torso.ortho_init:
            orthogonal_init(self.head, out_gain)

    def step(self, obs: torch.Tensor, carry: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, carry = self.body.step(obs, carry, starts)
        return self.head(h), carry

    def unroll(self, obs: torch.Tensor, starts: torch.Tensor,
               carry: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, carry = self.body.unroll(obs, starts, carry)
        return self.head(h), carry


RecurrentQNetwork = RecurrentNet  # DQN's Q-values per discrete action


class RecurrentCritics(nn.Module):
    """N critics Q(s, a): each a recurrent body over observations whose output joins the action in an
    MLP head. While acting nothing steps them, so every stored sequence unrolls them from a zero state
    (R2D2's zero-state variant); burn-in steps warm that state up."""

    def __init__(self, torso: RecurrentRecipe, action_dim: int, n: int) -> None:
        super().__init__()
        self.bodies = nn.ModuleList(RecurrentBody(torso) for _ in range(n))
        self.heads = nn.ModuleList(mlp(torso.rnn_size + action_dim, [torso.rnn_size], torso.activation)
                                   .append(nn.Linear(torso.rnn_size, 1)) for _ in range(n))
        self.carry_size = torso.carry_size

    def features(self, obs: torch.Tensor, starts: torch.Tensor, burn_in: int) -> list[torch.Tensor]:
        """Each body's outputs [T - burn_in, B, H] after a burn-in without gradients from a zero state."""
        out = []
        for body in self.bodies:
            carry = torch.zeros(starts.shape[1], self.carry_size, device=starts.device)
            if burn_in > 0:
                with torch.no_grad():
                    _, carry = body.unroll(obs[:burn_in], starts[:burn_in], carry)
            h, _ = body.unroll(obs[burn_in:], starts[burn_in:], carry)
            out.append(h)
        return out

    def q(self, features: list[torch.Tensor], actions: torch.Tensor) -> torch.Tensor:
        """Q-values [N, T, B] from each critic's features [T, B, H] and actions [T, B, A]."""
        return torch.stack([head(torch.cat([h, actions], -1)).squeeze(-1)
                            for head, h in zip(self.heads, features, strict=True)])


def _build(cell: Literal["gru", "lstm"]):
    def build(
        observation_space: gym.spaces.Space,
        action_space: gym.spaces.Space,
        normalize_obs: bool = False,
        clip_obs: float = 10.0,
        heads: Literal["actor_critic", "recipe"] = "actor_critic",
        hidden_sizes: list[int] = (64,),  # type: ignore[assignment]
        rnn_size: int = 64,
        activation: Activation = "tanh",
        ortho_init: bool = True,
        log_std_init: float = 0.0,
    ) -> RecurrentActorCritic | RecurrentRecipe:
        if not isinstance(observation_space, gym.spaces.Box):
            raise ConfigError(f"actor={cell} needs a Box observation space; the env has "
                              f"{type(observation_space).__name__}")
        require(all(h > 0 for h in hidden_sizes), "actor.hidden_sizes", list(hidden_sizes), "sizes must be > 0")
        require(rnn_size > 0, "actor.rnn_size", rnn_size, "must be > 0")
        refuse_separate(observation_space, cell)
        if heads == "recipe":  # off-policy: dqn builds a recurrent Q-network from this (R2D2)
            normalizer = RunningNorm(tuple(observation_space.shape), clip=clip_obs, enabled=normalize_obs)
            return RecurrentRecipe(int(np.prod(observation_space.shape)), list(hidden_sizes), rnn_size, cell,
                                  activation, ortho_init, normalizer)
        return RecurrentActorCritic(observation_space, action_space, cell, list(hidden_sizes), rnn_size, activation,
                                    ortho_init, log_std_init, normalize_obs, clip_obs)

    build.__doc__ = f"A {cell.upper()} actor-critic for on-policy algorithms."
    return build


build_gru_actor = ACTORS.register("gru", spec=NetworkSpec(recurrent=True))(_build("gru"))
build_lstm_actor = ACTORS.register("lstm", spec=NetworkSpec(recurrent=True))(_build("lstm"))
