"""PPO with invalid-action masking (sb3-contrib's MaskablePPO; Huang & Ontañón 2020).

The env says which actions are valid at each step (envs/masks.py reads its convention). Acting,
the stored log-probabilities and the update all use the policy restricted to those actions: the
logits of invalid actions are pushed to a finite minus infinity before the softmax, so they are
never sampled, get no probability mass, and add nothing to the entropy. Everything else is PPO.
"""

from __future__ import annotations

import torch

from rlcli.algos.ppo import PPO
from rlcli.contracts import ActOutput, AlgoSpec
from rlcli.registry import ALGOS

MASKED = AlgoSpec(on_policy=True, action_spaces=("Discrete", "MultiDiscrete"), networks=("mlp", "cnn"),
                  action_masks=True, compiles=True, population="on_policy")


@ALGOS.register("maskable_ppo", spec=MASKED)
class MaskablePPO(PPO):
    @torch.inference_mode()
    def act_masked(self, obs: torch.Tensor, action_mask: torch.Tensor, deterministic: bool = False) -> ActOutput:
        return self.networks.act(obs, deterministic, action_mask=action_mask)
