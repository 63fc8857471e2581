"""Issue 55's attacks, run as a user or an attacker would, with one row each: tried, survived, lost, let in.

    python scripts/fault_probe.py                 # every probe, in a temporary folder
    python scripts/fault_probe.py --only resume   # the probes whose name holds 'resume'

`survived`: rl-train / rl-eval / rl-report answered in one line on stderr (no traceback) with a non-zero exit, or
the Python API raised one clear exception; `lost`: a good checkpoint or run directory was damaged; `let in`: code a
file named ran (its marker file exists), a machine value was read, or nonsense was accepted with exit 0. The tests
in tests/test_faults*.py hold each of these; this script gives the table for a note, on whatever code is installed
(run it with PYTHONPATH=<other checkout>/src to probe another version).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

BIN = Path(sys.executable).parent
TINY = ["algo=ppo", "env=CartPole-v1", "algo.n_steps=64", "algo.batch_size=64", "train.num_envs=2",
        "train.test_every=256",
        "train.test_episodes=2", "train.checkpoint_every=256", "log.console=false", "train.stop_reward=null"]
FAULT_ENVS = Path(__file__).resolve().parents[1] / "tests" / "fault_envs"
Row = tuple[str, bool, bool, bool, str]  # probe, survived, lost, let in, what happened


def run(program: str, *args: str, cwd: Path, timeout: float = 120, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess:
    extra = dict(env or {})
    paths = [str(FAULT_ENVS), *filter(None, [extra.pop("PYTHONPATH", None), os.environ.get("PYTHONPATH")])]
    full = dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONPATH=os.pathsep.join(paths), **extra)
    return subprocess.run([str(BIN / program), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=full)


def python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              [str(cwd), *filter(None, [os.environ.get("PYTHONPATH")])])))


def one_line(out: subprocess.CompletedProcess) -> bool:
    lines = [x for x in out.stderr.splitlines() if x.strip() and "warn" not in x.lower()]
    return out.returncode not in (0, None) and len(lines) == 1 and "Traceback" not in out.stderr


def last(out: subprocess.CompletedProcess) -> str:
    lines = [x for x in (out.stderr or out.stdout).splitlines() if x.strip()]
    return f"exit {out.returncode}: " + (lines[-1][:150] if lines else "(nothing printed)")


def trained(where: Path, name: str = "run", steps: int = 512) -> Path:
    out = run("rl-train", *TINY, f"train.total_steps={steps}", f"hydra.run.dir={name}", cwd=where)
    assert out.returncode == 0, out.stderr
    return where / name


PAYLOAD = """# @package _global_
hydra:
  callbacks:
    probe:
      _target_: shutil.copyfile
      src: {src}
      dst: {marker}
"""


def resume_override(where: Path, line_of: Callable[[Path, Path], str], how: str) -> Row:
    """A run dir whose overrides.yaml names a yaml file in the run dir itself (through a group value with path
    parts), which sets a Hydra callback that copies a file; resumed three ways."""
    run_dir = trained(where, "run", 256)
    marker = where / "MARKER"
    payload = run_dir / ".hydra" / "evil.yaml"
    payload.write_text(PAYLOAD.format(src=run_dir / ".hydra" / "config.yaml", marker=marker))
    overrides = run_dir / ".hydra" / "overrides.yaml"
    overrides.write_text(overrides.read_text() + f"- {line_of(run_dir, payload)}\n")
    if how == "python":
        out = python(f"import rlcli\ntry:\n    rlcli.train(resume={str(run_dir)!r})\nexcept Exception as e:\n"
                     f"    print(type(e).__name__, e, file=__import__('sys').stderr); raise SystemExit(1)\n", where)
    else:
        target = run_dir if how == "dir" else sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))[-1]
        out = run("rl-train", f"resume={target}", "train.total_steps=512", cwd=where)
    let_in = marker.exists()
    return "", one_line(out) or (how == "python" and out.returncode == 1), False, let_in, last(out)


def group_path(group: str) -> Callable[[Path, Path], str]:
    def line(run_dir: Path, payload: Path) -> str:
        from rlcli.run.compose import conf_dir

        relative = os.path.relpath(payload.with_suffix(""), Path(conf_dir()) / group.split("@")[0].lstrip("+"))
        return f"{group}={relative}"
    return line


def probe_env_interpolation(where: Path) -> Row:
    run_dir = trained(where, "run", 256)
    overrides = run_dir / ".hydra" / "overrides.yaml"
    overrides.write_text(overrides.read_text() + "- log.mlflow_experiment=${oc.env:RLCLI_PROBE_SECRET}\n")
    out = run("rl-train", f"resume={run_dir}", "train.total_steps=512", cwd=where,
              env={"RLCLI_PROBE_SECRET": "s3cret-value"})
    leaked = any("s3cret-value" in p.read_text(errors="ignore") for p in run_dir.rglob("*.yaml"))
    return "", one_line(out), False, leaked or out.returncode == 0, last(out)


def crafted_env_checkpoint(where: Path, env_id: str) -> tuple[Path, Path]:
    """A data-only checkpoint whose config names a module env id; the module writes a marker when imported."""
    run_dir = trained(where, "run", 256)
    marker = where / "MARKER"
    (where / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                      "from gymnasium.envs.classic_control import CartPoleEnv\n"
                                      "import gymnasium\ngymnasium.register('CartPole-v1', entry_point=CartPoleEnv)\n")
    code = (f"import torch\nfrom rlcli.services import checkpoint\n"
            f"p={str(run_dir / 'checkpoints' / 'best.pt')!r}\n"
            f"d=checkpoint.load(p)\nd['config']['env']['id']={env_id!r}\n"
            f"checkpoint.write(__import__('pathlib').Path({str(where / 'model.pt')!r}), 256, d)\n")
    out = python(code, where)
    assert out.returncode == 0, out.stderr
    return where / "model.pt", marker


def probe_load_import(where: Path) -> Row:
    model, marker = crafted_env_checkpoint(where, "evilmod:CartPole-v1")
    out = python(f"import rlcli\ntry:\n    rlcli.load({str(model)!r})\nexcept Exception as e:\n"
                 "    print(type(e).__name__, e, file=__import__('sys').stderr); raise SystemExit(1)\n", where)
    return "", out.returncode == 1 and "Traceback" not in out.stderr, False, marker.exists(), last(out)


def probe_eval_import(where: Path) -> Row:
    model, marker = crafted_env_checkpoint(where, "evilmod:CartPole-v1")
    out = run("rl-eval", str(model), "episodes=1", cwd=where, env={"PYTHONPATH": str(where)})
    return "", one_line(out), False, marker.exists(), last(out)


def probe_cli(*args: str, program: str = "rl-train") -> Callable[[Path], Row]:
    def probe(where: Path) -> Row:
        out = run(program, *args, cwd=where, timeout=60)
        return "", one_line(out), False, out.returncode == 0, last(out)
    return probe


def probe_empty_run_dir(where: Path) -> Row:
    out = run("rl-train", *TINY, "train.total_steps=128", "hydra.run.dir=", cwd=where, timeout=60)
    spilled = (where / "checkpoints").exists() or (where / ".hydra").exists()
    return "", one_line(out), False, spilled or out.returncode == 0, last(out)


def probe_api(code: str) -> Callable[[Path], Row]:
    """Survived: a ValueError, TypeError, FileNotFoundError or LookupError raised by rlcli's own code (exit 1), not
    one from deep inside a library it called (exit 3)."""

    def probe(where: Path) -> Row:
        out = python("import rlcli\ntry:\n" + "".join(f"    {x}\n" for x in code.splitlines())
                     + "except (ValueError, TypeError, FileNotFoundError, LookupError) as e:\n"
                     "    import traceback\n"
                     "    own = 'rlcli' in traceback.extract_tb(e.__traceback__)[-1].filename\n"
                     "    print(type(e).__name__, str(e).splitlines()[0], file=__import__('sys').stderr)\n"
                     "    raise SystemExit(1 if own else 3)\n", where)
        return "", out.returncode == 1 and "Traceback" not in out.stderr, False, out.returncode == 0, last(out)
    return probe


def probe_predict_nan(where: Path) -> Row:
    trained(where, "run", 256)
    return probe_api("import numpy as np\np = rlcli.load('run')\n"
                     "print(p.predict(np.full(4, np.nan, np.float32)))")(where)


def probe_hydra_list(where: Path) -> Row:
    run_dir = trained(where, "run", 256)
    (run_dir / ".hydra" / "hydra.yaml").write_text("- a\n- b\n")
    out = run("rl-report", str(run_dir), cwd=where)
    return "", out.returncode != 0 and "Traceback" not in out.stderr or out.returncode == 0 and not out.stderr, \
        False, False, last(out)


def probe_eval_raises(where: Path) -> Row:
    trained(where, "run", 256)
    out = run("rl-eval", "run", "env.id=faulty_env:Faulty-v0", "env.kwargs.fault=raise", "env.kwargs.at=5",
              "episodes=1", cwd=where)
    return "", one_line(out), False, out.returncode == 0, last(out)


def probe_eval_nan(where: Path) -> Row:
    trained(where, "run", 256)
    out = run("rl-eval", "run", "env.id=faulty_env:Faulty-v0", "env.kwargs.fault=nan_obs",
              "env.kwargs.at=5", "episodes=1", cwd=where)
    return "", one_line(out), False, out.returncode == 0, last(out)


def probe_many_envs_sigint(where: Path) -> Row:
    full = dict(os.environ, HYDRA_FULL_ERROR="0")
    proc = subprocess.Popen([str(BIN / "rl-train"), *TINY, "train.num_envs=60000", "hydra.run.dir=run"],
                            cwd=where, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full)
    time.sleep(4)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    try:
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - started
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return "", False, False, True, "still running 30 s after one SIGINT"
    out = subprocess.CompletedProcess(proc.args, proc.returncode, "", err)
    return "", one_line(out) and took < 10, False, out.returncode == 0, f"{last(out)} ({took:.1f} s after SIGINT)"


def probe_lr_rescue(where: Path) -> Row:
    run_dir = trained(where, "run", 256)
    out = run("rl-train", f"resume={run_dir}", "train.total_steps=512", "algo.lr=1e-4", cwd=where)
    rescued = out.returncode == 0
    return "", rescued, False, False, last(out) if not rescued else "resumed with algo.lr=1e-4 (exit 0)"


def probe_deleted_dir(where: Path) -> Row:
    full = dict(os.environ, HYDRA_FULL_ERROR="0")
    proc = subprocess.Popen([str(BIN / "rl-train"), *TINY, "train.total_steps=400000", "hydra.run.dir=run"],
                            cwd=where, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full)
    for _ in range(600):
        if list((where / "run" / "checkpoints").glob("ckpt_*.pt")):
            break
        time.sleep(0.1)
    shutil.rmtree(where / "run", ignore_errors=True)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "", False, False, False, "did not stop"
    out = subprocess.CompletedProcess(proc.args, proc.returncode, "", err)
    truthful = "no checkpoint was saved before it" not in err
    return "", one_line(out) and truthful, False, False, last(out)


def probe_truncated_last(where: Path) -> Row:
    run_dir = trained(where, "run", 768)
    newest = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))[-1]
    newest.write_bytes(newest.read_bytes()[:1000])
    out = run("rl-eval", str(run_dir), "load=last", "episodes=1", cwd=where)
    said = "truncat" in out.stderr.lower() or "older" in out.stderr.lower() or newest.name in out.stderr
    return "", said, False, False, last(out)


def probe_raw_pickle(where: Path) -> Row:
    run_dir = trained(where, "run", 256)
    newest = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))[-1]
    import pickle

    data = newest.read_bytes()
    newest.write_bytes(data[: data.index(b"\n") + 1] + pickle.dumps({"x": 1}, protocol=4)
                       if b"\n" in data[:64] else pickle.dumps({"x": 1}, protocol=4))
    out = run("rl-eval", str(newest), "episodes=1", cwd=where)
    clean = "UserWarning" not in out.stderr and "()" not in out.stderr
    return "", one_line(out) and clean, False, out.returncode == 0, last(out)


def probe_readonly_eval(where: Path) -> Row:
    """rl-eval of a run on a read-only filesystem (a tmpfs remounted read-only: root ignores permissions)."""
    run_dir = trained(where, "run", 256)
    ro = where / "ro"
    ro.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(ro)], capture_output=True).returncode:
            return "", False, False, False, "probe error: cannot mount a tmpfs here"
        shutil.copytree(run_dir, ro / "run", ignore=shutil.ignore_patterns(".rlcli.lock"))
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
    else:
        shutil.copytree(run_dir, ro / "run")
        for p in [ro, *ro.rglob("*")]:
            p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        out = run("rl-eval", str(ro / "run"), "episodes=1", cwd=where)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], capture_output=True)
        else:
            for p in [ro, *ro.rglob("*")]:
                p.chmod(0o755)
    lines = [x for x in out.stderr.splitlines() if x.strip() and "warn" not in x.lower()]
    return "", len(lines) == 1 and "cannot write" in lines[0] and out.returncode != 0, False, False, last(out)


def probe_hung_env(where: Path) -> Row:
    hung = where / "hung_probe_env.py"
    hung.write_text("import time, gymnasium as gym\nfrom gymnasium.envs.classic_control import CartPoleEnv\n"
                    "class Hung(CartPoleEnv):\n    n = 0\n    def step(self, a):\n        Hung.n += 1\n"
                    "        if Hung.n > 300:\n            time.sleep(3600)\n        return super().step(a)\n"
                    "gym.register('Hung-v0', entry_point=Hung, max_episode_steps=200)\n")
    started = time.monotonic()
    try:
        out = run("rl-train", *TINY, "env=gym", "env.id=hung_probe_env:Hung-v0", "train.total_steps=2048",
                  "train.step_timeout=5", "hydra.run.dir=run", cwd=where, timeout=90, env={"PYTHONPATH": str(where)})
    except subprocess.TimeoutExpired:
        return "", False, False, False, "hung for 90 s"
    return "", one_line(out), False, False, f"{last(out)} ({time.monotonic() - started:.0f} s)"


def rows() -> list[tuple[str, Callable[[Path], Row]]]:
    out: list[tuple[str, Callable[[Path], Row]]] = []
    for group in ("hparams_search", "collector", "+algo@_global_", "+env@_global_", "+tuned@_global_"):
        for how in ("dir", "file", "python"):
            if how != "dir" and group != "hparams_search":
                continue
            out.append((f"1 resume {how}: {group}=<path to run dir yaml>",
                        lambda w, g=group, h=how: resume_override(w, group_path(g), h)))
    out.append(("1 resume: +hydra.callbacks line", lambda w: resume_override(
        w, lambda r, p: "+hydra.callbacks.probe._target_=shutil.copyfile", "dir")))
    out.append(("1 resume: ${oc.env:...} replayed", probe_env_interpolation))
    out.append(("2 rlcli.load of env.id=evilmod:...", probe_load_import))
    out.append(("2 rl-eval of env.id=evilmod:...", probe_eval_import))
    out.append(("3 torch_threads=100000", probe_cli(*TINY, "torch_threads=100000", "train.total_steps=128")))
    out.append(("4 hydra.run.dir=/dev/null/x", probe_cli(*TINY, "train.total_steps=128", "hydra.run.dir=/dev/null/x")))
    out.append(("4 rl-report: hydra.yaml a list", probe_hydra_list))
    out.append(("4 rl-eval: env raises", probe_eval_raises))
    out.append(("4 rlcli.load(123)", probe_api("rlcli.load(123)")))
    out.append(("4 rlcli.evaluate(None)", probe_api("rlcli.evaluate(None)")))
    out.append(("4 rlcli.evaluate('runs/x')", probe_api("rlcli.evaluate('runs/x')")))
    out.append(("4 rlcli.train(train=1000)", probe_api("rlcli.train('algo=ppo', train=1000)")))
    out.append(("5 deterministic=maybe", probe_cli(*TINY, "train.total_steps=128", "deterministic=maybe")))
    out.append(("5 hydra.run.dir=''", probe_empty_run_dir))
    out.append(("5 train.stop_reward=nan", probe_cli(*TINY[:-1], "train.total_steps=128", "train.stop_reward=nan")))
    out.append(("5 num_envs=60000 + one SIGINT", probe_many_envs_sigint))
    out.append(("5 predict(NaN obs)", probe_predict_nan))
    out.append(("5 rl-eval: NaN observations", probe_eval_nan))
    out.append(("6 resume with algo.lr changed", probe_lr_rescue))
    out.append(("7 run dir deleted mid-run", probe_deleted_dir))
    out.append(("7 rl-eval load=last, newest truncated", probe_truncated_last))
    out.append(("7 raw pickle in the new format", probe_raw_pickle))
    out.append(("7 rl-eval on a read-only run dir", probe_readonly_eval))
    out.append(("7 hung env (train.step_timeout=5)", probe_hung_env))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="run the probes whose name holds this text")
    args = parser.parse_args()
    print("| probe | survived | lost | let in | what happened |\n|---|---|---|---|---|")
    totals = [0, 0, 0, 0]
    for name, probe in rows():
        if args.only not in name:
            continue
        with tempfile.TemporaryDirectory() as folder:
            try:
                _, survived, lost, let_in, what = probe(Path(folder))
            except Exception as error:  # the probe's own set-up failed: say so, count it as not survived
                survived, lost, let_in, what = False, False, False, f"probe error: {type(error).__name__}: {error}"
        totals = [totals[0] + 1, totals[1] + survived, totals[2] + lost, totals[3] + let_in]
        yes = {True: "yes", False: "no"}
        what = what.replace("|", "/")
        print(f"| {name} | {yes[survived]} | {yes[lost]} | {yes[let_in]} | {what} |", flush=True)
    print(f"\ntried {totals[0]}, survived {totals[1]}, lost {totals[2]}, let in {totals[3]}")


if __name__ == "__main__":
    main()
