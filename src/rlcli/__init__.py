"""rlcli: a config-driven reinforcement-learning trainer, from the shell (`rl-train algo=ppo env=CartPole-v1`) or
from Python:

    import rlcli

    run = rlcli.train(algo="ppo", env="CartPole-v1", train={"total_steps": 50_000})
    policy = rlcli.load(run.run_dir, load="best")      # or run.load("best")
    action, state = policy.predict(obs)                 # one observation or a batch (from policy.make_env())
    rlcli.evaluate(policy, episodes=10).mean_return     # what rl-eval reports
    rlcli.export(policy, "onnx")                        # what rl-eval export=onnx writes

- train(overrides, env=, callbacks=, resume=, more_steps=, policy_kwargs=, **settings) -> Run: a run as rl-train
  makes it; env= a name, a function, an env instance or a VectorEnv; run.save(path) writes its policy to a file.
- load(run dir | checkpoint | saved file, load="best"|"last"|<env steps>, device=, env=) -> Policy, with predict()
  (on the env's own observations too), save() and make_env().
- evaluate(policy, env=, episodes=, seed=, video=) -> Evaluation: per-episode returns and lengths.
- export(policy, format="onnx"|"torchscript") -> Path: a standalone, checked policy file.
- Callback / RunContext: code of yours at the loop's points (after a collect, an update, a test phase, a
  checkpoint), able to log scalars, read the agent and stop the run cleanly.
- RlcliError: bad input or a failed run, in one line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlcli.entry.api import Policy, RlcliError, Run, load, train
    from rlcli.entry.api_evaluate import Evaluation, evaluate, export
    from rlcli.run.callbacks import Callback, RunContext

__version__ = "0.1.0"
__all__ = ["Callback", "Evaluation", "Policy", "RlcliError", "Run", "RunContext", "evaluate", "export", "load",
           "train", "__version__"]
# Imported when first used (PEP 562): the console scripts import rlcli.entry.cli, which installs the signal handlers
# before anything else loads, so a Ctrl-C at the very start of rl-train is one line too, not a traceback.
_HOMES = ({"Callback": "rlcli.run.callbacks", "RunContext": "rlcli.run.callbacks"}
          | dict.fromkeys(("Policy", "RlcliError", "Run", "load", "train"), "rlcli.entry.api")
          | dict.fromkeys(("Evaluation", "evaluate", "export"), "rlcli.entry.api_evaluate"))


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'rlcli' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
