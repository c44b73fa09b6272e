"""JupyterLab from the dev environment, on loopback, for browser tests and the notebook benchmark.

``lab(folder)`` starts ``jupyter lab`` serving ``folder`` (no token, no browser, its own settings,
config and workspace folders so that nothing of the user's JupyterLab leaks in) and yields its URL.
``run_all(page, url, name)`` opens a notebook in Playwright, waits for its kernel, and runs
Run → Run All Cells. ``widget_frame(page, i)`` is the i-th attnscope widget's frame.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.servers import free_port

HEAD_CELLS = "() => document.querySelectorAll('[data-testid=head-cell]').length"
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
# every cell rendered, not only those in view: a widget below the fold must load its frame too
SETTINGS = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
            "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                                   "checkForUpdates": False}}


def notebook(cells: list[str]) -> dict[str, Any]:
    """A notebook of code cells, with the kernelspec named so that JupyterLab asks nothing."""
    return {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
                       "outputs": [], "source": source} for i, source in enumerate(cells)],
            "metadata": {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


@contextmanager
def lab(folder: Path) -> Iterator[str]:
    """A JupyterLab serving ``folder``; yields its base URL. Its log is ``folder/.lab.log``."""
    home = folder / ".lab"
    for name, content in SETTINGS.items():
        path = home / "settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content), encoding="utf-8")
    port = free_port()
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"), "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    log = (folder / ".lab.log").open("wb")
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
               "--allow-root", "--IdentityProvider.token=", "--ServerApp.password=",
               "--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={folder}",
               "--LabApp.news_url=", "--LabServerApp.open_browser=False"]
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not start: see {folder / '.lab.log'}")
            time.sleep(0.3)
        yield url
    finally:
        process.terminate()  # the server shuts its kernels down with it
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
        log.close()


def run_all(page: Any, url: str, name: str, *, timeout_ms: int = 180_000) -> None:
    """Open ``name`` in JupyterLab, wait for an idle kernel, then Run → Run All Cells."""
    page.goto(f"{url}/lab/tree/{name}")
    page.wait_for_selector(".jp-Notebook", timeout=timeout_ms)
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=timeout_ms)  # the status bar
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


def widget_frame(page: Any, index: int, *, timeout_s: float = 180) -> Any:
    """The frame of the index-th attnscope widget on the page, once it has drawn its head grid (the
    frame is looked up again each time: a widget view may be rendered more than once)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        frames = page.locator("[data-testid=attnscope-widget] [data-testid=attnscope-frame]")
        if frames.count() > index:
            frames.nth(index).scroll_into_view_if_needed()
            frame = frames.nth(index).element_handle().content_frame()
            try:
                if frame is not None and frame.evaluate(HEAD_CELLS) > 0:
                    return frame
            except Exception:  # noqa: BLE001 - the frame navigated meanwhile: look again
                pass
        time.sleep(0.5)
    raise TimeoutError(f"attnscope widget {index} drew no head grid in {timeout_s:.0f} s")
