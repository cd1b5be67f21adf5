"""The head of a farm run: schedule every row's build on any node and its check on a node holding its device,
follow them, retry what a lost worker was running, and collect verified build dirs.

A row's life: build (any node) → received and verified → check (a node holding the device, alone on it) →
written whole into the farm's out dir. A row whose device no live node holds is built and then says so
(`not measured: no live node holds device:X`); it never waits for one. Ctrl-C cancels every task and leaves the
out dir as it was.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape

from tapeout import __version__
from tapeout.core.console import UI
from tapeout.core.errors import BadInput, TargetUnavailable, first_line
from tapeout.farm import results, tasks
from tapeout.farm.bundle import Bundle, pack
from tapeout.farm.plan import Job, Plan
from tapeout.farm.runtime import HOST, Cluster, device_resource

_POLL_S = 0.5


@dataclass
class Row:
    job: Job
    key: str
    index: int
    status: str = "queued"
    reason: str | None = None
    build_dir: str | None = None
    exit_code: int | None = None
    build_exit: int | None = None
    check_exit: int | None = None
    nodes: dict[str, str] = field(default_factory=dict)  # stage -> node id
    hosts: dict[str, str] = field(default_factory=dict)  # stage -> host name
    machines: dict[str, dict] = field(default_factory=dict)  # stage -> the machine as the task started on it
    attempts: dict[str, int] = field(default_factory=dict)  # stage -> tries so far
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: bool = False
    files: Bundle | None = None  # the verified build, held until its check comes back

    def to_json(self) -> dict[str, Any]:
        return {
            "project": self.job.project.display_name,
            "profile": self.job.profile,
            "device": self.job.device,
            "key": self.key,
            "status": self.status,
            "reason": self.reason,
            "build_dir": self.build_dir,
            "exit_code": self.exit_code,
            "build_exit_code": self.build_exit,
            "check_exit_code": self.check_exit,
            "nodes": self.nodes,
            "hosts": self.hosts,
            "machines": self.machines,
            "attempts": self.attempts,
            "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
            "skipped": self.skipped,
        }


class Farm:
    def __init__(self, plan: Plan, cluster: Cluster, ui: UI, watch: Callable[[dict], None] | None = None):
        self.plan, self.cluster, self.ui, self.watch = plan, cluster, ui, watch
        self.ray = cluster.ray
        self.pending: dict[Any, tuple[Row, str]] = {}  # object ref -> (row, stage)
        self.started: dict[tuple[str, str, int], dict] = {}
        self.seen_events = 0
        self.scratch = plan.out / ".farm-scratch"
        self.progress = None
        self.task_id = None
        self.remote_build = self.ray.remote(tasks.build)  # registered once: each .remote() reuses it
        self.remote_check = self.ray.remote(tasks.check)

    # ------------------------------------------------------------------ progress

    def say(self, row: Row, text: str) -> None:
        line = f"farm: {row.job.name} → {text}"
        (self.progress.console if self.progress else self.ui.err).print(escape(line), highlight=False)
        if self.watch:
            self.watch({"row": row.job.name, "status": row.status, "text": text})

    def _events(self) -> None:
        for event in self.ray.get(self.tracker.since.remote(self.seen_events)):
            self.seen_events += 1
            self.started[(event["key"], event["stage"], event["attempt"])] = event
            row = next(r for r in self.rows if r.key == event["key"])
            row.status = "building" if event["stage"] == "build" else "checking"
            self.say(
                row,
                f"{event['stage']} running on {event['host']} (node {event['node'][:8]})"
                + (f", try {event['attempt']}" if event["attempt"] > 1 else ""),
            )
            if self.watch:
                self.watch({"row": row.job.name, "stage": event["stage"], "node": event["node"], "started": True})

    def _advance(self) -> None:
        if self.progress is not None:
            self.progress.advance(self.task_id)

    # ------------------------------------------------------------------ submitting

    def submit(self, row: Row, stage: str) -> None:
        attempt = row.attempts[stage] = row.attempts.get(stage, 0) + 1
        job = {"key": row.key, "attempt": attempt, "tapeout": __version__, "profile": row.job.profile}
        if stage == "build":
            share = 1.0 / self.plan.settings.builds_per_node
            job.update(
                project=self.projects[row.job.project.root],
                profile_toml=row.job.profile_toml,
                project_file=row.job.project.file.relative_to(row.job.project.root).as_posix(),
            )
            remote = self.remote_build.options(num_cpus=0, resources={HOST: share}, max_retries=0)
        else:
            job["build"] = row.files
            remote = self.remote_check.options(
                num_cpus=0, resources={HOST: 1.0, device_resource(row.job.device): 1.0}, max_retries=0
            )
        self.pending[remote.remote(self.tracker, job)] = (row, stage)
        row.status = f"{stage} queued"

    def start_check(self, row: Row) -> None:
        if not self.cluster.holders(row.job.device):
            self.finish(row, "not measured", f"no live node holds {device_resource(row.job.device)}")
            return
        self.submit(row, "check")

    # ------------------------------------------------------------------ results

    def finish(self, row: Row, status: str, reason: str | None, check_files: Bundle | None = None) -> None:
        """Write the row's build (and check) whole, or record why there is none."""
        final = results.build_dir(self.plan, row.job)
        if row.files is not None:
            try:
                row.build_dir = str(results.write(final, row.files, check_files, row.job, received_before=True))
            except BadInput as exc:
                status, reason = "refused", first_line(exc)
                if check_files is not None:  # the build itself was verified on arrival: keep it, uncheck
                    reason = f"the check that came back: {reason}"
                    with contextlib.suppress(BadInput):
                        row.build_dir = str(results.write(final, row.files, None, row.job, received_before=True))
        row.status, row.reason, row.files = status, reason, None
        row.exit_code = row.check_exit if status == "checked" else row.build_exit if status == "built" else None
        self.say(
            row,
            status
            + (f": {reason}" if reason else "")
            + (f" (exit {row.exit_code})" if row.exit_code is not None else ""),
        )
        self._advance()

    def lost(self, row: Row, stage: str, exc: BaseException) -> None:
        attempt = row.attempts[stage]
        where = self.started.get((row.key, stage, attempt))
        node = f"{where['host']} (node {where['node'][:8]})" if where else "a node that never started it"
        candidates = (
            self.cluster.holders(row.job.device)
            if stage == "check"
            else [n["id"] for n in self.cluster.nodes() if n["resources"].get(HOST)]
        )
        others = [n for n in candidates if where is None or n != where["node"]]  # Ray may not know it is gone yet
        if attempt <= self.plan.settings.retries and others:
            self.say(row, f"{stage} lost with the worker on {node} ({type(exc).__name__}); trying another node")
            self.submit(row, stage)
            return
        why = (
            f"no tries left (retries = {self.plan.settings.retries})"
            if others
            else f"no other live node holds {device_resource(row.job.device)}"
            if stage == "check"
            else "no other live node takes builds"
        )
        self.finish(row, "build failed" if stage == "build" else "not measured", f"worker lost on {node}; {why}")

    def collect(self, ref) -> None:
        row, stage = self.pending.pop(ref)
        try:
            result = self.ray.get(ref)
        except self.ray.exceptions.TaskCancelledError:
            return  # cancelled by the head, which has already said why
        except self.ray.exceptions.RayTaskError as exc:  # the task's own code raised: another try would too
            cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
            self.finish(
                row,
                "build failed" if stage == "build" else "not measured",
                f"the {stage} task raised {type(cause).__name__}: {first_line(cause)}",
            )
            return
        except self.ray.exceptions.RayError as exc:  # the worker or its node is gone
            self.lost(row, stage, exc)
            return
        row.nodes[stage], row.hosts[stage] = result["node"], result["host"]
        row.machines[stage] = result.get("machine", {})
        if "seconds" in result:
            row.seconds[stage] = result["seconds"]
        if stage == "build":
            row.build_exit = result["exit_code"]
            if "files" not in result:
                self.finish(row, "build failed", result.get("error"))
                return
            try:
                results.received(result["files"], row.job, self.scratch)
            except BadInput as exc:
                self.finish(row, "refused", first_line(exc))
                return
            row.files = result["files"]
            self.say(row, f"built on {result['host']} (exit {row.build_exit})")
            if self.plan.settings.check:
                self.start_check(row)
            else:
                self.finish(row, "built", None)
            return
        row.check_exit = result["exit_code"]
        if "files" not in result:
            self.finish(row, "not measured", f"check on {result['host']}: {result.get('error')}")
        else:
            self.finish(row, "checked", None, check_files=result["files"])

    def unplaceable(self) -> None:
        """Queued tasks no live node can take any more (nodes removed): cancelled, and said so. A check needs a node
        holding its device; a build any node with `tapeout-host`."""
        builders = any(n["resources"].get(HOST) for n in self.cluster.nodes())
        for ref, (row, stage) in list(self.pending.items()):
            if (row.key, stage, row.attempts[stage]) in self.started:
                continue
            if stage == "check" and not self.cluster.holders(row.job.device):
                self.pending.pop(ref)
                self.ray.cancel(ref, force=False)
                self.finish(row, "not measured", f"no live node holds {device_resource(row.job.device)} any more")
            elif stage == "build" and not builders:
                self.pending.pop(ref)
                self.ray.cancel(ref, force=False)
                self.finish(row, "build failed", f"no live node takes builds any more (none advertises {HOST})")

    # ------------------------------------------------------------------ the run

    def run(self) -> list[Row]:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        previous, note = results.previous_rows(self.plan.out)
        if note:
            self.ui.note(note)
        self.projects: dict[Path, Bundle] = {}
        for job in self.plan.jobs:
            if job.project.root not in self.projects:
                self.projects[job.project.root] = pack(job.project.root, skip={self.plan.out})
        self.rows = []
        for i, job in enumerate(self.plan.jobs):
            key = results.inputs_key(job, self.projects[job.project.root], self.plan.settings.check)
            self.rows.append(Row(job, key, i))
        if not any(n["resources"].get(HOST) for n in self.cluster.nodes()):
            raise TargetUnavailable(
                f"no node of this Ray cluster advertises {HOST}, so none takes a farm's tasks (its "
                "nodes were started by `ray start` without tapeout's resources)",
                fix="start each node with `tapeout farm worker`, or give it --resources "
                f'\'{{"{HOST}": 1, "device:NAME": 1}}\' (docs/farm.md)',
            )
        self.tracker = self.ray.remote(tasks.Tracker).options(num_cpus=0, scheduling_strategy=self._on_head()).remote()
        self.scratch.mkdir(parents=True, exist_ok=True)
        with Progress(
            TextColumn("farm"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.ui.err,
            transient=True,
            disable=not self.ui.err.is_terminal,
        ) as progress:
            self.progress, self.task_id = progress, progress.add_task("rows", total=len(self.rows))
            try:
                for row in self.rows:
                    folder = results.build_dir(self.plan, row.job)
                    kept = results.unchanged(previous.get(row.key), folder, row.job, self.plan.settings.check)
                    if kept is not None:
                        old = previous[row.key]
                        row.skipped, row.build_dir = True, str(folder)
                        row.status, row.exit_code = kept
                        row.nodes, row.hosts = old.get("nodes", {}), old.get("hosts", {})
                        row.machines = old.get("machines", {})
                        self.say(row, f"unchanged since the last run ({row.status}): skipped")
                        self._advance()
                    else:
                        self.submit(row, "build")
                last_check = 0.0
                while self.pending:
                    ready, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=_POLL_S)
                    self._events()
                    for ref in ready:
                        self.collect(ref)
                    if time.monotonic() - last_check > 2.0:
                        self.unplaceable()
                        last_check = time.monotonic()
            except BaseException:
                for ref in self.pending:
                    with contextlib.suppress(Exception):
                        self.ray.cancel(ref, force=True)
                raise
            finally:
                self.progress = None
                shutil.rmtree(self.scratch, ignore_errors=True)
        return self.rows

    def _on_head(self):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return NodeAffinitySchedulingStrategy(node_id=self.cluster.head_node(), soft=False)


def run(plan: Plan, address: str | None, ui: UI, watch: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Run the plan on the cluster at `address` (or a local Ray instance), write farm.json and farm.html."""
    from tapeout.farm.devices import found_here

    started = time.perf_counter()
    plan.out.mkdir(parents=True, exist_ok=True)
    with ui.step("start a local Ray instance" if address is None else f"connect to the Ray cluster at {address}"):
        cluster = Cluster(address, local_devices=found_here() if address is None else None)
    ray_start = time.perf_counter() - started
    try:
        nodes = cluster.nodes()
        ui.note(
            f"{len(nodes)} node(s): "
            + "; ".join(
                f"{n['address']} ({n['id'][:8]}): "
                + ", ".join(sorted(k for k in n["resources"] if k.startswith("device:")))
                for n in nodes
            )
        )
        rows = Farm(plan, cluster, ui, watch).run()
    finally:
        cluster.close()
    data = results.summary(plan, [r.to_json() for r in rows], nodes, time.perf_counter() - started, ray_start)
    results.write_summary(plan, data)
    return data
