"""Take the README's screenshots of the admin from a running `make serve` (the example
project's demo): `python scripts/screenshot-admin.py [http://127.0.0.1:8000]`.

Headless Chromium (Debian's /usr/bin/chromium, or CHROMIUM), a 1,280 x 800 window,
logged in as the demo's admin/admin. Writes docs/images/admin-jobs.png (the job list).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
PAGES = {"admin-jobs.png": "/admin/django_delayq/job/"}


def main(base: str) -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
            args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{base}/admin/login/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", "admin")
        page.click("input[type=submit]")
        page.wait_for_url(f"{base}/admin/")
        for name, path in PAGES.items():
            page.goto(base + path)
            page.wait_for_load_state("networkidle")
            page.screenshot(path=str(IMAGES / name))
            print(IMAGES / name)
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000")
