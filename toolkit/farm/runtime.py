"""Ray, imported and started the farm's way: resource names, the local instance, the connection to a cluster.

Each node advertises `tapeout-host: 1` (its share of host-side work: a build takes 1/builds_per_node of it, a check
all of it, so a check never times beside a build on its node) and `device:NAME: 1` per device it holds (one check
per device at a time).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from pathlib import Path
from typing import Any

from tapeout.core.errors import TargetUnavailable, first_line

HOST = "tapeout-host"
INSTALL = 'pip install "tapeout[farm]" (Ray) on the head and on every worker'
_HIDE_AMDSMI = Path(__file__).with_name("hide_amdsmi")


def device_resource(name: str) -> str:
    return f"device:{name}"


def node_resources(devices: list[str]) -> dict[str, float]:
    return {HOST: 1.0, **{device_resource(d): 1.0 for d in devices}}


def hide_broken_amdsmi() -> bool:
    """Where amdsmi is installed (tapeout[rocm], the test extra) but ROCm's library is not, importing it raises
    KeyError, and Ray, which probes for AMD GPUs as it imports, dies of it in every process. Such an amdsmi is made
    to raise ImportError instead (Ray's own "not installed" case), here and in the processes Ray starts from here."""
    import importlib.util

    if "amdsmi" in sys.modules or importlib.util.find_spec("amdsmi") is None:
        return False
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import amdsmi  # noqa: F401
        return False
    except ImportError:
        return False
    except Exception:
        sys.modules["amdsmi"] = None  # a None entry makes `import amdsmi` raise ImportError
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(_HIDE_AMDSMI) + (os.pathsep + path if path else "")
        return True


def import_ray():
    hide_broken_amdsmi()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # the farm never reports usage anywhere
    try:
        import ray
    except ImportError:
        raise TargetUnavailable("Ray is not installed here: the farm runs on it", fix=INSTALL) from None
    except Exception as exc:
        raise TargetUnavailable(
            f"Ray does not import here ({type(exc).__name__}: {first_line(exc)})",
            fix="run `python -c 'import ray'` to see why; reinstall ray",
        ) from None
    return ray


# Ray 2.59+ starts `ray start --head` clusters with token authentication; a client that does not send the token
# (RAY_AUTH_MODE unset) is refused with nothing but a timeout, so the line says what to set
_AUTH_FIX = (
    "a cluster started with token authentication (`ray start --head` and `tapeout farm worker` do so) needs "
    "RAY_AUTH_MODE=token here, and its token: the head's ~/.ray/auth_token copied to this machine, or "
    "RAY_AUTH_TOKEN (docs/farm.md)"
)


class Cluster:
    """The Ray the farm runs on: a cluster at `address`, or a local instance holding this host's devices."""

    def __init__(self, address: str | None, local_devices: list[str] | None = None):
        self.address = address
        self.ray = import_ray()
        quiet: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False, "configure_logging": True}
        try:
            if address:
                self.ray.init(address=address, **quiet)
            else:
                self.ray.init(
                    address="local",
                    num_cpus=os.cpu_count() or 1,
                    include_dashboard=False,
                    resources=node_resources(local_devices or []),
                    **quiet,
                )
        except (ConnectionError, TimeoutError, ValueError, RuntimeError) as exc:
            where = f"the Ray cluster at {address}" if address else "a local Ray instance"
            fix = (
                "check the address (`tapeout farm worker` without --address starts a head and prints it); " + _AUTH_FIX
                if address
                else "see `ray start --head` for what Ray needs on this machine"
            )
            self.close()
            raise TargetUnavailable(f"cannot reach {where}: {first_line(exc)}", fix=fix) from None

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's live nodes: id, address and resources."""
        return [
            {"id": n["NodeID"], "address": n.get("NodeManagerAddress"), "resources": n.get("Resources", {})}
            for n in self.ray.nodes()
            if n.get("Alive")
        ]

    def holders(self, device: str) -> list[str]:
        """The live nodes that hold `device`."""
        return [n["id"] for n in self.nodes() if n["resources"].get(device_resource(device), 0) >= 1]

    def head_node(self) -> str:
        return self.ray.get_runtime_context().get_node_id()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ray.shutdown()
