"""The web page in a real headless Chromium against a real uvicorn server whose jobs are judged
by the real evaluator (compile-only on a machine without a GPU)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("websockets")

from multiminddev.env import EvalConfig, Evaluator
from multiminddev.serve.ab import ABStore
from tests.episode.helpers import BROKEN_KERNEL, RELU_KERNEL, RELU_PROBLEM
from tests.serve.helpers import (
    CHROMIUM,
    Chromium,
    ModelReply,
    UvicornThread,
    job_app,
    save_artifact,
)

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="/usr/bin/chromium is absent: install Debian's chromium package to run the page test")

# Model output that would run script if the page ever used innerHTML.
BAIT = '<img src=x onerror="window.__pwned = 1">'
BAITED_BROKEN = BROKEN_KERNEL.replace("extern \"C\"", f"// {BAIT}\nextern \"C\"")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store = ABStore.in_state_dir(tmp_path_factory.mktemp("ab-state"))
    store.add_arm("base", weight=1.0)
    with Evaluator(EvalConfig(num_workers=1, num_trials=2)) as evaluator:
        app = job_app(store, evaluator, [BAITED_BROKEN, RELU_KERNEL])
        with UvicornThread(app) as srv:
            yield srv, store
    store.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with Chromium(tmp_path_factory.mktemp("chromium-profile")) as chromium:
        yield chromium


def test_pasted_module_shows_turns_feedback_and_result(server, browser, tmp_path):
    srv, _ = server
    browser.navigate(srv.url + "/")
    browser.insert_text("#source", RELU_PROBLEM)
    browser.click("#submit")
    browser.wait_for("!document.getElementById('result').hidden", timeout_s=120)
    shot = browser.screenshot(tmp_path / "web-optimize.png")
    save_artifact(shot)

    turns = browser.evaluate("[...document.querySelectorAll('#turns li')].map(li => li.innerText)")
    assert len(turns) == 2
    assert "compile error" in turns[0] and "Tester's feedback" in turns[0]
    assert "compile-only" in turns[1]
    kernel = browser.evaluate("document.getElementById('result-kernel').textContent")
    assert "kernels.relu(" in kernel
    assert browser.evaluate("document.getElementById('result-arm').textContent") == "base"
    assert shot.stat().st_size > 10_000


def test_model_output_is_shown_as_text_never_markup(server, browser):
    srv, _ = server
    browser.navigate(srv.url + "/")
    browser.insert_text("#source", RELU_PROBLEM)
    browser.click("#submit")
    browser.wait_for("!document.getElementById('result').hidden", timeout_s=120)
    first_kernel = browser.evaluate("document.querySelector('#turns li pre.kernel').textContent")
    assert BAIT in first_kernel
    assert browser.evaluate("document.querySelectorAll('#turns img').length") == 0
    assert browser.evaluate("window.__pwned === undefined")


def test_bad_module_shows_the_servers_message(server, browser):
    srv, _ = server
    browser.navigate(srv.url + "/")
    browser.insert_text("#source", "this is not python (")
    browser.click("#submit")
    text = browser.wait_for(
        "document.getElementById('job-status').classList.contains('error') && "
        "document.getElementById('job-status').textContent")
    assert "submitting" not in text and text.strip()
    assert browser.evaluate("document.querySelectorAll('#turns li').length") == 0


def test_ab_tab_shows_recorded_outcomes(server, browser, tmp_path):
    srv, store = server
    recorded = len(store.outcomes())
    browser.navigate(srv.url + "/")
    browser.click("#tab-ab")
    cells = browser.wait_for(
        "(() => { const r = document.querySelector('#ab-table tbody tr[data-arm=base]');"
        " return r && [...r.cells].map(c => c.textContent); })()")
    save_artifact(browser.screenshot(tmp_path / "web-ab.png"))
    assert cells[0] == "base (control)"
    assert cells[2] == str(recorded)


def test_uploaded_file_fills_the_editor(server, browser, tmp_path):
    srv, _ = server
    module = tmp_path / "relu_module.py"
    module.write_text(RELU_PROBLEM)
    browser.navigate(srv.url + "/")
    browser.upload("#file", module)
    assert browser.wait_for("document.getElementById('source').value") == RELU_PROBLEM


REPLY_WITHOUT_KERNEL = "I would fuse the ReLU into one kernel, but here is only my plan."


@pytest.fixture(scope="module")
def format_failure_server(tmp_path_factory):
    store = ABStore.in_state_dir(tmp_path_factory.mktemp("ab-state-format"))
    store.add_arm("base", weight=1.0)
    with Evaluator(EvalConfig(num_workers=1, num_trials=2)) as evaluator:
        app = job_app(store, evaluator, [ModelReply(REPLY_WITHOUT_KERNEL), RELU_KERNEL])
        with UvicornThread(app) as srv:
            yield srv
    store.close()


def test_a_format_failure_shows_what_the_model_wrote(format_failure_server, browser):
    browser.navigate(format_failure_server.url + "/")
    browser.insert_text("#source", RELU_PROBLEM)
    browser.click("#submit")
    browser.wait_for("!document.getElementById('result').hidden", timeout_s=120)
    first = browser.evaluate("document.querySelector('#turns li').innerText")
    assert "no_code_block" in first
    assert REPLY_WITHOUT_KERNEL in first
