"""A local Prefect server kept for the session (``llm-dispatch server start|stop``): without a configured server,
every command that runs a flow would start a temporary one and wait for it; with this one up, they use it.

What is up is written to ``$PREFECT_HOME/llm-dispatch-server.json`` (its pid and API URL); a command reads it only
when no ``PREFECT_API_URL`` is configured, and only while that process lives.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer

from llm_dispatch.core import ConfigError

from ._common import err

__all__ = ["LocalServer", "running_server", "server_app", "start_server", "stop_server"]

STATE_FILE = "llm-dispatch-server.json"
DEFAULT_PORT = 4200
STARTUP_TIMEOUT = 120.0
STOP_TIMEOUT = 20.0


@dataclass(frozen=True, slots=True)
class LocalServer:
    pid: int
    api_url: str
    log: str


def _home() -> Path:
    from prefect.settings import PREFECT_HOME

    return Path(PREFECT_HOME.value()).expanduser()


def running_server(home: Path | None = None) -> LocalServer | None:
    """The server ``start_server`` left running, if its process still lives."""
    path = (home or _home()) / STATE_FILE
    try:
        server = LocalServer(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    return server if _alive(server.pid) else None


def start_server(*, port: int = DEFAULT_PORT, timeout: float = STARTUP_TIMEOUT) -> tuple[LocalServer, bool]:
    """Start ``prefect server start`` on 127.0.0.1:``port`` in a session of its own, wait until it answers, and
    write it down; returns it and whether it was started now (False: one was already up)."""
    home = _home()
    found = running_server(home)
    if found is not None:
        return found, False
    home.mkdir(parents=True, exist_ok=True)
    api_url = f"http://127.0.0.1:{port}/api"
    if _healthy(api_url):
        raise ConfigError(f"port {port} already answers as a Prefect server that llm-dispatch did not start: point "
                          f"PREFECT_API_URL at it ({api_url}), or give --port another port")
    log = home / "llm-dispatch-server.log"
    # Its telemetry only logs errors on an offline machine; a user's own setting still wins.
    env = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", **os.environ}
    env.pop("PREFECT_API_URL", None)
    # The UI asks its server where the API is (/ui-settings); unset, that is the default port's, whatever --port is.
    env.setdefault("PREFECT_UI_API_URL", api_url)
    with log.open("ab") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )
    server = LocalServer(pid=process.pid, api_url=api_url, log=str(log))
    deadline = time.monotonic() + timeout
    while not _healthy(api_url):
        if process.poll() is not None:
            raise ConfigError(f"the Prefect server stopped while starting (exit {process.returncode}); its log: {log}")
        if time.monotonic() > deadline:
            _stop(process.pid)
            raise ConfigError(f"the Prefect server did not answer within {timeout:.0f} s; its log: {log}")
        time.sleep(0.25)
    (home / STATE_FILE).write_text(json.dumps(asdict(server)), encoding="utf-8")
    return server, True


def stop_server() -> LocalServer | None:
    """Stop the server ``start_server`` started (None: none was running)."""
    home = _home()
    server = running_server(home)
    if server is not None:
        _stop(server.pid)
    (home / STATE_FILE).unlink(missing_ok=True)
    return server


def _stop(pid: int) -> None:
    """SIGTERM to the server's session (uvicorn and its services), SIGKILL if it outlives ``STOP_TIMEOUT``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reaps it when it is our own child that has ended
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _healthy(api_url: str) -> bool:
    import urllib.error  # with http.client and email: for this command, not every one the group registers
    import urllib.request

    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as answer:
            status: int = answer.status
            return status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


server_app = typer.Typer(no_args_is_help=True, help=(
    "A local Prefect server for the session: with none configured (PREFECT_API_URL), each run would start a "
    "temporary one first. `server start` keeps one up; run, collect and cancel use it while it is up."))


@server_app.command("start")
def server_start(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 4200,
) -> None:
    """Start a Prefect server in the background (its UI at the same address) for later commands to use."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        err.print(f"a Prefect server is configured already (PREFECT_API_URL={PREFECT_API_URL.value()}): commands "
                  "use it; nothing started", highlight=False, soft_wrap=True)
        return
    local, started = start_server(port=port)
    ui = local.api_url.removesuffix("/api")
    err.print(f"Prefect server {'started' if started else 'already up'} at {ui} (pid {local.pid}, log {local.log}); "
              f"run, collect and cancel use it until `llm-dispatch server stop`, in every terminal of this account "
              f"without PREFECT_API_URL (its state: {_home() / STATE_FILE})", highlight=False, soft_wrap=True)


@server_app.command("stop")
def server_stop() -> None:
    """Stop the Prefect server `llm-dispatch server start` started."""
    stopped = stop_server()
    err.print(f"stopped the Prefect server at {stopped.api_url} (pid {stopped.pid})" if stopped is not None
              else "no Prefect server of `llm-dispatch server start` is running", highlight=False)
