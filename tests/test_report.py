"""rl-report on made-up run directories with known numbers, and the IQM / search-space helpers."""

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlcli.entry import rl_report as report
from rlcli.registry import ConfigError
from rlcli.sweeps.tuning import iqm, parse_search_space

RL_REPORT = Path(sys.executable).parent / "rl-report"


def make_run(path: Path, overrides: list[str], seed: int, tests: list[tuple[int, list[float]]],
             status: dict | None = None, algo: str = "ppo") -> None:
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([*overrides, f"seed={seed}"]))
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": seed}))
    (path / ".hydra" / "hydra.yaml").write_text(
        yaml.safe_dump({"hydra": {"runtime": {"choices": {"algo": algo, "env": "CartPole-v1"}}}}))
    records = [{"env_steps": s, "wall_s": 10.0 * (i + 1), "returns": r, "lengths": [1] * len(r)}
               for i, (s, r) in enumerate(tests)]
    (path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if status is not None:
        (path / "status.json").write_text(json.dumps(status))


@pytest.fixture
def sweep(tmp_path):
    """2 configurations (lr) x 4 seeds with known final and best returns."""
    finals = {"0.001": [100.0, 200.0, 300.0, 1000.0], "0.0003": [50.0, 60.0, 70.0, 80.0]}
    job = 0
    for lr, values in finals.items():
        for seed, final in enumerate(values):
            tests = [(1000, [final / 2, final / 2]), (2000, [final + 10, final - 10])]
            make_run(tmp_path / "sw" / str(job), [f"algo.lr={lr}"], seed, tests,
                     status={"status": "completed", "env_steps": 2048, "train_seconds": 5.0 + seed})
            job += 1
    return tmp_path / "sw", finals


def test_groups_by_everything_but_the_seed(sweep):
    sweep_dir, finals = sweep
    groups = report.group_runs(report.find_runs([sweep_dir]))
    assert len(groups) == 2 and all(len(g.runs) == 4 for g in groups)
    assert report.swept_keys(groups) == ["algo.lr"]
    by_lr = {g.config["algo.lr"]: report.summarize(g) for g in groups}
    row = by_lr["0.001"]
    assert row["seeds"] == [0, 1, 2, 3]
    assert row["final"][0] == pytest.approx(400.0)
    assert row["final"][1] == pytest.approx(np.std([100, 200, 300, 1000]))
    assert row["final_iqm"] == pytest.approx(250.0)  # drops 100 and 1000
    assert row["best"][0] == pytest.approx(400.0)  # the final test is also the best here
    assert row["env_steps"] == 2048 and row["wall_s"] == pytest.approx(6.5)
    assert by_lr["0.0003"]["final_iqm"] == pytest.approx(65.0)


def test_cli_table_and_csv(sweep, tmp_path):
    sweep_dir, _ = sweep
    out = subprocess.run([str(RL_REPORT), str(sweep_dir), "--csv", str(tmp_path / "t.csv")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "400.0 ± 353.6" in out.stdout and "250.0" in out.stdout and "65.0 ± 11.2" in out.stdout
    with open(tmp_path / "t.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["algo.lr"] for r in rows} == {"0.001", "0.0003"}
    fast = next(r for r in rows if r["algo.lr"] == "0.001")
    assert float(fast["final_mean"]) == 400.0 and float(fast["final_iqm"]) == 250.0 and fast["n_seeds"] == "4"


def test_mean_curve_and_band():
    runs = [report.Run(Path("a"), {}, 0, steps=[0, 10], returns=[0.0, 10.0]),
            report.Run(Path("b"), {}, 1, steps=[0, 10], returns=[2.0, 20.0])]
    grid, mean, half = report.mean_curve(runs)
    assert grid.tolist() == [0, 10] and mean.tolist() == [1.0, 15.0]
    assert half[1] == pytest.approx(12.706 * np.std([10, 20], ddof=1) / math.sqrt(2))  # Student t, 1 dof


def test_one_seed_and_one_test_still_show(tmp_path):
    make_run(tmp_path / "one", ["algo.lr=0.001"], 7, [(1000, [42.0, 44.0])], status={"status": "completed"})
    out = subprocess.run([str(RL_REPORT), str(tmp_path / "one"), "--csv", str(tmp_path / "one.csv")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "43.0 ± -" in out.stdout and "± 0.0" not in out.stdout and "1: 7" in out.stdout
    with open(tmp_path / "one.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert (row["final_mean"], row["final_std"], row["best_std"]) == ("43.0", "", "")  # no spread: not 0.0
    groups = report.group_runs(report.find_runs([tmp_path / "one"]))
    assert report.plot_curves(groups, [], tmp_path / "c.png") == ["o"]  # a single point is drawn as a marker
    assert (tmp_path / "c.png").stat().st_size > 0


def test_no_runs_is_one_line(tmp_path):
    out = subprocess.run([str(RL_REPORT), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "no runs under" in out.stderr


def test_iqm_matches_its_definition():
    assert iqm([1, 2, 3, 4]) == 2.5
    assert iqm([5.0]) == 5.0
    assert iqm([0, 1, 2, 3, 4, 5, 6, 100]) == pytest.approx(np.mean([2, 3, 4, 5]))


def test_search_space_grammar():
    space = parse_search_space({"algo.lr": "tag(log, interval(1e-4, 1e-2))", "algo.n_epochs": "choice(4, 10)",
                                "algo.n_steps": "range(16, 64, 16)", "algo.batch_size": "int(interval(32, 256))"})
    lr = space["algo.lr"].to_optuna()
    assert lr.log and lr.low == 1e-4 and lr.high == 1e-2
    assert space["algo.n_epochs"].to_optuna().choices == (4, 10)
    assert space["algo.n_steps"].choices == [16, 32, 48]
    assert space["algo.batch_size"].integer and space["algo.batch_size"].probe_values() == [32, 256]
    with pytest.raises(ConfigError, match="does not parse"):
        parse_search_space({"algo.lr": "interval(oops"})


def test_a_seed_in_two_runs_of_one_configuration_is_warned_about(sweep, tmp_path):
    """Two sweeps of the same seeds reported together (a population and its basic twin): each run still counts, but
    rl-report says the spread is not over independent seeds (it showed 'seeds 4: 0,0,1,1' silently)."""
    sweep_dir, _ = sweep
    make_run(tmp_path / "again" / "0", ["algo.lr=0.001"], 0, [(2000, [90.0])], status={"status": "completed"})
    out = subprocess.run([str(RL_REPORT), str(sweep_dir), str(tmp_path / "again")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if line.startswith("rl-report: warning:")]
    assert len(warnings) == 1 and "algo.lr=0.001: seed 0 stands in 2 runs" in warnings[0], out.stderr
    assert "5: 0,0,1,2,3" in out.stdout
    alone = subprocess.run([str(RL_REPORT), str(sweep_dir)], capture_output=True, text=True, timeout=60)
    assert "warning" not in alone.stderr
