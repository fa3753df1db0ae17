"""The query explorer page in a real browser: headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
driven by Selenium) opens ``strata serve``'s page over HTTP, asks a question and reads the rendered sections, then
drives the graph view: the context's graph, a node's panel, its expansion, a search, a community and a document.
The service is closed as ``strata serve`` starts it by default (a token made at start): the page is opened from the
URL it prints, with the token, and works with no token typed.

Screenshots go to ``test-output/`` at the repository root (or ``$STRATA_TEST_OUTPUT``): explorer.png, graph.png,
community.png, document.png.
``.ci/run`` installs the browser when it is missing; elsewhere, without it, the test says so and skips
(under ``CI=true`` it fails instead, so CI never passes without having run it).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from flows.serve import TOKEN_ENV, create_app
from schemas.config import load_config
from tests.test_serve import OVERRIDES, served_index  # noqa: F401  (the module's index fixture)

#: fixed level shares, so that a question's context fills every section the page renders (by default the small
#: chunks of this index fill the budget and leave the levels nothing)
EXPLORER = OVERRIDES | {"retrieval": {"level_budget": "shares"}}

REPO = Path(__file__).resolve().parent.parent
CHROMIUM, DRIVER = shutil.which("chromium") or "/usr/bin/chromium", shutil.which("chromedriver") or "/usr/bin/chromedriver"


def _browser_or_skip():
    missing = [p for p in (CHROMIUM, DRIVER) if not Path(p).exists()]
    try:
        from selenium import webdriver  # noqa: F401
    except ImportError:
        missing.append("the selenium package (requirements.lock)")
    if missing:
        why = (f"browser test not run: {', '.join(missing)} missing; install Debian's chromium and chromium-driver "
               "(`apt-get install chromium chromium-driver`, as .ci/run does) to run it")
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(served_index, monkeypatch):  # noqa: F811
    """The service as ``strata serve`` runs it by default, and the URL it prints: ``http://127.0.0.1:PORT/?token=…``."""
    import uvicorn

    monkeypatch.setenv(TOKEN_ENV, "")  # the app makes its token (unset again afterwards)
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(str(served_index), load_config(overrides=EXPLORER)),
                                        host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.1)
    assert srv.started, "strata serve did not start"
    yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/?token={os.environ[TOKEN_ENV]}"
    srv.should_exit = True
    thread.join(30)


def test_the_explorer_page_asks_a_question_and_renders_each_section_in_chromium(server, tmp_path):
    base, printed = server
    _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)  # an explicit driver: nothing is downloaded
    try:
        wait = WebDriverWait(driver, 60)
        driver.get(base + "/")  # without the token: the page says where the key comes from
        wait.until(lambda d: "needs its key" in d.find_element(By.ID, "meta").text)
        driver.get(printed)  # the URL strata serve printed: nothing typed
        # the index summary, the modes of the index and the layer chart come from GET /index
        wait.until(lambda d: "hirag index, snapshot v1" in d.find_element(By.ID, "meta").text)
        assert "token" not in driver.current_url and driver.find_element(By.ID, "token").get_attribute("value") == ""
        driver.refresh()  # kept for the tab, gone from the address bar
        wait.until(lambda d: "hirag index, snapshot v1" in d.find_element(By.ID, "meta").text)
        modes = [o.get_attribute("value") for o in Select(driver.find_element(By.ID, "mode")).options]
        assert modes[0] == "hi" and {"naive", "ppr"} <= set(modes)
        layers = driver.find_elements(By.CSS_SELECTOR, "#layers div")
        assert layers and layers[0].text.startswith("layer 0 → 1:") and driver.find_elements(By.CSS_SELECTOR, "#layers .bar")

        driver.find_element(By.ID, "question").send_keys("Who was Scrooge's clerk?")
        Select(driver.find_element(By.ID, "mode")).select_by_value("hi")
        driver.find_element(By.ID, "budget").send_keys("1500")
        driver.find_element(By.CSS_SELECTOR, "#ask button[type=submit]").click()
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#result details[data-section=sources]")))

        sections = {s.get_attribute("data-section"): s for s in driver.find_elements(By.CSS_SELECTOR, "#result > details")}
        assert list(sections) == ["answer", "entities", "community reports", "paths", "sources"]
        heading = sections["answer"].find_element(By.TAG_NAME, "summary").text
        assert "extractive" in heading and "mode hi" in heading and "snapshot v1" in heading
        assert sections["answer"].find_element(By.CLASS_NAME, "item").text.strip() not in ("", "(no answer)")
        sources = sections["sources"].find_elements(By.CLASS_NAME, "item")
        assert sources and any("Cratchit" in s.text for s in sources)
        assert all(re.search(r" · chunk \d+ of \d+", s.text) for s in sources)  # each source's place in its document
        marks = sections["sources"].find_elements(By.TAG_NAME, "mark")  # the answer's sentences, in their source
        assert marks and all(m.text in sections["answer"].text for m in marks)
        assert sections["entities"].find_elements(By.CLASS_NAME, "item")
        assert driver.find_element(By.ID, "status").text == ""

        out = Path(os.environ.get("STRATA_TEST_OUTPUT", REPO / "test-output"))
        out.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(out / "explorer.png"))
        print(f"\nexplorer screenshot: {out / 'explorer.png'}")

        def text(css: str) -> str:  # read in one step: a panel re-rendered meanwhile leaves no stale element
            return driver.execute_script("const e = document.querySelector(arguments[0]); return e ? e.textContent : ''", css)

        # the graph of the context: its entities and sources as nodes
        driver.find_element(By.ID, "show-graph").click()
        wait.until(lambda d: d.execute_script("return cy.nodes('[kind = \"chunk\"]').length") > 0)
        assert driver.execute_script("return cy.nodes('[kind = \"entity\"]').length") > 0
        # laid out in the visible container and fitted: the nodes spread over it, none outside it
        box, width, height = driver.execute_script(
            "const b = cy.nodes().renderedBoundingBox(); return [[b.x1, b.y1, b.x2, b.y2], cy.width(), cy.height()]")
        assert width > 300 and height > 300 and box[0] >= -1 and box[1] >= -1 and box[2] <= width + 1 and box[3] <= height + 1
        assert box[2] - box[0] > width / 2 or box[3] - box[1] > height / 2, (box, width, height)
        assert re.search(r" · chunk \d+ of \d+$", driver.execute_script("return cy.nodes('[kind = \"chunk\"]')[0].data('label')"))
        # a search opens an entity's neighbourhood without a query; clicking a node shows its panel
        driver.find_element(By.ID, "entity-search").send_keys("Scrooge")
        driver.find_element(By.CSS_SELECTOR, "#search button").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#search-results a"))
        driver.find_element(By.CSS_SELECTOR, "#search-results a").click()
        wait.until(lambda d: "Scrooge" in text("#panel h3"))
        before = driver.execute_script("return cy.nodes().length")
        driver.find_element(By.ID, "expand").click()  # up to 60 neighbours, where the neighbourhood showed 25
        wait.until(lambda d: d.execute_script("return cy.nodes().length") > before)
        tapped = driver.execute_script(
            "const n = cy.nodes('[kind = \"entity\"]').filter((x) => x.degree() > 0)[0]; n.emit('tap'); return n.data('label')")
        wait.until(lambda d: text("#panel h3") == tapped)
        assert text("#panel p")  # its description
        assert driver.save_screenshot(str(out / "graph.png"))
        # its community: the report and its members
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#panel [data-section=communities] a"))
        driver.find_element(By.CSS_SELECTOR, "#panel [data-section=communities] a").click()
        wait.until(lambda d: d.find_element(By.ID, "tab-communities").is_displayed()
                   and d.find_elements(By.CSS_SELECTOR, "#community [data-section=members] a"))
        assert text("#community h3")
        assert "rating" in text("#community div.muted") and "weigh" in text("#community div.muted")  # with its reason
        assert driver.save_screenshot(str(out / "community.png"))
        # the first member opens in the graph; one of its sources (a summary's: its members') opens its document
        sources_css = "#panel > div:not([data-section]) > div > a"
        listing = driver.find_element(By.CSS_SELECTOR, "#community [data-section=members]")
        if not listing.get_attribute("open"):  # a community of over 30 members lists them folded
            listing.find_element(By.TAG_NAME, "summary").click()
        member = listing.find_element(By.TAG_NAME, "a")
        label = member.text
        member.click()
        wait.until(lambda d: d.find_element(By.ID, "tab-graph").is_displayed() and text("#panel h3") == label)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, sources_css))
        driver.find_element(By.CSS_SELECTOR, sources_css).click()
        wait.until(lambda d: d.find_element(By.ID, "tab-documents").is_displayed() and text("#document h3"))
        assert driver.find_elements(By.CSS_SELECTOR, "#document .item")
        listed = text("#document-list summary")
        assert listed.startswith("documents (") and int(listed.split("(")[1].split(")")[0]) >= 3
        assert driver.save_screenshot(str(out / "document.png"))
        driver.find_element(By.CSS_SELECTOR, "#tabs button[data-tab=ask]").click()

        # a bad request shows the service's message instead of sections
        driver.find_element(By.ID, "budget").clear()
        driver.find_element(By.ID, "budget").send_keys("1000000")  # over serve.max_budget
        driver.find_element(By.CSS_SELECTOR, "#ask button[type=submit]").click()
        wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("422"))
        assert "between 100 and" in driver.find_element(By.ID, "status").text
    finally:
        driver.quit()
