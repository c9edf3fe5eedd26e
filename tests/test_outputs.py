"""Outputs are the user's property: a file is replaced only with --force, never one of the
inputs, and a full disk or read-only folder is one line that leaves the old file intact."""

import os
import shutil
import stat
import subprocess
import sys
import threading

import pytest

from tests.conftest import ROOT, assert_user_error, cli_env, run_mt

TINY = ROOT / "configs" / "tiny.yaml"


def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True
    )
    return probe.returncode == 0


needs_mount = pytest.mark.skipif(
    not _can_mount(),
    reason="needs unshare -rm to mount a read-only or tiny tmpfs (user namespaces)",
)


def run_on_mount(folder, options: str, *args, timeout=300):
    """`mt ARGS` inside a private mount namespace where `folder` is a fresh tmpfs mounted with
    `options` (e.g. "ro", "size=64k"): a real read-only or full filesystem, no root needed."""
    folder.mkdir(parents=True, exist_ok=True)
    script = (
        f'mount -t tmpfs -o {options} tmpfs "{folder}" && exec "{sys.executable}" -m mt '
        + " ".join(f"'{a}'" for a in map(str, args))
    )
    env = cli_env()
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def src_file(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("mi lo\nka tu\n", encoding="utf-8")
    return path


def test_translate_refuses_to_write_over_its_input(tiny_run, src_file):
    before = src_file.read_bytes()
    assert_user_error(
        run_mt("translate", tiny_run, "-i", src_file, "-o", src_file), "also an input"
    )
    assert src_file.read_bytes() == before
    # the same file by another name is still the input
    assert_user_error(
        run_mt("translate", tiny_run, "-i", src_file, "-o", src_file.parent / "." / src_file.name),
        "also an input",
    )
    assert_user_error(
        run_mt(
            "translate", tiny_run / "last.pt", "-i", src_file, "-o", tiny_run / "last.pt", "--force"
        ),
        "also an input",
    )


def test_translate_replaces_an_existing_output_only_with_force(tiny_run, src_file, tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("keep me\n")
    assert_user_error(
        run_mt("translate", tiny_run, "-i", src_file, "-o", out),
        str(out),
        "already exists",
        "--force",
    )
    assert out.read_text() == "keep me\n"
    proc = run_mt("translate", tiny_run, "-i", src_file, "-o", out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert len(out.read_text().splitlines()) == 2
    new = tmp_path / "new.txt"
    assert run_mt("translate", tiny_run, "-i", src_file, "-o", new).returncode == 0
    umask = os.umask(0)
    os.umask(umask)
    assert new.stat().st_mode & 0o777 == 0o666 & ~umask  # not a private temp file


def test_outputs_in_a_missing_folder_fail_before_the_work(tiny_run, src_file, tmp_path):
    missing = tmp_path / "missing_dir"
    assert_user_error(
        run_mt("translate", tiny_run, "-i", src_file, "-o", missing / "out.txt"),
        str(missing),
        "does not exist",
    )
    assert_user_error(
        run_mt("average", tiny_run, "--last", "2", "-o", missing / "x.pt"),
        str(missing),
        "does not exist",
    )
    assert_user_error(
        run_mt("attention", tiny_run, "mi lo", "-o", missing / "a.png"),
        str(missing),
        "does not exist",
    )
    assert_user_error(run_mt("plot", tiny_run, "-o", missing / "p.png"), "does not exist")
    assert not missing.exists()


def test_picture_and_average_need_force_to_replace(tiny_run, tmp_path):
    png = tmp_path / "a.png"
    png.write_bytes(b"mine")
    assert_user_error(run_mt("attention", tiny_run, "mi lo", "-o", png), "already exists")
    assert_user_error(run_mt("plot", tiny_run, "-o", png), "already exists")
    assert png.read_bytes() == b"mine"
    snap = sorted(tiny_run.glob("step_*.pt"))[-1]
    before = snap.read_bytes()
    assert_user_error(
        run_mt("average", tiny_run, "--last", "2", "-o", snap, "--force"), "also an input"
    )
    assert snap.read_bytes() == before


@needs_mount
def test_read_only_filesystem_is_one_line(tiny_run, src_file, tmp_path):
    ro = tmp_path / "ro"
    for args in (
        ("translate", tiny_run, "-i", src_file, "-o", ro / "out.txt"),
        ("plot", tiny_run, "-o", ro / "p.png"),
        ("download", "synthetic", "--out", ro / "data"),
    ):
        proc = run_on_mount(ro, "ro", *args)
        assert_user_error(proc, str(ro), "Read-only file system")


@needs_mount
def test_full_disk_while_saving_a_checkpoint_names_the_disk(tiny_run, tmp_path):
    full = tmp_path / "full"
    proc = run_on_mount(full, "size=64k", "average", tiny_run, "--last", "2", "-o", full / "avg.pt")
    assert_user_error(proc, str(full / "avg.pt"), "disk is full")


def test_torch_unexpected_pos_on_a_full_disk_is_reported_as_a_full_disk(tmp_path, monkeypatch):
    import torch

    from mt import outputs
    from mt.artifacts import checkpoint
    from mt.errors import MTError

    def torch_on_full_disk(obj, f, *a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", torch_on_full_disk)
    monkeypatch.setattr(
        outputs.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 4096, 4096)
    )
    with pytest.raises(MTError, match=r"x\.pt: the disk is full"):
        checkpoint.atomic_save({"a": 1}, tmp_path / "x.pt")
    assert list(tmp_path.iterdir()) == []


def test_eval_of_empty_files_is_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("")
    assert_user_error(run_mt("eval", "--hyp", empty, "--ref", empty), "nothing to score")


@needs_mount
def test_training_on_a_disk_that_fills_stops_with_one_line(tmp_path):
    """The run directory on a 1 MB filesystem: the BPE model and the config fit, the first
    checkpoint does not."""
    disk = tmp_path / "disk"
    data = tmp_path / "data"
    assert run_mt("download", "synthetic", "--out", data).returncode == 0
    proc = run_on_mount(
        disk,
        "size=1m",
        "train",
        TINY,
        "--run-dir",
        disk / "run",
        "--set",
        f"data.dir={data}",
        "train.max_steps=20",
        "train.save_every=5",
    )
    assert_user_error(proc, "disk is full")


def _device(path, major: int, minor: int) -> bool:
    """A character device node at `path` (1,3 is null, 1,7 is full), where this process may
    make one (root, as CI runs); never the machine's own /dev."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    except (PermissionError, OSError):
        return False
    return True


def test_an_existing_fifo_is_written_into_without_force_and_stays_a_fifo(
    tiny_run, src_file, tmp_path
):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(
        target=lambda: got.append(fifo.read_text(encoding="utf-8")), daemon=True
    )
    reader.start()
    proc = run_mt("translate", tiny_run, "-i", src_file, "-o", fifo, "--device", "cpu")
    reader.join(timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert len(got) == 1 and len(got[0].splitlines()) == 2
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_device_node_is_written_into_never_replaced(tiny_run, src_file, tmp_path):
    null, full = tmp_path / "null", tmp_path / "full"
    if not (_device(null, 1, 3) and _device(full, 1, 7)):
        pytest.skip("making device nodes needs root")
    proc = run_mt("translate", tiny_run, "-i", src_file, "-o", null, "--device", "cpu")
    assert proc.returncode == 0, proc.stderr  # no --force needed, as for a shell's `>`
    snapshot = sorted(tiny_run.glob("step_*.pt"))[-1]
    proc = run_mt("average", tiny_run, "--last", "2", "-o", null)
    assert proc.returncode == 0, proc.stderr  # a checkpoint written into it too
    assert_user_error(
        run_mt("translate", tiny_run, "-i", src_file, "-o", full, "--force", "--device", "cpu"),
        f"could not write {full}",
    )
    for node in (null, full):
        assert stat.S_ISCHR(os.stat(node).st_mode), node  # still devices, not files
    assert snapshot.exists()


@pytest.mark.parametrize("out", ["-", "/dev/stdout"])
def test_dash_and_dev_stdout_are_standard_output(tiny_run, src_file, out):
    proc = run_mt("translate", tiny_run, "-i", src_file, "-o", out, "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 2


def test_an_output_through_a_symbolic_link_writes_its_target_and_needs_force(tmp_path):
    """A link is an existing output (--force to replace what it points to), written through as
    a shell's `>` would (the link stays a link); a link into a missing folder is refused before
    any work."""
    from tests.conftest import mt_here

    run = tmp_path / "run"
    code, _, err = mt_here("train", "tiny", "--run-dir", run, "--set",
                           f"data.dir={tmp_path / 'd'}", "train.max_steps=1")  # fmt: skip
    assert code == 0, err
    target, link = tmp_path / "target.txt", tmp_path / "link.txt"
    target.write_text("mine\n")
    link.symlink_to(target)
    code, _, err = mt_here("translate", run, "-o", link, input="a b\n")
    assert code == 2 and "symbolic link" in err and target.read_text() == "mine\n"
    code, _, err = mt_here("translate", run, "-o", link, "--force", input="a b\n")
    assert code == 0 and link.is_symlink() and target.read_text() != "mine\n", err
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to(tmp_path / "missing" / "x.txt")
    code, _, err = mt_here("translate", run, "-o", dangling, "--force", input="a b\n")
    assert code == 2 and "missing" in err and "does not exist" in err, err


def _on_full_disk(tmp_path, run, *args, copy_run=False):
    """`mt ARGS` with FULL (tmp_path/full) a tmpfs filled to the last byte before mt starts
    (with a copy of `run` in FULL/run first where asked): (the process, FULL's listing after
    it, one name a line)."""
    full, listing = tmp_path / "full", tmp_path / "listing"
    full.mkdir()
    copy = f'mkdir "{full}/run" && cp "{run}/best.pt" "{full}/run/" && ' if copy_run else ""
    command = " ".join(f"'{a}'" for a in map(str, args))
    script = (
        f'mount -t tmpfs -o size=8m tmpfs "{full}" && {copy}'
        f'{{ cat /dev/zero > "{full}/filler"; }} 2>/dev/null; '
        f'"{sys.executable}" -m mt {command}; rc=$?; '
        f'find "{full}" -mindepth 1 -printf "%P\\n" | sort > "{listing}"; exit $rc'
    )
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, env=cli_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    return proc, listing.read_text().split()


WRITERS = {  # a writing command on a full disk, and the path it must not leave behind
    "translate": (["translate", "{run}", "-i", "{src}", "-o", "{full}/out.txt"], "out.txt"),
    "average": (["average", "{run}", "--last", "2", "-o", "{full}/avg.pt"], "avg.pt"),
    "export": (["export", "{run}", "{full}/ct2"], "ct2"),
    "attention": (["attention", "{run}", "mi lo", "-o", "{full}/attn.png"], "attn.png"),
    "plot": (["plot", "{run}", "-o", "{full}/plot.png"], "plot.png"),
    "report": (["report", "{run}", "-o", "{full}/report.html"], "report.html"),
    "download": (["download", "synthetic", "--out", "{full}/data"], "data"),
    "tune": (["tune", "{full}/run", "--beams", "1,2", "--length-penalties", "1.0"], None),
}  # fmt: skip


@needs_mount
@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_writing_command_on_a_full_disk_is_one_line_and_leaves_no_file(
    name, tiny_run, src_file, tmp_path
):
    """Every command that writes, on a disk with no byte left: exit 2, one line naming the
    path and the full disk, and nothing under the output's name, half-written or empty, nor a
    temporary file left behind (the command's files are written to temporary names and
    renamed when whole); tune leaves best.pt as it was."""
    if name == "export":
        pytest.importorskip("ctranslate2")
    args, target = WRITERS[name]
    full = tmp_path / "full"
    args = [a.format(run=tiny_run, src=src_file, full=full) for a in args]
    proc, listing = _on_full_disk(tmp_path, tiny_run, *args, copy_run=name == "tune")
    assert_user_error(proc, "disk is full")
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: "), proc.stderr  # one line
    left = [p for p in listing if p != "filler" and not p.startswith("run")]
    assert left == [], left  # (the output's name included: target, or a temporary one)
    if target is not None:
        assert str(full / target) in proc.stderr
    else:  # the run's copy as it was: best.pt, no temporary file beside it
        assert "best.pt" in proc.stderr
        assert [p for p in listing if p.startswith("run/")] == ["run/best.pt"], listing
