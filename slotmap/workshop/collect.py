"""``slotmap workshop collect``: copy each learner's notebooks out of their home, as root,
without following anything a learner controls.

For every account the hub created (its record, ``slotmap.workshop.accounts.Registry``), the
``*.ipynb`` files directly in ``~/slotmap-course/my_work`` are copied into ``DEST/<learner>/``,
and those of a learner who worked in Chinese, directly in ``my_work/zh_CN``, into
``DEST/<learner>/zh_CN/`` (``slotmap grade`` grades them against the same solutions).
Every folder on the way and every file is opened with ``O_NOFOLLOW`` (a symbolic link is
refused, never followed) and checked on the open descriptor (``fstat``): a folder or a
regular file owned by that learner, a file of at most ``max_bytes``. Files are opened
non-blocking, so a FIFO cannot hang the collection. The copies go into folders only root
reads (0700, files 0600). What was skipped, and why, is printed and written with a digest of
every copy to ``DEST/collect.json``; ``slotmap workshop confirm --collected DEST`` reads it:
a skipped notebook, or one identical to another learner's, is flagged there.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pwd
import stat
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slotmap.i18n import ENGLISH, LANGUAGES
from slotmap.workshop.accounts import REGISTRY_FILE, Registry

MAX_BYTES = 20_000_000  # a notebook with its outputs; a course notebook is well below 1 MB
WORKSPACE = ("slotmap-course", "my_work")  # under the learner's home
MANIFEST = "collect.json"
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


@dataclass
class Report:
    """What was copied (learner -> file name -> sha256) and what was skipped (one line each)."""

    copied: dict[str, dict[str, str]] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def skip(self, learner: str, name: str, why: str) -> None:
        self.skipped.append({"learner": learner, "file": name, "why": why})


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def _open_folder(name: str, uid: int, dir_fd: int | None) -> int:
    """Open the folder ``name`` (in ``dir_fd``) without following a link; it must be owned
    by ``uid``. Raises ``OSError`` with the reason."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError as error:
        raise OSError(
            f"{name}: cannot open as a folder without following links ({error.strerror})"
        ) from None
    owner = os.fstat(fd).st_uid
    if owner != uid:
        os.close(fd)
        raise OSError(f"{name}: owned by uid {owner}, not the learner")
    return fd


def read_own_file(name: str, dir_fd: int, uid: int, max_bytes: int) -> bytes:
    """The bytes of the regular file ``name`` in ``dir_fd``, owned by ``uid``, at most
    ``max_bytes``; else ``OSError`` saying why (a link, a FIFO, someone else's, too big)."""
    try:
        fd = os.open(name, _READ, dir_fd=dir_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise OSError("a symbolic link (not followed)") from None
        raise OSError(f"cannot open ({error.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{_kind(info.st_mode)}, not a regular file")
        if info.st_uid != uid:
            raise OSError(f"owned by uid {info.st_uid}, not by the learner (uid {uid})")
        if info.st_size > max_bytes:
            raise OSError(f"{info.st_size} bytes, over the cap of {max_bytes}")
        chunks, total = [], 0
        while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:  # it grew while read
                raise OSError(f"over the cap of {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _private_folder(path: Path) -> None:
    """``path`` as a folder only its owner (root) enters: made 0700, and never a link."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise OSError(f"{path} is not a folder of this user's")
    os.chmod(path, 0o700)


def _write_private(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.new")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.replace(temporary, path)


def collect_learner(
    learner: str, uid: int, home: str, dest: Path, report: Report, max_bytes: int
) -> None:
    """Copy ``learner``'s notebooks (see the module docstring) into ``dest/learner``."""
    fds: list[int] = []
    try:
        try:
            fds.append(_open_folder(home, uid, None))
            for part in WORKSPACE:
                fds.append(_open_folder(part, uid, fds[-1]))
        except OSError as error:
            report.skip(learner, "/".join(WORKSPACE), str(error))
            return
        work = fds[-1]
        _copy_notebooks(learner, uid, work, dest / learner, "", report, max_bytes)
        # The copies of the exercises in another language: my_work/zh_CN (slotmap.lab).
        for lang in LANGUAGES:
            if lang == ENGLISH:
                continue
            try:
                os.stat(lang, dir_fd=work, follow_symlinks=False)
            except FileNotFoundError:
                continue  # never worked in that language
            try:
                fds.append(_open_folder(lang, uid, work))
            except OSError as error:
                report.skip(learner, lang, str(error))
                continue
            _copy_notebooks(
                learner, uid, fds[-1], dest / learner / lang, f"{lang}/", report, max_bytes
            )
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _copy_notebooks(
    learner: str, uid: int, fd: int, folder: Path, prefix: str, report: Report, max_bytes: int
) -> None:
    """Copy the notebooks directly in the open folder ``fd`` into ``folder`` (recorded as
    ``prefix`` + their name)."""
    _private_folder(folder)
    copied = report.copied.setdefault(learner, {})
    for name in sorted(os.listdir(fd)):
        if not name.endswith(".ipynb") or name.startswith("."):
            continue
        try:
            data = read_own_file(name, fd, uid, max_bytes)
        except OSError as error:
            report.skip(learner, prefix + name, str(error))
            continue
        _write_private(folder / name, data)
        copied[prefix + name] = hashlib.sha256(data).hexdigest()


def collect(dest: Path, accounts: dict[str, int], max_bytes: int = MAX_BYTES) -> Report:
    """Collect every learner of ``accounts`` (name -> the uid the hub created it with) into
    ``dest``; a learner whose account is gone or has another uid now is skipped."""
    _private_folder(dest)
    report = Report()
    for learner, uid in sorted(accounts.items()):
        try:
            account = pwd.getpwnam(learner)
        except KeyError:
            report.skip(learner, "", "no such account any more")
            continue
        if account.pw_uid != uid:
            report.skip(learner, "", f"the account's uid is {account.pw_uid}, not {uid}")
            continue
        collect_learner(learner, uid, account.pw_dir, dest, report, max_bytes)
    _write_private(dest / MANIFEST, json.dumps(asdict(report), indent=1).encode())
    return report


def problems(dest: Path, grades: list[dict] | None = None) -> list[str]:
    """What ``confirm`` flags from a collection: each notebook skipped (not the learner's
    own, or not a plain file), and each passing notebook identical to another learner's
    (``grades``: ``slotmap grade --json``'s list; an untouched exercise is identical in every
    home and passes nothing, so it is not flagged)."""
    manifest = json.loads((dest / MANIFEST).read_text(encoding="utf-8"))
    lines = [
        f"{item['learner']} {item['file']}: not collected: {item['why']}"
        for item in manifest["skipped"]
    ]
    passing = {
        grade["notebook"]
        for grade in grades or []
        if any(result in ("PASS", True) for result in grade.get("results", {}).values())
    }
    holders: dict[tuple[str, str], list[str]] = defaultdict(list)
    for learner, files in manifest["copied"].items():
        for name, digest in files.items():
            holders[(name, digest)].append(learner)
    for (name, _), learners in sorted(holders.items()):
        if len(learners) > 1 and any(f"{learner}/{name}" in passing for learner in learners):
            lines.append(f"{', '.join(sorted(learners))} {name}: the same file, byte for byte")
    return lines


def run(dest: str, state: str, max_bytes: int = MAX_BYTES) -> int:
    """``slotmap workshop collect``: print what was copied and skipped; 1 if anything was
    skipped."""
    report = collect(Path(dest), Registry(Path(state) / REGISTRY_FILE).created(), max_bytes)
    for learner, files in sorted(report.copied.items()):
        print(f"collected {learner}: {len(files)} notebooks")
    for item in report.skipped:
        print(f"skipped   {item['learner']} {item['file']}: {item['why']}")
    print(f"into {dest} (root only); the list: {Path(dest) / MANIFEST}")
    return 1 if report.skipped else 0
