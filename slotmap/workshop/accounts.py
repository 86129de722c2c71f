"""Who may log in to the workshop's hub, and as which system account its server runs.

A learner is only ever an account the hub itself created for the course: the name is new to
the machine at the first login, the hub creates it (``useradd``) before the first spawn and
records its name and uid in a root-only file of its state folder (``Registry``). So a login
is refused, with a message that says why, for:

* a name that breaks the rules (``NAME_RULES``: what the learner types is lower-cased first,
  so ``ROOT`` is ``root``);
* a reserved name (``RESERVED``: root, the usual system and service accounts, the names of
  the hub's own parts), and uid 0 under any name;
* an account or group of the machine the hub did not create (every system account, uid below
  ``UID_MIN`` of /etc/login.defs, and every other user's), or one whose uid changed since.

The instructors are named in the hub's configuration: their own accounts may exist already,
but never as root or a system account (uid below ``UID_MIN``).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

from slotmap.i18n import N_, _, tr

NAME_PATTERN = r"^[a-z][a-z0-9]{0,30}$"
NAME_RULES = N_(
    "a user name is 1 to 31 lower-case letters (a-z) and digits, starting with a letter; "
    "what you type is lower-cased (Ada becomes ada); no _ - . or spaces (zhang_wei: type "
    "zhangwei)"
)
# Names no learner gets even before an account of that name exists on this machine.
RESERVED = frozenset(
    """root toor admin administrator adm daemon bin sys sync games man lp mail news uucp proxy
    backup list irc gnats nobody nogroup operator shadow staff sudo wheel users disk kmem tty
    systemd messagebus sshd postgres mysql redis docker www ubuntu debian centos jupyter
    jupyterhub hub slotmap instructor""".split()
)
REGISTRY_FILE = "learners.json"


def uid_min(login_defs: Path = Path("/etc/login.defs")) -> int:
    """The lowest uid of a person's account on this machine (``UID_MIN``, default 1000)."""
    try:
        text = login_defs.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 1000
    found = re.search(r"^\s*UID_MIN\s+(\d+)", text, re.MULTILINE)
    return int(found.group(1)) if found else 1000


class Registry:
    """The accounts the hub created, name -> uid, in a file only root reads (0600, in the
    hub's 0700 state folder). Written whole through a temporary file."""

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def created(self) -> dict[str, int]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return {}
        with os.fdopen(fd, encoding="utf-8") as file:
            data = json.load(file)
        return {str(name): int(uid) for name, uid in data.items()}

    def add(self, name: str, uid: int) -> None:
        accounts = self.created()
        accounts[name] = uid
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".new")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump(accounts, file, indent=1, sort_keys=True)
        os.replace(temporary, self.path)


def name_problem(typed: str) -> str:
    """Why ``typed`` can never be a learner's name (public rules: the name alone), or ""."""
    name = typed.strip().lower()
    if not re.fullmatch(NAME_PATTERN, name):
        return _("'{typed}' is not a user name here: {rules}.").format(
            typed=typed, rules=tr(NAME_RULES)
        )
    if name in RESERVED:
        return _(
            "'{name}' is reserved on this machine (a system or hub account): pick another name."
        ).format(name=name)
    return ""


def account_problem(name: str, registry: Registry, admins: Iterable[str] = ()) -> str:
    """Why ``name`` (already lower-cased and within the rules) may not log in as a learner or
    an instructor on this machine, or "" when it may."""
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        account = None
    if account is not None and account.pw_uid == 0:
        return _("'{name}' is root on this machine: pick another name.").format(name=name)
    if name in set(admins):
        if account is not None and account.pw_uid < uid_min():
            return _("'{name}' is a system account of this machine, not an instructor's.").format(
                name=name
            )
        return ""
    if account is None:
        try:
            grp.getgrnam(name)
        except KeyError:
            return ""  # new: the hub creates it before the first spawn
        return _(
            "'{name}' is a group of this machine, not a learner's: pick another name."
        ).format(name=name)
    if registry.created().get(name) != account.pw_uid:
        return _(
            "'{name}' is an account of this machine, not one this workshop created for a "
            "learner: pick another name."
        ).format(name=name)
    return ""


def prepare_account(
    name: str, registry: Registry, admins: Iterable[str] = ()
) -> pwd.struct_passwd:
    """The account ``name``'s server runs as (the hub's pre-spawn hook, as root): created and
    recorded on the first spawn, refused (``PermissionError``) as at login. Its home is 0700:
    no learner reads another's work."""
    problem = name_problem(name) if name not in set(admins) else ""
    problem = problem or account_problem(name, registry, admins)
    if problem:
        raise PermissionError(problem)
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
        account = pwd.getpwnam(name)
        if name not in set(admins):
            registry.add(name, account.pw_uid)
        os.chmod(account.pw_dir, 0o700)
    if account.pw_uid < uid_min():  # a learner or an instructor, never a system account
        raise PermissionError(f"'{name}' has uid {account.pw_uid}, below UID_MIN")
    return account
