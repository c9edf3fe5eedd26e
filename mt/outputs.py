"""Outputs are the user's property: every file a command will write is checked before the work
starts, and written so that a failure never leaves half a file or a traceback.

The rule, the same for every command: an output may not be one of the command's inputs; an
existing file is replaced only with `--force`; its folder must exist and be writable. Files that
`mt train` owns inside a run directory (checkpoints, training.png, the log) are the exception:
the run rewrites them as it goes. An output that exists and is not a regular file (a device such
as /dev/null, a FIFO, a socket) is written into, as a shell redirection would, never replaced;
`-` and /dev/stdout are standard output. A training holds its run directory by a lock
(`RunLock`), and no other command writes that training's files while it runs (training_in).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from mt.errors import MTError, first_line, shorten

# Below this much free space a failed write is reported as a full disk: torch's zip writer
# says "unexpected pos" rather than ENOSPC when the disk fills under it.
FULL_DISK_BYTES = 16 * 2**20


def is_stdio(path: str | Path | None) -> bool:
    return path is None or str(path) in ("-", "/dev/stdout")


def is_special(path: str | Path) -> bool:
    """An existing path that is neither a regular file nor a folder: a character or block
    device, a FIFO or a socket, which a write goes into rather than replaces."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_folder_writable(folder: Path, what: str = "output") -> None:
    """The folder exists and a file can be created in it (a real probe: permission bits say
    nothing about a read-only mount or, for root, about anything)."""
    if folder.exists() and not folder.is_dir():
        raise MTError(f"{folder} is a file, not a folder: choose another {what} path")
    if not folder.is_dir():
        raise MTError(
            f"the {what} folder {folder} does not exist; create it first or choose another path"
        )
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".mt-write-test.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise MTError(
            f"cannot write to {folder} ({e.strerror}); choose a writable {what} path"
        ) from None


def check_folder_creatable(folder: Path, what: str = "output") -> None:
    """`folder` is a folder or can be made one: its nearest existing ancestor is writable."""
    if folder.exists() and not folder.is_dir():
        raise MTError(f"the {what} {folder} is a file; give a folder")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    check_folder_writable(existing, what)


def check_output(
    path: str | Path | None,
    *,
    force: bool = False,
    inputs: Iterable[str | Path | None] = (),
    what: str = "output",
) -> None:
    """Raise MTError before any work if writing `path` would fail or destroy something."""
    if path is None or is_stdio(path):
        return
    path = Path(path)
    for src in inputs:
        if src is None or is_stdio(src):
            continue
        if _same_file(path, Path(src)) or path.resolve() == Path(src).resolve():
            raise MTError(
                f"the {what} {path} is also an input of this command; write the "
                f"{what} to another file"
            )
    if path.is_dir():
        raise MTError(f"the {what} {path} is a folder; give a file name")
    check_not_training(path)
    if is_special(path):  # written into, as a shell's `>` does: nothing is replaced
        return
    if (path.exists() or path.is_symlink()) and not force:
        link = " (a symbolic link)" if path.is_symlink() else ""
        raise MTError(
            f"{path} already exists{link}; pass --force to overwrite it, or choose another "
            f"{what} path"
        )
    if path.is_symlink():  # (written through: its target's folder is the one written)
        path = Path(os.path.realpath(path))
    check_folder_writable(path.parent if str(path.parent) else Path("."), what)


RUN_LOCK = ".lock"  # the lock file a training holds in its run directory (mt.train.rundir)
# what a training writes into its run directory, besides step_N.pt and the BPE models
TRAINERS_FILES = {
    "best.pt",
    "last.pt",
    "last.pt.prev",
    "averaged.pt",
    "pretrained.pt",
    "config.yaml",
    "corpus.json",
    "run_info.json",
    "train_log.jsonl",
    "training.png",
}


class RunLock:
    """An exclusive lock on RUN_DIR/.lock holding the owner's pid. The kernel drops a flock
    when its process dies, so a lock file left by a killed run is simply taken over; a run
    that ends removes it."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / RUN_LOCK
        for _ in range(100):  # (a file its owner removed as we locked it: take the new one)
            # held open for as long as the lock is held (released by close): no `with` block
            self._f = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115
            self._take(run_dir)
            if _still_at(self._f, self.path):
                break
            self._f.close()
        else:
            raise MTError(f"{self.path} keeps being removed as it is locked; try again")
        self._f.seek(0)
        self._f.truncate()
        self._f.write(f"{os.getpid()}\n")
        self._f.flush()

    def _take(self, run_dir: Path) -> None:
        import fcntl

        try:
            fcntl.flock(self._f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._f.seek(0)
            holder = self._f.read().strip() or "unknown"
            self._f.close()
            raise MTError(
                f"{run_dir} is in use by another mt train (pid {holder}); wait for it "
                f"to finish, stop it, or use another --run-dir"
            ) from None

    def release(self) -> None:
        if not self._f.closed:
            if _still_at(self._f, self.path):
                self.path.unlink(missing_ok=True)  # (still held: no one takes it meanwhile)
            self._f.close()  # closing drops the flock


def _still_at(f, path: Path) -> bool:
    """Whether the open file `f` is still the file at `path`."""
    try:
        return os.path.samestat(os.fstat(f.fileno()), os.stat(path))
    except OSError:
        return False


def training_in(folder: Path) -> str | None:
    """The pid of a training that holds `folder` as its run directory, or None (its lock is
    an flock, which the kernel drops when the process dies)."""
    import fcntl

    try:
        f = open(folder / RUN_LOCK, encoding="utf-8")  # noqa: SIM115 (closed below)
    except OSError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return f.read().strip() or "unknown"
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def check_not_training(path: Path) -> None:
    """No command writes one of a training's own files while it runs (it would write over
    them, or they over its output); reading them stays allowed."""
    name = path.name
    trainers = name in TRAINERS_FILES or (name.startswith("step_") and name.endswith(".pt"))
    trainers = trainers or (name.startswith("spm") and name.endswith((".model", ".vocab")))
    holder = training_in(path.parent) if trainers else None
    if holder is not None:
        raise MTError(
            f"{path} is the training's own file, and a training is running in {path.parent} "
            f"(pid {holder}): write to another path, or wait for that training to end"
        )


def describe_write_error(path: Path, e: BaseException) -> str:
    """One line for a failed write, naming the path and saying when the disk is full."""
    reason = getattr(e, "strerror", None) or first_line(e, 120)
    full = getattr(e, "errno", None) == errno.ENOSPC
    if not full:
        with suppress(OSError):
            full = shutil.disk_usage(path.parent).free < FULL_DISK_BYTES
    if full:
        return (
            f"could not write {path}: the disk is full ({reason}); free some space (or "
            f"choose another folder) and run the command again"
        )
    return f"could not write {path} ({reason})"


def describe_os_error(e: OSError) -> str:
    """One line for an OSError about a file mt read or wrote along the way."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return describe_write_error(Path(e.filename), e)
    return f"{e.filename}: {e.strerror}"


@contextmanager
def atomic_file(path: str | Path, mode: str = "wb", keep_as: Path | None = None) -> Iterator:
    """Open a temp file beside `path`; on success it is flushed, synced and renamed over `path`
    (the old file first renamed to `keep_as`, if given); on any failure the temp file is removed
    and `path` is untouched. OS and writer errors become one-line MTErrors naming `path`.
    A device, FIFO or socket at `path` is written into directly (see is_special)."""
    path = Path(path)
    if path.is_symlink():  # written through, as a shell's `>` would: the link stays a link
        path = Path(os.path.realpath(path))
    if is_special(path):
        with _into_special(path, mode) as f:
            yield f
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise MTError(describe_write_error(path, e)) from None
    try:
        os.chmod(tmp, _file_mode(path))
        with os.fdopen(fd, mode) if "b" in mode else os.fdopen(fd, mode, encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if keep_as is not None and path.exists():
            os.replace(path, keep_as)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        _remove(tmp)
        raise MTError(describe_write_error(path, e)) from None
    except BaseException:
        _remove(tmp)
        raise


@contextmanager
def atomic_folder(out: Path) -> Iterator[Path]:
    """A temporary folder beside `out` for the caller to fill; when the caller is done it takes
    `out`'s name (an earlier folder there, which the caller checked may go, removed only then),
    with the permissions the umask gives a new folder. On any failure it is removed and `out`
    is untouched: a half-written export never sits under the final name. OS and writer errors
    (a full disk) become one-line MTErrors naming `out`."""
    try:
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    except OSError as e:
        raise MTError(describe_write_error(out, e)) from None
    try:
        yield tmp
        _readable(tmp)
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
            os.replace(out, old / "x")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except (OSError, RuntimeError) as e:  # (CTranslate2's writer raises RuntimeError)
        shutil.rmtree(tmp, ignore_errors=True)
        raise MTError(describe_write_error(out, e)) from None
    except MTError as e:  # a file's own atomic write: named where it was going
        shutil.rmtree(tmp, ignore_errors=True)
        raise MTError(str(e).replace(str(tmp), str(out))) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _readable(folder: Path) -> None:
    """A folder and its files as the user's umask makes new ones (mkdtemp's folder is 0700,
    and some writers make their files 0600)."""
    umask = _umask()
    folder.chmod(0o777 & ~umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


@contextmanager
def _into_special(path: Path, mode: str) -> Iterator:
    """`path` opened for writing as it is (no temp file, no rename); errors are one line."""
    try:
        with open(path, mode) if "b" in mode else open(path, mode, encoding="utf-8") as f:
            yield f
    except OSError as e:
        raise MTError(describe_write_error(path, e)) from None


def _file_mode(path: Path) -> int:
    """The replaced file's permissions, or what the umask gives a new file (mkstemp's temp file
    is private, 0600)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask (read by setting it, then put back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _remove(tmp: str) -> None:
    with suppress(OSError):
        os.unlink(tmp)


def write_text(path: str | Path, text: str) -> None:
    with atomic_file(path, "w") as f:
        f.write(text)


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_file(path, "wb") as f:
        f.write(data)


# what a picture is written as, by its name's ending (matplotlib's writers; raw pixel dumps and
# LaTeX's pgf left out: no viewer opens them)
PICTURE_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")


def picture_format(path: str | Path, flag: str = "-o") -> str:
    """The format a picture at `path` is written in, read from its name's ending (out.svg: an
    SVG); a name without one of PICTURE_FORMATS' endings is refused, naming them."""
    ending = Path(path).suffix.lower().lstrip(".")
    if ending not in PICTURE_FORMATS:
        shown = f"ends in .{ending}" if ending else "has no ending"
        raise MTError(
            f"{flag} {shorten(str(path), 80)}: the name {shown}, and a picture is written in "
            f"the format its name ends in: .{', .'.join(PICTURE_FORMATS)} (e.g. "
            f"{Path(path).stem or 'picture'}.png)"
        )
    return ending
