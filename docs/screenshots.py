"""Make the admin screenshots of the docs from the demo, at a laptop's width.

Usage, from the repository root, with the project's virtualenv (the ``dev`` extra brings
Playwright; the browser is Debian's Chromium, ``bash .ci/install-browser``)::

    python docs/screenshots.py [--width 1280] [--out docs/images]

1. ``example_project/manage.py demo --no-web --exit-when-done`` seeds the demo's orders and
   runs their tasks to the end (its database, ``pgtasks_example``, on the server the demo
   finds: see the README);
2. ``manage.py runserver`` serves its admin on a free local port;
3. Chromium, ``--width`` pixels wide with the admin's navigation sidebar open, logs in as
   ``demo`` and saves ``admin-dashboard.png`` (the dashboard) and ``admin-failed-group.png``
   (the task list of the commonest failure group) into ``--out``.

The pictures of ``docs/admin.md`` are made this way, so they show the admin as it is.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANAGE = [sys.executable, str(ROOT / "example_project" / "manage.py")]
CHROMIUM = os.environ.get("PGTASKS_CHROMIUM", "/usr/bin/chromium")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} did not answer within {timeout:g}s.") from None
            time.sleep(0.2)


def shoot(base: str, width: int, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(f"{base}/admin/login/?next=/admin/")
            page.fill("#id_username", "demo")
            page.fill("#id_password", "demo")
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/")
            page.goto(f"{base}/admin/django_pgtasks/task/dashboard/")
            page.wait_for_selector("svg.pgtasks-chart")
            page.screenshot(path=str(out / "admin-dashboard.png"), full_page=True)
            group = page.locator("[id^=pgtasks-error-groups-] tr.error-group a").first
            group.click()
            page.wait_for_selector("#result_list")
            page.screenshot(path=str(out / "admin-failed-group.png"), full_page=True)
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=1280, help="window width (default 1280)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images",
                        help="where the pictures go (default docs/images)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    subprocess.run([*MANAGE, "demo", "--no-web", "--exit-when-done"], check=True, cwd=ROOT)
    port = free_port()
    server = subprocess.Popen([*MANAGE, "runserver", "--noreload", f"127.0.0.1:{port}"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(f"{base}/admin/login/")
        shoot(base, args.width, args.out)
    finally:
        server.terminate()
        server.wait(30)
    for name in ("admin-dashboard.png", "admin-failed-group.png"):
        print(args.out / name)


if __name__ == "__main__":
    main()
