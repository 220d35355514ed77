"""Refresh docs/dashboard.png and docs/dashboard-node.png from the demo fleet.

    .venv/bin/python docs/screenshots.py

Runs `gpu-node-agent demo` (8 nodes, scripted faults), waits until the faults have played out, and
photographs the overview and gpu-03's page (the flapping IB port) with Debian's chromium.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

DOCS = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"
SETTLE_S = 25.0  # the demo's last scripted fault comes at +20 s
WIDTH = 1400


async def shoot(url: str) -> None:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = await browser.new_page(viewport={"width": WIDTH, "height": 200})  # full_page grows it
        await page.goto(url)
        await page.locator("td.worst").first.wait_for()
        await page.wait_for_timeout(500)
        await page.screenshot(path=str(DOCS / "dashboard.png"), full_page=True)
        await page.goto(url + "node/gpu-03")
        await page.locator("#timeline svg").wait_for()
        await page.wait_for_timeout(500)
        height = min(1200, await page.evaluate("document.documentElement.scrollHeight"))  # the events list goes on
        await page.screenshot(path=str(DOCS / "dashboard-node.png"), full_page=True,
                              clip={"x": 0, "y": 0, "width": WIDTH, "height": height})
        await browser.close()


def main() -> int:
    demo = subprocess.Popen([sys.executable, "-m", "agent", "demo", "--duration", "40", "--nodes", "8", "--port", "0",
                             "--workdir", "/tmp/gna-shots"], stdout=subprocess.PIPE, text=True)
    assert demo.stdout is not None
    started = time.monotonic()
    url = next((m.group(1) for line in demo.stdout if (m := re.search(r"demo: dashboard at (http://\S+)", line))), "")
    threading.Thread(target=demo.stdout.read, daemon=True).start()  # a full pipe would stall the demo
    try:
        if not url:
            print("the demo printed no dashboard URL", file=sys.stderr)
            return 1
        time.sleep(max(0.0, SETTLE_S - (time.monotonic() - started)))
        asyncio.run(shoot(url))
        print(f"wrote {DOCS / 'dashboard.png'} and {DOCS / 'dashboard-node.png'}")
    finally:
        rc = demo.wait(60)  # it ends by itself and tears its fleet down
    return rc


if __name__ == "__main__":
    sys.exit(main())
