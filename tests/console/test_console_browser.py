"""The console in a real browser: headless Chromium (Debian's `chromium` + `chromium-driver`)
driven by selenium against a real bridge. Connect, run a tool turn answered with canned outputs,
then one with a custom (freeform) tool on another lane, stored, run the transport race on a small workload, check the server view; no Content-Security-Policy
violation or script error on the way. Screenshots go to $TETHER_TEST_ARTIFACTS (default: the
test's tmp dir).

Without chromium the test skips with the reason; under TETHER_TEST_REQUIRE_SERVERS=1 (CI) it fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest

from tether.backends.simulated import CUSTOM_INPUT

from .conftest import KEY_ADMIN, ConsoleStack

REQUIRE = os.environ.get("TETHER_TEST_REQUIRE_SERVERS", "") not in ("", "0")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1000")  # fmt: skip
WAIT_S = 20.0
CUSTOM_TOOLS = [{"type": "custom", "name": "apply_patch", "description": "Apply a patch.", "format": {"type": "text"}}]


def browser_or_skip():
    try:
        from selenium import webdriver
    except ImportError:
        webdriver = None
    missing = [name for name, found in (("chromium", CHROMIUM), ("chromium-driver", DRIVER), ("selenium", webdriver)) if not found]
    if missing:
        reason = f"needs {', '.join(missing)} (apt-get install chromium chromium-driver; pip install -e '.[dev]')"
        if REQUIRE:
            pytest.fail(f"TETHER_TEST_REQUIRE_SERVERS=1 and the browser test {reason}")
        pytest.skip(reason)
    return webdriver


def artifacts_dir(tmp_path: Path) -> Path:
    out = Path(os.environ.get("TETHER_TEST_ARTIFACTS") or tmp_path) / "console"
    out.mkdir(parents=True, exist_ok=True)
    return out


def start_chromium(webdriver, profile: str):
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))


def drive(webdriver, origin: str, shots: Path, *, key: str = KEY_ADMIN, workload: str = "chat3",
          speed: str = "4000@5:10", race_timeout_s: float = WAIT_S, live_server_shot: bool = False) -> dict:
    """The whole browser session (blocking: runs in a thread while the server serves). Also
    used by scripts/console_screenshots.py against a running `tether serve`."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    seen: dict = {}
    with tempfile.TemporaryDirectory(prefix="tether-chromium-") as profile:
        driver = start_chromium(webdriver, profile)
        try:
            wait = WebDriverWait(driver, WAIT_S)
            text_of = lambda id_: driver.find_element(By.ID, id_).text  # noqa: E731
            driver.get(origin + "/console")
            driver.find_element(By.ID, "api-key").send_keys(key)
            driver.find_element(By.ID, "key-apply").click()
            wait.until(ec.text_to_be_present_in_element((By.ID, "key-status"), "(admin)"))
            # Loaded by the key check; selected below once the list is there.
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"#r-workload option[value={workload}]"))
            seen["stored"] = driver.execute_script(
                "return [localStorage.length, sessionStorage.length, document.cookie, location.href]")

            # Session view: connect with a token, a turn that calls a tool, answered with canned output.
            driver.find_element(By.ID, "ws-connect").click()
            wait.until(ec.text_to_be_present_in_element((By.ID, "ws-status"), "connected (tether.console)"))
            driver.find_element(By.ID, "s-send").click()
            wait.until(ec.element_to_be_clickable((By.ID, "s-send-outputs")))
            seen["call"] = driver.find_element(By.CSS_SELECTOR, "#s-calls .call").text
            driver.find_element(By.XPATH, "//button[text()='fill all canned']").click()
            driver.find_element(By.ID, "s-send-outputs").click()
            wait.until(ec.presence_of_element_located((By.ID, "s-answer")))
            seen["answer"] = text_of("s-answer")
            seen["cached"] = text_of("s-cached")
            seen["stages"] = text_of("s-stages")
            seen["chain"] = [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#s-chain li")]
            seen["events"] = [row.text for row in driver.find_elements(By.CSS_SELECTOR, "#s-events tr")]
            driver.save_screenshot(str(shots / "session.png"))
            # A custom tool on a lane of its own (a new chain), stored: its call answered the same way.
            driver.find_element(By.ID, "s-lane").send_keys("custom")
            driver.find_element(By.ID, "s-store").click()
            driver.execute_script("document.getElementById('s-tools').value = arguments[0]", json.dumps(CUSTOM_TOOLS))
            driver.find_element(By.ID, "s-send").click()
            wait.until(ec.element_to_be_clickable((By.ID, "s-send-outputs")))
            seen["custom_call"] = driver.find_element(By.CSS_SELECTOR, "#s-calls .call").text
            driver.find_element(By.XPATH, "//button[text()='fill all canned']").click()
            driver.find_element(By.ID, "s-send-outputs").click()
            wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#s-chain li")) == 4)
            seen["custom_chain"] = [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#s-chain li")][2:]
            seen["custom_events"] = [row.text for row in driver.find_elements(By.CSS_SELECTOR, "#s-events tr")
                                     if "custom_tool_call" in row.text]  # fmt: skip
            driver.find_element(By.ID, "s-store").click()
            # A turn on another lane for a model that does not exist: the server view counts its code.
            for field_id, value in (("s-model", "tether-lab/nope"), ("s-lane", "probe")):
                driver.find_element(By.ID, field_id).clear()
                driver.find_element(By.ID, field_id).send_keys(value)
            driver.find_element(By.ID, "s-send").click()
            wait.until(ec.text_to_be_present_in_element((By.ID, "s-status"), "failed"))

            # Transport race on a small workload at a fast model speed.
            driver.find_element(By.CSS_SELECTOR, ".tab[data-view=race]").click()
            Select(driver.find_element(By.ID, "r-workload")).select_by_value(workload)
            field = driver.find_element(By.ID, "r-speed")
            field.clear()
            field.send_keys(speed)
            driver.find_element(By.ID, "r-run").click()
            if live_server_shot:  # the server view while the race runs, then back to the race
                driver.find_element(By.CSS_SELECTOR, ".tab[data-view=server]").click()
                wait.until(lambda d: d.find_element(By.ID, "v-active").text not in ("", "0"))
                wait.until(lambda d: d.find_element(By.ID, "v-rate").text not in ("", "–", "0"))
                driver.save_screenshot(str(shots / "server-live.png"))
                driver.find_element(By.CSS_SELECTOR, ".tab[data-view=race]").click()
            WebDriverWait(driver, race_timeout_s).until(
                lambda d: d.execute_script("return document.body.dataset.raceDone") == "1")
            seen["race_status"] = text_of("r-status")
            seen["race_http"] = text_of("r-http")
            seen["race_ws"] = text_of("r-ws")
            seen["race_points"] = len(driver.find_elements(By.CSS_SELECTOR, "#r-chart-time circle"))
            driver.save_screenshot(str(shots / "race.png"))

            # Server view: live figures for the admin key.
            driver.find_element(By.CSS_SELECTOR, ".tab[data-view=server]").click()
            wait.until(ec.text_to_be_present_in_element((By.ID, "v-status"), "live"))
            wait.until(lambda d: d.find_element(By.ID, "v-rate").text != "–")  # two polls: a rate
            seen["server_turns"] = text_of("v-turns")
            seen["server_hit"] = text_of("v-hit")
            seen["server_stages"] = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#v-stages tr")]
            seen["server_errors"] = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#v-errors tr")]
            driver.save_screenshot(str(shots / "server.png"))
            seen["log"] = driver.get_log("browser")
        finally:
            driver.quit()
    return seen


async def test_console_in_a_browser(stack: ConsoleStack, tmp_path: Path) -> None:
    webdriver = browser_or_skip()
    shots = artifacts_dir(tmp_path)
    seen = await asyncio.to_thread(drive, webdriver, stack.origin, shots)

    assert seen["stored"] == [0, 0, "", stack.origin + "/console"]  # the key is in no storage, no URL
    assert seen["call"].startswith("get_weather")
    assert "This is Tether's simulated model" in seen["answer"] and "2 tools" in seen["answer"]
    assert int(seen["cached"].replace(",", "")) > 0  # the continuation reused the cached prefix
    assert "backend" in seen["stages"] and "render" in seen["stages"]
    assert len(seen["chain"]) == 2 and "← resp_" in seen["chain"][1]
    assert any("response.completed" in row for row in seen["events"])
    assert seen["custom_call"].startswith(f"apply_patch {CUSTOM_INPUT}")
    assert all("· lane custom · completed" in li for li in seen["custom_chain"])
    assert any("response.custom_tool_call_input.delta" in row for row in seen["custom_events"])
    assert any(f"response.custom_tool_call_input.done {json.dumps(CUSTOM_INPUT)}" in row for row in seen["custom_events"])
    # The call was answered with a custom_tool_call_output carrying the canned text.
    final_id = seen["custom_chain"][1].split()[0]
    async with httpx.AsyncClient(base_url=stack.origin, headers={"Authorization": f"Bearer {KEY_ADMIN}"}) as http:
        items = (await http.get(f"/v1/responses/{final_id}/input_items", params={"order": "asc"})).json()["data"]
    assert [i["type"] for i in items] == ["message", "custom_tool_call", "custom_tool_call_output"]
    assert items[2]["call_id"] == items[1]["call_id"]
    assert json.loads(items[2]["output"])["input"] == CUSTOM_INPUT
    assert "done" in seen["race_http"] and "done" in seen["race_ws"], (seen["race_http"], seen["race_ws"])
    assert seen["race_status"].startswith("done: WebSocket")
    assert seen["race_points"] == 2 * 4  # chat3: 4 turns per transport
    completed = int(seen["server_turns"].split("/")[0].replace(",", ""))
    assert completed >= 2 + 2 * 4
    assert "model_not_found 1" in seen["server_errors"]
    assert seen["server_hit"].endswith("%")
    assert any(row.startswith("backend") for row in seen["server_stages"])
    # The page's first token request, before a key is typed, is a 401 on a server with keys:
    # that is how it learns a key is needed. Anything else logged as an error is a failure.
    probe = "/console/token - Failed to load resource: the server responded with a status of 401"
    problems = [e["message"] for e in seen["log"]
                if (e["level"] == "SEVERE" or "Content Security Policy" in e["message"]) and probe not in e["message"]]
    assert not problems, problems
    assert {p.name for p in shots.iterdir()} >= {"session.png", "race.png", "server.png"}
