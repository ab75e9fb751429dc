"""JupyterLab in a real browser: chapter 01 runs clean and its slider redraws the figure.

Starts ``python -m mambalearn lab`` (JupyterLab with the course's config) on 127.0.0.1 (free
port, random token, temporary config/runtime/workspace folders, a copy of the notebook so nothing
in the repository is autosaved), drives Debian's chromium through Playwright (no browser
download; `make browser` installs it), runs all cells, checks that no cell shows an error, moves
the ipywidgets slider and waits for the figure to be redrawn, once (a figure function that
returns its figure would be shown twice). Every request that leaves 127.0.0.1 is refused and
reported. The server and its kernels are shut down
afterwards, and the test fails if any of their processes outlive it.
"""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import psutil  # comes with ipykernel
import pytest

from conftest import require_chromium
from course.classroom import slides_offline

require_chromium()

ROOT = Path(__file__).resolve().parent.parent
CH01 = ROOT / "notebooks" / "01_discretization.ipynb"
ARTIFACTS = Path(os.environ.get("MAMBALEARN_ARTIFACTS", ROOT / "build" / "test-artifacts"))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base, token, path, method="GET"):
    req = urllib.request.Request(f"{base}{path}", method=method,
                                 headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body else None


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """(base URL, token, notebook name) of a JupyterLab server; shut down and checked after."""
    tmp = tmp_path_factory.mktemp("lab")
    work = tmp / "work"
    work.mkdir()
    shutil.copy(CH01, work / CH01.name)
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp / "config"),
               JUPYTER_DATA_DIR=str(tmp / "data"), JUPYTER_RUNTIME_DIR=str(tmp / "run"),
               MAMBALEARN_PROGRESS="0")
    env.pop("MPLBACKEND", None)  # make exports Agg; a kernel under Agg shows no figures
    # started as a student starts it: `python -m mambalearn lab` (what `make lab` runs, the
    # course's Jupyter config included), the test's own settings after `--`
    cmd = [sys.executable, "-m", "mambalearn", "lab", "--root", str(work), "--", f"--port={port}",
           f"--ServerApp.token={token}",
           "--ServerApp.port_retries=0", f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
           f"--LabApp.user_settings_dir={tmp / 'settings'}", "--LabApp.expose_app_in_browser=True",
           "--ServerApp.shutdown_no_activity_timeout=600"]
    labconfig = tmp / "config" / "labconfig"  # no "get Jupyter news?" toast over the page
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    log = open(tmp / "server.log", "w")
    server = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            if server.poll() is not None:
                log_tail = (tmp / "server.log").read_text()[-3000:]
                raise RuntimeError(f"jupyter lab exited:\n{log_tail}")
            try:
                _api(base, token, "/api/status")
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError("jupyter lab did not answer within 60 s")
        yield base, token, CH01.name
    finally:
        family = [server] + _children(server.pid)
        try:  # the server stops its kernels itself when asked through the API
            _api(base, token, "/api/shutdown", method="POST")
            server.wait(timeout=20)
        except Exception:  # noqa: BLE001 - then by force, below
            pass
        family += [p for p in _children(server.pid) if p not in family]
        for p in family:
            _kill(p)
        log.close()
    alive = [p for p in family if _alive(p)]
    assert not alive, f"processes left behind: {alive}"
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "the server still listens"


def _children(pid):
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(p):
    if isinstance(p, subprocess.Popen):
        return p.poll() is None
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill(p):
    if not _alive(p):
        return
    if isinstance(p, subprocess.Popen):
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
    else:
        p.kill()
        p.wait(timeout=10)


# the interact() output's figure: its largest PNG (a plot with lines, not a blank canvas)
FIGURE = """() => {
    const imgs = [...document.querySelectorAll('.widget-interact .jp-OutputArea-output img')]
        .filter(i => i.complete && i.naturalWidth > 100);
    imgs.sort((a, b) => b.getAttribute('src').length - a.getAttribute('src').length);
    return imgs.length ? imgs[0].getAttribute('src') : null;
}"""
FIGURES = """() => [...document.querySelectorAll('.widget-interact .jp-OutputArea-output img')]
    .filter(i => i.complete && i.naturalWidth > 100).length"""
DRAWN = "() => { const f = (" + FIGURE + ")(); return f !== null && f.length > 10000; }"
REDRAWN = "before => { const f = (" + FIGURE + ")(); return f !== null && f !== before; }"
ERRORS = "[data-mime-type='application/vnd.jupyter.error']"
RUN_ALL = """async () => {
    const app = window.jupyterapp;
    const panel = app.shell.currentWidget;
    await panel.context.ready;
    await panel.sessionContext.ready;
    return await app.commands.execute('notebook:run-all-cells');
}"""


def test_chapter_01_runs_in_jupyterlab_and_the_slider_redraws(lab):
    from playwright.sync_api import sync_playwright  # the dev extra; the browser is Debian's

    base, token, name = lab
    refused = []

    def only_localhost(route):
        if route.request.url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")):
            return route.continue_()
        refused.append(route.request.url)
        return route.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=slides_offline.chromium(),
                                    args=slides_offline.CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.route("**/*", only_localhost)
            page.goto(f"{base}/lab/tree/{name}?reset&token={token}", wait_until="domcontentloaded")
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell"
                                   " && window.jupyterapp.shell.currentWidget"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext",
                                   timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=60_000)
            ok = page.evaluate(RUN_ALL)
            nb = nbformat.read(CH01, as_version=4)
            cells = len([c for c in nb.cells if c.cell_type == "code"])
            prompts = page.eval_on_selector_all(
                ".jp-Notebook .jp-CodeCell .jp-InputPrompt", "els => els.map(e => e.textContent)")
            errors = page.eval_on_selector_all(
                ERRORS, "els => els.map(e => e.textContent)")
            assert not errors, f"cells show errors: {[e[:300] for e in errors]}"
            assert ok is True, "run-all reported a failure"
            assert len(prompts) == cells, prompts
            assert all(p.strip("[]: ").isdigit() for p in prompts), f"cells not run: {prompts}"

            # the interact() slider: move it with the keyboard, wait for the figure to change
            slider = page.locator(".widget-slider").first
            slider.scroll_into_view_if_needed()
            page.wait_for_function(DRAWN, timeout=30_000)  # a PNG with a plot in it, not blank
            before = page.evaluate(FIGURE)
            readout = slider.locator(".widget-readout").first.text_content()
            handle = slider.locator(".noUi-handle").first
            handle.focus()
            # one step at a time, as a student moves it: each step redraws exactly one figure
            # (presses faster than the kernel redraws overlap their clear-and-draw, which the
            # notebook does not control)
            for _ in range(3):
                page.keyboard.press("ArrowRight")
                page.wait_for_function(REDRAWN, arg=before, timeout=30_000)
                page.wait_for_timeout(1000)  # a second figure, if any, would be drawn by now
                assert page.evaluate(FIGURES) == 1, "the slider shows more than one figure"
                before = page.evaluate(FIGURE)
            after_readout = slider.locator(".widget-readout").first.text_content()
            assert after_readout != readout, (readout, after_readout)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shot = ARTIFACTS / "lab_slider.png"
            page.evaluate("src => document.querySelector(`img[src=\"${src}\"]`).scrollIntoView()",
                          page.evaluate(FIGURE))
            page.screenshot(path=str(shot))
            errors = page.eval_on_selector_all(
                ERRORS, "els => els.map(e => e.textContent)")
            assert not errors, f"moving the slider raised: {errors[0][:300]}"
        finally:
            browser.close()
    assert not refused, f"JupyterLab asked the network for {refused[:5]}"
