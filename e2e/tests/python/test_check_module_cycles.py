"""scripts/check-module-cycles, the structure check ./test runs: it passes on our crates and
fails, naming the lines, on a crate with an import cycle, a too-long file or a fat main.rs."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "check-module-cycles"


def check(*crates):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, crates)],
        capture_output=True, text=True, timeout=60,
    )


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


def test_children_that_use_their_parent_are_no_cycle(tmp_path):
    c = crate(tmp_path, {
        "lib.rs": "mod a;\n",
        "a/mod.rs": "mod x;\nmod y;\npub struct Ctx;\n",
        "a/x.rs": "use super::Ctx;\nuse super::y::Y;\n",
        "a/y.rs": "pub struct Y;\nfn f(_: &super::Ctx) {}\n",
    })
    result = check(c)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "a: y -> x" in result.stdout


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
