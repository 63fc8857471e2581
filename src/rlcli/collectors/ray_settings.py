"""`collector=ray`'s settings and the checks made before any worker starts (ray_collector.py runs them)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlcli.registry import ConfigError, require


@dataclass
class RaySettings:
    """The `collector:` section for collector=ray (conf/collector/ray.yaml says what each key means)."""

    name: str = "ray"
    workers: int = 2
    envs_per_worker: int | None = None
    address: str | None = None
    max_policy_lag: int = 1
    cpus_per_worker: float = 1.0
    max_restarts: int = 3

    def __post_init__(self) -> None:
        require(self.workers > 0, "collector.workers", self.workers, "must be > 0")
        require(self.envs_per_worker is None or self.envs_per_worker > 0, "collector.envs_per_worker",
                self.envs_per_worker, "must be > 0 (or null: train.num_envs split over the workers)")
        require(self.max_policy_lag >= 0, "collector.max_policy_lag", self.max_policy_lag,
                "must be >= 0 (0: synchronous)")
        require(self.cpus_per_worker >= 0, "collector.cpus_per_worker", self.cpus_per_worker, "must be >= 0")
        require(self.max_restarts >= 0, "collector.max_restarts", self.max_restarts, "must be >= 0")
        if self.address is not None:
            host, _, port = str(self.address).rpartition(":")
            require(bool(host) and port.isdigit(), "collector.address", self.address,
                    "use HOST:PORT of a running Ray head (or null: a private Ray instance on this machine)")

    def envs_each(self, num_envs: int) -> int:
        """Envs per worker: collector.envs_per_worker, or train.num_envs split evenly."""
        if self.envs_per_worker is not None:
            return self.envs_per_worker
        if num_envs % self.workers:
            fits = [w for w in range(1, num_envs + 1) if num_envs % w == 0]
            raise ConfigError(f"collector.workers={self.workers} does not divide train.num_envs={num_envs}; choose "
                              f"from: {', '.join(map(str, fits))}, or set collector.envs_per_worker")
        return num_envs // self.workers

    def unused_num_envs(self, asked: int) -> str | None:
        """What to tell a user whose train.num_envs (`asked`) collector.envs_per_worker overrides; None if it does
        not."""
        total = None if self.envs_per_worker is None else self.workers * self.envs_per_worker
        if total is None or total == asked:
            return None
        return (f"train.num_envs={asked} is not used: collector.envs_per_worker={self.envs_per_worker} on "
                f"collector.workers={self.workers} run {total} envs")


def ray_settings(cfg: DictConfig) -> RaySettings | None:
    """The checked settings of collector=ray, or None for the local collector."""
    from rlcli.registry import check_kwargs

    node = cfg.get("collector")
    section: dict[str, Any] = OmegaConf.to_container(node, resolve=True) if node is not None else {}  # type: ignore[assignment]
    name = section.get("name", "local")
    if name == "local":
        extra = sorted(set(section) - {"name"})
        if extra:
            raise ConfigError(f"unknown key 'collector.{extra[0]}' for collector=local; it has no settings "
                              "(collector=ray has workers, envs_per_worker, address, ...)")
        return None
    if name != "ray":
        raise ConfigError(f"collector={name!r} is unknown; choose from: local, ray")
    check_kwargs(RaySettings, section, prefix="collector")
    return RaySettings(**section)


def check_fits(use_sde: bool = False, episodic: bool = False, max_policy_lag: int = 0) -> None:
    """What the Ray collector does not cover yet, in one line each."""
    if use_sde and max_policy_lag > 0:
        raise ConfigError("collector=ray keeps gSDE's exploration matrices (algo.use_sde=true) in step with the "
                          "workers in synchronous mode only: set collector.max_policy_lag=0, or use collector=local")
    if episodic:
        raise ConfigError("collector=ray collects fixed-length fragments; algo.train_freq_unit=episode needs "
                          "collector=local (or algo.train_freq_unit=step)")


def check_ray(settings: RaySettings) -> None:
    """Ray installed, and the cluster's head answering when an address is given: one line otherwise."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError("collector=ray needs Ray: pip install -e '.[ray]'") from None
    if settings.address is not None:
        host, _, port = str(settings.address).rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=3):
                pass
        except OSError as error:
            why = error.strerror or error
            raise ConfigError(f"collector.address={settings.address}: no Ray head answers there ({why}); "
                              "start one with `ray start --head --port=PORT`, or use collector.address=null") from None
