"""C51 (Bellemare et al. 2017, "A Distributional Perspective on Reinforcement Learning"): the Q-network predicts,
for each action, a categorical distribution over `n_atoms` fixed returns from `v_min` to `v_max`; it learns by
cross-entropy toward the target network's distribution of the greedy next action, shifted by the reward and
discount and projected back onto the atoms. Actions are chosen by the distributions' means. As CleanRL's c51.py.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch

from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.algos.dqn import DQN
from rlcli.contracts import AlgoSpec
from rlcli.registry import ALGOS, require


def categorical_projection(probs: torch.Tensor, targets: torch.Tensor, atoms: torch.Tensor) -> torch.Tensor:
    """The distribution with mass `probs` [B, n] at the returns `targets` [B, n], moved onto the fixed `atoms`
    [n]: each target (clipped to the atoms' range) splits its mass between its two neighbouring atoms in
    proportion to closeness. Written as the triangle kernel max(0, 1 - |target - atom| / spacing), which is that
    split and needs no scatter (so it also runs under a population's vmap)."""
    spacing = atoms[1] - atoms[0]
    clipped = targets.clamp(atoms[0], atoms[-1])
    weights = (1.0 - (clipped.unsqueeze(-1) - atoms).abs() / spacing).clamp_min(0.0)  # [B, n targets, n atoms]
    return (probs.unsqueeze(-1) * weights).sum(-2)


@ALGOS.register("c51", spec=AlgoSpec(on_policy=False, action_spaces=("Discrete",), networks=("mlp", "cnn"),
                                     compiles=True, population="lockstep"))
class C51(DQN):
    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        n_atoms: int = 51,  # fixed returns (atoms) of each action's distribution
        v_min: float = -10.0,  # the atoms span [v_min, v_max]: set it to the env's range of returns
        v_max: float = 10.0,
        lr: float = 2.5e-4,
        max_grad_norm: float | None = None,
        **dqn_settings: Any,
    ) -> None:
        """The paper's atoms (51 over [-10, 10]) and CleanRL's lr and no clipping, where they differ from DQN's
        (conf/algo/c51.yaml says the same)."""
        require(n_atoms >= 2, "algo.n_atoms", n_atoms, "must be >= 2")
        require(v_min < v_max, "algo.v_min", v_min, f"must be below algo.v_max={v_max}")
        require(not dqn_settings.get("dueling", False), "algo.dueling", True, "is not built for C51's distributions")
        require(dqn_settings.get("loss", "huber") == "huber", "algo.loss", dqn_settings.get("loss"),
                "C51 always learns by cross-entropy to the projected target distribution")
        self.n_atoms = n_atoms
        super().__init__(recipe, action_space, num_envs, lr=lr, max_grad_norm=max_grad_norm, **dqn_settings)
        self.atoms = torch.linspace(v_min, v_max, n_atoms)

    def outputs_per_action(self) -> int:
        return self.n_atoms

    def atoms_on(self, device: torch.device) -> torch.Tensor:
        """The atoms on the networks' device, moved there once (not copied at every call on a GPU)."""
        if self.atoms.device != device:
            self.atoms = self.atoms.to(device)
        return self.atoms

    def log_probs(self, obs: torch.Tensor, target: bool = False) -> torch.Tensor:
        """[B, actions, atoms] log-probabilities of the online (or target) network."""
        out = (self.networks.q_target if target else self.networks.q)(obs)
        return out.view(out.shape[0], self.n_actions, self.n_atoms).log_softmax(-1)

    def q_values(self, obs: torch.Tensor, target: bool = False) -> torch.Tensor:
        return (self.log_probs(obs, target).exp() * self.atoms_on(obs.device)).sum(-1)

    def transition_loss(self, batch: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Cross-entropy to the projected target distribution; each transition's cross-entropy is its PER
        priority (as Rainbow's), and the mean Q of the actions taken is logged."""
        atoms = self.atoms_on(batch.obs.device)
        rows = torch.arange(batch.obs.shape[0], device=batch.obs.device)
        with torch.no_grad():
            next_probs = self.log_probs(batch.next_obs, target=True).exp()
            # the greedy next action by mean return: of the target net, or (double) of the online net
            chooser = self.q_values(batch.next_obs) if self.double else (next_probs * atoms).sum(-1)
            next_taken = next_probs[rows, chooser.argmax(-1)]  # [B, atoms]
            targets = self.reward_scale * batch.rewards.unsqueeze(-1) + batch.discounts.unsqueeze(-1) * atoms
            target_probs = categorical_projection(next_taken, targets, atoms)
        taken = self.log_probs(batch.obs)[rows, batch.actions.long()]  # [B, atoms]
        per_sample = -(target_probs * taken).sum(-1)
        q_taken = (taken.detach().exp() * atoms).sum(-1)
        return (batch.weights * per_sample).mean(), (per_sample.detach(), q_taken.mean())
