"""Offline RL figures (issue #57): a medium-replay dataset made here from one SAC run's whole replay buffer, BC,
TD3+BC, IQL, CQL and ReBRAC on it over seeds (final and best normalized score from rl-report, mean and 95% CI), and
optionally a head-to-head with d3rlpy (its own venv) on the same arrays, network sizes, batch size, learning rates,
gradient steps and test episodes. docs/results/offline.md shows what it gave.

    python scripts/offline_bench.py --quick                                   # a ~2-minute smoke run
    nice -n 10 python scripts/offline_bench.py --work /tmp/ob \\
        --d3rlpy-python /tmp/d3rlpy-venv/bin/python                           # docs/results/offline.md's Pendulum-v1
    nice -n 10 python scripts/offline_bench.py --env Hopper-v5 --work /tmp/hb --sac-steps 60000 \\
        --steps 4000 --test-every 1000 --test-episodes 5 --hidden 64 64 \\
        --d3rlpy-python /tmp/d3rlpy-venv/bin/python   # its Hopper-v5 section (whose SAC run was stopped at 43,928)

The SAC run takes the env's tuned config where conf/tuned/sac/<env>.yaml has one (Hopper-v5: RL-Zoo's, 10,000
random steps first); --sac-overrides adds Hydra overrides to it. A SAC run stopped by SIGTERM saves a checkpoint
(its buffer included) and the script stops; run it again and the dataset is made from that checkpoint.

Every step is a subprocess (rl-train, rl-dataset, rl-report, the d3rlpy helper), one at a time, each on one torch
thread. A step whose output is already under --work is not run again (delete it to redo it), so an interrupted
run goes on where it stopped. Prints markdown tables and writes every figure to <work>/offline_bench.json.

d3rlpy's venv: python3 -m venv /tmp/d3rlpy-venv && /tmp/d3rlpy-venv/bin/pip install torch==2.13.0 d3rlpy==2.8.1
(for a MuJoCo env add mujoco==3.17.0 imageio: gymnasium 1.0.0's MuJoCo envs import both).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

BIN = Path(sys.executable).parent
ALGOS = ("bc", "td3_bc", "iql", "cql", "rebrac")

# The d3rlpy side, run by --d3rlpy-python with one JSON argument. TD3+BC and IQL with the settings of rlcli's
# conf/algo/td3_bc.yaml and iql.yaml (CORL's): the same lr, batch, gamma, tau, alpha / expectile / beta, policy
# delay and smoothing noise, the IQL actor's lr annealed to 0 by a cosine over the run, no observation or reward
# scaling; the same hidden sizes for every network. Test: the deterministic policy, 10 episodes of the env (seeds
# 0..n-1) every test_every gradient steps, as rl-train's test phases.
D3RLPY_SIDE = r'''
import json, sys, time
t_start = time.perf_counter()
import numpy as np, torch, gymnasium as gym, d3rlpy
from d3rlpy.models.encoders import VectorEncoderFactory
from d3rlpy.optimizers import AdamFactory
from d3rlpy.optimizers.lr_schedulers import CosineAnnealingLRFactory
a = json.loads(sys.argv[1])
torch.set_num_threads(1)
d3rlpy.seed(a["seed"])
z = np.load(a["npz"])
dataset = d3rlpy.dataset.MDPDataset(
    observations=z["observations"].astype(np.float32), actions=z["actions"].astype(np.float32),
    rewards=z["rewards"].astype(np.float32).reshape(-1, 1), terminals=z["terminations"].astype(np.float32),
    timeouts=z["truncations"].astype(np.float32))
enc = VectorEncoderFactory(hidden_units=list(a["hidden"]), activation="relu")
if a["algo"] == "td3_bc":
    algo = d3rlpy.algos.TD3PlusBCConfig(
        actor_learning_rate=3e-4, critic_learning_rate=3e-4, batch_size=256, gamma=0.99, tau=0.005,
        n_critics=2, target_smoothing_sigma=0.2, target_smoothing_clip=0.5, alpha=2.5, update_actor_interval=2,
        actor_encoder_factory=enc, critic_encoder_factory=enc).create(device="cpu:0")
elif a["algo"] == "iql":
    algo = d3rlpy.algos.IQLConfig(
        actor_learning_rate=3e-4, critic_learning_rate=3e-4, batch_size=256, gamma=0.99, tau=0.005,
        n_critics=2, expectile=0.7, weight_temp=3.0, max_weight=100.0,
        actor_optim_factory=AdamFactory(lr_scheduler_factory=CosineAnnealingLRFactory(T_max=a["steps"])),
        actor_encoder_factory=enc, critic_encoder_factory=enc, value_encoder_factory=enc).create(device="cpu:0")
else:
    raise SystemExit(f"no d3rlpy side for {a['algo']}")
env = gym.make(a["env"])
def test():
    returns = []
    for ep in range(a["episodes"]):
        obs, _ = env.reset(seed=ep)
        done, total = False, 0.0
        while not done:
            action = algo.predict(np.asarray(obs, dtype=np.float32)[None])[0]
            obs, reward, term, trunc, _ = env.step(action)
            total += float(reward)
            done = term or trunc
        returns.append(total)
    return returns
tests = []
t_fit = time.perf_counter()
def on_epoch(algo, epoch, total_step):
    tests.append({"steps": total_step, "returns": test(), "wall_s": time.perf_counter() - t_fit})
algo.fit(dataset, n_steps=a["steps"], n_steps_per_epoch=a["test_every"], show_progress=False,
         save_interval=10**9, logger_adapter=d3rlpy.logging.NoopAdapterFactory(), epoch_callback=on_epoch)
end = time.perf_counter()
print(json.dumps({"tests": tests, "train_s": end - t_fit, "process_s": end - t_start,
                  "d3rlpy": d3rlpy.__version__, "torch": torch.__version__, "gymnasium": gym.__version__}))
'''


def run(cmd: list[str], log: Path) -> float:
    """Run one command (its output to `log`), return its wall seconds; a failure stops the script."""
    print("$", " ".join("<the d3rlpy helper, D3RLPY_SIDE>" if arg == D3RLPY_SIDE else arg for arg in cmd), flush=True)
    start = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"exit code {code} after {wall:.0f} s: {' '.join(cmd)} (see {log})")
    print(f"  {wall:.1f} s", flush=True)
    return wall


def t_half(values: list[float]) -> float:
    """95% CI half-width with Student's t (the small-sample interval; rl-report's uses 1.96)."""
    t975 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}
    n = len(values)
    return t975.get(n, 1.96) * float(np.std(values, ddof=1)) / math.sqrt(n) if n > 1 else 0.0


def ci(values: list[float]) -> dict[str, Any]:
    """Mean and 95% interval over seeds: ci95 is Student's t (rl-report's since 28211b6), ci95_z the normal 1.96."""
    n = len(values)
    half = 1.96 * float(np.std(values, ddof=1)) / math.sqrt(n) if n > 1 else 0.0
    return {"mean": float(np.mean(values)), "ci95": t_half(values), "ci95_z": half, "values": list(values)}


def fmt(c: dict[str, Any] | None, digits: int = 1) -> str:
    return "-" if c is None else f"{c['mean']:.{digits}f} ± {c['ci95']:.{digits}f}"


def eval_records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines() if line.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/offline_bench"), help="where runs and datasets go")
    p.add_argument("--tuned", action="store_true",
                   help="give the offline runs their tuned presets (conf/tuned/<algo>/<env>.yaml, CORL's for "
                        "Hopper-v5); by default they run with the algorithms' defaults, as the d3rlpy side does")
    p.add_argument("--env", default="Pendulum-v1")
    p.add_argument("--sac-steps", type=int, default=10000, help="env steps of the SAC run whose buffer is the dataset")
    p.add_argument("--sac-overrides", nargs="*", default=[], help="extra Hydra overrides of the SAC run")
    p.add_argument("--steps", type=int, default=4000, help="gradient steps of each offline run")
    p.add_argument("--test-every", type=int, default=1000, help="gradient steps between test phases")
    p.add_argument("--test-episodes", type=int, default=10)
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 64], help="hidden sizes of every network")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--algos", nargs="+", default=list(ALGOS))
    p.add_argument("--d3rlpy-python", help="a python with d3rlpy 2.8.1: run the head-to-head")
    p.add_argument("--d3rlpy-algos", nargs="+", default=["td3_bc", "iql"])
    p.add_argument("--d3rlpy-seeds", type=int, nargs="+", default=None, help="default: --seeds")
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny budgets, one seed")
    args = p.parse_args()
    if args.quick:
        args.sac_steps, args.steps, args.test_every, args.test_episodes = 1500, 200, 100, 2
        args.seeds, args.hidden = [0], [32, 32]
        if args.work == Path("/tmp/offline_bench"):
            args.work = Path("/tmp/offline_bench_quick")
    d3_seeds = args.d3rlpy_seeds if args.d3rlpy_seeds is not None else args.seeds
    work = args.work
    (work / "logs").mkdir(parents=True, exist_ok=True)
    hidden = "[" + ",".join(map(str, args.hidden)) + "]"
    out: dict[str, Any] = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                           "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version(),
                                       "load_at_start": list(__import__("os").getloadavg())}, "walls": {}}
    common = ["torch_threads=1", "log.tensorboard=false", "log.console=false"]

    # 1. The SAC run: its whole replay buffer becomes the dataset (D4RL's medium-replay).
    sac_dir = work / "sac"
    if not any((sac_dir / "checkpoints").glob("ckpt_*.pt")):
        out["walls"]["sac"] = run([str(BIN / "rl-train"), "algo=sac", f"env={args.env}", "seed=0",
                                   f"train.total_steps={args.sac_steps}", f"train.test_every={args.sac_steps // 2}",
                                   "train.stop_reward=null", *common, *args.sac_overrides,
                                   f"hydra.run.dir={sac_dir}"],
                                  work / "logs" / "sac.log")
    npz = work / "medium-replay.npz"
    if not npz.exists():
        out["walls"]["dataset"] = run([str(BIN / "rl-dataset"), "make", "--from-buffer", str(sac_dir),
                                       "--out", str(npz)], work / "logs" / "dataset.log")
    import rlcli
    from rlcli.offline.load import load_dataset

    out["machine"]["rlcli"] = str(Path(rlcli.__file__).parent)  # PYTHONPATH can point this at a snapshot

    ds = load_dataset(str(npz))
    ends = np.flatnonzero(np.asarray(ds.terminations) | np.asarray(ds.truncations))
    rets = [float(r.sum()) for r in np.split(np.asarray(ds.rewards, dtype=np.float64), ends[:-1] + 1)]
    out["dataset"] = {"path": str(npz), "env": ds.env_id, "transitions": int(len(ds.rewards)),
                      "episodes": len(rets), "return_mean": float(np.mean(rets)), "return_min": float(min(rets)),
                      "return_max": float(max(rets)), "ref_min_score": ds.ref_min_score,
                      "ref_max_score": ds.ref_max_score,
                      "sac_final_test": eval_records(sac_dir)[-1] if (sac_dir / "eval.jsonl").exists() else None}
    lo, hi = ds.ref_min_score, ds.ref_max_score
    norm = (lambda r: 100.0 * (r - lo) / (hi - lo)) if lo is not None and hi is not None else (lambda r: None)
    out["dataset"]["normalized_mean"] = norm(out["dataset"]["return_mean"])

    # 2. The offline algorithms: one rl-train -m per algorithm (its seeds one after another in that process, the
    # basic launcher), and 3. d3rlpy on the same arrays, one process per seed. The algorithms of the head-to-head
    # go first, each right before its d3rlpy counterpart, so that both sides run under the same load.
    runs_dir = work / "runs"
    out["rlcli_runs"], out["d3rlpy"] = {}, {}

    def rlcli(algo: str) -> None:
        sweep = runs_dir / algo
        jobs = sorted((d for d in sweep.glob("*") if (d / ".hydra").is_dir()), key=lambda d: d.name)
        done = len(jobs) == len(args.seeds) and all(
            (d / "status.json").exists() and json.loads((d / "status.json").read_text()).get("status") == "completed"
            for d in jobs)
        if not done:
            wall = run([str(BIN / "rl-train"), "-m", f"algo={algo}", f"dataset={npz}",
                        "seed=" + ",".join(map(str, args.seeds)), f"train.total_steps={args.steps}",
                        f"train.test_every={args.test_every}", f"train.test_episodes={args.test_episodes}",
                        "train.stop_reward=null", f"actor.hidden_sizes={hidden}", *common,
                        # the algorithm's defaults, as d3rlpy gets them, unless --tuned (conf/tuned/<algo>/<env>.yaml)
                        *([] if args.tuned else ["~tuned"]),
                        f"hydra.sweep.dir={sweep}"], work / "logs" / f"{algo}.log")
            (sweep / "bench_wall_s.txt").write_text(f"{wall}\n")  # kept for a later run of this script
            jobs = sorted((d for d in sweep.glob("*") if (d / ".hydra").is_dir()), key=lambda d: d.name)
        if (sweep / "bench_wall_s.txt").exists():
            out["walls"][algo] = float((sweep / "bench_wall_s.txt").read_text())
        for run_dir in jobs:
            seed = int(yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())["seed"])
            status = json.loads((run_dir / "status.json").read_text())
            recs = eval_records(run_dir)
            out["rlcli_runs"][f"{algo}/seed{seed}"] = {
                "dir": str(run_dir), "status": status.get("status"),
                "tests": [{"steps": r["env_steps"], "return": float(np.mean(r["returns"])),
                           "score": r.get("normalized_score")} for r in recs],
                "train_s": status.get("train_seconds"),
                # the sweep's process wall (start-up once, then its seeds) shared out over its seeds
                "process_s": out["walls"][algo] / len(jobs) if algo in out["walls"] else None}

    def d3rlpy(algo: str) -> None:
        for seed in d3_seeds:
            res_path = work / "d3rlpy" / f"{algo}_seed{seed}.json"
            res_path.parent.mkdir(exist_ok=True)
            if not res_path.exists():
                spec = {"npz": str(npz), "env": ds.env_id, "algo": algo, "seed": seed, "steps": args.steps,
                        "test_every": args.test_every, "episodes": args.test_episodes, "hidden": args.hidden}
                log = work / "logs" / f"d3rlpy_{algo}_seed{seed}.log"
                wall = run([args.d3rlpy_python, "-c", D3RLPY_SIDE, json.dumps(spec)], log)
                result = json.loads(log.read_text().strip().splitlines()[-1])
                result["wall_s"] = wall
                res_path.write_text(json.dumps(result))
            result = json.loads(res_path.read_text())
            for t in result["tests"]:
                t["return"] = float(np.mean(t["returns"]))
                t["score"] = norm(t["return"])
            out["d3rlpy"][f"{algo}/seed{seed}"] = result

    h2h_algos = [a for a in args.d3rlpy_algos if a in args.algos] if args.d3rlpy_python else []
    for algo in h2h_algos:
        rlcli(algo)
        d3rlpy(algo)
    for algo in args.algos:
        if algo not in h2h_algos:
            rlcli(algo)

    report_csv = work / "report.csv"
    run([str(BIN / "rl-report"), str(runs_dir), "--csv", str(report_csv)], work / "logs" / "report.txt")
    out["rl_report_table"] = (work / "logs" / "report.txt").read_text()
    out["rl_report"] = {}
    with open(report_csv) as f:
        for row in csv.DictReader(f):
            out["rl_report"][row["algo"]] = row
    table = {}
    for algo in args.algos:
        per = [out["rlcli_runs"][f"{algo}/seed{s}"] for s in args.seeds]
        table[algo] = {"final_score": ci([r["tests"][-1]["score"] for r in per]),
                       "best_score": ci([max(t["score"] for t in r["tests"]) for r in per]),
                       "final_return": ci([r["tests"][-1]["return"] for r in per]),
                       "curve": [float(np.mean([r["tests"][i]["score"] for r in per]))
                                 for i in range(len(per[0]["tests"]))],
                       "train_s": ci([r["train_s"] for r in per])}
        rep = out["rl_report"].get(algo)
        if rep:  # the table's numbers are rl-report's: the same as computed here from eval.jsonl
            for k in ("final_score", "best_score"):
                assert abs(float(rep[f"{k}_mean"]) - table[algo][k]["mean"]) < 1e-6, (algo, rep)
                assert abs(float(rep[f"{k}_ci95"]) - table[algo][k]["ci95"]) < 1e-6, (algo, rep)
    out["table"] = table

    if h2h_algos:
        steps_list = [t["steps"] for t in out["rlcli_runs"][f"{h2h_algos[0]}/seed{d3_seeds[0]}"]["tests"]]
        assert all(steps_list == [t["steps"] for t in r["tests"]] for r in out["d3rlpy"].values()), \
            "the two sides tested at other steps"
        h2h = {}
        for algo in h2h_algos:
            d3 = [out["d3rlpy"][f"{algo}/seed{s}"] for s in d3_seeds]
            rl = [out["rlcli_runs"][f"{algo}/seed{s}"] for s in d3_seeds]
            h2h[algo] = {
                "seeds": d3_seeds,
                "rlcli_final_return": ci([r["tests"][-1]["return"] for r in rl]),
                "d3rlpy_final_return": ci([r["tests"][-1]["return"] for r in d3]),
                "rlcli_final_score": ci([r["tests"][-1]["score"] for r in rl]),
                "d3rlpy_final_score": ci([r["tests"][-1]["score"] for r in d3]),
                "rlcli_train_s": ci([r["train_s"] for r in rl]),
                "d3rlpy_train_s": ci([r["train_s"] for r in d3]),
                "rlcli_process_s": ci([r["process_s"] for r in rl]) if all(r["process_s"] for r in rl) else None,
                "d3rlpy_process_s": ci([r["wall_s"] for r in d3]),
            }
            h2h[algo]["train_s_ratio"] = h2h[algo]["rlcli_train_s"]["mean"] / h2h[algo]["d3rlpy_train_s"]["mean"]
            if h2h[algo]["rlcli_process_s"]:
                h2h[algo]["process_s_ratio"] = (h2h[algo]["rlcli_process_s"]["mean"]
                                                / h2h[algo]["d3rlpy_process_s"]["mean"])
        out["head_to_head"] = h2h
        out["d3rlpy_versions"] = {k: d3[0][k] for k in ("d3rlpy", "torch", "gymnasium")}
    out["machine"]["load_at_end"] = list(__import__("os").getloadavg())

    # The tables.
    d = out["dataset"]
    print(f"\ndataset: {d['env']} medium-replay, {d['transitions']:,} transitions, {d['episodes']} episodes, "
          f"return mean {d['return_mean']:.1f} (min {d['return_min']:.1f}, max {d['return_max']:.1f}); "
          f"ref_min {lo}, ref_max {hi}; dataset's normalized mean {d['normalized_mean']}")
    print(f"\n| algorithm | final normalized score | best normalized score | final return | train s |"
          f" score by test phase ({', '.join(str(t['steps']) for t in per[0]['tests'])} gradient steps) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for algo, row in table.items():
        print(f"| {algo} | {fmt(row['final_score'])} | {fmt(row['best_score'])} | {fmt(row['final_return'])} |"
              f" {row['train_s']['mean']:.0f} | {' / '.join(f'{v:.0f}' for v in row['curve'])} |")
    if out.get("head_to_head"):
        print("\n| algorithm | rlcli final return | d3rlpy final return | rlcli train s | d3rlpy train s |"
              " train s ratio rlcli/d3rlpy | process s ratio |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for algo, h in out["head_to_head"].items():
            print(f"| {algo} | {fmt(h['rlcli_final_return'])} | {fmt(h['d3rlpy_final_return'])} |"
                  f" {fmt(h['rlcli_train_s'], 0)} | {fmt(h['d3rlpy_train_s'], 0)} | {h['train_s_ratio']:.2f} |"
                  f" {h.get('process_s_ratio', float('nan')):.2f} |")
    (work / "offline_bench.json").write_text(json.dumps(out, indent=1, default=str))
    print(f"\n{work / 'offline_bench.json'}")


if __name__ == "__main__":
    main()
