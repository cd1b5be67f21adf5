"""The farm against `tapeout build` + `tapeout check` run one after another, on this one host.

    python bench/farm.py

The matrix of tests/test_farm.py made all host-side: three toy projects (two-layer MLPs of three widths) × three
lean profiles (ORT CPU FP32, ORT CPU INT8, OpenVINO CPU; 20 timed runs in one process, no op profile), 18 tasks.
Three ways, one after another, in this one run:

1. serial: `tapeout build` then `tapeout check` per row, each a fresh process, as a user would type them;
2. farm, one node: a local Ray instance (`tapeout farm PLAN`), one task at a time as serial: its overhead per task
   (Ray's start-up excluded and included) is the difference divided by 18;
3. farm, two nodes: a Ray cluster of two worker nodes on this host (ray.cluster_utils), both holding host-cpu: two
   builds at once, each check alone on its node. On one 2-core host both nodes share the same cores: the speed-up is
   what overlapping the host-side steps buys here, not what two machines would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantization import cpu_line  # the same folder: the shared helpers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from farm_matrix import lean_profiles, toy_projects  # the matrix tests/test_farm.py runs

PROFILES = {"lean": "cpu-fp32", "lean-int8": "cpu-int8", "lean-ov": "openvino-cpu"}


def setup(root: Path) -> tuple[list[Path], list[Path]]:
    return toy_projects(root), lean_profiles(root, PROFILES)


def plan(root: Path, projects: list[Path], profiles: list[Path], out: str) -> Path:
    path = root / f"{out}.toml"
    path.write_text(
        f'[farm]\nout = "{out}"\n\n'
        + "".join(
            f'[[build]]\nproject = "{p}"\nprofiles = {json.dumps([str(f) for f in profiles])}\n\n' for p in projects
        )
    )
    return path


def serial(root: Path, projects: list[Path], profiles: list[Path]) -> float:
    started = time.perf_counter()
    for project in projects:
        for profile in profiles:
            out = root / "serial" / project.name / profile.stem
            for args in (["build", str(project), "-p", str(profile), "-o", str(out)], ["check", str(out)]):
                done = subprocess.run([sys.executable, "-m", "tapeout", *args], capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"tapeout {' '.join(args)} exited {done.returncode}: {done.stderr[-500:]}")
    return time.perf_counter() - started


def farm_local(path: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tapeout", "farm", str(path), "--json"], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"tapeout farm exited {done.returncode}: {done.stderr[-800:]}")
    return json.loads(done.stdout)


def farm_two_nodes(path: Path) -> tuple[dict, float]:
    from tapeout.core.console import UI
    from tapeout.farm import head
    from tapeout.farm.plan import load_plan
    from tapeout.farm.runtime import import_ray, node_resources

    import_ray()
    from ray.cluster_utils import Cluster

    started = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=1, resources=node_resources(["host-cpu"]))
    cluster.wait_for_nodes()
    start = time.perf_counter() - started
    try:
        data = head.run(load_plan(path), cluster.address, UI())
    finally:
        cluster.shutdown()
    return data, start


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="tapeout-bench-farm-"))
    try:
        projects, profiles = setup(root)
        tasks = 2 * len(projects) * len(profiles)
        print(f"running the {len(projects)} × {len(profiles)} matrix ({tasks} tasks) three ways …", file=sys.stderr)
        t_serial = serial(root, projects, profiles)
        one = farm_local(plan(root, projects, profiles, "farm-one"))
        two, two_start = farm_two_nodes(plan(root, projects, profiles, "farm-two"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for data in (one, two):
        assert all(r["status"] == "checked" for r in data["rows"]), data["rows"]
    rows = [
        ("serial: tapeout build + check", t_serial, None, 0.0),
        ("farm, local Ray, 1 node", one["seconds"], one["ray_start_seconds"], None),
        ("farm, 2 nodes (one host)", two["seconds"] + two_start, two_start + two["ray_start_seconds"], None),
    ]
    print(f"\n{cpu_line()}; {tasks} tasks (9 builds, 9 checks)\n")
    print(f"{'way':32} {'wall s':>8} {'Ray start s':>12} {'overhead/task s':>16} {'(excl. start)':>14} {'speed-up':>9}")
    for name, wall, start, _ in rows:
        over = (wall - t_serial) / tasks
        over_ex = "—" if start is None else f"{(wall - start - t_serial) / tasks:+.2f}"
        print(
            f"{name:32} {wall:8.1f} {'—' if start is None else f'{start:.1f}':>12} "
            f"{'—' if start is None else f'{over:+.2f}':>16} {over_ex:>14} {t_serial / wall:8.2f}×"
        )


if __name__ == "__main__":
    main()
