"""What a run's budget really is (whole collect phases), and what a user should hear about it before training."""

from __future__ import annotations

import os

from rlcli.collectors.ray_settings import ray_settings
from rlcli.contracts import OffPolicyLearner
from rlcli.run.build import Components

# A -m sweep says its jobs' budget warnings once, before its first job (entry/rl_train.precheck_sweep); its jobs then
# write them to their train.log only. The environment carries this to the jobs' processes (joblib's workers).
SAID_BY_SWEEP = "RLCLI_SWEEP_SAID_BUDGET_WARNINGS"


def said_by_the_sweep() -> bool:
    return os.environ.get(SAID_BY_SWEEP) == "1"


def planned_steps(c: Components, env_steps: int) -> int:
    """Where the run ends at the latest: whole collect phases from `env_steps` until train.total_steps."""
    per_phase = c.steps_per_phase
    todo = max(0, c.settings.total_steps - env_steps)
    return env_steps + -(-todo // per_phase) * per_phase


BUDGET_KEYS = ("train.total_steps", "algo.n_steps", "train.num_envs", "algo.train_freq")


def budget_warnings(c: Components, planned: int, typed: set[str] | None = None) -> list[str]:
    """What a user should know before a run whose budget does not do what it says. The rounding to whole collect
    phases is said only when the user typed one of its settings (`typed`: the command line's keys; None: always),
    so a shipped tuned config does not warn about itself, and only when it adds more than 1% to the budget."""
    s, algo, warnings = c.settings, c.algo, []
    per_phase = c.steps_per_phase
    rays = ray_settings(c.cfg)
    unused = rays.unused_num_envs(c.cfg.train.num_envs) if rays is not None else None
    if unused and (typed is None or "train.num_envs" in typed):
        warnings.append(f"{unused} (drop collector.envs_per_worker to split train.num_envs over the workers)")
    if c.offline is not None:  # gradient steps: a loop iteration is algo.gradient_steps of them
        if planned - s.total_steps > 0.01 * s.total_steps and (typed is None or "train.total_steps" in typed
                                                               or "algo.gradient_steps" in typed):
            warnings.append(f"train.total_steps={s.total_steps:,} is not a whole number of loop iterations "
                            f"(algo.gradient_steps={per_phase:,} each): the run takes {planned:,} gradient steps")
        return warnings
    # a rounding of at most 1% of the budget (100,000 -> 100,096) is not worth a line: SB3 rounds up the same way
    material = planned - s.total_steps > 0.01 * s.total_steps
    if material and (typed is None or any(key in typed for key in BUDGET_KEYS)):
        phase = "one rollout" if c.spec.on_policy else "one collect phase"
        what = f"{phase} is {algo.steps_per_collect:,} x {s.num_envs} envs"
        key = "algo.n_steps" if c.spec.on_policy else "algo.train_freq"
        fix = (f"; for exactly {s.total_steps:,}, {key}={s.total_steps // s.num_envs}" if s.total_steps < per_phase
               and s.total_steps % s.num_envs == 0 else f"; {key} x train.num_envs dividing it trains exactly that")
        warnings.append(f"train.total_steps={s.total_steps:,} is not a whole number of collect phases ({what} = "
                        f"{per_phase:,} env steps): the run takes {planned:,} env steps{fix}")
    learner = c.learner
    # its first update comes after the first collect phase that reaches learning_starts (trainer.learning_started)
    if isinstance(learner, OffPolicyLearner) and (starts := learner.algo.learning_starts) > planned - per_phase:
        learns = "never learns" if starts > planned else "learns only after its last collect phase"
        warnings.append(f"algo.learning_starts={starts:,} {'>' if starts > planned else '<='} the run's {planned:,} "
                        f"env steps: it acts randomly throughout and {learns}; lower algo.learning_starts or raise "
                        "train.total_steps")
    return warnings
