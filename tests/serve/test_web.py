"""The page's routes: what is served, with which headers, and nothing outside the allowlist."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi import FastAPI
from fastapi.testclient import TestClient

from multiminddev.serve.web import STATIC_DIR, STATIC_FILES, web_router


@pytest.fixture(scope="module")
def client():
    app = FastAPI()
    app.include_router(web_router())
    return TestClient(app)


def test_page_is_served_at_root_with_a_script_policy(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert 'src="/static/app.js"' in r.text


def test_every_file_the_page_links_is_served(client):
    page = client.get("/").text
    linked = re.findall(r'(?:src|href)="(/static/[^"]+)"', page)
    assert sorted(linked) == sorted(f"/static/{n}" for n in STATIC_FILES)
    for path in linked:
        assert client.get(path).status_code == 200


@pytest.mark.parametrize("name", ["index.html.bak", "..%2Fweb.py", "%2E%2E%2Fab.py", "ab.py"])
def test_nothing_outside_the_allowlist_is_served(client, name):
    assert client.get(f"/static/{name}").status_code == 404


def test_the_page_never_writes_markup_from_strings():
    """Model output reaches the page as text: no innerHTML, outerHTML, insertAdjacentHTML or
    document.write anywhere in its script."""
    script = (STATIC_DIR / "app.js").read_text()
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("//"))
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write", code)
