"""The built wheel (not only the editable install) finds its configs and trains from any directory."""

import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installed_into_fresh_venv_finds_its_configs(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(REPO)],
                   check=True, timeout=600)
    wheel = next(dist.glob("rlcli-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # Reuse this environment's dependencies (torch etc.) without reinstalling them: a .pth file adds
    # its site-packages after the new venv's own, where the wheel's rlcli is installed.
    new_site = next((venv / "lib").glob("python*/site-packages"))
    (new_site / "_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
                   check=True, timeout=600)
    rl_train = str(venv / "bin" / "rl-train")
    work = tmp_path / "elsewhere"
    work.mkdir()
    info = subprocess.run([rl_train, "--info", "searchpath"], cwd=work, capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    assert str(new_site / "rlcli" / "conf") in info.stdout
    out = subprocess.run([rl_train, "algo=ppo", "env=CartPole-v1", "train.total_steps=512", "train.test_every=0",
                          "log.console=false", "hydra.run.dir=run"], cwd=work, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert list((work / "run" / "checkpoints").glob("ckpt_*.pt"))
    assert (work / "run" / ".hydra" / "config.yaml").read_text().count("n_steps: 32") == 1  # tuned file found
