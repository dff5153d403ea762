"""The web console (`orchestrator-cli console`, docs/design/console.md) in a real browser, on the
real cluster, while Claude Code (with the scripted model stand-in) waits on a held call.

Two consoles run, each with its user's credentials (`--as`): alice, who has the chart's
`orchestrator-approver` ClusterRole (and may change and cancel tasks, read their audit and their
pods' logs), and mallory, who may only read TaskRuns and the catalog. Each page is open in its
own headless Chromium (Debian's chromium and chromium-driver, driven by Selenium; separate
browsers, separate cookies), with `window.Notification` replaced by a recorder before the page
loads. Then:

1. The TaskRuns are applied: the held task and a second one whose agent (a command of its own)
   logs two lines and sleeps. Their rows appear in both pages without a reload (the live event
   stream), with their age relative (`5 s ago`, the creation time in the title); the list's
   filter hides the row it does not match, then both, and shows both again.
2. The agent's call to everything/echo, with a long argument (~600 bytes, a newline, an end
   marker no clipped preview could show), is held: both pages show it pending with its
   arguments first (one value a line, before anything else of the params, `_meta` included),
   and the whole params text folded, exactly as the status has it one click away, with its byte
   count and the digest recomputed over those bytes; the request's time relative; the notice
   and a browser notification name it; the page's tool lines are `task describe`'s "Effective
   tools" lines; the agent reaches the model through its proxy's gateway, and the page shows
   what the proxy counted (status.usage).
3. mallory may not approve: her Approve and Reject are disabled with the reason visible (her
   SelfSubjectAccessReview: she may not create toolapprovals in the namespace), as are Cancel and
   the grant form (she may not patch TaskRuns); a POST her page makes anyway still gets the API
   server's 403, and the call is still pending.
4. alice presses Approve: the page says so, the approval turns approved live in both pages, and
   (the scripted model holding the agent's next step, so that nothing waits) the banner and the
   title's count are gone; then the model's next request carries echo's real answer. The second
   task's Logs tab shows its agent's log as `kubectl logs` does; mallory's Logs tab says she may
   not list pods.
5. From the page, with the agent waiting on a second held call (the banner back): the audit
   shows the approved call; add-context refuses an unknown server with the CLI's own refusal and
   grants a real catalog tool (a history row appears live and the tool line changes); a budget
   change; cancel, confirmed, turns the row Cancelled.
6. The console's guards seen from outside the browser: a foreign Host, a POST without the
   console's header or from another origin, a request without the session cookie.

Screenshots (full page) are written to $ORCH_CONSOLE_SCREENSHOTS when set, else to a pytest tmp
dir. The copies in docs/images/console/ were taken by this test; to refresh them, from
e2e/tests/python with the cluster up:

    ORCH_CONSOLE_SCREENSHOTS=$PWD/../../../docs/images/console flock /tmp/orch-e2e.lock pytest -q test_console.py

Needs the cluster with its real node (`./test` provides it) and chromium + chromium-driver
(`e2e/setup` installs them).
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from story import (
    MCP,
    MODEL_PORT,
    ScriptedModel,
    Story,
    agent_task,
    chart_object,
    text,
    tool_result_text,
    tool_use,
    wait_until,
)

TASK = "console-held"
TASK_ID = 3101
APPROVER = "alice"
VIEWER = "mallory"
END = "<<END-OF-ARGUMENT-7f3a>>"
# Longer than any preview would show, with a newline inside, and a marker at its very end.
LONG = ("deploy the release notes, first line\nsecond line: " + " ".join(f"word{i:03d}" for i in range(75)) + " " + END)
assert 550 <= len(LONG) <= 700 and "\n" in LONG
# The agent shapes its second call to mislead the person who approves: markup that would run if
# the page built HTML from it, and characters that reverse or hide text on screen.
HOSTILE = 'hold 0: <img src=x onerror="window.__pwned=1"> report\u202etxt.exe\u200b'
HOLDS = [HOSTILE] + [f"hold {i}: wait for the person" for i in range(1, 4)]
GRANT = "everything:get-sum"
# A second task whose agent (a command of its own) only logs two lines and sleeps: the Logs
# tab's text, and a second row for the list's filter.
LOGGER = "console-logger"
LOGGED = ["agent: LOGGER-5d2a started", "agent: <b>markup stays text</b>"]
AGO = re.compile(r"\d+ (s|min) ago")

# Replaces window.Notification before any page script runs: permission is granted, and every
# notification the page makes is kept in window.__notifications.
NOTIFICATION_RECORDER = """
window.__notifications = [];
window.Notification = class Notification {
  constructor(title, options) {
    options = options || {};
    window.__notifications.push({title: title, body: options.body, tag: options.tag});
  }
  close() {}
  static get permission() { return 'granted'; }
  static requestPermission(cb) { if (cb) cb('granted'); return Promise.resolve('granted'); }
};
"""


class ConsoleCalls:
    """The model asks for echo with the long message (approved from the page), then, once the
    test lets it go on (`resume`: meanwhile nothing waits), with each HOLDS message in turn
    (held, until the task is cancelled); each call's answer is kept."""

    def __init__(self):
        self.results: dict[str, str] = {}
        self.resume = threading.Event()

    def __call__(self, first):
        r = yield tool_use(MCP + "everything__echo", {"message": LONG})
        self.results[LONG] = tool_result_text(r)
        if not self.resume.wait(300):
            raise AssertionError("the test did not let the agent go on within 300 s")
        for message in HOLDS:
            r = yield tool_use(MCP + "everything__echo", {"message": message})
            self.results[message] = tool_result_text(r)
        yield text("done")


def console_argv(story: Story, user: str, *extra: str) -> list[str]:
    return [str(story.binaries["orchestrator-cli"]), "--kubeconfig", str(story.kubeconfig),
            "-n", story.work_ns, "--catalog-namespace", story.system_ns,
            "--catalog-name", chart_object("catalog"), "--as", user,
            "console", "--no-open", "--port", "0", *extra]


class Console:
    """`orchestrator-cli console` as one user, read until it prints its URL."""

    def __init__(self, story: Story, user: str, cleanup: ExitStack, *extra: str):
        self.user = user
        self.stderr = story.workdir / f"console-{user}.stderr"
        argv = console_argv(story, user, *extra)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.stderr.open("wb"),
                                     stdin=subprocess.DEVNULL, text=True)
        cleanup.callback(self.stop)
        lines: queue.Queue = queue.Queue()

        def read():  # the first line to the queue, the rest drained so the pipe never fills
            for line in self.proc.stdout:
                lines.put(line)

        threading.Thread(target=read, daemon=True).start()
        try:
            first = lines.get(timeout=30)
        except queue.Empty:
            raise AssertionError(f"the console as {user} printed no URL within 30 s "
                                 f"(exit {self.proc.poll()}): {self.stderr.read_text()}") from None
        m = re.fullmatch(r"console: (http://127\.0\.0\.1:(\d+)/\?token=([^\s]+))\n", first)
        assert m, f"the console's first line is not `console: http://127.0.0.1:PORT/?token=TOKEN`: {first!r}"
        self.url, self.port, self.token = m.group(1), int(m.group(2)), m.group(3)
        assert len(self.token) >= 43, f"a 256-bit token is at least 43 characters: {self.token!r}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def request(self, method: str, path: str, headers: dict, body: bytes | None = None):
        """One HTTP request to the console as is (http.client sends the Host we give)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for k, v in {"Host": f"127.0.0.1:{self.port}", **headers}.items():
                conn.putheader(k, v)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode(errors="replace")
        finally:
            conn.close()


class Page:
    """One console page in its own headless Chromium."""

    def __init__(self, console: Console, cleanup: ExitStack, shots: Path):
        self.console, self.shots = console, shots
        options = webdriver.ChromeOptions()
        chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
        assert chromium and driver, "chromium and chromium-driver are missing: run e2e/setup"
        options.binary_location = chromium
        for arg in ("--headless=new", "--no-sandbox", "--window-size=1280,900", "--disable-gpu",
                    "--no-first-run", "--no-default-browser-check"):
            options.add_argument(arg)
        # An explicit driver path: Selenium Manager never looks anything up or downloads.
        self.driver = webdriver.Chrome(service=Service(executable_path=driver), options=options)
        cleanup.callback(self.driver.quit)
        self.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": NOTIFICATION_RECORDER})
        self.driver.get(console.url)
        # The token leaves the address bar (303 to /), the page says who and that it is live.
        self.wait(lambda d: d.current_url == f"http://127.0.0.1:{console.port}/", "the redirect to /")
        self.wait(lambda d: self.text("[data-testid=whoami]") == console.user, f"whoami to say {console.user}")
        self.wait(lambda d: self.text("[data-testid=connection]") == "live", "the connection to be live")
        # Gone after a reload: the checks below that things appear "without reload" look at it.
        self.driver.execute_script("window.__sameDocument = true;")

    # --- reading the page (by JavaScript: the page re-renders, elements go stale) -------------

    def texts(self, css: str) -> list[str]:
        return self.driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent);", css)

    def text(self, css: str) -> str | None:
        found = self.texts(css)
        return found[0].strip() if found else None

    def attrs(self, css: str, *names: str) -> list[dict]:
        return self.driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => "
            "Object.fromEntries(arguments[1].map(n => [n, e.getAttribute(n)])));", css, list(names))

    def wait(self, condition, what: str, timeout: float = 30):
        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.1).until(condition)
        except TimeoutException:
            body = self.driver.execute_script("return document.body ? document.body.innerText : ''")
            raise AssertionError(f"{self.console.user}'s page: timed out after {timeout}s waiting for {what}\n"
                                 f"--- page text ---\n{body[:4000]}\n--- console stderr ---\n"
                                 f"{self.console.stderr.read_text()[-3000:]}") from None

    def wait_for(self, css: str, what: str, timeout: float = 30):
        self.wait(lambda d: self.texts(css), what, timeout)

    # --- acting on it ------------------------------------------------------------------------

    def click(self, css: str) -> None:
        for _ in range(20):
            try:
                self.driver.find_element(By.CSS_SELECTOR, css).click()
                return
            except StaleElementReferenceException:
                continue
        raise AssertionError(f"{css} kept going stale")

    def press_enter(self, css: str) -> None:
        """Moves the keyboard focus to the element and presses Enter (no mouse)."""
        for _ in range(20):
            try:
                element = self.driver.find_element(By.CSS_SELECTOR, css)
                self.driver.execute_script("arguments[0].focus();", element)
                assert self.driver.switch_to.active_element == element, f"{css} cannot take the focus"
                element.send_keys(Keys.ENTER)
                return
            except StaleElementReferenceException:
                continue
        raise AssertionError(f"{css} kept going stale")

    def type(self, css: str, value: str) -> None:
        for _ in range(20):
            try:
                field = self.driver.find_element(By.CSS_SELECTOR, css)
                field.clear()
                field.send_keys(value)
                return
            except StaleElementReferenceException:
                continue
        raise AssertionError(f"{css} kept going stale")

    def shown(self, css: str) -> bool:
        """Whether the first element `css` finds takes space on the page (not hidden, folded
        away or display:none)."""
        return self.driver.execute_script(
            "const e = document.querySelector(arguments[0]); "
            "return !!e && e.getClientRects().length > 0 && e.checkVisibility();", css)

    def same_document(self) -> bool:
        return self.driver.execute_script("return window.__sameDocument === true;")

    def screenshot(self, name: str) -> Path:
        """The whole page: the window made as tall as the document, then back to 1280x900."""
        height = self.driver.execute_script(
            "return Math.max(document.documentElement.scrollHeight, document.body.scrollHeight);")
        self.driver.set_window_size(1280, max(900, height + 120))
        self.driver.execute_script("window.scrollTo(0, 0);")
        path = self.shots / name
        try:
            self.wait(lambda d: d.execute_script("return document.readyState") == "complete", "the page to settle", 5)
            assert self.driver.save_screenshot(str(path)), f"no screenshot {path}"
        finally:
            self.driver.set_window_size(1280, 900)
        return path


def row(task: str) -> str:
    return f"[data-testid=task-row][data-name={task}]"


def article(approval_id: str) -> str:
    return f"[data-testid=approval][data-id='{approval_id}']"


def approvals(story: Story) -> list[dict]:
    return story.json("get", "taskrun", TASK, "-n", story.work_ns).get("status", {}).get("approvals", [])


def pending(story: Story, message: str) -> dict:
    def find():
        for a in approvals(story):
            if a["state"] == "Pending" and json.loads(a.get("params") or "{}").get("arguments", {}).get("message") == message:
                return a
        return None

    return wait_until(f"the call {message[:30]!r}… to be listed as pending", find, timeout=180, interval=0.3)


def described_tools(story: Story) -> tuple[str, list[str]]:
    """`task describe`'s "Effective tools (SOURCE):" header and the indented lines under it."""
    out = story.cli("task", "describe", TASK)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Effective tools ("))
    source = lines[at][len("Effective tools ("):-len("):")]
    tools = []
    for line in lines[at + 1:]:
        if not line.startswith(" "):
            break
        tools.append(line.strip())
    return source, tools


def page_tools(page: Page) -> tuple[str, list[str]]:
    return (page.text("[data-testid=tools-source]") or "").removeprefix("Source: "), \
        [t.strip() for t in page.texts("[data-testid=tool-line]")]


def test_the_console_shows_a_held_call_live_and_only_the_approver_can_approve_it(story: Story, tmp_path_factory):
    started = time.monotonic()
    ns = story.work_ns
    shots = Path(os.environ.get("ORCH_CONSOLE_SCREENSHOTS") or tmp_path_factory.mktemp("console-screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    script = ConsoleCalls()
    story.model = ScriptedModel(script, port=MODEL_PORT).start()
    story.cleanup.callback(story.model.stop)
    story.kubectl("create", "secret", "generic", "anthropic", "-n", ns, "--from-literal=api-key=sk-ant-stand-in-console")
    # alice: the chart's approver role, and what the page's other buttons need (add-context and
    # cancel patch the TaskRun; the audit reads the proxy through pods/portforward, with the
    # auditors' token).
    story.kubectl("create", "rolebinding", "alice-approves", "-n", ns, f"--clusterrole={chart_object('approver')}", f"--user={APPROVER}")
    story.kubectl("create", "role", "task-operator", "-n", ns, "--verb=get,list,watch,patch", "--resource=taskruns.orchestrator.io")
    story.kubectl("create", "rolebinding", "alice-operates", "-n", ns, "--role=task-operator", f"--user={APPROVER}")
    story.kubectl("create", "role", "task-audit", "-n", ns, "--verb=get,list,create",
                  "--resource=pods,pods/portforward,pods/log")
    story.kubectl("create", "rolebinding", "alice-audits", "-n", ns, "--role=task-audit", f"--user={APPROVER}")
    # ... with the auditors' token the proxy asks for (docs/cli.md, `task audit`).
    story.kubectl("create", "role", "task-audit-token", "-n", ns, "--verb=get", "--resource=secrets",
                  "--resource-name=orchestrator-task-auditor")
    story.kubectl("create", "rolebinding", "alice-audit-token", "-n", ns, "--role=task-audit-token", f"--user={APPROVER}")
    # mallory: may read TaskRuns, no approver role (nor pods, nor patching TaskRuns).
    story.kubectl("create", "role", "taskrun-reader", "-n", ns, "--verb=get,list,watch", "--resource=taskruns.orchestrator.io")
    story.kubectl("create", "rolebinding", "mallory-reads", "-n", ns, "--role=taskrun-reader", f"--user={VIEWER}")
    # Both read the catalog (the page's tool lines and its datalist).
    story.kubectl("create", "role", "catalog-reader", "-n", story.system_ns, "--verb=get",
                  "--resource=configmaps", f"--resource-name={chart_object('catalog')}")
    for user in (APPROVER, VIEWER):
        story.kubectl("create", "rolebinding", f"{user}-reads-catalog", "-n", story.system_ns,
                      "--role=catalog-reader", f"--user={user}")

    with ExitStack() as cleanup:
        approver_console = Console(story, APPROVER, cleanup)
        viewer_console = Console(story, VIEWER, cleanup)
        approver = Page(approver_console, cleanup, shots)
        viewer = Page(viewer_console, cleanup, shots)

        # 1. The task appears in both pages, live.
        # Through the model gateway: the page shows what the proxy counted.
        taskrun = agent_task(TASK, TASK_ID, "console", "echo a long message, then wait", {
            "policy": {"requireApproval": {"tools": ["everything/echo"], "timeoutSeconds": 300}},
            "mcpServers": [{"name": "everything", "tools": {"allow": ["echo"]}}],
        }, gateway=True)
        story.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(taskrun))
        logger = agent_task(LOGGER, TASK_ID + 1, "console", "log and sleep", {
            "mcpServers": [{"name": "everything", "tools": {"allow": ["echo"]}}]})
        logger["spec"]["agent"] = {"command": ["sh", "-c", "".join(f"echo '{line}'; " for line in LOGGED) + "exec sleep 900"]}
        story.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(logger))
        cleanup.callback(lambda: story.kubectl("delete", "taskrun", LOGGER, "-n", ns, "--wait=false"))
        for page in (approver, viewer):
            for task in (TASK, LOGGER):
                page.wait_for(row(task), f"the row of {task}")
            assert page.same_document(), f"{page.console.user}'s page reloaded"
            assert page.attrs(row(TASK), "data-namespace") == [{"data-namespace": ns}]
            # When it was created, relative; the time itself in the title.
            created = story.json("get", "taskrun", TASK, "-n", ns)["metadata"]["creationTimestamp"]
            page.wait(lambda d: AGO.fullmatch(page.text(f"{row(TASK)} [data-field=age] time") or ""),
                      "the row's age, e.g. `5 s ago`")
            assert page.attrs(f"{row(TASK)} [data-field=age] time", "title", "datetime") == \
                [{"title": created, "datetime": created}]

        # The list's filter hides the rows it does not match, and says so.
        approver.type("[data-testid=task-filter]", "HELD")
        approver.wait(lambda d: approver.shown(row(TASK)) and not approver.shown(row(LOGGER)), "the filter to hide the logger")
        assert approver.text("[data-testid=task-filter-count]") == "1 of 2 tasks shown"
        approver.type("[data-testid=task-filter]", "nosuch")
        approver.wait(lambda d: not approver.shown(row(TASK)) and not approver.shown(row(LOGGER)), "the filter to hide both")
        assert approver.text("[data-testid=task-empty]") == "No task matches “nosuch”.", approver.text("[data-testid=task-empty]")
        approver.type("[data-testid=task-filter]", "x" + Keys.BACKSPACE)
        approver.wait(lambda d: approver.shown(row(TASK)) and approver.shown(row(LOGGER)), "both rows back")

        # 2. The held call, whole, in both pages, with its notice and notification.
        held = pending(story, LONG)
        call = article(held["id"])
        for page in (approver, viewer):
            # alice uses the mouse, mallory the keyboard.
            page.click(row(TASK)) if page is approver else page.press_enter(row(TASK))
            page.wait_for(f"[data-testid=task-detail][data-name={TASK}][data-namespace={ns}]", "the task's detail")
            page.wait(lambda d: page.driver.execute_script("return location.hash") == f"#{ns}/{TASK}", "the hash #ns/name")
            page.wait_for(call, "the held call's approval", timeout=60)
            page.wait(lambda d: (page.attrs(call, "data-state") or [{}])[0].get("data-state", "").lower() == "pending",
                      "the approval to be pending")
            assert page.text(f"{call} [data-testid=approval-call]") == "everything/echo"
            # What a person judges comes first: the arguments, one value a line, on screen...
            arguments = page.text(f"{call} [data-testid=approval-arguments]") or ""
            assert json.loads(arguments) == json.loads(held["params"])["arguments"], arguments
            assert "\n  \"message\": " in arguments and END in arguments and "_meta" not in arguments, arguments
            assert page.shown(f"{call} [data-testid=approval-arguments]")
            assert page.driver.execute_script(
                "const [a, p] = [...arguments].map(s => document.querySelector(s)); "
                "return !!(a.compareDocumentPosition(p) & Node.DOCUMENT_POSITION_FOLLOWING);",
                f"{call} [data-testid=approval-arguments]", f"{call} [data-testid=approval-params]"), \
                "the arguments come before the whole params"
            # ... and every byte of the params one click away, as the status has them.
            assert not page.shown(f"{call} [data-testid=approval-params]"), "the whole params start folded"
            page.click(f"{call} [data-testid=approval-raw-toggle]")
            page.wait(lambda d: page.shown(f"{call} [data-testid=approval-params]"), "the whole params to unfold")
            shown = page.texts(f"{call} [data-testid=approval-params]")
            assert shown == [held["params"]], f"the page shows {shown}, the status has {held['params']!r}"
            assert json.loads(shown[0])["arguments"]["message"] == LONG and END in shown[0]
            summary = page.text(f"{call} [data-testid=approval-raw-toggle]") or ""
            assert f"{len(held['params'].encode())} bytes" in summary and "digest" in summary, summary
            # The digest is checked over exactly those bytes (nothing masked here).
            assert page.text(f"{call} [data-testid=approval-digest-check]") == \
                "recomputed from the whole params: it names exactly them"
            assert AGO.fullmatch(page.text(f"{call} [data-testid=approval-requested]") or ""), \
                page.text(f"{call} [data-testid=approval-requested]")
            assert page.attrs(f"{call} [data-testid=approval-requested]", "title") == [{"title": held["requestedAt"]}]
            # All of it on screen (a box that scrolls would still show it all; ~1 KB needs none).
            box = page.driver.execute_script(
                "const e = document.querySelector(arguments[0]); return [e.scrollHeight, e.clientHeight, "
                "e.scrollWidth, e.clientWidth];", f"{call} [data-testid=approval-params]")
            assert box[0] <= box[1] + 1 and box[2] <= box[3] + 1, f"the params box is clipped: {box}"
            assert held["digest"] in (page.text(f"{call} [data-testid=approval-digest]") or "")
            # Every control has a name a screen reader says.
            unnamed = page.driver.execute_script(
                "return [...document.querySelectorAll('input, button, textarea')].filter(e => "
                "!(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())"
                ".map(e => e.outerHTML);")
            assert unnamed == [], f"controls without a label: {unnamed}"
            assert re.fullmatch(r"expires in (\d+m)?\d+s", page.text(f"{call} [data-testid=approval-countdown]") or ""), \
                page.text(f"{call} [data-testid=approval-countdown]")
            page.wait(lambda d: page.text(f"{row(TASK)} [data-field=pending]") == "1", "the row's pending count 1")
            page.wait(lambda d: page.text("[data-testid=detail-phase]") == "Running", "the detail's phase Running")
            assert page.texts("[data-testid=detail-result]"), "the detail has no detail-result"
            # The agent waits on the held call: its model requests so far, as the proxy counted
            # them (status.usage), on the page.
            def usage_shown(_):
                u = story.json("get", "taskrun", TASK, "-n", ns).get("status", {}).get("usage") or {}
                shown = page.text("[data-testid=detail-usage]") or ""
                return u.get("requests", 0) >= 1 and shown.startswith(f"{u['requests']} requests") \
                    and f", {u['outputTokens']} out" in shown

            page.wait(usage_shown, "the detail to show status.usage (the model requests the proxy counted)")
            # Readable at 1280 wide: nothing makes the page scroll sideways.
            wide = page.driver.execute_script(
                "return [document.documentElement.scrollWidth, document.documentElement.clientWidth];")
            assert wide[0] <= wide[1], f"the page is {wide[0]} px wide in a {wide[1]} px window"
            notice = f"Call waiting for approval: {ns}/{TASK} everything/echo"
            page.wait(lambda d: page.text("[data-testid=notice]") == notice, f"the notice {notice!r}")
            notes = page.driver.execute_script("return window.__notifications;")
            assert {"title": "Call waiting for approval", "body": f"{ns}/{TASK}: everything/echo",
                    "tag": f"{ns}/{TASK}/{held['id']}"} in notes, notes
            assert page.same_document(), f"{page.console.user}'s page reloaded"

        # The tool lines are task describe's.
        approver.wait(lambda d: page_tools(approver)[1] == described_tools(story)[1],
                      "the page's tool lines to be task describe's")
        source, lines = described_tools(story)
        assert page_tools(approver) == (source, lines), (page_tools(approver), source, lines)
        assert lines == ["everything: echo"], lines
        approver.click(f"{call} [data-testid=approval-raw-toggle]")
        approver.wait(lambda d: not approver.shown(f"{call} [data-testid=approval-params]"), "the whole params to fold again")
        approver.screenshot("pending-approval.png")

        # 3. mallory may not approve: her Approve (and Reject) are off, and the page says why, in
        # the API server's answer to her SelfSubjectAccessReview; alice's are on.
        asked = len(story.model.conversation())
        because = f"you ({VIEWER}) may not create toolapprovals.orchestrator.io in namespace {ns}"
        viewer.wait(lambda d: because in (viewer.text(f"{call} [data-testid=approval-permission]") or ""),
                    "mallory's page to say why she may not approve")
        assert viewer.shown(f"{call} [data-testid=approval-permission]")
        for button in ("approve", "reject"):
            assert viewer.attrs(f"{call} [data-testid={button}]", "disabled") == [{"disabled": ""}], button
            assert approver.attrs(f"{call} [data-testid={button}]", "disabled") == [{"disabled": None}], button
        assert approver.text(f"{call} [data-testid=approval-permission]") == ""
        # Cancel and the grant form too: patching the TaskRun is not hers either.
        assert f"may not patch taskruns.orchestrator.io in namespace {ns}" in (viewer.text("[data-testid=cancel-permission]") or "")
        assert viewer.attrs("[data-testid=cancel]", "disabled") == [{"disabled": ""}]
        assert viewer.attrs("[data-testid=context-submit]", "disabled") == [{"disabled": ""}]
        # The disabled button is advice: the API server still refuses her, whatever asks.
        sent = viewer.driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            fetch(arguments[0], {method: 'POST', credentials: 'same-origin',
                headers: {'Content-Type': 'application/json', 'X-Orchestrator-Console': '1'},
                body: JSON.stringify({decision: 'approve', reason: 'looks fine to me', digest: arguments[1]})})
              .then(r => r.json().then(b => done([r.status, b])), e => done([0, String(e)]));""",
            f"/api/namespaces/{ns}/tasks/{TASK}/approvals/{held['id']}", held["digest"])
        assert sent[0] == 403 and sent[1]["reason"] == "Forbidden", sent
        assert f'User "{VIEWER}" cannot create resource "toolapprovals"' in sent[1]["error"], sent
        assert [a["state"] for a in approvals(story) if a["id"] == held["id"]] == ["Pending"]
        assert story.kubectl("get", "toolapprovals", "-n", ns, "-o", "name").strip() == ""
        assert len(story.model.conversation()) == asked and LONG not in script.results
        viewer.screenshot("forbidden.png")

        # 4. alice approves: the page says so, both pages show it approved, and the model's next
        # request carries echo's answer.
        approver.type(f"{call} [data-testid=approval-reason]", "read it whole")
        approver.click(f"{call} [data-testid=approve]")
        approver.wait_for(f"{call} [data-testid=approval-message][data-ok=true]", "alice's approval to be accepted")
        said = approver.text(f"{call} [data-testid=approval-message]")
        assert held["id"] in said and APPROVER in said, said
        for page in (approver, viewer):
            page.wait(lambda d: (page.attrs(call, "data-state") or [{}])[0].get("data-state", "").lower() == "approved",
                      "the approval to turn approved", timeout=60)
            assert page.same_document(), f"{page.console.user}'s page reloaded"
        decided = next(a for a in approvals(story) if a["id"] == held["id"])
        assert (decided["state"], decided.get("decidedBy"), decided.get("reason")) == ("Approved", APPROVER, "read it whole"), decided
        # Nothing waits now (the agent is held back until the test lets it go on): the banner is gone.
        for page in (approver, viewer):
            page.wait(lambda d: page.text("[data-testid=notice]") == "" and d.title == "orchestrator console",
                      "the banner and the title's count to go once nothing waits")
            assert not page.shown("[data-testid=notice]")
        approver.screenshot("approved.png")
        script.resume.set()
        carrying = story.model.wait_for(lambda r: LONG in tool_result_text(r), timeout=60, what="echo's answer")
        assert story.model.conversation().index(carrying) == asked, "echo's answer is not in the model's next request"
        assert script.results[LONG] == f"Echo: {LONG}", script.results

        # The Logs tab: the end of the agent container's log (pods/log, as `task logs`).
        approver.click(row(LOGGER))
        approver.wait_for(f"[data-testid=task-detail][data-name={LOGGER}]", "the logger's detail")
        approver.click("[data-testid=tab-logs]")
        approver.wait(lambda d: all(line in (approver.text("[data-testid=logs-text]") or "") for line in LOGGED),
                      "the agent's log lines in the Logs tab", timeout=90)
        assert approver.texts("[data-testid=logs-text]")[0] == story.kubectl(
            "logs", "-n", ns, f"job/{LOGGER}", "-c", "agent"), "the page shows the log as kubectl does"
        assert approver.driver.execute_script("return document.querySelectorAll('b').length;") == 0
        said = approver.text("[data-testid=logs-message]") or ""
        assert said.startswith(f"the last {len(LOGGED)} lines of container agent of pod {LOGGER}-"), said
        assert not approver.shown("[data-testid=panel-overview]")
        approver.screenshot("logs.png")
        approver.click("[data-testid=tab-overview]")
        # mallory may not read pods' logs: her Logs tab says so instead of a log.
        viewer.click("[data-testid=tab-logs]")
        viewer.wait(lambda d: f"you ({VIEWER}) may not list pods in namespace {ns}" in (viewer.text("[data-testid=logs-message]") or ""),
                    "mallory's Logs tab to say why she may not read it")
        assert viewer.attrs("[data-testid=logs-message]", "data-ok") == [{"data-ok": "false"}]
        viewer.click("[data-testid=tab-overview]")
        approver.click(row(TASK))
        approver.wait_for(f"[data-testid=task-detail][data-name={TASK}]", "the held task's detail again")

        # 5. With the agent waiting on its next held call: audit, add-context, cancel.
        second = pending(story, HOLDS[0])
        hostile = article(second["id"])
        approver.wait_for(f"{hostile} [data-testid=approval-params]", "the second held call")
        # A call waits again: so does the banner.
        approver.wait(lambda d: approver.text("[data-testid=notice]") == f"Call waiting for approval: {ns}/{TASK} everything/echo",
                      "the banner for the second held call")
        # Its markup is text, and what would hide or reverse text is shown as `\u{…}`.
        shown = approver.text(f"{hostile} [data-testid=approval-params]") or ""
        assert '<img src=x onerror=\\"window.__pwned=1\\">' in shown, shown
        assert "\u202e" not in shown and "\u200b" not in shown, ascii(shown)
        assert "report\\u{202e}txt.exe\\u{200b}" in shown, ascii(shown)
        assert "report\\u{202e}txt.exe\\u{200b}" in (approver.text(f"{hostile} [data-testid=approval-arguments]") or "")
        assert approver.driver.execute_script(
            "return [document.querySelectorAll('img').length, window.__pwned === undefined];") == [0, True]
        # The audit shows the approved call.
        audited = "[data-testid=audit-row][data-server=everything][data-decision=approved]"
        clicked = [0.0]

        def audit_row(_):
            if approver.texts(audited):
                return True
            if time.monotonic() - clicked[0] > 2:
                approver.click("[data-testid=audit-refresh]")
                clicked[0] = time.monotonic()
            return False

        approver.wait(audit_row, "the approved echo call in the audit", timeout=60)
        record = approver.attrs(audited, "data-tool", "data-outcome")[0]
        assert record["data-tool"].endswith("echo") and record["data-outcome"] == "ok", record

        # add-context: an unknown server is refused with the CLI's own words.
        cli_refusal = story.cli("--as", APPROVER, "task", "add-context", TASK, "--enable-tools", "nosuch:tool")
        assert cli_refusal.returncode == 2, cli_refusal
        cli_words = cli_refusal.stderr.strip().removeprefix("error: ").splitlines()[0]
        approver.type("[data-testid=enable-tools]", "nosuch:tool")
        approver.click("[data-testid=context-submit]")
        approver.wait_for("[data-testid=context-message][data-ok=false]", "the refusal of nosuch:tool")
        refusal = approver.text("[data-testid=context-message]")
        assert "nosuch" in refusal and cli_words in refusal, (refusal, cli_words)
        assert approver.attrs("[data-testid=context-message]", "role") == [{"role": "status"}]
        # A real catalog tool is granted: a history row appears and the tool line changes, live.
        history = len(approver.texts("[data-testid=history-row]"))
        approver.type("[data-testid=enable-tools]", GRANT)
        approver.click("[data-testid=context-submit]")
        approver.wait_for("[data-testid=context-message][data-ok=true]", f"the grant of {GRANT}")
        approver.wait(lambda d: len(approver.texts("[data-testid=history-row]")) == history + 1, "a new history row")
        newest = approver.texts("[data-testid=history-row]")[-1]
        assert APPROVER in newest and "get-sum" in newest, newest
        approver.wait(lambda d: page_tools(approver)[1] == ["everything: echo, get-sum"], "the tool line to list get-sum")
        approver.wait(lambda d: page_tools(approver)[1] == described_tools(story)[1],
                      "the page's tool lines to be task describe's after the grant")
        assert approver.same_document()
        approver.screenshot("context-and-audit.png")
        # A person raises the model budget from the page, as `add-context --budget` does.
        before = story.json("get", "taskrun", TASK, "-n", ns)["spec"].get("budget", {})
        approver.type("[data-testid=budget]", "outputTokens=lots")
        approver.click("[data-testid=context-submit]")
        approver.wait_for("[data-testid=context-message][data-ok=false]", "the refusal of a budget that is no number")
        assert "outputTokens is a whole number" in approver.text("[data-testid=context-message]")
        assert story.json("get", "taskrun", TASK, "-n", ns)["spec"].get("budget", {}) == before, "a refused budget changed the TaskRun"
        approver.type("[data-testid=budget]", "outputTokens=250000 wallTimeSeconds=7200")
        approver.click("[data-testid=context-submit]")
        approver.wait_for("[data-testid=context-message][data-ok=true]", "the budget raise")
        budget = story.json("get", "taskrun", TASK, "-n", ns)["spec"]["budget"]
        assert (budget["outputTokens"], budget["wallTimeSeconds"]) == (250000, 7200), budget
        report = " ".join(approver.texts("[data-testid=context-form] .report li"))
        assert "budget: " in report and "outputTokens" in report and "→ 250000" in report, report

        # Cancel, confirmed: the row turns Cancelled.
        approver.click("[data-testid=cancel]")
        approver.wait_for("[data-testid=cancel-confirm]", "the cancel button to ask for confirmation")
        approver.click("[data-testid=cancel-confirm]")
        approver.wait(lambda d: approver.text(f"{row(TASK)} [data-field=phase]") == "Cancelled",
                      "the row's phase Cancelled", timeout=90)
        approver.wait(lambda d: approver.text("[data-testid=detail-phase]") == "Cancelled", "the detail's phase Cancelled")
        assert APPROVER in (approver.text("[data-testid=cancel-message]") or ""), approver.text("[data-testid=cancel-message]")
        cancelled = story.json("get", "taskrun", TASK, "-n", ns)["status"]
        assert cancelled["phase"] == "Cancelled" and cancelled["cancellation"]["requestedBy"] == APPROVER, cancelled
        viewer.wait(lambda d: viewer.text(f"{row(TASK)} [data-field=phase]") == "Cancelled", "the viewer's row Cancelled")
        approver.screenshot("cancelled.png")

        # 6. The guards, from outside the browser.
        console = approver_console
        cookie = next(c for c in approver.driver.get_cookies() if c["name"] == f"orchestrator_console_{console.port}")
        assert cookie["httpOnly"] and cookie.get("sameSite") == "Strict", cookie
        session = {"Cookie": f"{cookie['name']}={cookie['value']}"}
        status, headers, body = console.request("GET", "/api/session", session)
        assert status == 200 and json.loads(body)["user"] == APPROVER, (status, body)
        assert json.loads(body)["namespace"] == ns, body
        csp = [d.strip() for d in headers.get("content-security-policy", "").split(";")]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, headers
        assert (headers.get("x-frame-options"), headers.get("referrer-policy"), headers.get("x-content-type-options"),
                headers.get("cache-control")) == ("DENY", "no-referrer", "nosniff", "no-store"), headers
        status, _, body = console.request("GET", "/api/session", {**session, "Host": f"evil.example:{console.port}"})
        assert status == 403, (status, body)
        # Behind a tunnel (ssh -L, a port-forward) the browser names another local port: still served.
        status, _, body = console.request("GET", "/api/session", {**session, "Host": "localhost:18443"})
        assert status == 200, (status, body)
        status, _, body = console.request("GET", "/api/session", {})
        assert status == 401, (status, body)
        status, _, body = console.request("GET", "/?token=" + "0" * len(console.token), {})
        assert status == 401, (status, body)
        path = f"/api/namespaces/{ns}/tasks/{TASK}/context"
        change = json.dumps({"enable": [], "disable": []}).encode()
        status, _, body = console.request("POST", path, {**session, "Content-Type": "application/json"}, change)
        assert status == 403, f"a POST without X-Orchestrator-Console: {status} {body}"
        status, _, body = console.request("POST", path, {**session, "Content-Type": "application/json",
                                                         "X-Orchestrator-Console": "1",
                                                         "Origin": "http://evil.example"}, change)
        assert status == 403, f"a POST from another origin: {status} {body}"
        # The same request from the page's own origin gets past the guards (the task is finished).
        status, _, body = console.request("POST", path, {**session, "Content-Type": "application/json",
                                                         "X-Orchestrator-Console": "1",
                                                         "Origin": f"http://127.0.0.1:{console.port}"}, change)
        assert status not in (401, 403), f"a POST with the header and the page's origin: {status} {body}"

    print(f"console test: {time.monotonic() - started:.0f} s from the model's start to the guards; screenshots in {shots}")


def test_the_console_says_at_start_what_the_caller_may_not_list(story: Story):
    """-A for someone who may list TaskRuns in one namespace only shows that one and says why (as
    `task approvals -A` does); someone who may list none gets the API server's refusal at once,
    not an empty page."""
    ns = story.work_ns
    story.kubectl("create", "role", "console-lister", "-n", ns, "--verb=get,list,watch",
                  "--resource=taskruns.orchestrator.io")
    story.kubectl("create", "rolebinding", "nina-lists", "-n", ns, "--role=console-lister", "--user=nina")
    with ExitStack() as cleanup:
        console = Console(story, "nina", cleanup, "-A")
        status, headers, _ = console.request("GET", f"/?token={console.token}", {})
        assert status == 303, status
        cookie = headers["set-cookie"].split(";")[0]
        status, _, body = console.request("GET", "/api/session", {"Cookie": cookie})
        assert status == 200, (status, body)
        assert json.loads(body) == {"user": "nina", "namespace": ns, "allNamespaces": False}, body
        said = console.stderr.read_text()
        assert "you may not list TaskRuns in all namespaces" in said and f"showing namespace {ns} only" in said, said

    refused = subprocess.run(console_argv(story, "nobody"), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1, refused
    assert refused.stdout == "", "no URL for a console that cannot show anything"
    assert f"listing TaskRuns in namespace {ns}" in refused.stderr and "forbidden" in refused.stderr, refused.stderr
