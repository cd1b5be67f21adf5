"""The device farm (`tapeout farm`) on a real Ray cluster of several nodes on this one machine
(ray.cluster_utils.Cluster), each node with its own device resources.

One run of a 3 projects × 3 profiles plan carries most checks: every check on a node holding its device, a node killed
while a check runs on it (the row is retried on the other node holding the device), a device no node holds (the row
says so, nothing waits), and the table and page built from build dirs verified on the head. The rest are cheap:
a forged report refused, a re-run that skips what did not change, Ctrl-C on the head, bad plans and workers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from farm_matrix import lean_profiles, toy_projects

from conftest import one_line_error, run_cli

pytestmark = pytest.mark.farm

NPU = "intel-core-ultra-200v"  # a device spec one test node holds (all nodes are this host; the node is the device)


def _plan(root: Path, projects: list[Path], profiles: list[str], devices: str = "", out: str = "out") -> Path:
    lean_profiles(root, {"lean": "cpu-fp32", "lean-ov": "openvino-cpu", "lean-trt": "tensorrt-fp16"})
    builds = "".join(f'[[build]]\nproject = "{p}"\nprofiles = {json.dumps(profiles)}\n\n' for p in projects)
    plan = root / "plan.toml"
    plan.write_text(f'[farm]\nout = "{out}"\nretries = 1\n\n{builds}[devices]\n{devices}')
    return plan


@pytest.fixture(scope="module")
def cluster():
    from tapeout.farm.runtime import HOST, import_ray, node_resources

    saved = os.environ.get("PYTHONPATH"), sys.modules.get("amdsmi", False)
    ray = import_ray()  # hides an amdsmi without ROCm from Ray's processes, as the farm does
    from ray.cluster_utils import Cluster

    # a killed node is declared dead in about 4 s, not Ray's default 30 (a busy 2-core host still answers in time)
    fast_failure = {
        "health_check_initial_delay_ms": 0,
        "health_check_period_ms": 1000,
        "health_check_failure_threshold": 4,
    }
    c = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "resources": {HOST: 1.0}, "_system_config": fast_failure}
    )
    nodes = {
        "cpu-a": c.add_node(num_cpus=1, resources=node_resources(["host-cpu"])),
        "cpu-b": c.add_node(num_cpus=1, resources=node_resources(["host-cpu"])),
        "npu": c.add_node(num_cpus=1, resources=node_resources([NPU])),
    }
    c.wait_for_nodes()
    yield c, nodes
    ray.shutdown()
    c.shutdown()
    path, amdsmi = saved  # this process's amdsmi and PYTHONPATH as they were: later tests import amdsmi themselves
    os.environ.pop("PYTHONPATH", None) if path is None else os.environ.__setitem__("PYTHONPATH", path)
    if amdsmi is False:
        sys.modules.pop("amdsmi", None)


@pytest.fixture(scope="module")
def matrix(cluster, tmp_path_factory):
    """The 3 × 3 plan run once on the cluster: lean ORT CPU and OpenVINO CPU builds checked on the host-cpu and the
    NPU-spec nodes, TensorRT builds whose h100-sxm no node holds; the first host-cpu node to start a check is
    killed while it runs."""
    from tapeout.core.console import UI
    from tapeout.farm import head
    from tapeout.farm.plan import load_plan

    c, nodes = cluster
    root = tmp_path_factory.mktemp("farm")
    projects = toy_projects(root)
    plan_path = _plan(
        root,
        projects,
        ["lean.toml", "lean-ov.toml", "lean-trt.toml"],
        devices=f'lean-ov = "{NPU}"\nlean-trt = "h100-sxm"\n',
    )
    killed: dict[str, str] = {}
    host_cpu = {nodes["cpu-a"].node_id: "cpu-a", nodes["cpu-b"].node_id: "cpu-b"}

    def watch(event: dict) -> None:
        if event.get("started") and event["stage"] == "check" and event["node"] in host_cpu and not killed:
            killed["node"], killed["row"] = event["node"], event["row"]
            c.remove_node(nodes[host_cpu[event["node"]]], allow_graceful=False)

    started = time.perf_counter()
    data = head.run(load_plan(plan_path), c.address, UI(), watch=watch)
    return {
        "data": data,
        "plan": plan_path,
        "projects": projects,
        "killed": killed,
        "root": root,
        "seconds": time.perf_counter() - started,
        "nodes": {k: v.node_id for k, v in nodes.items()},
    }


def _rows(data: dict) -> dict[str, dict]:
    return {f"{r['project']}/{r['profile']}": r for r in data["rows"]}


def test_each_check_runs_on_a_node_holding_its_device(matrix):
    rows, nodes = _rows(matrix["data"]), matrix["nodes"]
    assert len(rows) == 9
    for name, r in rows.items():
        if r["profile"] == "lean-trt":
            continue
        assert r["status"] == "checked" and r["exit_code"] == 0, r
        expected = {nodes["npu"]} if r["profile"] == "lean-ov" else {nodes["cpu-a"], nodes["cpu-b"]}
        assert r["nodes"]["check"] in expected, (name, r["nodes"])
        assert r["machines"]["check"]["cpu_flags"] and r["machines"]["build"]["logical_cores"] >= 1
        check = json.loads((Path(r["build_dir"]) / "check.json").read_text())
        assert check["measurement"]["latency_ms"]["quantiles"]["p50"]["point"] > 0


def test_a_node_killed_mid_check_has_its_row_retried_on_another_node_with_the_device(matrix):
    killed = matrix["killed"]
    assert killed, "no check started on a host-cpu node"
    r = _rows(matrix["data"])[killed["row"]]
    assert r["attempts"]["check"] == 2 and r["status"] == "checked", r
    assert r["nodes"]["check"] != killed["node"] and r["nodes"]["check"] in (
        matrix["nodes"]["cpu-a"],
        matrix["nodes"]["cpu-b"],
    )
    out = matrix["plan"].parent / "out"
    leftovers = [p for p in out.rglob("*") if p.name.startswith(".") and ("partial" in p.name or "old" in p.name)]
    assert not leftovers  # nothing half-written beside the build dirs
    from tapeout.builds.reader import open_build

    for d in (p for p in out.glob("*/*") if p.is_dir()):
        opened = open_build(d)  # every build dir the farm wrote is whole
        assert (opened.report is not None and opened.check_report is not None) or "lean-trt" in d.name


def test_a_device_no_node_holds_is_a_row_that_says_so(matrix):
    for project in ("toy-a", "toy-b", "toy-c"):
        r = _rows(matrix["data"])[f"{project}/lean-trt"]
        assert r["status"] == "not measured" and "device:h100-sxm" in r["reason"], r
        assert r["build_dir"] and (Path(r["build_dir"]) / "manifest.json").is_file()  # built host-side all the same
        assert not (Path(r["build_dir"]) / "check.json").exists()
    assert matrix["data"]["exit_code"] == 3  # unsettled rows: not a pass


def test_the_farm_writes_one_verified_table_and_page(matrix):
    data, out = matrix["data"], matrix["plan"].parent / "out"
    on_disk = json.loads((out / "farm.json").read_text())
    assert on_disk["rows"] == json.loads(json.dumps(data["rows"]))
    compare = data["compare"]
    assert {r["project"] for r in compare["rows"]} == {"toy-a", "toy-b", "toy-c"} and len(compare["rows"]) == 9
    checked = [r for r in compare["rows"] if r["profile"] != "lean-trt"]
    assert all(r["from"] == "check" for r in checked)
    # one recommendation per model (their accuracy budgets are unmeasured: the toy projects have no metric)
    assert [part.split(":")[0] for part in compare["why"].split("; ")] == ["toy-a", "toy-b", "toy-c"]
    page = (out / "farm.html").read_text()
    assert page.count("<h3>") == 3 and "not measured" in page and "h100-sxm" in page
    markdown = (out / "farm.md").read_text()
    assert markdown.count("| toy-") == 18 and "Recommendation: toy-a:" in markdown


def test_a_forged_report_from_a_worker_is_refused_and_nothing_is_written(matrix, tmp_path):
    from tapeout.core.errors import BadInput
    from tapeout.farm import results
    from tapeout.farm.bundle import pack_build
    from tapeout.farm.plan import load_plan

    plan = load_plan(matrix["plan"])
    job = next(j for j in plan.jobs if j.name == "toy-a/lean")
    files = pack_build(results.build_dir(plan, job))
    checked = {k: v for k, v in files.items() if k.startswith("check")}
    files = {k: v for k, v in files.items() if not k.startswith("check")}
    forged_check = json.loads(checked["check.json"])
    forged_check["measurement"]["latency_ms"]["quantiles"]["p50"]["point"] /= 10
    with pytest.raises(BadInput, match="sha256 mismatch"):  # a build verified on arrival: its check still is
        results.write(
            tmp_path / "checked",
            files,
            {**checked, "check.json": json.dumps(forged_check).encode()},
            job,
            received_before=True,
        )
    assert not (tmp_path / "checked").exists()
    assert (results.write(tmp_path / "checked", files, checked, job, received_before=True) / "check.json").is_file()
    report = json.loads(files["report.json"])
    report["measurement"]["latency_ms"]["quantiles"]["p50"]["point"] /= 10  # ten times faster, on paper
    forged = {**files, "report.json": json.dumps(report).encode()}
    final = tmp_path / "toy-a" / "lean"
    with pytest.raises(BadInput, match="sha256 mismatch"):
        results.write(final, forged, None, job)
    assert not final.exists() and not any(p.name.startswith(".") for p in final.parent.iterdir())
    other = next(j for j in plan.jobs if j.name == "toy-b/lean")
    with pytest.raises(BadInput, match="is the build of toy-a/lean, not of toy-b/lean"):
        results.write(tmp_path / "toy-b" / "lean", files, None, other)
    with pytest.raises(BadInput, match="not a plain relative path"):
        results.write(tmp_path / "x", {**files, "../escape.txt": b"x"}, None, job)


def test_a_rerun_skips_what_did_not_change_and_rebuilds_what_did(matrix, cluster):
    from tapeout.core.console import UI
    from tapeout.farm import head
    from tapeout.farm.plan import load_plan

    c, _ = cluster
    root, projects = matrix["root"], matrix["projects"]
    plan_path = _plan(root, projects[:1], ["lean.toml", "lean-ov.toml"], devices=f'lean-ov = "{NPU}"\n')
    lean = root / "lean.toml"
    lean.write_text(lean.read_text().replace("iterations = 20", "iterations = 24"))  # this profile's inputs change
    data = head.run(load_plan(plan_path), c.address, UI())
    rows = _rows(data)
    assert rows["toy-a/lean-ov"]["skipped"] and not rows["toy-a/lean"]["skipped"], rows
    assert all(r["status"] == "checked" for r in data["rows"]) and data["exit_code"] == 0
    check = json.loads((Path(rows["toy-a/lean"]["build_dir"]) / "check.json").read_text())
    assert check["measurement"]["latency_ms"]["count"] == 24
    # a summary edited between runs says which rows to look at, never what they came to: the skipped rows' status
    # and exit code are read from their verified build dirs
    summary = json.loads((root / "out" / "farm.json").read_text())
    for row in summary["rows"]:
        row.update(exit_code=1, reason="forged")
    (root / "out" / "farm.json").write_text(json.dumps(summary))
    again = _rows(head.run(load_plan(plan_path), c.address, UI()))
    assert all(r["skipped"] and r["exit_code"] == 0 and r["status"] == "checked" for r in again.values()), again
    assert not any(r.get("reason") == "forged" for r in again.values())


def test_a_task_whose_own_code_raises_is_a_failed_row_not_a_lost_worker(matrix, cluster, tmp_path, monkeypatch):
    """The worker's unpacking refuses a project bundle with a name that climbs out of its folder: the task raises,
    and the row says so once (no retry: another node would raise the same)."""
    from tapeout.core.console import UI
    from tapeout.farm import head
    from tapeout.farm.plan import load_plan

    c, _ = cluster
    plan = load_plan(_plan(tmp_path, toy_projects(tmp_path)[:1], ["lean.toml"], out="raised"))
    monkeypatch.setattr(head, "pack", lambda root, skip=(): {"../outside.py": b"x", "tapeout.toml": b""})
    data = head.run(plan, c.address, UI())
    (row,) = data["rows"]
    assert row["status"] == "build failed" and row["attempts"] == {"build": 1}, row
    assert "the build task raised BadInput" in row["reason"] and "not a plain relative path" in row["reason"]
    assert not (tmp_path / "outside.py").exists() and not (tmp_path / "raised" / "toy-a").exists()


def test_with_no_tries_left_a_lost_check_is_marked_with_its_node_and_nothing_half_written(matrix, cluster, tmp_path):
    """retries = 0: the node running the check is removed; the row says `not measured: worker lost on …`, its build
    (verified when it came back) is written without a check, and no staging dir is left. Runs after the others: it
    removes a node."""
    from tapeout.builds.reader import open_build
    from tapeout.core.console import UI
    from tapeout.farm import head
    from tapeout.farm.plan import load_plan

    c, _ = cluster
    spare = c.add_node(num_cpus=1, resources={"device:spare-cpu": 1.0, "tapeout-host": 1.0})
    c.wait_for_nodes()
    plan_path = _plan(tmp_path, toy_projects(tmp_path)[:1], ["lean.toml"], devices='lean = "spare-cpu"\n', out="lost")
    plan_path.write_text(plan_path.read_text().replace("retries = 1", "retries = 0"))

    def watch(event: dict) -> None:
        if event.get("started") and event["stage"] == "check":
            c.remove_node(spare, allow_graceful=False)

    data = head.run(load_plan(plan_path), c.address, UI(), watch=watch)
    (row,) = data["rows"]
    assert (
        row["status"] == "not measured"
        and row["reason"].startswith("worker lost on ")
        and spare.node_id[:8] in row["reason"]
        and "no other live node holds device:spare-cpu" in row["reason"]
    ), row
    opened = open_build(row["build_dir"])
    assert opened.report is not None and opened.check_report is None
    assert not [p for p in (tmp_path / "lost").rglob(".*")]
    assert data["exit_code"] == 3


def test_a_cluster_whose_nodes_take_no_farm_tasks_is_one_line_not_a_hang(cluster, tmp_path):
    """Nodes started by a plain `ray start` advertise no tapeout-host: nothing could run, so the farm says so."""
    from ray.cluster_utils import Cluster

    from tapeout.core.console import UI
    from tapeout.core.errors import TargetUnavailable
    from tapeout.farm import head
    from tapeout.farm.plan import load_plan

    bare = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        plan = load_plan(_plan(tmp_path, toy_projects(tmp_path)[:1], ["lean.toml"]))
        with pytest.raises(TargetUnavailable, match="no node of this Ray cluster advertises tapeout-host"):
            head.run(plan, bare.address, UI())
    finally:
        bare.shutdown()


def test_the_scratch_of_a_killed_worker_is_removed_by_the_next_task_on_its_machine():
    import tempfile

    import psutil

    from tapeout.farm import tasks

    pid = next(p for p in range(4_000_000, 4_100_000) if not psutil.pid_exists(p))
    dead = Path(tempfile.gettempdir()) / f"tapeout-farm-{pid}-abc"
    (dead / "project").mkdir(parents=True)
    alive = Path(tempfile.mkdtemp(prefix=f"tapeout-farm-{os.getpid()}-"))
    with tasks._scratch() as scratch:
        assert Path(scratch).is_dir() and not dead.exists() and alive.is_dir()
    alive.rmdir()


def test_ctrl_c_on_the_head_cancels_and_leaves_no_build(tmp_path):
    projects = toy_projects(tmp_path)
    plan = _plan(tmp_path, projects[:1], ["lean.toml"])
    env = {**os.environ, "COLUMNS": "200"}
    # as from a terminal: a suite started in the background (nohup, `&`) passes SIGINT down ignored, and tapeout
    # leaves an ignored SIGINT ignored
    proc = subprocess.Popen(
        [sys.executable, "-m", "tapeout", "farm", str(plan)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "build running" in line:
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    code = proc.wait(timeout=60)
    assert code == 130, "".join(seen) + rest
    assert "interrupted" in rest and "Traceback" not in rest
    out = tmp_path / "out"
    assert not (out / "toy-a").exists() and not (out / "farm.json").exists()


@pytest.mark.parametrize(
    ("plan", "says"),
    [
        ('[[build]]\nproject = "toy-a"\nprofiles = ["cpu-fp3"]\n', "unknown profile 'cpu-fp3'"),
        ('[[build]]\nproject = "nowhere"\nprofiles = ["cpu-fp32"]\n', "no project file at"),
        (
            '[[build]]\nproject = "toy-a"\nprofiles = ["cpu-fp32"]\n[devices]\ncpu-fp32 = "a b"\n',
            "must be a device name",
        ),
        ('[[build]]\nproject = "toy-a"\nprofiles = ["cuda-fp32"]\n', "names no device spec"),
        (
            '[[build]]\nproject = "toy-a"\nprofiles = ["cpu-fp32"]\n[devices]\ncpu-int8 = "host-cpu"\n',
            "no [[build]] entry builds",
        ),
        ('[farm]\nretries = -1\n[[build]]\nproject = "toy-a"\nprofiles = ["cpu-fp32"]\n', "farm.retries"),
        (
            '[[build]]\nproject = "toy-a"\nprofiles = ["cpu-fp32"]\n[[build]]\nproject = "toy-a"\nprofiles = ["cpu-fp32"]\n',
            "twice",
        ),
    ],
)
def test_a_bad_plan_is_one_line_and_exit_2_before_anything_starts(tmp_path, plan, says):
    toy_projects(tmp_path)
    (tmp_path / "plan.toml").write_text(plan)
    result = run_cli("farm", tmp_path / "plan.toml")
    assert result.code == 2 and says in one_line_error(result), result.err


def test_a_project_named_as_a_path_is_refused_and_one_without_a_name_is_named_by_its_folder(tmp_path):
    """Build dirs are the farm's out/<project>/<profile>: a [model] name that climbs out ("../x") is refused when
    the project is read, before Ray starts; a project without one is named after its folder, not an internal error
    after the cluster started."""
    from tapeout.farm.plan import load_plan

    a = toy_projects(tmp_path)[0]
    (tmp_path / "plan.toml").write_text(f'[[build]]\nproject = "{a.name}"\nprofiles = ["cpu-fp32"]\n')
    text = (a / "tapeout.toml").read_text()
    (a / "tapeout.toml").write_text(text.replace('name = "toy-a"', 'name = "../escaped"'))
    result = run_cli("farm", tmp_path / "plan.toml")
    assert result.code == 2 and "[model] name '../escaped' must be a plain name" in one_line_error(result)
    (a / "tapeout.toml").write_text(text.replace('name = "toy-a"\n', ""))
    (job,) = load_plan(tmp_path / "plan.toml").jobs
    assert job.name == "toy-a/cpu-fp32" and "name" not in (a / "tapeout.toml").read_text().split("[[inputs]]")[0]


def test_a_worker_advertises_only_devices_it_can_run(tmp_path):
    result = run_cli("farm", "worker", "--dry-run", "--json")
    assert result.code == 0, result.err
    shown = result.json()
    assert shown["resources"]["device:host-cpu"] == 1.0 and shown["resources"]["tapeout-host"] == 1.0
    assert shown["command"][1:3] == ["start", "--head"] and shown["machine"]["logical_cores"] >= 1
    gpu = run_cli("farm", "worker", "--devices", "host-cpu,h100-sxm", "--dry-run")
    assert gpu.code == 4 and "cannot advertise h100-sxm" in one_line_error(gpu)
    phone = run_cli("farm", "worker", "--devices", "snapdragon-8-gen3", "--dry-run")
    assert phone.code == 4 and "emulator" in one_line_error(phone)
    mixed = run_cli("farm", "worker", "--out", tmp_path)
    assert mixed.code == 2 and "--out is for a plan" in one_line_error(mixed)
