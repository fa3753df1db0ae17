"""Screenshots of the explorer on an index, for a before/after of what a person browsing the graph sees (issue 65).

Serves ``--index`` as ``strata serve`` does (on loopback, a token made here), opens the page in headless Chromium
(Debian's ``chromium`` + ``chromium-driver``, as the browser test), asks ``--question``, shows the context's graph,
opens ``--entity`` from the search and its first community, and writes ``<out>/<name>-graph.png`` and
``<out>/<name>-community.png``; prints the community's title, rating line and first findings.

    .venv/bin/python benchmarks/explorer_screens.py --index ./index --name after --out docs/screens
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flows.env import apply_offline_defaults  # noqa: E402

apply_offline_defaults()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--name", required=True, help="file name prefix, e.g. before / after")
    ap.add_argument("--out", default=str(REPO / "docs" / "screens"))
    ap.add_argument("--question", default="Who employed Bob Cratchit?")
    ap.add_argument("--entity", default="Bob Cratchit")
    ap.add_argument("--budget", type=int, default=2000)
    args = ap.parse_args()

    import uvicorn
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from flows.serve import TOKEN_ENV, create_app
    from schemas.config import load_config

    token = secrets.token_urlsafe(16)
    os.environ[TOKEN_ENV] = token
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(
        uvicorn.Config(create_app(args.index, load_config()), host="127.0.0.1", port=port, log_level="warning")
    )
    threading.Thread(target=srv.run, daemon=True).start()
    deadline = time.monotonic() + 120
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as profile:
        for flag in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--window-size=1400,1100",
        ):
            opts.add_argument(flag)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
        try:
            wait = WebDriverWait(driver, 120)

            def text(css: str) -> str:
                return driver.execute_script(
                    "const e = document.querySelector(arguments[0]); return e ? e.textContent : ''", css
                )

            driver.get(f"http://127.0.0.1:{port}/?token={token}")
            wait.until(lambda d: "snapshot v" in d.find_element(By.ID, "meta").text)
            driver.find_element(By.ID, "question").send_keys(args.question)
            Select(driver.find_element(By.ID, "mode")).select_by_value("hi")
            driver.find_element(By.ID, "budget").send_keys(str(args.budget))
            driver.find_element(By.CSS_SELECTOR, "#ask button[type=submit]").click()
            wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#result details[data-section=sources]")))
            driver.find_element(By.ID, "show-graph").click()  # the context's graph, where the search is
            wait.until(lambda d: d.execute_script("return cy.nodes('[kind = \"chunk\"]').length") > 0)
            driver.find_element(By.ID, "entity-search").send_keys(args.entity)
            driver.find_element(By.CSS_SELECTOR, "#search button").click()
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#search-results a"))
            driver.find_element(By.CSS_SELECTOR, "#search-results a").click()
            wait.until(lambda d: args.entity.split()[0] in text("#panel h3"))
            time.sleep(2)  # the layout settles
            driver.save_screenshot(str(out / f"{args.name}-graph.png"))
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#panel [data-section=communities] a"))
            driver.find_element(By.CSS_SELECTOR, "#panel [data-section=communities] a").click()
            wait.until(lambda d: d.find_element(By.ID, "tab-communities").is_displayed() and text("#community h3"))
            time.sleep(1)
            driver.save_screenshot(str(out / f"{args.name}-community.png"))
            print("community:", text("#community h3"))
            print("  ", text("#community div.muted"))
            for li in driver.find_elements(By.CSS_SELECTOR, "#community li")[:3]:
                print("  -", li.text[:160])
        finally:
            driver.quit()
            srv.should_exit = True
    print(f"wrote {out / (args.name + '-graph.png')} and {out / (args.name + '-community.png')}")


if __name__ == "__main__":
    main()
