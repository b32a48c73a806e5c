"""The interactive use, in a real browser: JupyterLab on 127.0.0.1 with a token, notebook 04 opened
and run top to bottom with its defaults, as a person would (Run > Run All Cells), driven by
Playwright with the system's Chromium (never a downloaded browser).

Runs with ``make test-browser`` (marker ``browser``, left out of the plain ``pytest`` run). Where
Chromium or Playwright is missing it skips with a message, except under ``MOESPEC_REQUIRE_BROWSER=1``
(set by ``make test-browser``, which CI runs), where it fails. The screenshot goes to
``MOESPEC_BROWSER_ARTIFACTS`` (default: the test's temporary folder).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from moespec import paths

pytestmark = pytest.mark.browser

NOTEBOOK = "04_theory.ipynb"
#: Figures notebook 04 draws: staircases, two threshold panels, error bounds.
FIGURES = 4


def _missing(what: str) -> None:
    message = (f"{what}. Install it with `make test-browser` (apt-get install chromium; pip install playwright), "
               "or point MOESPEC_CHROMIUM at a Chromium/Chrome executable.")
    if os.environ.get("MOESPEC_REQUIRE_BROWSER") == "1":
        pytest.fail(f"browser test required (MOESPEC_REQUIRE_BROWSER=1) but: {message}")
    pytest.skip(message)


def chromium_path() -> str:
    for candidate in (os.environ.get("MOESPEC_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium",
                      shutil.which("chromium-browser"), shutil.which("google-chrome")):
        if candidate and Path(candidate).exists():
            return candidate
    _missing("no Chromium found (MOESPEC_CHROMIUM, chromium, /usr/bin/chromium, chromium-browser, google-chrome)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyterlab(tmp_path):
    """JupyterLab serving a scratch copy of notebook 04, its own settings and runtime folders, and
    figures written to a scratch folder (the committed notebook and figures/ stay untouched)."""
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(paths.notebooks_dir() / NOTEBOOK, root / NOTEBOOK)
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    # no news or update check (a notification toast would cover the notebook; no network anyway)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false",
                                                                          "checkForUpdates": False}))
    port, token = _free_port(), secrets.token_hex(16)
    run = tmp_path / "run"  # the notebook's run folder: its figures land in run/figures
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(paths.ROOT), os.environ.get("PYTHONPATH")])),
           "MOESPEC_RUN_DIR": str(run), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
           "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    log = open(tmp_path / "jupyterlab.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                             f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
                             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
                             f"--LabApp.user_settings_dir={tmp_path / 'settings'}"]
                            + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {proc.returncode}: "
                                   f"{(tmp_path / 'jupyterlab.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("JupyterLab did not answer within 120 s")
            time.sleep(0.5)
        yield {"url": url, "token": token, "root": root, "figures": run / "figures", "tmp": tmp_path}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _wait_for_kernel(lab: dict, timeout: float = 120) -> None:
    """Until the server holds a session for the notebook whose kernel is idle (the page's own
    indicator reads idle before a kernel exists, and a run requested then asks for a kernel)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{lab['url']}/api/sessions?token={lab['token']}", timeout=5) as r:
            sessions = json.loads(r.read())
        if any(s.get("path", "").endswith(NOTEBOOK) and (s.get("kernel") or {}).get("execution_state") == "idle"
               for s in sessions):
            return
        time.sleep(0.5)
    raise AssertionError(f"no idle kernel for {NOTEBOOK} within {timeout:.0f} s")


def test_notebook_04_runs_in_jupyterlab(jupyterlab):
    path = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright Python package is not installed")
    artifacts = Path(os.environ.get("MOESPEC_BROWSER_ARTIFACTS") or jupyterlab["tmp"])
    artifacts.mkdir(parents=True, exist_ok=True)
    console, page_errors = [], []
    started = time.monotonic()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: console.append(f"{m.type}: {m.text} ({m.location.get('url', '')})")
                    if m.type == "error" else None)
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            page.goto(f"{jupyterlab['url']}/lab/tree/{NOTEBOOK}?token={jupyterlab['token']}")
            page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=120_000)
            _wait_for_kernel(jupyterlab)  # the server has started the notebook's kernel and it is idle
            page.wait_for_function(
                "() => { const e = document.querySelector('.jp-NotebookPanel .jp-Notebook-ExecutionIndicator');"
                " return e !== null && e.getAttribute('data-status') === 'idle'; }", timeout=120_000)
            prompts = "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim())"
            started_run = f"() => ({prompts})().some(t => t !== '[ ]:' && t !== '')"
            for attempt in range(3):  # a run requested while the kernel connection settles can be dropped
                page.get_by_role("menuitem", name="Run", exact=True).click()
                page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
                try:
                    page.wait_for_function(started_run, timeout=20_000)
                    break
                except Exception:
                    dialogs = page.evaluate("() => [...document.querySelectorAll('.jp-Dialog')].map(e => e.innerText)")
                    page.screenshot(path=str(artifacts / f"jupyterlab_04_theory_attempt{attempt}.png"))
                    if attempt == 2 or dialogs:
                        pytest.fail(f"Run All Cells did not start the notebook (attempt {attempt + 1}); "
                                    f"dialogs {dialogs}, prompts {page.evaluate(prompts)}, console {console}")
            try:  # every code cell has an execution count, none is running ([*])
                page.wait_for_function(
                    f"() => {{ const p = ({prompts})(); return p.length > 0 && p.every(t => /^\\[\\d+\\]:?$/.test(t)); }}",
                    timeout=240_000)
                page.wait_for_function(  # the figures have rendered: decoded images with a size
                    f"() => {{ const im = [...document.querySelectorAll('.jp-RenderedImage img')];"
                    f" return im.length >= {FIGURES} && im.every(i => i.complete && i.naturalWidth > 0); }}",
                    timeout=60_000)
            except Exception:
                page.screenshot(path=str(artifacts / "jupyterlab_04_theory_failed.png"))
                pytest.fail(f"notebook 04 did not finish in JupyterLab: prompts {page.evaluate(prompts)}, "
                            f"console errors {console}, page errors {page_errors}; screenshot in {artifacts}")
            errors_shown = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'] "
                                        ":text('Traceback')").count()
            # the last figure and the closing summary in view; the notebook paints cells as they scroll in
            page.evaluate("() => [...document.querySelectorAll('.jp-NotebookPanel .jp-Cell')].pop()"
                          ".scrollIntoView({block: 'end'})")
            page.wait_for_timeout(1500)
            shot = artifacts / "jupyterlab_04_theory.png"
            page.screenshot(path=str(shot), full_page=False)
            page.keyboard.press("Control+s")  # save, to read the outputs from the file
            page.wait_for_timeout(1500)
        finally:
            browser.close()
    elapsed = time.monotonic() - started
    nb = json.loads((jupyterlab["root"] / NOTEBOOK).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    outputs = [o for c in code for o in c.get("outputs", [])]
    errors = [f"{o.get('ename')}: {o.get('evalue')}" for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    print(f"notebook 04 in JupyterLab with Chromium {path}: {len(code)} code cells, {len(images)} figures, "
          f"{elapsed:.1f} s from browser start; screenshot {shot}")
    assert not errors and not errors_shown, f"error outputs: {errors}"
    assert all(c.get("execution_count") for c in code), "a code cell did not run"
    assert len(images) >= FIGURES, f"{len(images)} figures in the saved notebook, expected {FIGURES}"
    assert not page_errors, f"uncaught page errors: {page_errors}"
    assert not console, f"console errors: {console}"
    assert sorted(p.name for p in jupyterlab["figures"].glob("04_*.png")) == [
        "04_error_bounds.png", "04_staircases.png", "04_thresholds_bytes.png", "04_thresholds_time.png"]
    assert shot.stat().st_size > 10_000
