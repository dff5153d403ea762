"""The git zone's git (config/git-zone/git; docs/architecture.md, "Servers that run repository
content"), run on this machine with the real /usr/bin/git (Debian bookworm's 2.39, as in the
images) on repositories an agent made hostile. No cluster.

Each route plants a program that records that it ran (a file in the test's `loot` directory).
First plain git runs the same commands on the same repository and the program runs (the route is
live), then the zone's git runs them: nothing ran, git still did its work, and what it set aside
is named on stderr with the allow-list. Routes: signature verification (log.showSignature with
x509 and ssh programs, allowedSignersFile, defaultKeyCommand), a submodule's own configuration
and attributes (a filter driver, fsmonitor, hooks; one submodule's `.git` file pointing outside
the work tree), include/includeIf and extensions.worktreeConfig, a git directory that names
another common directory, the configuration rewritten while git runs (the race), and the routes
the earlier deny-list covered (hooks, hooksPath, fsmonitor, filter/textconv/merge drivers,
external diff, ssh command, pager). Then the catalog's git MCP server (mcp-server-git, GitPython)
with this git first on its PATH: every tool works on an ordinary repository (tracking, identity
and submodules read as before) and on the hostile one, where nothing ran either.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ZONE = ROOT / "config" / "git-zone"
REAL = "/usr/bin/git"

# What a planted program does: record who ran it; a filter or textconv passes its input through.
STEAL = r"""#!/bin/sh
me=$(basename "$0")
echo "ran $0 $* as $(id -u)" > "LOOT/ran-$me-$$"
case $me in *filter*) exec cat ;; *textconv*) exec cat "$1" ;; esac
exit 0
"""

pytestmark = pytest.mark.skipif(not Path(REAL).exists(), reason="needs /usr/bin/git")


class Lab:
    def __init__(self, root: Path):
        self.root = root
        self.loot = root / "loot"
        self.steal = root / "steal"
        self.home = root / "home"
        for d in (self.loot, self.steal, self.home, root / "zone-tmp"):
            d.mkdir()
        # The agent's own git and the control: plain git, nothing of this machine's config.
        self.plain_env = {"PATH": os.environ["PATH"], "HOME": str(self.home), "GIT_CONFIG_NOSYSTEM": "1",
                          "LANG": "C", "GIT_AUTHOR_DATE": "1700000000 +0000",
                          "GIT_COMMITTER_DATE": "1700000000 +0000"}
        # The zone: its git first on PATH, its own TMPDIR (the zone's /tmp in the pod).
        self.zone_env = {**self.plain_env, "PATH": f"{ZONE}:{os.environ['PATH']}",
                         "TMPDIR": str(root / "zone-tmp")}

    def program(self, name: str) -> str:
        path = self.steal / name
        path.write_text(STEAL.replace("LOOT", str(self.loot)))
        path.chmod(0o755)
        return str(path)

    def ran(self) -> list[str]:
        return sorted(p.name.rsplit("-", 1)[0] for p in self.loot.iterdir() if p.name.startswith("ran-"))

    def clear(self) -> None:
        for p in self.loot.iterdir():
            p.unlink()

    def agent(self, cwd: Path, *args: str, input: str | None = None) -> str:
        """The agent's own git (plain, before anything is planted that it would run)."""
        out = subprocess.run([REAL, *args], cwd=cwd, env=self.plain_env, capture_output=True, text=True,
                             input=input, timeout=60)
        assert out.returncode == 0, (args, out.stderr)
        return out.stdout

    def plain(self, cwd: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([REAL, *args], cwd=cwd, env=self.plain_env, capture_output=True, text=True, timeout=60)

    def zone(self, cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        """The zone's git, found on PATH as GitPython finds it."""
        return subprocess.run(["git", *args], cwd=cwd, env={**self.zone_env, **(env or {})}, capture_output=True,
                              text=True, timeout=60)

    def repo(self, name: str) -> Path:
        path = self.root / name
        self.agent(self.root, "init", "-q", "-b", "main", name)
        self.agent(path, "config", "user.name", "agent")
        self.agent(path, "config", "user.email", "agent@example.com")
        (path / "a.txt").write_text("one\n")
        self.agent(path, "add", "a.txt")
        self.agent(path, "commit", "-q", "-m", "first")
        return path


@pytest.fixture
def lab(tmp_path):
    return Lab(tmp_path)


def touch_same(path: Path) -> None:
    """Rewrite a tracked file with its own content: same size, new mtime, so git must hash it
    again (running its clean filter) to know it is unchanged."""
    text = path.read_bytes()
    time.sleep(0.01)
    path.write_bytes(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def check_route(lab: Lab, cwd: Path, commands: list[list[str]], expect: set[str], prepare=None,
                control_cwd: Path | None = None) -> list[subprocess.CompletedProcess]:
    """Plain git runs the planted programs `expect` (the route is live); the zone's git runs the
    same commands and none. `prepare` runs before each (what the first run refreshed, made stale
    again); a control that changes the repository runs on a copy (`control_cwd`). Returns the
    zone's results."""
    if prepare:
        prepare()
    for args in commands:
        lab.plain(control_cwd or cwd, *args)
    assert expect <= set(lab.ran()), f"the control did not run {expect - set(lab.ran())}: {lab.ran()}"
    lab.clear()
    if prepare:
        prepare()
    results = [lab.zone(cwd, *args) for args in commands]
    assert lab.ran() == [], f"planted programs ran through the zone's git: {lab.ran()}"
    return results


def signed_commit(lab: Lab, repo: Path, parent: str, armor: str, message: str) -> str:
    """A commit carrying a signature header of the given kind (its bytes need not verify: git
    hands them to the kind's program, which is the route)."""
    tree = lab.agent(repo, "rev-parse", f"{parent}^{{tree}}").strip()
    body = (f"tree {tree}\nparent {parent}\nauthor agent <agent@example.com> 1700000000 +0000\n"
            f"committer agent <agent@example.com> 1700000000 +0000\n"
            f"gpgsig -----BEGIN {armor}-----\n U0lHTkFUVVJF\n -----END {armor}-----\n\n{message}\n")
    return lab.agent(repo, "hash-object", "-t", "commit", "-w", "--stdin", input=body).strip()


def test_signature_verification_runs_no_program_of_the_repository(lab):
    repo = lab.repo("sig")
    head = lab.agent(repo, "rev-parse", "HEAD").strip()
    c1 = signed_commit(lab, repo, head, "SIGNED MESSAGE", "signed x509")
    c2 = signed_commit(lab, repo, c1, "SSH SIGNATURE", "signed ssh")
    c3 = signed_commit(lab, repo, c2, "PGP SIGNATURE", "signed openpgp")
    lab.agent(repo, "update-ref", "refs/heads/main", c3)
    (lab.root / "allowed_signers").write_text("")
    for key, value in [("log.showSignature", "true"), ("gpg.format", "ssh"),
                       ("gpg.x509.program", lab.program("x509")), ("gpg.ssh.program", lab.program("ssh-keygen")),
                       ("gpg.program", lab.program("gpg")), ("gpg.ssh.allowedSignersFile", str(lab.root / "allowed_signers")),
                       ("gpg.ssh.defaultKeyCommand", lab.program("key-command"))]:
        lab.agent(repo, "config", key, value)
    log, show, whatchanged = check_route(lab, repo, [["log", "-4"], ["show", "HEAD~1"], ["whatchanged", "-2"]],
                                         {"ran-x509", "ran-ssh-keygen", "ran-gpg"})
    for out in (log, show, whatchanged):
        assert out.returncode == 0, out.stderr
    assert [line.strip() for line in log.stdout.splitlines() if line.startswith("    ")] == [
        "signed openpgp", "signed ssh", "signed x509", "first"]
    assert "signed ssh" in show.stdout and "Good signature" not in show.stdout + show.stderr
    # What the user reads: the keys set aside, by name, and the allow-list.
    for key in ("log.showsignature", "gpg.x509.program", "gpg.ssh.program", "gpg.ssh.allowedsignersfile",
                "gpg.ssh.defaultkeycommand", "gpg.program", "gpg.format"):
        assert key in log.stderr, log.stderr
    assert "outside the allow-list" in log.stderr and "user/author/committer name and email" in log.stderr
    # Asked for by name, verification runs the zone's own `false`, never the repository's program.
    asked = lab.zone(repo, "log", "--show-signature", "-3")
    assert asked.returncode == 0 and "signed ssh" in asked.stdout, asked.stderr
    assert lab.ran() == []


def submodule_repo(lab: Lab) -> tuple[Path, Path, Path]:
    """A repository with two submodules: `s`, its git directory absorbed into .git/modules/s (as
    `git submodule add` makes it), and `t`, whose `.git` file points at a git directory outside
    the work tree. Each gets its own filter driver and attributes, fsmonitor, hooks."""
    src = lab.repo("sub-src")
    top = lab.repo("top")
    lab.agent(top, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(src), "s")
    lab.agent(top, "commit", "-q", "-m", "add s")
    elsewhere = lab.root / "elsewhere.git"
    lab.agent(lab.root, "clone", "-q", "--separate-git-dir", str(elsewhere), str(src), str(top / "t"))
    lab.agent(top, "add", "t")
    lab.agent(top, "commit", "-q", "-m", "add t")
    assert (top / "t" / ".git").read_text().strip() == f"gitdir: {elsewhere}"
    return top, top / ".git" / "modules" / "s", elsewhere


def test_a_submodule_s_own_configuration_and_attributes_run_nothing(lab):
    top, s_git, t_git = submodule_repo(lab)
    for name, git_dir in [("s", s_git), ("t", t_git)]:
        with open(git_dir / "config", "a") as f:
            f.write(f'[filter "z"]\n\tclean = {lab.program(name + "-filter")}\n\tsmudge = {lab.program(name + "-filter")}\n'
                    f'[diff "z"]\n\ttextconv = {lab.program(name + "-textconv")}\n'
                    f"[core]\n\tfsmonitor = {lab.program(name + '-fsmonitor')}\n"
                    f"\thooksPath = {lab.steal}\n")
        (top / name / ".gitattributes").write_text("* filter=z diff=z\n")
        (git_dir / "hooks" / "post-checkout").write_text(STEAL.replace("LOOT", str(lab.loot)))
        (git_dir / "hooks" / "post-checkout").chmod(0o755)

    def stale():
        touch_same(top / "s" / "a.txt")
        touch_same(top / "t" / "a.txt")

    commands = [["status"], ["diff"], ["diff", "--submodule=diff"], ["status", "--porcelain=2"]]
    status, diff, subdiff, porcelain = check_route(lab, top, commands, {"ran-s-filter", "ran-t-filter"}, stale)
    for out in (status, diff, subdiff, porcelain):
        assert out.returncode == 0, out.stderr
    # git still looked into both (through the zone's git, which names what it set aside there).
    assert "modified:   s (untracked content)" in status.stdout and "modified:   t (untracked content)" in status.stdout
    assert f"ignoring what {s_git}/config sets" in status.stderr and f"ignoring what {t_git}/config sets" in status.stderr
    assert "filter.z.clean" in status.stderr and "core.fsmonitor" in status.stderr


def test_include_includeif_and_worktree_config_run_nothing(lab):
    repo = lab.repo("inc")
    included = lab.root / "included.gitconfig"
    included.write_text(f'[filter "i"]\n\tclean = {lab.program("include-filter")}\n\tsmudge = {lab.program("include-filter")}\n')
    conditional = lab.root / "conditional.gitconfig"
    conditional.write_text(f'[diff "c"]\n\ttextconv = {lab.program("includeif-textconv")}\n')
    lab.agent(repo, "config", "include.path", str(included))
    lab.agent(repo, "config", f"includeIf.gitdir:{repo}/.path", str(conditional))
    lab.agent(repo, "config", "core.repositoryFormatVersion", "1")
    lab.agent(repo, "config", "extensions.worktreeConfig", "true")
    lab.agent(repo, "config", "--worktree", "filter.w.clean", lab.program("worktree-filter"))
    (repo / "b.md").write_text("b\n")
    (repo / "c.txt").write_text("c\n")
    lab.agent(repo, "add", "b.md", "c.txt")
    lab.agent(repo, "commit", "-q", "-m", "b c")
    (repo / ".gitattributes").write_text("a.txt filter=i\nb.md filter=w\nc.txt diff=c\n")
    (repo / "c.txt").write_text("c\nc\n")

    def stale():
        touch_same(repo / "a.txt")
        touch_same(repo / "b.md")

    status, diff = check_route(lab, repo, [["status", "--short"], ["diff"]],
                               {"ran-include-filter", "ran-worktree-filter", "ran-includeif-textconv"}, stale)
    assert status.returncode == 0 and diff.returncode == 0, status.stderr + diff.stderr
    assert " M c.txt" in status.stdout and "+c" in diff.stdout
    for key in ("include.path", f"includeif.gitdir:{repo}/.path", "extensions.worktreeconfig"):
        assert key in status.stderr, status.stderr


def test_a_git_directory_naming_another_common_directory_runs_nothing(lab):
    """The work tree's `.git` file points at a git directory whose `commondir` names another
    directory (a linked worktree's layout): the configuration git reads is that one's."""
    repo = lab.repo("linked")
    lab.agent(repo, "worktree", "add", "-q", str(lab.root / "wt"), "-b", "wt")
    with open(repo / ".git" / "config", "a") as f:
        f.write(f'[filter "l"]\n\tclean = {lab.program("commondir-filter")}\n[core]\n\tfsmonitor = {lab.program("commondir-fsmonitor")}\n')
    (lab.root / "wt" / ".gitattributes").write_text("* filter=l\n")
    (status,) = check_route(lab, lab.root / "wt", [["status", "--short"]], {"ran-commondir-filter"},
                            lambda: touch_same(lab.root / "wt" / "a.txt"))
    assert status.returncode == 0 and "?? .gitattributes" in status.stdout, status.stderr
    assert "filter.l.clean" in status.stderr


def test_core_worktree_cannot_put_the_work_tree_over_other_files(lab):
    """core.worktree is allowed (a submodule's git directory names its work tree with it), but
    the work tree must hold a `.git` leading to the git directory: the repository cannot make git
    write its files elsewhere (the zone's own /tmp, here a directory standing for it)."""
    repo = lab.repo("wt-elsewhere")
    target = lab.root / "zone-files"
    target.mkdir()
    lab.agent(repo, "config", "core.worktree", str(target))
    control = lab.plain(target, f"--git-dir={repo}/.git", "checkout", "-f", "HEAD", "--", "a.txt")
    assert control.returncode == 0 and (target / "a.txt").exists(), control.stderr
    (target / "a.txt").unlink()
    out = lab.zone(target, f"--git-dir={repo}/.git", "checkout", "-f", "HEAD", "--", "a.txt")
    assert out.returncode == 128, out
    assert f"the work tree {target} has no .git leading to the git directory {repo}/.git" in out.stderr, out.stderr
    assert list(target.iterdir()) == []


def test_the_configuration_rewritten_while_git_runs_runs_nothing(lab):
    """The race: the agent rewrites .git/config over and over, a filter in and out, while the
    zone's git runs. git reads the copy the wrapper reduced, never the file."""
    repo = lab.repo("race")
    config = repo / ".git" / "config"
    clean = config.read_text()
    hostile = clean + f'[filter "r"]\n\tclean = {lab.program("race-filter")}\n\tsmudge = {lab.program("race-filter")}\n'
    (repo / ".gitattributes").write_text("* filter=r\n")
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            for text in (clean, hostile):
                tmp = config.with_suffix(".tmp")
                tmp.write_text(text)
                tmp.replace(config)
                touch_same(repo / "a.txt")

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    try:
        outs = [lab.zone(repo, "status", "--short") for _ in range(40)]
    finally:
        stop.set()
        flipper.join()
    assert all(o.returncode == 0 for o in outs), [o.stderr for o in outs if o.returncode]
    noted = sum("filter.r.clean" in o.stderr for o in outs)
    print(f"\n40 calls while the configuration flipped: the filter was in the copy {noted} times, ran 0 times")
    assert lab.ran() == [], lab.ran()
    # The control: plain git in the same race runs it.
    config.write_text(hostile)
    touch_same(repo / "a.txt")
    lab.plain(repo, "status", "--short")
    assert lab.ran() == ["ran-race-filter"]


def plant_everything(lab: Lab, repo: Path) -> None:
    """The routes the deny-list covered, in the repository's own configuration and files."""
    hooks = ["pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-checkout",
             "post-index-change", "reference-transaction", "pre-auto-gc", "post-merge"]
    (repo / ".hooks").mkdir()
    for n in hooks:
        for d in (repo / ".git" / "hooks", repo / ".hooks"):
            (d / n).write_text(STEAL.replace("LOOT", str(lab.loot)))
            (d / n).chmod(0o755)
    with open(repo / ".git" / "config", "a") as f:
        f.write(f"""[core]
	hooksPath = {repo}/.hooks
	fsmonitor = {lab.program("fsmonitor")}
	sshCommand = {lab.program("ssh")}
	pager = {lab.program("pager")}
	editor = {lab.program("editor")}
	attributesFile = {repo}/.attrs
[diff]
	external = {lab.program("external-diff")}
[filter "x"]
	clean = {lab.program("filter")}
	smudge = {lab.program("filter")}
	required = true
[diff "x"]
	textconv = {lab.program("textconv")}
[merge "x"]
	driver = {lab.program("merge")} %O %A %B
[alias]
	st = !{lab.program("alias")}
""")
    (repo / ".gitattributes").write_text("* filter=x diff=x merge=x\n")
    (repo / ".git" / "info" / "attributes").write_text("* filter=x diff=x merge=x\n")


def test_the_routes_the_deny_list_covered_stay_closed(lab):
    repo = lab.repo("old")
    (repo / "a.txt").write_text("1\n2\n3\n4\n5\n")
    lab.agent(repo, "commit", "-qam", "five lines")
    lab.agent(repo, "checkout", "-q", "-b", "other")
    (repo / "a.txt").write_text("1 other\n2\n3\n4\n5\n")
    lab.agent(repo, "commit", "-qam", "other")
    lab.agent(repo, "checkout", "-q", "main")
    plant_everything(lab, repo)
    (repo / "a.txt").write_text("1\n2\n3\n4\n5 main\n")
    # The control changes the repository (commit, merge): it runs on a copy.
    copy = lab.root / "old-copy"
    shutil.copytree(repo, copy, symlinks=True)
    commands = [["status"], ["diff"], ["add", "a.txt", ".gitattributes"], ["diff", "--cached"],
                ["commit", "-q", "-m", "second"], ["log", "-p", "-1"], ["show", "HEAD"],
                ["checkout", "-q", "other"], ["merge", "-q", "--no-edit", "main"], ["checkout", "-q", "main"]]
    results = check_route(lab, repo, commands, {"ran-filter", "ran-textconv", "ran-external-diff", "ran-fsmonitor",
                                                "ran-merge", "ran-pre-commit", "ran-post-checkout"},
                          control_cwd=copy)
    assert all(r.returncode == 0 for r in results), [(c, r.stderr) for c, r in zip(commands, results) if r.returncode]
    assert "core.hookspath" in results[0].stderr and "filter.x.clean" in results[0].stderr, results[0].stderr
    assert "+5 main" in results[1].stdout and "+5 main" in results[3].stdout
    # git merged the two sides itself (no driver): both changes are in.
    merged = lab.zone(repo, "show", "other:a.txt")
    assert merged.stdout == "1 other\n2\n3\n4\n5 main\n", merged
    # An alias of the repository's is no command either.
    alias = lab.zone(repo, "st")
    assert alias.returncode != 0 and "'st' is not a git command" in alias.stderr, alias.stderr
    assert lab.plain(repo, "st").returncode == 0 and lab.ran() == ["ran-alias"]


def test_what_the_allow_list_keeps_still_acts(lab):
    """Identity, remote tracking, the default branch and a SHA-256 repository are read as before;
    nothing is set aside for a clone's configuration."""
    origin = lab.repo("origin")
    lab.agent(lab.root, "clone", "-q", str(origin), "clone")
    clone = lab.root / "clone"
    lab.agent(clone, "config", "user.name", "Zone Tester")
    lab.agent(clone, "config", "user.email", "zone@example.com")
    status = lab.zone(clone, "status")
    assert status.returncode == 0 and "Your branch is up to date with 'origin/main'" in status.stdout, status
    assert status.stderr == "", status.stderr
    (clone / "a.txt").write_text("changed\n")
    assert lab.zone(clone, "commit", "-qam", "by the zone").returncode == 0
    assert lab.zone(clone, "log", "-1", "--format=%an <%ae>").stdout.strip() == "Zone Tester <zone@example.com>"
    assert "ahead of 'origin/main' by 1 commit" in lab.zone(clone, "status").stdout
    # A SHA-256 repository (extensions.objectFormat).
    lab.agent(lab.root, "init", "-q", "--object-format=sha256", "-b", "main", "sha")
    sha = lab.root / "sha"
    (sha / "f").write_text("f\n")
    assert lab.zone(sha, "add", "f").returncode == 0
    out = lab.zone(sha, "-c", "user.name=z", "-c", "user.email=z@e", "commit", "-qm", "sha256")
    assert out.returncode == 0, out.stderr
    assert len(lab.zone(sha, "rev-parse", "HEAD").stdout.strip()) == 64
    # Outside any repository, what needs none still runs; what needs one says so.
    outside = lab.root / "home"
    assert lab.zone(outside, "version").stdout.startswith("git version 2.")
    nothing = lab.zone(outside, "status")
    assert nothing.returncode == 128 and "not a git repository" in nothing.stderr
    # A new repository, made by the zone's git.
    assert lab.zone(lab.root, "init", "-q", "made").returncode == 0
    assert (lab.root / "made" / ".git" / "HEAD").exists()
    # From inside a git directory: refused, naming where git runs here.
    inside = lab.zone(clone / ".git", "status")
    assert inside.returncode == 128 and "not from inside its git directory" in inside.stderr, inside.stderr


# The catalog's git MCP server, with the zone's git, over its stdio.


class GitServer:
    def __init__(self, lab: Lab, repo: Path):
        server = shutil.which("mcp-server-git", path=os.environ["PATH"])
        if server is None:
            pytest.skip("mcp-server-git is not installed (eval \"$(e2e/setup env)\")")
        env = {**lab.zone_env, "PYTHONPATH": str(ZONE)}
        self.proc = subprocess.Popen([server, "--repository", str(repo)], cwd=repo, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.next = 0
        self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "test_git_zone", "version": "1"}})
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")

    def request(self, method: str, params: dict) -> dict:
        self.next += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params}) + "\n")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], deadline - time.monotonic())
            if not ready:
                break
            line = self.proc.stdout.readline()
            assert line, "the git server exited"
            message = json.loads(line)
            if message.get("id") == self.next:
                assert "error" not in message, message
                return message["result"]
        raise AssertionError(f"no answer to {method}")

    def call(self, tool: str, **arguments) -> str:
        result = self.request("tools/call", {"name": tool, "arguments": arguments})
        text = "\n".join(c.get("text", "") for c in result["content"])
        assert not result.get("isError"), f"{tool}: {text}"
        return text

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=20)


def run_every_tool(server: GitServer, repo: Path) -> dict[str, str]:
    r = str(repo)
    out = {"status": server.call("git_status", repo_path=r)}
    (repo / "a.txt").write_text("one\ntwo\n")
    (repo / "notes.md").write_text("# notes\n")
    out["diff_unstaged"] = server.call("git_diff_unstaged", repo_path=r)
    out["add"] = server.call("git_add", repo_path=r, files=["a.txt", "notes.md"])
    out["diff_staged"] = server.call("git_diff_staged", repo_path=r)
    out["commit"] = server.call("git_commit", repo_path=r, message="second")
    out["log"] = server.call("git_log", repo_path=r, max_count=5)
    out["create_branch"] = server.call("git_create_branch", repo_path=r, branch_name="side")
    out["checkout"] = server.call("git_checkout", repo_path=r, branch_name="side")
    out["show"] = server.call("git_show", repo_path=r, revision="HEAD")
    out["diff"] = server.call("git_diff", repo_path=r, target="HEAD~1")
    out["branch"] = server.call("git_branch", repo_path=r, branch_type="local")
    (repo / "a.txt").write_text("three\n")
    server.call("git_add", repo_path=r, files=["a.txt"])
    out["reset"] = server.call("git_reset", repo_path=r)
    out["status_after"] = server.call("git_status", repo_path=r)
    return out


def check_tools(out: dict[str, str]) -> None:
    assert "On branch main" in out["status"], out["status"]
    assert "+two" in out["diff_unstaged"]
    assert "+# notes" in out["diff_staged"] and "+two" in out["diff_staged"]
    assert "second" in out["commit"] or "Changes committed" in out["commit"], out["commit"]
    assert "second" in out["log"] and "first" in out["log"], out["log"]
    assert "side" in out["create_branch"]
    assert "Switched to branch 'side'" in out["checkout"]
    assert "second" in out["show"] and "+two" in out["show"], out["show"]
    assert "+two" in out["diff"]
    assert "* side" in out["branch"] and "main" in out["branch"], out["branch"]
    assert "On branch side" in out["status_after"] and "modified:   a.txt" in out["status_after"], out["status_after"]
    assert "Changes to be committed" not in out["status_after"]


def test_the_git_servers_tools_work_on_an_ordinary_repository(lab):
    repo = lab.repo("ordinary")
    server = GitServer(lab, repo)
    try:
        out = run_every_tool(server, repo)
    finally:
        server.close()
    check_tools(out)
    assert lab.plain(repo, "log", "--format=%s %an", "-2").stdout.split("\n")[:2] == ["second agent", "first agent"]


def test_the_git_servers_tools_work_on_a_hostile_repository_and_run_nothing(lab):
    repo = lab.repo("hostile")
    head = lab.agent(repo, "rev-parse", "HEAD").strip()
    lab.agent(repo, "update-ref", "refs/heads/main", signed_commit(lab, repo, head, "SSH SIGNATURE", "first"))
    # A submodule with its own filter driver, attributes and fsmonitor (git_status looks into it).
    src = lab.repo("sub-src")
    lab.agent(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(src), "s")
    lab.agent(repo, "commit", "-q", "-m", "add s")
    with open(repo / ".git" / "modules" / "s" / "config", "a") as f:
        f.write(f'[filter "z"]\n\tclean = {lab.program("s-filter")}\n[core]\n\tfsmonitor = {lab.program("s-fsmonitor")}\n')
    (repo / "s" / ".gitattributes").write_text("* filter=z\n")
    touch_same(repo / "s" / "a.txt")
    plant_everything(lab, repo)
    for key, value in [("log.showSignature", "true"), ("gpg.x509.program", lab.program("x509")),
                       ("gpg.ssh.program", lab.program("ssh-keygen")), ("gpg.ssh.allowedSignersFile", "/dev/null")]:
        lab.agent(repo, "config", key, value)
    server = GitServer(lab, repo)
    try:
        out = run_every_tool(server, repo)
    finally:
        server.close()
    assert lab.ran() == [], f"planted programs ran in the git server's zone: {lab.ran()}"
    check_tools(out)
    assert "modified:   s (untracked content)" in out["status"], out["status"]
