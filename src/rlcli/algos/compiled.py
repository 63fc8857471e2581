"""`compile=true`: a whole gradient step (loss, gradients, grad-norm clip and the optimizer) as one compiled graph.

Compiling only the loss gains nothing on small networks: the time goes to autograd's backward, the clip
and the optimizer's Python. So the step is written as a pure function of the parameters, the optimizer's
state and the batch (`torch.func.grad_and_value` over `functional_call`, the optimizer's formula by hand:
Adam, A2C's RMSprop or PQN's RAdam) and compiled whole with torch.compile. The parameters and the optimizer's state
stay where they are (the networks, the optimizer's own state, in torch.optim's layout): each step reads
them and copies the results back, so checkpoints, resume and the eager path are unchanged. An algorithm
with several optimizers (SAC's critics and policy) compiles one step per optimizer.

Inductor's caches go to `$XDG_CACHE_HOME/rlcli/torchinductor` (`~/.cache/...`) unless
TORCHINDUCTOR_CACHE_DIR is set: the second run with the same shapes (another seed, a sweep's next job)
loads the compiled kernels instead of building them again.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlcli.algos.isa_probe import remember_isa_probes


def cache_dir() -> Path:
    """Where torch.compile's on-disk caches live for rlcli runs (set before the first compile)."""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen and not _is_torch_default(chosen):  # the user's choice (torch writes its own default in here too)
        return Path(chosen)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = base / "rlcli" / "torchinductor"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path


# dynamo's graphs per compiled function (and over all functions) that one process may hold: see before_compiling
RECOMPILE_LIMIT, ACCUMULATED_RECOMPILE_LIMIT = 256, 4096


def before_compiling() -> Path:
    """Set up a process for rlcli's compiled steps: the on-disk cache (`cache_dir`), and room for many graphs of one
    step function. Every compiled step of a kind runs one Python function (`CompiledStep._pure_step`, a population's
    `CompiledMembersStep._pure_step`), and each distinct configuration (shapes, clip or none, optimizer groups,
    deterministic mode) is another graph of it. Torch keeps 8 per function, then runs the function eagerly from there
    on, with one warning: a basic-launcher sweep of 10 compile=true jobs differing in algo.max_grad_norm (then a
    constant of the graph) ran its 9th and 10th jobs eagerly (measured here, 2026-11-26). Inductor's deterministic
    flag follows torch's; its check of the CPU's vector instruction sets is answered from disk after the first process
    (isa_probe.py). Returns the cache directory."""
    import torch._dynamo.config as dynamo
    import torch._inductor.config as inductor

    # what torch.use_deterministic_algorithms would have set (services/runtime.set_deterministic leaves it to here)
    inductor.deterministic = torch.are_deterministic_algorithms_enabled()
    dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, ACCUMULATED_RECOMPILE_LIMIT)
    use_fast_tanh()
    remember_isa_probes()
    return cache_dir()


def use_fast_tanh() -> None:
    """Compiled CPU kernels compute tanh as 2 / (1 + exp(-2x)) - 1, torch's own option (off by default since
    torch 2.7, for one user's tanh fed to atan2): within 2e-7 of tanh, the error absolute (so relative near 0),
    where torch's vectorized tanh is 1-ULP accurate and about 2.7x slower here (220 us against 81 us for
    8 x 256 x 64 floats). An MLP's activations do not need tanh's last bits: a population of 4 PPO CartPole
    members' compiled update took about a fifth less time. TORCHINDUCTOR_CPP_USE_DECOMPOSE_TANH, when set, is the
    user's choice (0: torch's tanh), read again at each compiled step's set-up."""
    import torch._inductor.config as inductor

    if hasattr(inductor.cpp, "use_decompose_tanh"):
        inductor.cpp.use_decompose_tanh = os.environ.get(FAST_TANH_VARIABLE, "1") == "1"


FAST_TANH_VARIABLE = "TORCHINDUCTOR_CPP_USE_DECOMPOSE_TANH"


class LazilyCompiled:
    """`torch.compile(function)`, set up at its first call: building a compiled step then costs nothing, so that
    rl-train's pre-check of a compile=true sweep (which builds a job's components and discards them) does not
    import torch's compiler stack (dynamo, inductor, sympy: 2.1 s of the sweep's start-up here, before any job
    began).

    On a GPU the step is also captured as a CUDA graph (torch.compile's mode="reduce-overhead", LeanRL's recipe): a
    step is then one graph launch instead of one launch per kernel, which is where a small network's step spends its
    time on a GPU. The graph's outputs live in memory the next launch overwrites, so a caller copies out what it
    keeps (`owned`) before calling again. RLCLI_CUDA_GRAPHS=0 compiles without graphs (to compare, or where a driver
    misbehaves); =capture, a single run's steps are captured by rlcli instead (CompiledStep). `graphs` says which it
    chose (None before the first call)."""

    def __init__(self, function: Callable[..., Any], graphs: bool | None = None) -> None:
        self.function = function
        self.compiled: Callable[..., Any] | None = None
        self.graphs = graphs  # None: chosen at the first call (False: the caller captures the step itself)

    def __call__(self, *args: Any) -> Any:
        if self.compiled is None:
            before_compiling()
            if self.graphs is None:
                self.graphs = cuda_graphs_wanted(args)
            mode = "reduce-overhead" if self.graphs else None
            self.compiled = torch.compile(self.function, dynamic=False, mode=mode)
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous call's outputs are copied out by now
        return self.compiled(*args)

    def owned(self, outputs: Any) -> Any:
        """`outputs` the caller may keep past the next call: copies of the graph's tensors under CUDA graphs."""
        if not self.graphs:
            return outputs
        return torch.utils._pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, outputs)


CUDA_GRAPHS_VARIABLE = "RLCLI_CUDA_GRAPHS"  # 1 (the default): torch's graphs; 0: none; capture: rlcli's by hand


def cuda_graphs_setting() -> str:
    """RLCLI_CUDA_GRAPHS: 1 (unset: torch's graphs), 0 (none) or capture; anything else is a one-line error."""
    from rlcli.registry import ConfigError

    value = os.environ.get(CUDA_GRAPHS_VARIABLE, "1")
    if value not in ("0", "1", "capture"):
        raise ConfigError(f"{CUDA_GRAPHS_VARIABLE}={value!r}: choose 1 (torch.compile's CUDA graphs, the default), 0 "
                          "(none) or capture (rlcli's, by hand)")
    return value


def captured_by_hand() -> bool:
    """RLCLI_CUDA_GRAPHS=capture: a single run's compiled steps are captured by rlcli (cuda_graph.py) instead of by
    torch.compile's mode="reduce-overhead". Not yet the default: written on 2026-11-28 when no GPU was lent to check
    it; tests/test_cuda.py checks it against uncaptured steps, and scripts/cuda_speed.py's sac-compiled-capture row
    measures it."""
    return cuda_graphs_setting() == "capture"


def cuda_graphs_wanted(args: Any) -> bool:
    """Whether a compiled step over `args` is captured as a CUDA graph: its tensors are on a GPU, and
    RLCLI_CUDA_GRAPHS is not 0."""
    if cuda_graphs_setting() == "0":
        return False
    leaves = torch.utils._pytree.tree_leaves(args)
    return any(isinstance(x, torch.Tensor) and x.is_cuda for x in leaves)


def _is_torch_default(path: str) -> bool:
    """torch's inductor sets TORCHINDUCTOR_CACHE_DIR to its per-user temp folder whenever it first asks for a
    cache (building torch.optim.RMSprop does): that is not a user's choice."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # another torch's layout: take the variable as the user's
        return False
    return os.path.abspath(path) == os.path.abspath(default_cache_dir())


class NetworksCall(nn.Module):
    """A function of the networks (a loss, a population's acting) as a module call, so that `functional_call` can
    substitute their parameters (those of a compiled step's graph inputs, or a population member's)."""

    def __init__(self, networks: nn.Module, function: Callable[..., Any]) -> None:
        super().__init__()
        self.networks = networks
        self._function = (function,)  # a tuple, not a submodule: the networks are registered once, above

    @property
    def function(self) -> Callable[..., Any]:
        return self._function[0]

    def forward(self, *args: Any) -> Any:
        return self._function[0](*args)


class _AdamRule:
    """torch's Adam (FusedAdam's state: step, exp_avg, exp_avg_sq), by hand."""

    slots = ("exp_avg", "exp_avg_sq")

    def __init__(self, optimizer: Any) -> None:
        group = optimizer.param_groups[0]  # betas and eps are the same in every group rlcli makes
        self.hyper = torch.tensor([*group["betas"], group["eps"]], dtype=torch.float32)
        self.optimizer = optimizer

    def state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = self.optimizer._state(p)
        return state

    @staticmethod
    def apply(params: list[torch.Tensor], grads: list[torch.Tensor], slots: list[list[torch.Tensor]],
              step: torch.Tensor, lrs: list[torch.Tensor], hyper: torch.Tensor) -> tuple[list[Any], list[Any]]:
        beta1, beta2, eps = hyper[0], hyper[1], hyper[2]
        new_step = step + 1
        bias1 = 1 - beta1 ** new_step
        bias2_sqrt = torch.sqrt(1 - beta2 ** new_step)
        new_params, new_m, new_v = [], [], []
        for p, g, m, v, lr in zip(params, grads, slots[0], slots[1], lrs, strict=True):
            m = torch.lerp(m, g, 1 - beta1)
            v = v * beta2 + (1 - beta2) * g * g
            new_params.append(p - (lr / bias1) * m / (v.sqrt() / bias2_sqrt + eps))
            new_m.append(m)
            new_v.append(v)
        return new_params, [new_m, new_v]


class _TorchLayoutRule:
    """A rule whose state is a torch.optim optimizer's own (per parameter: a float32 step and the slots)."""

    slots: tuple[str, ...]
    optimizer: Any  # torch.optim's, or rlcli's RMSprop or RAdam of the same layout (algos/optim.py)

    def state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        """p's state, made as the optimizer's own first step makes it, so that the eager path and checkpoints
        agree."""
        state: dict[str, torch.Tensor] = self.optimizer.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            for name in self.slots:
                state[name] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state


class _RMSpropRule(_TorchLayoutRule):
    """RMSprop without momentum or centering (A2C's, SB3's TF-like settings), by hand: torch.optim.RMSprop's
    formula and state, which rlcli's RMSprop (algos/optim.py) shares."""

    slots = ("square_avg",)

    def __init__(self, optimizer: Any) -> None:  # torch.optim.RMSprop or rlcli's (algos/optim.py)
        from rlcli.registry import ConfigError

        group = optimizer.param_groups[0]
        if group["momentum"] or group["centered"] or group["weight_decay"] or group["maximize"]:
            raise ConfigError("compile=true covers RMSprop without momentum, centering or weight decay only")
        self.hyper = torch.tensor([group["alpha"], group["eps"]], dtype=torch.float32)
        self.optimizer = optimizer

    @staticmethod
    def apply(params: list[torch.Tensor], grads: list[torch.Tensor], slots: list[list[torch.Tensor]],
              step: torch.Tensor, lrs: list[torch.Tensor], hyper: torch.Tensor) -> tuple[list[Any], list[Any]]:
        alpha, eps = hyper[0], hyper[1]
        new_params, new_avg = [], []
        for p, g, avg, lr in zip(params, grads, slots[0], lrs, strict=True):
            avg = avg * alpha + (1 - alpha) * g * g
            new_params.append(p - lr * g / (avg.sqrt() + eps))
            new_avg.append(avg)
        return new_params, [new_avg]


class _RAdamRule(_TorchLayoutRule):
    """torch.optim.RAdam (PQN's, CleanRL's choice) without weight decay, by hand: Adam's moments, then the
    variance rectification once its approximated SMA length passes 5, plain bias-corrected momentum before."""

    slots = ("exp_avg", "exp_avg_sq")

    def __init__(self, optimizer: Any) -> None:
        from rlcli.registry import ConfigError

        group = optimizer.param_groups[0]
        if group["weight_decay"] or group["maximize"]:
            raise ConfigError("compile=true covers RAdam without weight decay only")
        self.hyper = torch.tensor([*group["betas"], group["eps"]], dtype=torch.float32)
        self.optimizer = optimizer

    @staticmethod
    def apply(params: list[torch.Tensor], grads: list[torch.Tensor], slots: list[list[torch.Tensor]],
              step: torch.Tensor, lrs: list[torch.Tensor], hyper: torch.Tensor) -> tuple[list[Any], list[Any]]:
        beta1, beta2, eps = hyper[0], hyper[1], hyper[2]
        new_step = step + 1
        bias1, bias2 = 1 - beta1 ** new_step, 1 - beta2 ** new_step
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * new_step * beta2 ** new_step / bias2
        rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)).clamp_min(0).sqrt()
        rectified = rho_t > 5.0
        new_params, new_m, new_v = [], [], []
        for p, g, m, v, lr in zip(params, grads, slots[0], slots[1], lrs, strict=True):
            m = torch.lerp(m, g, 1 - beta1)
            v = v * beta2 + (1 - beta2) * g * g
            adaptive = torch.where(rectified, rect * bias2.sqrt() / (v.sqrt() + eps), 1.0)
            new_params.append(p - m / bias1 * lr * adaptive)
            new_m.append(m)
            new_v.append(v)
        return new_params, [new_m, new_v]


OptimizerRule = _AdamRule | _RMSpropRule | _RAdamRule


def optimizer_rule(optimizer: Any) -> OptimizerRule:
    """The optimizer's formula by hand, reading and writing its own state (a population's compiled step applies it
    to stacked members, sweeps/population/compiled.py)."""
    from rlcli.algos.optim import FusedAdam, RAdam, RMSprop
    from rlcli.registry import ConfigError

    if isinstance(optimizer, FusedAdam):
        return _AdamRule(optimizer)
    if isinstance(optimizer, (torch.optim.RMSprop, RMSprop)):
        return _RMSpropRule(optimizer)
    if isinstance(optimizer, (torch.optim.RAdam, RAdam)):
        return _RAdamRule(optimizer)
    # the step reads and writes FusedAdam's (or the torch-layout RMSprop's and RAdam's) state
    raise ConfigError("compile=true needs torch's fused Adam kernel, which this torch build lacks")


class CompiledStep:
    """One optimizer step of `loss(*args) -> (loss, aux)` over the parameters of `networks` that `optimizer`
    trains (the others, such as a target network's or, for a policy's step, the critics', are read as they
    are), compiled whole.

    Numerically the same update as zero_grad -> backward -> clip_grad_norm_ -> optimizer.step, up to
    floating-point reordering (the tests compare runs within a stated tolerance). Randomness belongs
    outside: a loss that samples takes its noise as an argument, drawn eagerly from the run's stream.
    `updates_buffers`: the loss updates buffers in place (CrossQ's batch-renorm running statistics), so the
    networks' buffers go in as inputs of the differentiated function (a grad transform may not mutate what it
    captured) and the compiled graph writes them back."""

    def __init__(self, networks: nn.Module, optimizer: Any, loss: Callable[..., Any],
                 updates_buffers: bool = False) -> None:
        self.rule = optimizer_rule(optimizer)
        self.module = NetworksCall(networks, loss)
        self.optimizer = optimizer
        group_of = {id(p): i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}
        trained = [(n, p) for n, p in networks.named_parameters() if id(p) in group_of]
        if len(trained) != len(group_of):
            raise ValueError("compile: the optimizer trains parameters outside the networks")
        self.names = [f"networks.{n}" for n, _ in trained]
        self.params = [p for _, p in trained]
        self.group = [group_of[id(p)] for p in self.params]
        self.networks, self.updates_buffers = networks, updates_buffers
        # every tensor of the graph on the parameters' device: on a GPU, CPU hyperparameters and learning rates
        # made inductor pass host scalars to its kernels, and the launch failed ("CUDA driver error: invalid
        # argument", seen on an H200 with torch 2.11)
        self.device = self.params[0].device
        self.hyper = self.rule.hyper.to(self.device)
        self._step = LazilyCompiled(self._pure_step)
        self.graphed: Any = None  # cuda_graph.GraphedStep, where RLCLI_CUDA_GRAPHS=capture (made at the first call)
        self._buffer_names: list[str] = []
        self._lrs_key: tuple[float, ...] = ()
        self._lrs = torch.zeros(0)
        self.compile_seconds: float | None = None  # the first call: tracing and compiling (or loading the cache)

    def __deepcopy__(self, memo: dict[int, Any]) -> CompiledStep:
        """A copy over the copied networks, optimizer and loss: a copied torch.compile wrapper would still run this
        step's module (a deep-copied algorithm would train through the original's other weights)."""
        return CompiledStep(copy.deepcopy(self.networks, memo), copy.deepcopy(self.optimizer, memo),
                            copy.deepcopy(self.module.function, memo), self.updates_buffers)

    def _pure_step(self, params: list[torch.Tensor], slots: list[list[torch.Tensor]], step: torch.Tensor,
                   lrs: torch.Tensor, hyper: torch.Tensor, buffers: dict[str, torch.Tensor],
                   max_grad_norm: torch.Tensor | None, args: tuple[Any, ...]) -> tuple[Any, ...]:
        def loss_of(flat: list[torch.Tensor], buffers: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
            loss, aux = torch.func.functional_call(self.module, dict(zip(self.names, flat, strict=True)) | buffers,
                                                   args, strict=False)
            return loss, aux

        grads, (loss, aux) = torch.func.grad_and_value(loss_of, has_aux=True)(params, buffers)
        if max_grad_norm is not None:  # clip_grad_norm_'s formula
            total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
            coef = torch.clamp(max_grad_norm / (total + 1e-6), max=1.0)
            grads = [g * coef for g in grads]
        new_params, new_slots = self.rule.apply(params, grads, slots, step, [lrs[g] for g in self.group], hyper)
        return new_params, new_slots, loss.detach(), aux

    def __call__(self, max_grad_norm: torch.Tensor | None, *args: Any) -> tuple[torch.Tensor, Any]:
        """One step; `max_grad_norm` (a 0-dim tensor on the parameters' device, or None: no clip) and the
        arguments that schedules change are tensors, so that a new value is not a new graph. On a GPU with
        RLCLI_CUDA_GRAPHS=capture, one replay of the step's CUDA graph captured by hand (cuda_graph.py), where every
        tensor it keeps is on the GPU (A2C's and PQN's optimizers count their steps on the CPU, as torch's do: theirs
        stay with torch's graphs)."""
        states = [self.rule.state(p) for p in self.params]
        slots = [[s[name] for s in states] for name in self.rule.slots]
        steps = [s["step"] for s in states]
        lrs = self._learning_rates()
        first = self.compile_seconds is None
        started = time.perf_counter()
        with torch.no_grad():
            params = [p.detach() for p in self.params]
            buffers = ({f"networks.{n}": b for n, b in self.networks.named_buffers()} if self.updates_buffers
                       else {})  # read each step: they are the modules' own tensors, updated in place
            fixed = ([*params, *(t for slot in slots for t in slot), *steps, *buffers.values()]
                     if first or self.graphed is not None else [])  # built only where a capture reads it
            if first and captured_by_hand() and cuda_graphs_wanted(fixed) and all(t.is_cuda for t in fixed):
                from rlcli.algos.cuda_graph import GraphedStep

                self._step.graphs = False  # compiled plainly, and captured whole by GraphedStep
                self._buffer_names = list(buffers)
                self.graphed = GraphedStep(self._fixed_step)
            if self.graphed is not None:
                loss, aux = self.graphed(fixed, (lrs, max_grad_norm, args), self._capture_context())
            else:
                loss, aux = self._step.owned(self._apply(params, slots, steps, buffers, lrs, max_grad_norm, args))
        if first:
            self.compile_seconds = time.perf_counter() - started
            logging.getLogger("rlcli").info(
                "compile: the first compiled update took %.1f s (tracing, and compiling or loading from the cache %s)",
                self.compile_seconds, cache_dir())
        return loss, aux

    def _apply(self, params: list[torch.Tensor], slots: list[list[torch.Tensor]], steps: list[torch.Tensor],
               buffers: dict[str, torch.Tensor], lrs: torch.Tensor, max_grad_norm: torch.Tensor | None,
               args: tuple[Any, ...]) -> tuple[torch.Tensor, Any]:
        """The compiled step, its results written into the parameters and the optimizer's state."""
        new_params, new_slots, loss, aux = self._step(params, slots, steps[0].to(self.device), lrs, self.hyper,
                                                      buffers, max_grad_norm, args)
        torch._foreach_copy_(params, new_params)
        for old, new in zip(slots, new_slots, strict=True):
            torch._foreach_copy_(old, new)
        torch._foreach_add_(steps, 1)
        return loss, aux

    def _fixed_step(self, fixed: list[torch.Tensor], moving: tuple[Any, ...]) -> tuple[torch.Tensor, Any]:
        """`_apply` over `__call__`'s flat list of the tensors a CUDA graph reads and writes in place."""
        n, k = len(self.params), len(self.rule.slots)
        slots = [fixed[n * (i + 1):n * (i + 2)] for i in range(k)]
        buffers = dict(zip(self._buffer_names, fixed[n * (k + 2):], strict=True))
        lrs, max_grad_norm, args = moving
        return self._apply(fixed[:n], slots, fixed[n * (k + 1):n * (k + 2)], buffers, lrs, max_grad_norm, args)

    def _capture_context(self) -> tuple[Any, ...]:
        """What a captured step reads besides its arguments, which a replay cannot see change: the addresses of the
        networks' tensors (a target network's, a normalizer's: read in place), and the values of the settings a
        schedule moves that the loss reads from its algorithm (`schedulable`: reward_scale, TD3's target noise,
        IQL's expectile...). A change is a new capture."""
        owner = getattr(self.module.function, "__self__", None)
        settings = tuple(getattr(owner, name, None) for name in getattr(owner, "schedulable", ()))
        tensors = tuple(t.data_ptr() for t in (*self.networks.parameters(), *self.networks.buffers()))
        return settings, tensors

    def _learning_rates(self) -> torch.Tensor:
        """Each param group's learning rate as a tensor on the device (schedules move them), made anew only when
        one changed: a host-to-device copy waits for the GPU's queue."""
        lrs = tuple(float(g["lr"]) for g in self.optimizer.param_groups)
        if lrs != self._lrs_key:
            self._lrs_key = lrs
            self._lrs = torch.tensor(lrs, dtype=torch.float32, device=self.device)
        return self._lrs
