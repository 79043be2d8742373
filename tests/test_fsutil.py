"""kog.fsutil: outputs are written atomically, to regular files only, mode 0644; unparsable state is kept aside."""
import os
import stat

import pytest

from kog.errors import UsageError
from kog.fsutil import OutputPathError, atomic_output, atomic_write_bytes, atomic_write_json, keep_aside


def test_new_and_replaced_files_are_0644_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        p = atomic_write_bytes(tmp_path / "a" / "out.html", b"one")
        assert p.read_bytes() == b"one" and stat.S_IMODE(p.stat().st_mode) == 0o644
        atomic_write_json(p, {"x": 1})
        assert p.read_text() == '{\n "x": 1\n}\n' and stat.S_IMODE(p.stat().st_mode) == 0o644
        with atomic_output(tmp_path / "w.bin") as tmp:
            tmp.write_bytes(b"w")
        assert stat.S_IMODE((tmp_path / "w.bin").stat().st_mode) == 0o644
    finally:
        os.umask(old)
    assert sorted(x.name for x in (tmp_path / "a").iterdir()) == ["out.html"]     # no temp file left


@pytest.mark.parametrize("what", ["symlink", "fifo", "folder", "dangling-symlink"])
def test_anything_but_a_regular_file_is_refused_and_left_as_it_was(tmp_path, what):
    target = tmp_path / "target.txt"
    target.write_text("keep me")
    p = tmp_path / "out"
    if what == "symlink":
        p.symlink_to(target)
    elif what == "dangling-symlink":
        p.symlink_to(tmp_path / "nowhere")
    elif what == "fifo":
        os.mkfifo(p)
    else:
        p.mkdir()
    with pytest.raises(OutputPathError) as e:
        atomic_write_bytes(p, b"x")
    assert isinstance(e.value, UsageError) and e.value.exit_code == 2
    assert str(p) in str(e.value) and "\n" not in str(e.value)
    assert target.read_text() == "keep me"
    assert {"symlink": p.is_symlink, "dangling-symlink": p.is_symlink, "fifo": lambda: stat.S_ISFIFO(
        os.lstat(p).st_mode), "folder": p.is_dir}[what]()
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith(".")] == []


def test_a_read_only_folder_is_one_line(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        if os.access(d, os.W_OK):
            pytest.skip("running as root: a read-only folder is writable")
        with pytest.raises(OutputPathError, match="cannot write"):
            atomic_write_bytes(d / "x.json", b"{}")
        with pytest.raises(OutputPathError, match="cannot create folder"):
            atomic_write_bytes(d / "sub" / "x.json", b"{}")
    finally:
        d.chmod(0o755)


def test_a_file_where_the_folder_should_be_is_one_line(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputPathError, match="cannot write .*(not a folder|Not a directory)"):
        atomic_write_bytes(tmp_path / "f" / "x.json", b"{}")


def test_a_failed_write_leaves_the_old_file(tmp_path):
    p = tmp_path / "state.json"
    p.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_output(p) as tmp:
            tmp.write_text("half")
            raise RuntimeError("writer died")
    assert p.read_text() == "old" and sorted(x.name for x in tmp_path.iterdir()) == ["state.json"]


def test_keep_aside_never_overwrites_an_earlier_copy(tmp_path):
    p = tmp_path / "tuned.json"
    p.write_text("{trunc")
    assert keep_aside(p).name == "tuned.json.corrupt-1"
    p.write_text("{again")
    assert keep_aside(p).name == "tuned.json.corrupt-2"
    assert (tmp_path / "tuned.json.corrupt-1").read_text() == "{trunc" and not p.exists()
