"""Checked by mypy (see pyproject's [tool.mypy] files), not run by pytest: every built-in algorithm
satisfies the Protocol of its kind, as contracts.py declares it."""

from rlcli.algos.a2c import A2C
from rlcli.algos.crossq import CrossQ
from rlcli.algos.dqn import DQN
from rlcli.algos.maskable_ppo import MaskablePPO
from rlcli.algos.pg import PolicyGradient
from rlcli.algos.ppo import PPO
from rlcli.algos.pqn import PQN
from rlcli.algos.qrdqn import QRDQN
from rlcli.algos.rnd import RNDPPO
from rlcli.algos.sac import SAC
from rlcli.algos.td3 import TD3
from rlcli.algos.tqc import TQC
from rlcli.algos.trpo import TRPO
from rlcli.contracts import MaskedPolicy, OffPolicyAlgorithm, OnPolicyAlgorithm


def on_policy(ppo: PPO, a2c: A2C, pg: PolicyGradient, rnd: RNDPPO, trpo: TRPO,
              maskable: MaskablePPO, pqn: PQN) -> list[OnPolicyAlgorithm]:
    return [ppo, a2c, pg, rnd, trpo, maskable, pqn]


def masked(maskable: MaskablePPO) -> list[MaskedPolicy]:
    return [maskable]


def off_policy(dqn: DQN, sac: SAC, td3: TD3, qrdqn: QRDQN, tqc: TQC, crossq: CrossQ) -> list[OffPolicyAlgorithm]:
    return [dqn, sac, td3, qrdqn, tqc, crossq]
