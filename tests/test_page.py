"""The branch page behind GitHub sign-in, as a reviewer meets it: a real uvicorn server over TLS
(a test CA), the fake GitHub's OAuth web flow and API over HTTP, and Debian's Chromium driven by
WebDriver; edge cases and headers with httpx against the same server (``pagekit``).

The engine is a test double that keeps the grants it is asked for and answers with a fresh
password each time (the front door's end-to-end test uses the real engine). The browser trusts
the server's certificate through ``--ignore-certificate-errors-spki-list`` (the SHA-256 of the
leaf's public key, so only this key is accepted; certificate errors are not ignored otherwise);
httpx trusts the test CA.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import ssl
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

import pagekit
from fakegithub import FakeGitHub
from helpers import free_tcp_port, top_ports
from pagekit import CLIENT_ID, FINGERPRINT, HOST, SESSION_SECONDS, Engine, Site, running_page, view
from pgoverlay.errors import ConfigError, GitHubError, UnsafeFileError
from pgoverlay.runner.callers import oauth
from pgoverlay.runner.service.models import GrantRequest
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.web import page, render
from pgoverlay.runner.web.sessions import Sessions

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PORT = top_ports(90, 1)[0]
ORIGIN = f"https://{HOST}:{PORT}"
BRANCH = "shop-pr-12"
PRIVATE_BRANCH = "secret-pr-3"
REPO = "acme/shop"
PRIVATE_REPO = "acme/vault"
SESSION_COOKIE_NAME = "__Host-pgoverlay"
# What differs between two answers for one reason only: the response's nonce, the session's
# CSRF token (each sign-in opens a new session).
PER_SESSION = re.compile(r"nonce-[^'\"]+|nonce=\"[^\"]+\"|name=\"csrf\" value=\"[^\"]+\"")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    engine = Engine(
        {BRANCH: view(BRANCH, REPO), PRIVATE_BRANCH: view(PRIVATE_BRANCH, PRIVATE_REPO)}
    )
    folder = tmp_path_factory.mktemp("page")
    # The admin allows personal credentials on unmasked bases here; the test of a host that
    # does not runs a page of its own.
    with running_page(folder, engine, port=PORT, access_unmasked=True) as made:
        made.fake.add_repo(REPO, private=True)
        made.fake.add_repo(PRIVATE_REPO, private=True)
        made.fake.add_collaborator(REPO, "alice", "write")
        made.fake.add_collaborator(REPO, "bob", "read")
        made.fake.add_collaborator(PRIVATE_REPO, "alice", "admin")
        yield made


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO)
    return caplog


# -- the browser ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            pytest.fail(
                f"{path} is missing: install `chromium chromium-driver` (scripts/test.sh does)"
            )
    profile = tmp_path_factory.mktemp("chromium-profile")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--ignore-certificate-errors-spki-list={site.tls.spki_sha256}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def chrome(browser: webdriver.Chrome, site: Site) -> webdriver.Chrome:
    """The browser with no cookies and an empty request log, signed in at the fake as nobody."""
    browser.execute_cdp_cmd("Network.clearBrowserCookies", {})
    browser.get_log("performance")  # type: ignore[no-untyped-call]
    site.fake.sign_in(None)
    return browser


def visited(driver: webdriver.Chrome) -> list[str]:
    """Every URL the browser requested since the last call (redirects included), and its
    history."""
    urls = []
    for entry in driver.get_log("performance"):  # type: ignore[no-untyped-call]
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    history = driver.execute_cdp_cmd("Page.getNavigationHistory", {})
    return urls + [e["url"] for e in history["entries"]]


def authorizations(fake: FakeGitHub) -> int:
    return sum(r["path"] == "/login/oauth/authorize" for r in fake.requests)


def open_page(driver: webdriver.Chrome, fake: FakeGitHub, login: str, branch: str) -> None:
    fake.sign_in(login)
    driver.get(f"{ORIGIN}/b/{branch}")


def assert_no_secret(texts: list[str], secrets_: list[str]) -> None:
    for text in texts:
        assert "gho_" not in text, text  # the fake's user tokens
        for s in secrets_:
            assert s not in text


# -- in the browser ------------------------------------------------------------------------------
def test_a_writer_signs_in_sees_the_branch_and_its_report_and_gets_a_read_write_credential(
    site: Site, chrome: webdriver.Chrome, logs: pytest.LogCaptureFixture
) -> None:
    before = len(site.engine.grants)
    open_page(chrome, site.fake, "alice", BRANCH)
    assert chrome.current_url == f"{ORIGIN}/b/{BRANCH}"
    text = chrome.find_element(By.TAG_NAME, "body").text
    assert f"Branch {BRANCH}" in text
    assert "This branch holds production data" in text
    assert "Signed in with GitHub as alice: your access is read-write." in text
    cells = [c.text for c in chrome.find_elements(By.CSS_SELECTOR, "table td")]
    assert "db/0041_<orders>_index.sql" in cells  # escaped, shown as written
    assert any(c.startswith("ACCESS EXCLUSIVE on public.orders: 409 ms") for c in cells)
    assert "notice: takes ACCESS EXCLUSIVE on public.orders for 409 ms" in cells
    assert "ERROR: <b>boom</b>" in text
    assert "prod version 3" in text

    chrome.find_element(By.ID, "get-credential").click()
    WebDriverWait(chrome, 10).until(EC.url_to_be(f"{ORIGIN}/b/{BRANCH}/credential"))
    WebDriverWait(chrome, 10).until(EC.presence_of_element_located((By.ID, "expires")))
    assert site.engine.grants[before:] == [
        (
            BRANCH,
            GrantRequest(
                login="alice",
                read_only=False,
                ttl=None,
                repository=None,
                app=False,
                vouched_by="github:alice",
            ),
        )
    ]
    password = site.engine.passwords[-1]
    fields = {
        f.get_attribute("id"): f.get_attribute("value") or ""
        for f in chrome.find_elements(By.CSS_SELECTOR, "input.secret")
    }
    assert fields["url"].startswith(f"postgresql://alice:{password}@{HOST}:6543/{BRANCH}?")
    assert fields["psql"] == f"psql '{fields['url']}'"
    assert fields["jdbc"].startswith(f"jdbc:postgresql://{HOST}:6543/{BRANCH}?user=alice&")
    # self-signed: verified against the door's own certificate, offered for download
    assert fields["url"].endswith("?sslmode=verify-full&sslrootcert=pgoverlay-door.crt")
    link = chrome.find_element(By.CSS_SELECTOR, 'a[download="pgoverlay-door.crt"]')
    with site.client() as http:
        served = http.get(str(link.get_attribute("href")))
    assert served.status_code == 200
    assert served.text == site.tls.cert.read_text()
    assert chrome.find_element(By.ID, "fingerprint").text == FINGERPRINT
    assert "UTC" in chrome.find_element(By.ID, "expires").text
    copies = chrome.find_elements(By.CSS_SELECTOR, "div.copyable button")
    assert len(copies) == 3  # the script ran under the CSP's nonce

    urls = visited(chrome)
    assert any("/login/oauth/authorize" in u for u in urls)
    assert_no_secret(urls, [password])
    lines = [r.getMessage() for r in logs.records]
    assert_no_secret(lines, [password])
    callbacks = [line for line in lines if "/oauth/callback" in line]
    assert callbacks and not any("code=" in line or "state=" in line for line in callbacks)
    assert any("alice got a read-write credential" in r.getMessage() for r in logs.records)


def test_a_reader_with_read_permission_gets_a_read_only_credential(
    site: Site, chrome: webdriver.Chrome
) -> None:
    open_page(chrome, site.fake, "bob", BRANCH)
    assert "your access is read-only" in chrome.find_element(By.TAG_NAME, "body").text
    chrome.find_element(By.ID, "get-credential").click()
    WebDriverWait(chrome, 10).until(EC.presence_of_element_located((By.ID, "expires")))
    assert site.engine.grants[-1] == (
        BRANCH,
        GrantRequest(
            login="bob",
            read_only=True,
            ttl=None,
            repository=None,
            app=False,
            vouched_by="github:bob",
        ),
    )
    assert "(read-only)" in chrome.find_element(By.TAG_NAME, "body").text


def test_a_reader_without_access_is_refused_with_the_page_of_a_branch_that_does_not_exist(
    site: Site, chrome: webdriver.Chrome
) -> None:
    before = len(site.engine.grants)
    open_page(chrome, site.fake, "mallory", PRIVATE_BRANCH)  # acme/vault is private to alice
    refused = PER_SESSION.sub("", chrome.page_source)
    assert chrome.find_element(By.TAG_NAME, "h1").text == "Not found"
    assert PRIVATE_BRANCH not in chrome.find_element(By.TAG_NAME, "body").text
    chrome.get(f"{ORIGIN}/b/no-such-branch")  # a sign-in of its own: a new session
    assert PER_SESSION.sub("", chrome.page_source) == refused
    assert len(site.engine.grants) == before
    # alice, an admin of the private repository, gets in
    chrome.execute_cdp_cmd("Network.clearBrowserCookies", {})
    open_page(chrome, site.fake, "alice", PRIVATE_BRANCH)
    assert "your access is read-write" in chrome.find_element(By.TAG_NAME, "body").text


def test_an_expired_session_signs_in_again(site: Site, chrome: webdriver.Chrome) -> None:
    open_page(chrome, site.fake, "alice", BRANCH)
    assert "as alice" in chrome.find_element(By.TAG_NAME, "body").text
    first = authorizations(site.fake)
    chrome.get(f"{ORIGIN}/b/{BRANCH}")
    assert authorizations(site.fake) == first  # within the session: no new sign-in

    site.fake.sign_in("bob")  # the next sign-in at GitHub is bob's
    site.clock.now += SESSION_SECONDS + 1
    chrome.get(f"{ORIGIN}/b/{BRANCH}")
    assert authorizations(site.fake) == first + 1
    assert chrome.current_url == f"{ORIGIN}/b/{BRANCH}"
    assert "as bob: your access is read-only" in chrome.find_element(By.TAG_NAME, "body").text


def test_signing_out_ends_the_session_and_the_next_visit_signs_in_again(
    site: Site, chrome: webdriver.Chrome
) -> None:
    open_page(chrome, site.fake, "alice", BRANCH)
    first = authorizations(site.fake)
    chrome.find_element(By.ID, "signout").click()
    WebDriverWait(chrome, 10).until(EC.url_to_be(f"{ORIGIN}/signout"))
    assert "You are signed out" in chrome.find_element(By.TAG_NAME, "body").text
    chrome.get(f"{ORIGIN}/b/{BRANCH}")
    assert authorizations(site.fake) == first + 1  # sent to GitHub again


def test_the_not_found_page_says_who_is_signed_in_and_signs_out(
    site: Site, chrome: webdriver.Chrome
) -> None:
    open_page(chrome, site.fake, "mallory", PRIVATE_BRANCH)
    assert chrome.find_element(By.TAG_NAME, "h1").text == "Not found"
    assert chrome.find_element(By.ID, "login").text == "mallory"
    first = authorizations(site.fake)
    chrome.find_element(By.ID, "signout").click()
    WebDriverWait(chrome, 10).until(EC.url_to_be(f"{ORIGIN}/signout"))
    assert "You are signed out" in chrome.find_element(By.TAG_NAME, "body").text
    site.fake.sign_in("alice")  # now as another GitHub user
    chrome.get(f"{ORIGIN}/b/{PRIVATE_BRANCH}")
    assert authorizations(site.fake) == first + 1
    assert chrome.find_element(By.ID, "login").text == "alice"
    assert "your access is read-write" in chrome.find_element(By.TAG_NAME, "body").text


def test_the_branch_page_links_its_pull_request_and_shows_the_schema_changes(
    site: Site, chrome: webdriver.Chrome
) -> None:
    open_page(chrome, site.fake, "alice", BRANCH)
    link = chrome.find_element(By.ID, "pull")
    assert link.get_attribute("href") == f"{site.fake.url}/{REPO}/pull/12"
    assert link.text == f"{REPO}#12"
    assert chrome.find_element(By.ID, "schema").text == "Schema changes"
    items = [li.text for li in chrome.find_elements(By.CSS_SELECTOR, "#schema ~ ul li")]
    assert items == [
        "+ index public.orders_amount_idx on public.orders: btree (amount)",
        "~ column public.orders.note<i>: type integer → bigint",  # escaped, shown as written
    ]
    assert "1 index added, 1 column changed" in chrome.find_element(By.TAG_NAME, "body").text


def test_sign_ins_and_refused_ones_are_lines_of_the_audit_log(
    site: Site, chrome: webdriver.Chrome
) -> None:
    before = len(site.audit)
    open_page(chrome, site.fake, "alice", BRANCH)
    chrome.execute_cdp_cmd("Network.clearBrowserCookies", {})
    open_page(chrome, site.fake, "mallory", PRIVATE_BRANCH)
    open_page(chrome, site.fake, "mallory", "no-such-branch")
    with site.client() as client:  # a callback this browser did not start
        assert client.get(f"{ORIGIN}/oauth/callback?code=x&state=forged").status_code == 400
    lines = site.audit[before:]
    assert [(x["event"], x.get("login"), x.get("branch"), x["outcome"]) for x in lines] == [
        ("page_sign_in", "alice", BRANCH, "ok"),
        ("page_sign_in", "mallory", PRIVATE_BRANCH, "refused:access"),
        ("page_sign_in", "mallory", "no-such-branch", "refused:access"),
        ("page_sign_in", None, None, "refused:state"),
    ]
    assert lines[0]["access"] == "read-write" and lines[0]["repository"] == REPO
    assert lines[2]["repository"] is None  # a branch that does not exist names nothing
    assert all(x["source"] == "127.0.0.1" for x in lines)
    assert_no_secret([json.dumps(x) for x in lines], ["s3cret-of-the-oauth-client"])


def test_an_unmasked_branch_offers_no_credential_where_the_admin_gives_none(
    site: Site, chrome: webdriver.Chrome, tmp_path: Path
) -> None:
    """On a host whose admin gives no personal credential on production data, the page of
    such a branch offers none, and a credential asked for anyway is refused in words for a
    reviewer, naming no setting of the admin's."""
    engine = Engine({BRANCH: view(BRANCH, REPO)}, masked=False, refuse_unmasked=True)
    port = top_ports(92, 1)[0]
    with running_page(tmp_path, engine, port=port, tls=site.tls) as strict:
        strict.fake.add_repo(REPO, private=True)
        strict.fake.add_collaborator(REPO, "alice", "write")
        open_page(chrome, strict.fake, "alice", BRANCH)
        chrome.get(f"{strict.origin}/b/{BRANCH}")
        WebDriverWait(chrome, 10).until(EC.url_to_be(f"{strict.origin}/b/{BRANCH}"))
        body = chrome.find_element(By.TAG_NAME, "body").text
        assert "This branch holds production data" in body
        assert "No personal credential is given on this branch" in body
        assert not chrome.find_elements(By.ID, "get-credential")
        assert "PGOVERLAY_" not in body
        with strict.client() as client:  # the form of a page from before, posted anyway
            token = csrf_of(sign_in(strict, client, "alice").text)
            r = client.post(
                f"{strict.origin}/b/{BRANCH}/credential",
                headers={"Origin": strict.origin},
                data={"csrf": token},
            )
        assert r.status_code == 409
        assert "ask the runner&#x27;s admin" in r.text and "PGOVERLAY_" not in r.text
        assert engine.passwords == []


# -- over HTTP, with httpx -----------------------------------------------------------------------
def sign_in(site: Site, client: httpx.Client, login: str, branch: str = BRANCH) -> httpx.Response:
    return pagekit.sign_in(site, client, login, branch)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


def test_every_answer_carries_the_security_headers(site: Site) -> None:
    with site.client() as client:
        signed_in = sign_in(site, client, "alice")
        assert signed_in.headers["referrer-policy"] == "same-origin"  # its form sends Origin
        for path in (f"/b/{BRANCH}", "/nowhere", "/signin?next=/b/x", "/oauth/callback"):
            r = httpx.get(ORIGIN + path, verify=ssl.create_default_context(cafile=str(site.tls.ca)))
            csp = r.headers["content-security-policy"]
            assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, path
            assert "'unsafe-inline'" not in csp
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["referrer-policy"] == "no-referrer"
            assert r.headers["strict-transport-security"].startswith("max-age=")
            assert r.headers["cache-control"] == "no-store"
        nonce = re.search(r"'nonce-([^']+)'", signed_in.headers["content-security-policy"])
        assert nonce and f'<style nonce="{nonce.group(1)}">' in signed_in.text
        assert "<script>" not in signed_in.text


def test_an_anonymous_reader_is_sent_to_sign_in_whether_the_branch_exists_or_not(
    site: Site,
) -> None:
    with site.client() as client:
        for name in (BRANCH, "no-such-branch"):
            r = client.get(f"{ORIGIN}/b/{name}")
            assert r.status_code == 303
            assert r.headers["location"] == f"/signin?next=%2Fb%2F{name}"
        r = client.get(f"{ORIGIN}/signin?next=%2Fb%2F{BRANCH}")
        assert r.status_code == 303
        target = urlsplit(r.headers["location"])
        query = parse_qs(target.query, keep_blank_values=True)
        assert f"{target.scheme}://{target.netloc}{target.path}" == (
            f"{site.fake.url}/login/oauth/authorize"
        )
        assert query["client_id"] == [CLIENT_ID]
        assert query["redirect_uri"] == [f"{ORIGIN}/oauth/callback"]
        assert query["scope"] == [""]
        assert len(query["state"][0]) >= 40
        cookie = r.headers["set-cookie"]
        assert cookie.startswith("__Host-pgoverlay-signin=")
        for flag in ("HttpOnly", "Path=/", "SameSite=lax", "Secure"):
            assert flag.lower() in cookie.lower()


def test_sign_in_refuses_a_forged_a_replayed_or_another_browsers_state(site: Site) -> None:
    site.fake.sign_in("alice")
    with site.client() as client, site.client() as other:
        start = client.get(f"{ORIGIN}/signin?next=%2Fb%2F{BRANCH}")
        back = httpx.get(start.headers["location"])  # the fake redirects at once
        assert back.status_code == 302
        callback = back.headers["location"]
        state = parse_qs(urlsplit(callback).query)["state"][0]

        forged = client.get(callback.replace(state, state[:-2] + "xx"))
        assert forged.status_code == 400
        assert "Sign-in refused" in forged.text
        assert other.get(callback).status_code == 400  # no state cookie: not this browser

        done = client.get(callback)
        assert done.status_code == 303 and done.headers["location"] == f"/b/{BRANCH}"
        session_cookie = next(
            c for c in done.headers.get_list("set-cookie") if c.startswith("__Host-pgoverlay=")
        )
        for flag in ("HttpOnly", "Path=/", "SameSite=lax", "Secure", "Max-Age=3600"):
            assert flag.lower() in session_cookie.lower()
        assert client.get(ORIGIN + done.headers["location"]).status_code == 200
        assert client.get(callback).status_code == 400  # a state is good once

        site.clock.now += 601  # a sign-in left too long
        late = client.get(f"{ORIGIN}/signin?next=%2Fb%2F{BRANCH}")
        site.clock.now += 601
        back = httpx.get(late.headers["location"])
        assert client.get(back.headers["location"]).status_code == 400


def test_two_sign_ins_of_one_browser_may_be_under_way_at_once(site: Site) -> None:
    site.fake.sign_in("alice")
    with site.client() as client:
        callbacks = []
        for branch in (BRANCH, PRIVATE_BRANCH):  # two tabs
            start = client.get(f"{ORIGIN}/signin?next=%2Fb%2F{branch}")
            callbacks.append(httpx.get(start.headers["location"]).headers["location"])
        for branch, callback in zip((BRANCH, PRIVATE_BRANCH), callbacks, strict=True):
            done = client.get(callback)
            assert done.status_code == 303 and done.headers["location"] == f"/b/{branch}"
        for branch in (BRANCH, PRIVATE_BRANCH):  # both checked, in the one session now
            assert client.get(f"{ORIGIN}/b/{branch}").status_code == 200


def test_an_engine_that_cannot_answer_gets_a_page_not_a_traceback(site: Site) -> None:
    with site.client() as client:
        assert sign_in(site, client, "alice").status_code == 200
        site.engine.failing = True
        try:
            r = client.get(f"{ORIGIN}/b/{BRANCH}")
        finally:
            site.engine.failing = False
        assert r.status_code == 503 and "could not answer" in r.text
        assert r.headers["x-frame-options"] == "DENY"


def test_only_a_reader_with_access_makes_the_engine_measure_a_layer(site: Site) -> None:
    """Measuring a layer walks it as root: a signed-in reader without access, however often
    they ask, makes the engine do nothing of the kind."""
    before = len(site.engine.measured)
    with site.client() as client:
        for _ in range(3):
            refused = sign_in(site, client, "mallory", PRIVATE_BRANCH)
            assert refused.status_code == 404
        assert site.engine.measured[before:] == []
    with site.client() as client:
        assert sign_in(site, client, "alice", PRIVATE_BRANCH).status_code == 200
    assert site.engine.measured[before:] == [PRIVATE_BRANCH]


def test_a_sign_out_needs_the_sessions_csrf_token_and_the_pages_origin(site: Site) -> None:
    with site.client() as client:
        page = sign_in(site, client, "alice")
        token = csrf_of(page.text)
        forged = client.post(
            f"{ORIGIN}/signout", data={"csrf": "wrong"}, headers={"origin": ORIGIN}
        )
        elsewhere = client.post(
            f"{ORIGIN}/signout", data={"csrf": token}, headers={"origin": "https://evil.test"}
        )
        assert forged.status_code == elsewhere.status_code == 403
        assert "<strong>alice</strong>" in client.get(f"{ORIGIN}/b/{BRANCH}").text  # still in
        done = client.post(f"{ORIGIN}/signout", data={"csrf": token}, headers={"origin": ORIGIN})
        assert done.status_code == 200
        assert client.get(f"{ORIGIN}/b/{BRANCH}").status_code == 303


def test_a_credential_needs_the_sessions_csrf_token_and_the_pages_origin(site: Site) -> None:
    """(httpx runs no script: signing in and getting a credential need no JavaScript.)"""
    with site.client() as client:
        html = sign_in(site, client, "alice").text
        token = csrf_of(html)
        url = f"{ORIGIN}/b/{BRANCH}/credential"
        before = len(site.engine.grants)
        cases = [
            ({"Origin": ORIGIN}, {}),
            ({"Origin": ORIGIN}, {"csrf": "x" * len(token)}),
            ({"Origin": "https://evil.example"}, {"csrf": token}),
            ({}, {"csrf": token}),
        ]
        for headers, form in cases:
            r = client.post(url, headers=headers, data=form)
            assert r.status_code == 403, (headers, form)
            assert "Refused" in r.text
        with site.client() as stranger:  # a token without its session
            r = stranger.post(url, headers={"Origin": ORIGIN}, data={"csrf": token})
            assert r.status_code == 401
        assert len(site.engine.grants) == before

        r = client.post(url, headers={"Origin": ORIGIN}, data={"csrf": token})
        assert r.status_code == 200
        assert r.headers["cache-control"] == "no-store"
        assert site.engine.passwords[-1] in r.text
        assert "password" not in r.headers.get("set-cookie", "")


def test_a_signed_in_reader_learns_nothing_from_a_branch_name(site: Site) -> None:
    """A branch that does not exist is refused as one the reader may not see: after the
    sign-in that checks it, and on every visit after (no new sign-in either way)."""
    with site.client() as client:
        unknown = sign_in(site, client, "mallory", "no-such-branch")
        refused = sign_in(site, client, "mallory", PRIVATE_BRANCH)
        assert unknown.status_code == refused.status_code == 404
        assert PER_SESSION.sub("", unknown.text) == PER_SESSION.sub("", refused.text)
        count = authorizations(site.fake)
        for name in ("no-such-branch", PRIVATE_BRANCH):
            assert client.get(f"{ORIGIN}/b/{name}").status_code == 404
        assert authorizations(site.fake) == count


def test_github_failing_during_sign_in_is_said_without_the_token(site: Site) -> None:
    site.fake.fail_next("GET", r"^/repos/acme/shop$", 502)
    with site.client() as client:
        r = sign_in(site, client, "alice")
        assert r.status_code == 502
        assert "Sign-in failed" in r.text and "GitHub answered 502" in r.text
        assert "gho_" not in r.text
        assert SESSION_COOKIE_NAME not in client.cookies  # no session from a failed sign-in
        assert sign_in(site, client, "alice").status_code == 200  # and the next one works


def test_sign_in_goes_back_only_to_a_branch_page(site: Site) -> None:
    with site.client() as client:
        for target in ("https://evil.example/", "//evil.example/b/x", "/b/../signin", "/b/X"):
            r = client.get(f"{ORIGIN}/signin", params={"next": target})
            assert r.status_code == 400, target


def test_the_client_secret_and_the_readers_token_stay_out_of_the_fakes_log(site: Site) -> None:
    with site.client() as client:
        sign_in(site, client, "alice")
    for request in site.fake.requests:
        text = json.dumps(request)
        assert "s3cret-of-the-oauth-client" not in text
        assert "gho_" not in text
        assert "code" not in request["query"]


# -- pure parts ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "write_permission", "expected"),
    [
        (
            {"admin": True, "maintain": True, "push": True, "triage": True, "pull": True},
            "write",
            "read-write",
        ),
        ({"push": True, "triage": True, "pull": True}, "write", "read-write"),
        ({"push": True, "triage": True, "pull": True}, "maintain", "read-only"),
        ({"maintain": True, "push": True, "pull": True}, "maintain", "read-write"),
        ({"admin": True, "push": True, "pull": True}, "never", "read-only"),
        ({"triage": True, "pull": True}, "write", "read-only"),
        ({"pull": True}, "write", "read-only"),
        ({"pull": False, "push": False, "admin": False}, "write", None),
        ({}, "write", None),
    ],
)
def test_github_permissions_map_to_access(
    flags: dict[str, bool], write_permission: oauth.WritePermission, expected: str | None
) -> None:
    assert oauth.access(flags, write_permission=write_permission) == expected


def test_a_cookie_not_signed_by_the_page_is_no_session() -> None:
    store = Sessions(secret=b"k" * 32, lifetime=60)
    session = store.open(
        "alice", reader_token="gho_alice", repository=REPO, access="read-only", now=0, previous=None
    )
    signed = store.sign("session", session.id)
    assert store.unsign("session", signed) == session.id
    assert store.unsign("state", signed) is None  # signed for another purpose
    assert store.unsign("session", session.id + ".00") is None
    assert Sessions(secret=b"o" * 32, lifetime=60).unsign("session", signed) is None
    assert store.get(session.id, now=59) is session
    assert store.get(session.id, now=60) is None


def test_a_new_sign_in_carries_over_only_fresh_access_of_the_same_reader() -> None:
    store = Sessions(secret=b"k" * 32, lifetime=100)
    first = store.open(
        "alice",
        reader_token="gho_alice",
        repository="a/one",
        access="read-only",
        now=0,
        previous=None,
    )
    second = store.open(
        "alice",
        reader_token="gho_alice",
        repository="a/two",
        access=None,
        now=50,
        previous=first.id,
    )
    assert second.id != first.id and store.get(first.id, now=50) is None
    assert store.checked(second, "A/One", now=60) == second.repositories["a/one"]
    assert store.checked(second, "a/one", now=100) is None  # checked at 0: too old now
    assert store.checked(second, "a/two", now=100) is not None
    bob = store.open(
        "bob",
        reader_token="gho_bob",
        repository="a/three",
        access="read-only",
        now=60,
        previous=second.id,
    )
    assert set(bob.repositories) == {"a/three"}


def test_connection_strings_quote_what_a_url_cannot_hold() -> None:
    c = render.Credential(
        branch="pr-1",
        login="al",
        role="gh_al@x",
        read_only=False,
        expires_at=0.0,
        password="p@ss/w:rd?&",
        host="db.example",
        port=6543,
        database="pr-1",
    )
    strings = render.connection_strings(c, verify=True)
    assert strings["URL"] == (
        "postgresql://gh_al%40x:p%40ss%2Fw%3Ard%3F%26@db.example:6543/pr-1"
        "?sslmode=verify-full&sslrootcert=system"
    )
    assert strings["JDBC"] == (
        "jdbc:postgresql://db.example:6543/pr-1?user=gh_al%40x&"
        "password=p%40ss%2Fw%3Ard%3F%26&sslmode=verify-full"
        "&sslfactory=org.postgresql.ssl.DefaultJavaSSLFactory"
    )
    assert render.connection_strings(c, verify=False)["URL"].endswith(
        "?sslmode=verify-full&sslrootcert=pgoverlay-door.crt"
    )


def test_the_client_secret_file_holds_the_secret_alone(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    with pytest.raises(ConfigError, match="PGOVERLAY_OAUTH_CLIENT_SECRET_FILE"):
        oauth.read_client_secret(None)
    for text in ("", "\n", "two words\n"):
        path.write_text(text)
        with pytest.raises(ConfigError, match="must hold the client secret alone"):
            oauth.read_client_secret(path)
    path.write_text("0123abcd\n")
    assert oauth.read_client_secret(path) == "0123abcd"
    with pytest.raises(UnsafeFileError, match="cannot open"):
        oauth.read_client_secret(tmp_path / "missing")


def test_github_unreachable_or_redirecting_is_an_error_without_the_token() -> None:
    closed = f"http://127.0.0.1:{free_tcp_port()}"
    github = oauth.GitHubSignIn(
        web_url=closed, api_url=closed, client_id="c", client_secret="the-secret", timeout=5
    )
    with pytest.raises(GitHubError, match="cannot reach GitHub") as unreachable:
        github.exchange("the-code", redirect_uri="https://x/cb")
    assert "the-secret" not in str(unreachable.value) and "the-code" not in str(unreachable.value)
    assert "the-secret" not in repr(github)
    with FakeGitHub() as fake:
        fake.add_repo(REPO)
        fake.add_token("gho_moved", "alice")
        fake.fail_next("GET", r"^/repos/", 301, headers={"Location": "https://elsewhere.example/"})
        github = oauth.GitHubSignIn(
            web_url=fake.url, api_url=fake.url, client_id="c", client_secret="s"
        )
        with pytest.raises(GitHubError, match="answered 301") as moved:
            github.access("gho_moved", REPO, write_permission="write")
        assert "gho_moved" not in str(moved.value)
        assert len(fake.requests) == 1  # not followed
    with pytest.raises(ConfigError, match="PGOVERLAY_GITHUB_API_URL"):
        oauth.GitHubSignIn(web_url=closed, api_url="file:///etc", client_id="c", client_secret="s")


def test_the_pages_origin_is_the_door_host_and_its_https_port() -> None:
    assert page.page_origin(Settings(door_host="db.example", door_https_port=443)) == (
        "https://db.example"
    )
    assert page.page_origin(Settings(door_host="::1", door_https_port=8443)) == "https://[::1]:8443"
    assert page.page_origin(Settings(advertise_host="runner-3", door_https_port=8443)) == (
        "https://runner-3:8443"
    )
