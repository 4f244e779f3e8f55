"""One headless Chromium driven through Selenium, loading MiniWoB++ task pages.

MiniWoB++'s pages (inside the ``miniwob`` package) expose a small JavaScript API (``core``):
``startEpisodeReal`` draws a problem from ``Math.seedrandom``, ``getDOMInfo`` numbers the
elements (``ref``), ``elementClick(ref)`` clicks one, and ``WOB_DONE_GLOBAL`` /
``WOB_REWARD_GLOBAL`` / ``WOB_RAW_REWARD_GLOBAL`` hold the episode's end and MiniWoB's own
reward. This module talks to that API directly (miniwob's ``SeleniumInstance`` is a thread
with a fixed task, which a pool worker switching tasks does not need).

Chromium runs headless with ``--no-sandbox`` (root in containers has no user namespace for
Chrome's sandbox) and ``--disable-dev-shm-usage`` (small /dev/shm in containers). The binary
and driver default to Debian's ``/usr/bin/chromium`` and ``/usr/bin/chromedriver``
(``apt-get install chromium chromium-driver``), overridable by ``MINIWOB_CHROME_BINARY`` /
``MINIWOB_CHROMEDRIVER``.
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import numpy as np

TASK_W, TASK_H = 160, 210  # MiniWoB's task area (pixels, top-left of the page)
CHROME = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def html_dir() -> Path:
    import miniwob

    return Path(miniwob.__file__).parent / "html" / "miniwob"


def task_names() -> list[str]:
    """The MiniWoB++ task pages shipped by the ``miniwob`` package."""
    return sorted(p.stem for p in html_dir().glob("*.html"))


# A watchdog per browser: a pool worker killed for a hang (SIGKILL) runs no cleanup, and
# Chromium outlives its chromedriver; the watchdog kills the driver's whole process group
# (Chromium included) once the worker that started it is gone.
_WATCHDOG = """
import os, signal, sys, time
parent, group = int(sys.argv[1]), int(sys.argv[2])
while True:
    time.sleep(0.5)
    try:
        os.killpg(group, 0)
    except OSError:
        break  # the browser is gone: nothing to guard
    try:
        os.kill(parent, 0)
    except OSError:
        os.killpg(group, signal.SIGKILL)
        break
"""


class BrowserError(RuntimeError):
    """The browser died, hung past its timeout or refused a command."""


class Browser:
    """A lazily started headless Chromium on MiniWoB++ pages."""

    def __init__(self, *, timeout_s: float = 20.0, headless: bool = True):
        self.timeout_s = timeout_s
        self.headless = headless
        self.driver = None
        self.page: str | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        if self.headless:
            options.add_argument("--headless=new")
        for arg in ("--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
            options.add_argument(arg)
        options.add_argument("--window-size=500,400")
        options.binary_location = os.environ.get("MINIWOB_CHROME_BINARY", CHROME)
        service = Service(
            executable_path=os.environ.get("MINIWOB_CHROMEDRIVER", CHROMEDRIVER),
            popen_kw={"start_new_session": True},  # its own group: Chromium joins it
        )
        try:
            self.driver = webdriver.Chrome(service=service, options=options)
        except Exception as exc:
            raise BrowserError(
                f"could not start Chromium ({type(exc).__name__}: {exc}); install it with "
                "`apt-get install chromium chromium-driver` or set MINIWOB_CHROME_BINARY and "
                "MINIWOB_CHROMEDRIVER"
            ) from exc
        import subprocess
        import sys

        group = self.driver.service.process.pid
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(group)],
            start_new_session=True,
        )
        self.driver.set_script_timeout(self.timeout_s)
        self.driver.set_page_load_timeout(self.timeout_s)
        self.page = None

    def quit(self) -> None:
        driver, self.driver, self.page = self.driver, None, None
        if driver is not None:
            try:
                driver.quit()
            except Exception:  # already dead: nothing to close
                pass
            try:  # whatever survived (a killed driver leaves Chromium running)
                os.killpg(driver.service.process.pid, 9)
            except (OSError, AttributeError):
                pass
        watchdog, self._watchdog = getattr(self, "_watchdog", None), None
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()

    @property
    def started(self) -> bool:
        return self.driver is not None

    def pids(self) -> list[int]:
        """The chromedriver's pid and its browser processes (tests kill them)."""
        import psutil

        if self.driver is None:
            return []
        root = psutil.Process(self.driver.service.process.pid)
        return [root.pid] + [p.pid for p in root.children(recursive=True)]

    # ---------------------------------------------------------------- episodes

    def js(self, script: str, *args):
        if self.driver is None:
            raise BrowserError("the browser is not running")
        try:
            return self.driver.execute_script(script, *args)
        except Exception as exc:  # WebDriverException, or urllib3's when the driver is dead
            raise BrowserError(f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc

    def begin(self, task: str, seed: int, max_ms: int) -> None:
        """Open ``task``'s page (when not already open) and start an episode from ``seed``."""
        if self.driver is None:
            self.start()
        if self.page != task:
            try:
                self.driver.get((html_dir() / f"{task}.html").as_uri())
            except Exception as exc:
                raise BrowserError(f"loading {task}: {type(exc).__name__}") from exc
            self.page = task
        self.js("core.endEpisode(0);")
        self.js(f"Math.seedrandom({int(seed)}); core.EPISODE_MAX_TIME = {int(max_ms)};")
        self.js("core.startEpisodeReal();")
        deadline = time.monotonic() + self.timeout_s
        while not self.js("return WOB_TASK_READY;"):
            if time.monotonic() > deadline:
                raise BrowserError(f"task {task} did not become ready")
            time.sleep(0.02)

    def utterance(self) -> str:
        return self.js("return core.getUtterance();")

    def dom(self) -> dict:
        return self.js("return core.getDOMInfo();")

    def metadata(self) -> dict:
        return self.js(
            "return {done: WOB_DONE_GLOBAL, reward: WOB_REWARD_GLOBAL, "
            "raw_reward: WOB_RAW_REWARD_GLOBAL, reason: WOB_REWARD_REASON};"
        )

    def click(self, ref: int) -> bool:
        """Click element ``ref``; False when the page refuses (no such element)."""
        return self.js(f"return core.elementClick({int(ref)});") is True

    def wait_for_suggestions(self, wait_s: float = 0.45) -> None:
        """Autocomplete widgets (jQuery UI, 300 ms delay) open their menu after typing."""
        if self.js("return document.querySelector('.ui-autocomplete-input') !== null;"):
            time.sleep(wait_s)

    def type_text(self, ref: int, text: str) -> None:
        """Focus the element, then send real key strokes (pages listen to key events)."""
        from selenium.webdriver.common.action_chains import ActionChains

        if not self.click(ref):
            raise BrowserError(f"could not focus element ref {ref}")
        try:
            chain = ActionChains(self.driver, duration=0)
            for key in text:
                chain.w3c_actions.key_action.key_down(key)
                chain.w3c_actions.key_action.key_up(key)
            chain.perform()
        except Exception as exc:
            raise BrowserError(f"typing: {type(exc).__name__}") from exc

    def select_option(self, ref: int, option: str) -> bool:
        """Choose the ``<option>`` whose text is ``option`` in the ``<select>`` ``ref``."""
        return bool(
            self.js(
                "var el = core.previousDOMInfo[arguments[0]];"
                "for (var i = 0; i < el.options.length; i++) {"
                "  if (el.options[i].text.trim() === arguments[1]) {"
                "    el.selectedIndex = i; el.dispatchEvent(new Event('change'));"
                "    return true; } }"
                "return false;",
                int(ref),
                option,
            )
        )

    def select_options(self, ref: int) -> list[str]:
        return self.js(
            "var el = core.previousDOMInfo[arguments[0]];"
            "return Array.from(el.options).map(function (o) { return o.text.trim(); });",
            int(ref),
        )

    def screenshot(self) -> np.ndarray:
        """The task area as ``[210, 160, 3]`` uint8 RGB."""
        from PIL import Image

        try:
            png = self.driver.get_screenshot_as_png()
        except Exception as exc:
            raise BrowserError(f"screenshot: {type(exc).__name__}") from exc
        image = Image.open(io.BytesIO(png)).convert("RGB")
        inner_w = self.js("return window.innerWidth;")
        scale = image.size[0] / inner_w  # device pixels per CSS pixel
        image = image.crop((0, 0, int(TASK_W * scale), int(TASK_H * scale)))
        return np.asarray(image.resize((TASK_W, TASK_H)), dtype=np.uint8)
