"""MLP actor-critic: an observation normalizer, policy and value bodies (shared or separate), heads."""

from __future__ import annotations

import math
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlcli.actors.heads import BernoulliHead, CategoricalHead, GaussianHead, MultiCategoricalHead, masked_policy
from rlcli.actors.layers import Activation, mlp, orthogonal_init
from rlcli.actors.normalizer import RunningNorm
from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.actors.per_agent import PerAgentActorCritic, separate_agents, setting_of
from rlcli.actors.sde import SdeOptions, StateDependentGaussianHead
from rlcli.contracts import ActOutput, EvalOutput, NetworkSpec, RecurrentState
from rlcli.envs.dict_obs import PackedDict
from rlcli.registry import ACTORS, ConfigError, require
from rlcli.services.runtime import DeviceConstants

PolicyHead = CategoricalHead | GaussianHead | MultiCategoricalHead | BernoulliHead | StateDependentGaussianHead


def policy_head(features: int, action_space: gym.spaces.Space, log_std_init: float,
                sde: SdeOptions | None = None) -> PolicyHead:
    """Categorical logits for Discrete actions, a diagonal Gaussian for Box actions (gSDE's state-dependent one
    with `sde`), independent categoricals for MultiDiscrete and independent Bernoullis for MultiBinary ones."""
    if sde is not None:
        if not isinstance(action_space, gym.spaces.Box):
            raise ConfigError(f"algo.use_sde=true explores in continuous (Box) actions; the env's actions are "
                              f"{type(action_space).__name__}: use algo.use_sde=false")
        return StateDependentGaussianHead(features, int(np.prod(action_space.shape)), log_std_init, sde.full_std,
                                          sde.use_expln)
    if isinstance(action_space, gym.spaces.Discrete):
        return CategoricalHead(features, int(action_space.n))
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return MultiCategoricalHead(features, np.asarray(action_space.nvec).reshape(-1).tolist())
    if isinstance(action_space, gym.spaces.MultiBinary):
        return BernoulliHead(features, int(np.prod(action_space.shape)))
    return GaussianHead(features, int(np.prod(action_space.shape)), log_std_init)


def action_conversions(action_space: gym.spaces.Space) -> tuple[DeviceConstants | None, DeviceConstants | None]:
    """(bounds, start): a Box's bounds, which the env's actions are clipped to; for MultiDiscrete / MultiBinary,
    what the entries' indices are offset by (their `start`, or 0) on their way to the env as integers."""
    if isinstance(action_space, gym.spaces.Box):
        return DeviceConstants(action_space.low, action_space.high), None
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return None, DeviceConstants(np.asarray(action_space.start).reshape(-1).astype(np.int64))
    if isinstance(action_space, gym.spaces.MultiBinary):
        return None, DeviceConstants(np.zeros(int(np.prod(action_space.shape)), dtype=np.int64))
    return None, None


class ActorCritic(nn.Module):
    """Policy and value function for on-policy algorithms over flat Box observations, or over the
    features of an `encoder` shared by policy and value (actor=cnn passes its convolutions).

    `normalizer` belongs to the actor (its statistics are saved with it) but is applied by the
    callers: the collector updates it and stores normalized observations, so the update sees exactly
    what acting saw; testing applies it frozen. `act`, `value` and `evaluate` take normalized input.
    """

    def __init__(
        self,
        observation_space: gym.spaces.Space,
        action_space: gym.spaces.Space,
        hidden_sizes: list[int],
        activation: Activation,
        shared: bool,
        ortho_init: bool,
        log_std_init: float,
        normalize_obs: bool,
        clip_obs: float,
        value_outputs: int = 1,
        encoder: nn.Module | None = None,
        sde: SdeOptions | None = None,
        policy_size: int | None = None,
    ):
        super().__init__()
        self.encoder = nn.Flatten() if encoder is None else encoder
        obs_dim = int(np.prod(observation_space.shape)) if encoder is None else int(encoder.out_features)
        self.obs_shape = tuple(observation_space.shape)
        self.normalizer = RunningNorm(self.obs_shape, clip=clip_obs, enabled=normalize_obs)
        # MAPPO's centralized critic (envs/multiagent.py): the policy reads the first `policy_size` inputs (the agent's
        # own observation), the value network all of them (with the global state)
        self.policy_size = policy_size
        if policy_size is not None and shared:
            raise ConfigError("actor.shared=true gives policy and value one body, but a centralized critic's value "
                              "network sees more inputs than the policy (env.critic_state=true): use "
                              "actor.shared=false")
        self.pi_body = mlp(obs_dim if policy_size is None else policy_size, hidden_sizes, activation)
        self.v_body = self.pi_body if shared else mlp(obs_dim, hidden_sizes, activation)
        features = hidden_sizes[-1] if hidden_sizes else obs_dim
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_bounds, self.action_start = action_conversions(action_space)
        self.head = policy_head(features, action_space, log_std_init, sde)
        self.value_outputs = value_outputs  # 2 for rnd_ppo: extrinsic and intrinsic value heads
        self.value_head = nn.Linear(features, value_outputs)
        if ortho_init:
            orthogonal_init(self.pi_body, math.sqrt(2))
            if not shared:
                orthogonal_init(self.v_body, math.sqrt(2))
            orthogonal_init(self.head, 0.01)
            orthogonal_init(self.value_head, 1.0)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters split into shared / policy / value, for separate learning rates."""
        shared = self.pi_body is self.v_body
        pi = list(self.head.parameters()) + ([] if shared else list(self.pi_body.parameters()))
        v = list(self.value_head.parameters()) + ([] if shared else list(self.v_body.parameters()))
        common = list(self.encoder.parameters()) + (list(self.pi_body.parameters()) if shared else [])
        return {"shared": common, "pi": pi, "v": v}

    def _features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.encoder(obs)  # already normalized by the caller: see `normalizer`
        pi = self.pi_body(self._policy_inputs(x))
        return pi, (pi if self.v_body is self.pi_body else self.v_body(x))

    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None,
            action_mask: torch.Tensor | None = None) -> ActOutput:
        """`action_mask` (Discrete or MultiDiscrete actions): sample only among the valid actions."""
        params, values = self.policy_and_values(obs, action_mask)
        return self.sampled(params, values, deterministic)

    def policy_and_values(self, obs: torch.Tensor, action_mask: torch.Tensor | None = None,
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy head's parameters and the values: acting's arithmetic, without the draw (a population
        computes this for all its members at once, then draws each member's actions from its own RNG)."""
        pi, v = self._features(obs)
        return self._policy(pi, action_mask), self._values(v)

    def sampled(self, params: torch.Tensor, values: torch.Tensor, deterministic: bool = False,
                uniforms: torch.Tensor | None = None) -> ActOutput:
        """`uniforms`: `draw`'s numbers for these states, drawn beforehand."""
        actions = self.head.sample(params, deterministic) if uniforms is None else self.head.sample(params, False,
                                                                                                   uniforms)
        return ActOutput(actions, self.head.log_prob(params, actions), values)

    def draw(self, params: torch.Tensor) -> torch.Tensor | None:
        """The random numbers `sampled` takes at these policy-head outputs, drawn now from torch's generator; None
        where the head does not draw them apart (only a categorical head does). A population draws each member's
        from the member's own stream, then samples for all members in one call on their stacked rows."""
        draw = getattr(self.head, "draw", None)
        return None if draw is None else draw(params)

    def policy_params(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy head's output (log-probs or means) at these states: for KL terms between policies."""
        return self.head(self.pi_body(self._policy_inputs(self.encoder(obs))))

    def _policy_inputs(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.policy_size is None else x[..., :self.policy_size]

    def _values(self, v: torch.Tensor) -> torch.Tensor:
        """[B] for one value head, [B, value_outputs] for several."""
        values = self.value_head(v)
        return values.squeeze(-1) if self.value_outputs == 1 else values

    def value(self, obs: torch.Tensor, state: RecurrentState | None = None) -> torch.Tensor:
        _, v = self._features(obs)
        return self._values(v)

    def _policy(self, pi: torch.Tensor, action_mask: torch.Tensor | None) -> torch.Tensor:
        params = self.head(pi)
        return params if action_mask is None else masked_policy(self.head, params, action_mask)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor, action_mask: torch.Tensor | None = None) -> EvalOutput:
        """Log-probs, entropies and values; with `action_mask`, of the policy restricted to the valid actions."""
        pi, v = self._features(obs)
        params = self._policy(pi, action_mask)
        return EvalOutput(
            self.head.log_prob(params, actions), self.head.entropy(params), self._values(v)
        )


@ACTORS.register("mlp", spec=NetworkSpec(sde=True))
def build_mlp_actor(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    normalize_obs: bool = False,
    clip_obs: float = 10.0,
    heads: Literal["actor_critic", "recipe"] = "actor_critic",
    hidden_sizes: list[int] = (64, 64),  # type: ignore[assignment]
    activation: Activation = "tanh",
    shared: bool = False,
    ortho_init: bool = True,
    log_std_init: float | None = None,
    full_std: bool = True,
    use_expln: bool = False,
    obs_extractor: list[int] = (),  # type: ignore[assignment]
    act_extractor: list[int] = (),  # type: ignore[assignment]
    value_outputs: int = 1,
    use_sde: bool = False,
) -> ActorCritic | PerAgentActorCritic | Any:
    """An ActorCritic for on-policy algorithms (one per agent, PerAgentActorCritic, where env.share_params=false), or
    a NetworkRecipe from which off-policy ones build heads.
    `log_std_init` None: SB3's default for the policy that uses it (0 for on-policy Gaussians, -3 for SAC's gSDE).
    `use_sde` comes from the algorithm's `algo.use_sde` (gSDE); `full_std` and `use_expln` shape its noise."""
    if isinstance(observation_space, PackedDict):
        raise ConfigError("the env's Dict observations hold images: use actor=combined (a CNN for each image, the "
                          "other entries concatenated), not actor=mlp")
    if not isinstance(observation_space, gym.spaces.Box):
        raise ConfigError(
            f"actor=mlp needs a Box observation space (Discrete, MultiDiscrete and Dict ones are turned into one); "
            f"the env has {type(observation_space).__name__}: wrap it in gymnasium.wrappers.TransformObservation "
            "to a Box in your own module")
    for key, sizes in (("hidden_sizes", hidden_sizes), ("obs_extractor", obs_extractor),
                       ("act_extractor", act_extractor)):
        require(all(h > 0 for h in sizes), f"actor.{key}", list(sizes), "sizes must be > 0")
    if heads == "recipe":  # off-policy algorithms build their own heads on this torso
        obs_dim = int(np.prod(observation_space.shape))
        normalizer = RunningNorm(tuple(observation_space.shape), clip=clip_obs, enabled=normalize_obs)
        return NetworkRecipe(obs_dim, list(hidden_sizes), activation, ortho_init, normalizer, list(obs_extractor),
                             list(act_extractor), log_std_init=log_std_init, sde=SdeOptions(full_std, use_expln),
                             agents=separate_agents(observation_space))
    if obs_extractor or act_extractor:
        raise ConfigError("actor.obs_extractor and actor.act_extractor shape off-policy networks; on-policy "
                          "algorithms use actor.hidden_sizes (and actor.shared)")

    def build() -> ActorCritic:
        return ActorCritic(
            observation_space, action_space, list(hidden_sizes), activation, shared, ortho_init,
            0.0 if log_std_init is None else log_std_init, normalize_obs, clip_obs, value_outputs,
            sde=SdeOptions(full_std, use_expln) if use_sde else None,
            policy_size=getattr(observation_space, "policy_size", None),  # a centralized critic (envs/multiagent.py)
        )

    layout = separate_agents(observation_space)
    if layout is None:
        return build()
    if use_sde:
        setting, undo = setting_of(layout)
        raise ConfigError(f"algo.use_sde=true has no per-agent version ({setting}): use algo.use_sde=false, or "
                          f"{undo}")
    if layout.id_start is None:
        raise ConfigError("env.share_params=false with env.joint=true is for algo=vdn, qmix, masac, maddpg; "
                          "on-policy algorithms take one row per agent: set env.joint=false")
    return PerAgentActorCritic([build() for _ in range(layout.copies)], layout)
