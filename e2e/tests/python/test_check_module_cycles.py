"""scripts/check-module-cycles, the structure check ./test runs: it passes on our crates and
fails, naming the lines, on a crate with an import cycle, a too-long file, a fat main.rs, or more
(or fewer) child-to-parent imports than its budget allows."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "check-module-cycles"


def check(*crates, budget=None):
    args = ["--budget", str(budget)] if budget else []
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args, *map(str, crates)],
        capture_output=True, text=True, timeout=60,
    )


def budget(tmp_path, lines):
    path = tmp_path / "parent-imports.budget"
    path.write_text("# test budget\n" + "".join(f"{key} {n}\n" for key, n in lines.items()))
    return path


def crate(tmp_path, files):
    for name, text in files.items():
        path = tmp_path / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_our_crates_import_one_way_and_stay_small():
    result = check()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no import cycles" in result.stdout


def test_a_cycle_is_named_with_the_lines_that_make_it(tmp_path):
    c = crate(tmp_path, {
        "lib.rs": "mod a;\nmod b;\nmod c;\n",
        "a.rs": "use crate::b::B;\npub struct A;\n",
        "b.rs": "pub struct B;\n// crate::a::A in a comment is no reference\nfn f() -> crate::c::C { todo!() }\n",
        "c.rs": "pub struct C;\nconst S: &str = \"crate::b::B in a string is none either\";\nfn g(_: super::a::A) {}\n",
    })
    result = check(c)
    assert result.returncode == 1
    assert "CYCLE in src/lib.rs: a <-> b <-> c" in result.stdout, result.stdout
    assert "a -> b: " in result.stdout and "a.rs:1 crate::b::B" in result.stdout
    assert "c -> a: " in result.stdout and "c.rs:3 super::a::A" in result.stdout


PARENT_USERS = {
    "lib.rs": "mod a;\n",
    "a/mod.rs": "mod x;\nmod y;\n#[cfg(test)]\nmod checks;\npub struct Ctx;\npub fn apply() {}\n",
    "a/x.rs": "use super::{Ctx, apply};\nuse super::y::Y;\n",
    "a/y.rs": "pub struct Y;\nfn f(_: &super::Ctx) {}\n",
    # A test module's use of its parent is what it is for: not counted.
    "a/checks.rs": "use super::*;\nfn t(_: Ctx) {}\n",
}


def test_children_that_use_their_parent_are_no_cycle_but_are_counted(tmp_path):
    c = crate(tmp_path / "c", PARENT_USERS)
    result = check(c, budget=budget(tmp_path, {c / "src" / "a": 3}))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "a: {checks, y} -> x" in result.stdout, result.stdout
    assert f"parent imports in {c / 'src' / 'a'}: 3 (budget 3)" in result.stdout, result.stdout
    assert "x.rs:1 super::Ctx" in result.stdout and "x.rs:1 super::apply" in result.stdout
    assert "y.rs:2 super::Ctx" in result.stdout
    assert "checks.rs" not in result.stdout


def test_parent_imports_over_their_budget_fail_naming_the_lines(tmp_path):
    c = crate(tmp_path / "c", PARENT_USERS)
    result = check(c, budget=budget(tmp_path, {c / "src" / "a": 2}))
    assert result.returncode == 1
    assert f"PARENT IMPORTS OVER BUDGET in {c / 'src' / 'a'}: 3 (budget 2" in result.stdout, result.stdout
    assert "x.rs:1 super::apply" in result.stdout
    # No budget line at all is a budget of 0.
    result = check(c, budget=budget(tmp_path, {}))
    assert result.returncode == 1
    assert f"PARENT IMPORTS OVER BUDGET in {c / 'src' / 'a'}: 3 (budget 0" in result.stdout, result.stdout


def test_parent_imports_under_their_budget_fail_until_it_is_lowered(tmp_path):
    c = crate(tmp_path / "c", PARENT_USERS)
    result = check(c, budget=budget(tmp_path, {c / "src" / "a": 5}))
    assert result.returncode == 1
    assert f"PARENT IMPORTS UNDER BUDGET in {c / 'src' / 'a'}: 3 (budget 5): lower it to 3" in result.stdout, result.stdout
    # A module whose imports are all gone must have its line removed (or set to 0).
    (c / "src" / "a" / "x.rs").write_text("use super::y::Y;\n")
    (c / "src" / "a" / "y.rs").write_text("pub struct Y;\n")
    result = check(c, budget=budget(tmp_path, {c / "src" / "a": 3}))
    assert result.returncode == 1
    assert "UNDER BUDGET" in result.stdout and "lower it to 0" in result.stdout, result.stdout
    result = check(c, budget=budget(tmp_path, {}))
    assert result.returncode == 0, result.stdout + result.stderr


def test_long_files_and_a_fat_main_fail_but_test_files_may_be_long(tmp_path):
    c = crate(tmp_path, {
        "main.rs": "mod big;\nmod tests;\n" + "// flag\n" * 60,
        "big.rs": "fn f() {}\n" * 601,
        "tests.rs": "#[test]\nfn t() {}\n" * 400,
    })
    result = check(c)
    assert result.returncode == 1
    assert "big.rs has 601 lines (at most 600)" in result.stdout
    assert "main.rs has 62 lines (a main.rs: under 50)" in result.stdout
    assert "tests.rs" not in result.stdout.replace("{big, tests}", "")
