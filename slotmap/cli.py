"""The ``slotmap`` command.

* ``doctor`` says which backend runs and with which versions, then launches the production
  kernel (and its family) on a small batch and compares it with the reference: a canary for
  a broken install.
* ``lab`` gives the learner their own copies of the exercises (``my_work/``, never
  overwritten) and starts JupyterLab on the course with the course's configuration;
  ``--lang zh``: the lessons, the exercises and JupyterLab's menus in Chinese.
* ``exercises build`` regenerates ``exercises/`` from ``solutions/`` (``--check``: only say
  whether they drifted); ``exercises copy`` makes the learner's copies.
* ``translate update|build|messages`` keeps the course's other languages tied to the English:
  per-cell notebook translations (``translations/``) and the runtime messages' gettext catalog
  (``slotmap/locale/``); ``--check``: only say what is stale or missing.
* ``grade FOLDER`` runs every notebook in a folder headless and prints a notebook x exercise
  table of pass/fail (for instructors).
* ``ascend`` compiles every launch the course makes on an NPU with triton-ascend's compiler,
  up to the stage that needs CANN, and reports what passed and what the IR shows.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from slotmap.i18n import LANG_VAR, N_, _, columns, language, tr
from slotmap.lab import (
    COURSE_MARKER,
    course_root,
    exercise_copies,
    is_course,
    lab_command,
    lessons_folder,
)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Installed versions, read from package metadata (importing torch_npu can break torch)."""
    names = ["torch", "triton", "triton-ascend", "torch-npu", "numpy", "hypothesis"]
    names += ["jupyterlab", "ipywidgets", "jupyterlab_widgets", "ipykernel", "matplotlib"]
    found = {name: _version(name) for name in names}
    found["python"] = sys.version.split()[0]
    return found


# The course's widget stack, as pyproject.toml's lab extra pins it (a test keeps the two equal).
# ipywidgets (the kernel side) and jupyterlab_widgets (which ships the JupyterLab extension
# that renders the widgets) are released in pairs: ipywidgets 8.1.9 requires
# jupyterlab_widgets~=3.0.17, whose extension is @jupyter-widgets/jupyterlab-manager 5.0.16.
# A mismatch shows widgets as "Error displaying widget: model not found", or as plain text.
LAB_PINS = {"jupyterlab": ">=4.4,<4.7", "ipywidgets": "==8.1.9", "jupyterlab_widgets": "==3.0.17"}
WIDGETS_EXTENSION = "@jupyter-widgets/jupyterlab-manager"


@dataclass
class WidgetStack:
    """What decides whether widgets render: installed versions, ipywidgets' own requirements,
    and the widgets extension that jupyterlab_widgets ships and the one JupyterLab loads."""

    versions: dict[str, str | None]  # jupyterlab, ipywidgets, jupyterlab_widgets
    ipywidgets_requires: list[str]  # ipywidgets' requirement strings, from its metadata
    shipped_extension: str | None  # the extension version in jupyterlab_widgets' files
    loaded_extension: tuple[str, str] | None  # (version, folder): the first on Jupyter's path


def widget_stack() -> WidgetStack:
    """Read the widget stack from package metadata and Jupyter's data path."""
    import json

    names = ("jupyterlab", "ipywidgets", "jupyterlab_widgets")
    found = {name: _version(name) for name in names}
    try:
        requires = importlib.metadata.requires("ipywidgets") or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    shipped = None
    try:
        distribution = importlib.metadata.distribution("jupyterlab_widgets")
        for file in distribution.files or []:
            if str(file).replace("\\", "/").endswith(f"{WIDGETS_EXTENSION}/package.json"):
                shipped = json.loads(Path(distribution.locate_file(file)).read_text())["version"]
    except (importlib.metadata.PackageNotFoundError, OSError, ValueError, KeyError):
        pass
    loaded = None
    try:
        from jupyter_core.paths import jupyter_path

        # JupyterLab loads an extension from the first folder that has it (jupyterlab_server's
        # get_federated_extensions walks jupyter_path("labextensions") in order).
        for folder in jupyter_path("labextensions"):
            package = Path(folder) / WIDGETS_EXTENSION / "package.json"
            if package.is_file():
                loaded = (json.loads(package.read_text())["version"], folder)
                break
    except (ImportError, OSError, ValueError, KeyError):
        pass
    return WidgetStack(found, list(requires), shipped, loaded)


def widget_problems(stack: WidgetStack) -> list[str]:
    """Why widgets would not render in the course's JupyterLab; empty when they would."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name

    versions = stack.versions
    if kernel_side_only(stack):
        # No JupyterLab here (a headless server whose notebooks a lab elsewhere connects
        # to): only the kernel side can be checked.
        pin = LAB_PINS["ipywidgets"]
        if versions["ipywidgets"] not in SpecifierSet(pin):
            return [
                _("{name} {version} is not the course's pin {name}{pin}").format(
                    name="ipywidgets", version=versions["ipywidgets"], pin=pin
                )
            ]
        return []
    missing = [name for name in LAB_PINS if not versions.get(name)]
    if missing:
        return [
            _("{name} is not installed: the course's widgets need it").format(name=name)
            for name in missing
        ]
    problems = []
    for name, pin in LAB_PINS.items():
        if versions[name] not in SpecifierSet(pin):
            problems.append(
                _("{name} {version} is not the course's pin {name}{pin}").format(
                    name=name, version=versions[name], pin=pin
                )
            )
    for text in stack.ipywidgets_requires:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.marker is None and canonicalize_name(requirement.name) == (
            "jupyterlab-widgets"
        ):
            have = versions["jupyterlab_widgets"]
            if have not in requirement.specifier:
                problems.append(
                    _("ipywidgets {version} needs jupyterlab_widgets{pin}, found {have}").format(
                        version=versions["ipywidgets"], pin=requirement.specifier, have=have
                    )
                )
    if stack.loaded_extension is None:
        problems.append(
            _("JupyterLab finds no {extension} extension").format(extension=WIDGETS_EXTENSION)
        )
    elif stack.shipped_extension and stack.loaded_extension[0] != stack.shipped_extension:
        version, folder = stack.loaded_extension
        problems.append(
            _(
                "JupyterLab loads {extension} {version} from {folder}, but "
                "jupyterlab_widgets {widgets} ships {shipped}: remove {path}"
            ).format(
                extension=WIDGETS_EXTENSION,
                version=version,
                folder=folder,
                widgets=versions["jupyterlab_widgets"],
                shipped=stack.shipped_extension,
                path=Path(folder) / WIDGETS_EXTENSION,
            )
        )
    return problems


def kernel_side_only(stack: WidgetStack) -> bool:
    """ipywidgets is installed but JupyterLab is not: the frontend lives elsewhere."""
    return bool(stack.versions.get("ipywidgets")) and not stack.versions.get("jupyterlab")


def widgets_report(stack: WidgetStack) -> tuple[bool, list[str]]:
    """(all good, the doctor's lines) for the widget stack."""
    versions = stack.versions
    if not any(versions.get(name) for name in LAB_PINS):
        return True, [_("widgets      not installed (the course needs the lab extra)")]
    problems = widget_problems(stack)
    if not problems and kernel_side_only(stack):
        return True, [
            _(
                "widgets      kernel side only: ipywidgets {version}, no JupyterLab "
                "here; the JupyterLab that runs these notebooks needs jupyterlab_widgets{pin}"
            ).format(version=versions["ipywidgets"], pin=LAB_PINS["jupyterlab_widgets"])
        ]
    if not problems:
        version, folder = stack.loaded_extension or ("?", "?")
        return True, [
            _(
                "widgets      match: ipywidgets {ipywidgets}, jupyterlab_widgets "
                "{widgets}, {extension} {version} ({folder})"
            ).format(
                ipywidgets=versions["ipywidgets"],
                widgets=versions["jupyterlab_widgets"],
                extension=WIDGETS_EXTENSION,
                version=version,
                folder=folder,
            )
        ]
    lines = [_("widgets      MISMATCH: {problem}").format(problem=problem) for problem in problems]
    lines.append(
        _(
            "             widgets would show 'Error displaying widget: model not found' or as "
            "text; reinstall the lab extra: pip install -e '.[lab]' (rm -rf .venv && make lab)"
        )
    )
    return False, lines


def canary() -> list[tuple[str, bool, float, str]]:
    """Run every kernel on a small mixed batch against the oracle.

    Returns (name, passed, seconds, detail) per check. The first launch includes the
    compilation (or, on the CPU, the interpreter's warm-up).
    """
    import torch

    import slotmap

    device = slotmap.DEVICE
    generator = torch.Generator().manual_seed(0)
    lengths = [5, 0, 37, 1, 130]
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    qsl = torch.tensor(starts, dtype=torch.int32, device=device)
    first = [0, 0, 90, 513, 7]
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(first, lengths, strict=True)])
    positions = positions.to(device=device, dtype=torch.int64)
    block_size, blocks = 16, 48
    # Physical block numbers above 2**24 catch a float32 gather that rounds.
    table = torch.randperm(4096, generator=generator)[: len(lengths) * blocks] + 2**24
    table = table.reshape(len(lengths), blocks).to(device=device, dtype=torch.int32)
    ring = torch.randint(0, 1000, (len(lengths), 1), generator=generator, dtype=torch.int32)
    ring = ring.to(device)
    single = (qsl, positions, table, block_size)
    groups = (qsl, positions, [table, ring], [block_size, 8])
    cp = dict(kv_cache_block_size=32, cp_world_size=2, cp_rank=1, cp_interleave=8)
    # (name, launcher, its reference, arguments, options for both, launcher-only options)
    cases = [
        (
            N_("window kernel"),
            slotmap.compute_slot_mapping,
            slotmap.slot_mapping_oracle,
            single,
            {},
            {"tile_size": 64},
        ),
        (
            N_("window kernel, float32-halves gather"),
            slotmap.compute_slot_mapping,
            slotmap.slot_mapping_oracle,
            single,
            {},
            {"tile_size": 64, "gather_as_float": True},
        ),
        (
            N_("direct kernel"),
            slotmap.compute_slot_mapping_direct,
            slotmap.slot_mapping_oracle,
            single,
            {},
            {},
        ),
        (
            N_("window kernel, context parallel"),
            slotmap.compute_slot_mapping,
            slotmap.slot_mapping_oracle,
            single,
            cp,
            {},
        ),
        (
            N_("fused two-group kernel"),
            slotmap.compute_slot_mappings,
            slotmap.slot_mappings_oracle,
            groups,
            {"circular": [False, True]},
            {},
        ),
    ]
    max_num_tokens = starts[-1] + 11
    checks = []
    for name, launcher, reference, args, options, launcher_only in cases:
        options = dict(options, max_num_tokens=max_num_tokens)
        run = functools.partial(launcher, *args, **options, **launcher_only)
        checks.append((name, run, reference(*args, **options)))
    results = []
    for name, run, want in checks:
        start = time.perf_counter()
        try:
            got = run().cpu()  # .cpu() waits for the device
            want = want.cpu()
            ok = torch.equal(got, want)
            detail = (
                _("exact")
                if ok
                else _("MISMATCH at {token}").format(token=int((got != want).nonzero()[0, 0]))
            )
        except Exception as exc:  # noqa: BLE001 - the doctor reports, it does not crash
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        results.append((name, ok, time.perf_counter() - start, detail))
    return results


def doctor(_args: argparse.Namespace) -> int:
    import slotmap

    print(
        _("backend      {backend} on device {device}").format(
            backend=slotmap.BACKEND.name, device=repr(slotmap.DEVICE)
        )
    )
    print(_("why          {reason}").format(reason=slotmap.BACKEND.reason))
    interpret = repr(os.environ.get("TRITON_INTERPRET", ""))
    print(_("interpreter  TRITON_INTERPRET={value}").format(value=interpret))
    found = versions()
    missing = _("not installed")
    for name in ["python", "torch", "triton", "triton-ascend", "torch-npu"]:
        print(f"{name:<12} {found[name] or missing}")
    if found["triton"] and found["triton-ascend"]:
        print(_("WARNING      triton and triton-ascend both installed: they overwrite each other"))
    lab = ["jupyterlab", "ipywidgets", "jupyterlab_widgets", "ipykernel", "matplotlib"]
    listed = ", ".join(f"{n} {found[n] or '-'}" for n in lab)
    print(_("lab          {packages}").format(packages=listed))
    widgets_ok, lines = widgets_report(widget_stack())
    print("\n".join(lines))
    print(_("canary       production kernels against the reference:"))
    results = canary()
    for name, ok, seconds, detail in results:
        verdict = _pad(_("PASS") if ok else _("FAIL"), 4)
        print(f"  {verdict}  {_pad(tr(name), 38)} {seconds * 1e3:8.1f} ms  {detail}")
    passed = all(ok for _name, ok, _seconds, _detail in results)
    if passed and widgets_ok:
        print(_("doctor: all good"))
    else:
        failed = ([] if passed else [_("the canary")]) + ([] if widgets_ok else [_("the widgets")])
        print(_("doctor: {failed} FAILED").format(failed=_(" and ").join(failed)))
    return 0 if passed and widgets_ok else 1


def _pad(text: str, width: int) -> str:
    """``text`` padded to ``width`` terminal columns: a CJK character takes two."""
    return text + " " * (width - columns(text))


NO_AUTH_FLAG = "--unsafe-no-auth"
EMPTY_VALUES = ("", "''", '""')


def sets_empty_token(jupyter_args: list[str]) -> bool:
    """Whether pass-through Jupyter options set an empty token, which turns authentication
    off: any ``--<Class>.token`` (IdentityProvider, PasswordIdentityProvider, ServerApp,
    NotebookApp, ...) or ``--token``, as ``--X.token=`` or ``--X.token ''``."""
    for i, option in enumerate(jupyter_args):
        name, equals, value = option.partition("=")
        if not name.startswith("--") or name[2:].rsplit(".", 1)[-1].lower() != "token":
            continue
        if not equals:  # the value is the next argument
            value = jupyter_args[i + 1] if i + 1 < len(jupyter_args) else ""
        if value.strip() in EMPTY_VALUES:
            return True
    return False


def lab_problem(args: argparse.Namespace) -> str | None:
    """Why ``slotmap lab`` must not start with these arguments (one line), or None."""
    root = course_root()
    if not is_course(root):
        return _(
            "no course here: neither {here} nor a folder above it, nor {root}, holds "
            "{marker}; run slotmap lab in the slotmap checkout"
        ).format(here=Path.cwd(), root=root, marker=COURSE_MARKER)
    empty = args.token == "" or sets_empty_token(args.jupyter_args)
    if empty and not args.unsafe_no_auth:
        return _(
            "an empty token turns authentication off: anyone who can reach the port can run "
            "code as you; pass a token, or add {flag} if you mean it"
        ).format(flag=NO_AUTH_FLAG)
    return None


def lab_language(args: argparse.Namespace) -> tuple[str, str, list[str]]:
    """(language, lessons folder, notes) for ``slotmap lab``: ``--lang``, else ``$SLOTMAP_LANG``,
    else the locale; the lessons in that language if they are built, else the English ones."""
    from slotmap import i18n

    lang = i18n.use(args.lang) if args.lang else i18n.use(i18n.from_environment())
    if lang == i18n.ENGLISH:
        return lang, "notebooks", []
    notes = []
    if not _version(LANGUAGE_PACKS[lang]):
        notes.append(
            _("JupyterLab's own menus stay in English: {package} is not installed").format(
                package=LANGUAGE_PACKS[lang]
            )
            + " (pip install -e '.[lab]')"
        )
    lessons = lessons_folder(course_root(), lang)
    if lessons == "notebooks":
        notes.append(_("the lessons are not translated yet: opening the English ones"))
    return lang, lessons, notes


# JupyterLab's interface in each language the course speaks.
LANGUAGE_PACKS = {"zh_CN": "jupyterlab-language-pack-zh-CN"}


def lab(args: argparse.Namespace) -> int:
    try:  # first: it chooses the language the other lines are in
        lang, lessons, notes = lab_language(args)
    except ValueError as error:
        print(f"slotmap lab: --lang {error}", file=sys.stderr)
        return 2
    problem = lab_problem(args)
    if problem:
        print(f"slotmap lab: {problem}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"slotmap lab: {note}", file=sys.stderr)
    command = lab_command(
        args.port,
        args.no_browser,
        args.token,
        args.ip,
        args.jupyter_args,
        lessons=lessons,
        lang=lang,
    )
    if args.dry_run:
        print(" ".join(command))
        return 0
    root = course_root()
    if (root / "exercises").is_dir():
        from slotmap.exercises.build import EXERCISES, WorkspaceError, copy_to_workspace

        for exercises_folder, workspace in exercise_copies(EXERCISES, root / "my_work", lang):
            try:
                messages = copy_to_workspace(exercises_folder, workspace)
            except WorkspaceError as error:
                print(f"slotmap lab: {error}", file=sys.stderr)
                return 2
            for message in messages:
                print(f"slotmap: {message}")
    os.environ[LANG_VAR] = lang  # the notebooks' kernels speak it too
    os.execv(command[0], command)
    return 0  # not reached


def exercises(args: argparse.Namespace) -> int:
    from slotmap.exercises import build

    if args.action == "copy":
        workspace = Path(args.workspace) if args.workspace else build.learner_workspace()
        messages = []
        try:
            # The copies `slotmap lab` makes in the course's language: the language's own too.
            for folder, copies in exercise_copies(build.EXERCISES, workspace, language()):
                messages += build.copy_to_workspace(folder, copies)
        except build.WorkspaceError as error:
            print(f"slotmap exercises: {error}", file=sys.stderr)
            return 2
        print("\n".join(messages) or _("{where}: nothing new to copy").format(where=workspace))
        return 0
    if args.check:
        problems = build.stale_exercises()
        print("\n".join(problems) or "exercises/ is up to date with solutions/")
        if problems:
            print("run: slotmap exercises build")
        return 1 if problems else 0
    changed = build.build_exercises()
    print("\n".join(f"wrote {path}" for path in changed) or "exercises/ was up to date")
    return 0


def translate(args: argparse.Namespace) -> int:
    """``slotmap translate update|build|messages [--check]``: the course in another language."""
    from slotmap.i18n import normalize
    from slotmap.translate import documents, messages, notebooks

    lang = normalize(args.lang)  # zh -> zh_CN: the folders' names
    if args.action == "update":
        written = notebooks.update_translations(lang) + documents.update_documents(lang)
        print("\n".join(f"wrote {path}" for path in written) or "translations/ was up to date")
        return 0
    if args.action == "messages":
        if args.check:
            problems = messages.message_problems(lang)
            print("\n".join(problems) or f"the {lang} catalog says everything the source says")
            return 1 if problems else 0
        changed = messages.update(lang)
        print("\n".join(f"wrote {path}" for path in changed) or "the catalog was up to date")
        return 0
    for notebook in notebooks.english_notebooks():
        state = notebooks.status(notebook, lang)
        cells = len(state.translated) + len(state.stale) + len(state.missing)
        print(
            f"{notebook:<40} {len(state.translated):>3}/{cells} translated, "
            f"{len(state.stale)} stale, {len(state.missing)} missing"
        )
    for document in documents.DOCUMENTS:
        state = documents.status(document, lang)
        blocks = len(state.translated) + len(state.stale) + len(state.missing)
        print(
            f"{document:<40} {len(state.translated):>3}/{blocks} blocks translated, "
            f"{len(state.kept)} kept in English, {len(state.stale)} stale, "
            f"{len(state.missing)} missing"
        )
    if args.check:
        problems = notebooks.translation_problems(lang) + documents.document_problems(lang)
        print("\n".join(problems) or f"the {lang} notebooks are up to date with their English")
        return 1 if problems else 0
    try:
        changed = notebooks.build_translations(lang) + documents.build_documents(lang)
    except ValueError as error:
        print(f"slotmap translate: {error}", file=sys.stderr)
        return 1
    print(
        "\n".join(f"wrote {path}" for path in changed) or f"the {lang} notebooks were up to date"
    )
    return 0


def progress_bar(done: int, total: int, seconds: float, width: int = 30) -> str:
    """``slotmap grade``'s progress on a terminal: a bar, the count and the time so far."""
    filled = width * done // total
    elapsed = _("{done}/{total} {seconds} s").format(
        done=done, total=total, seconds=f"{seconds:.0f}"
    )
    return f"[{'#' * filled}{'.' * (width - filled)}] {elapsed}"


def progress_line(one, done: int, total: int) -> str:  # noqa: ANN001 - a grade.Grade
    """``slotmap grade``'s line for a notebook just graded (not on a terminal): its verdicts."""
    from slotmap.exercises.grade import result_label

    verdict = _(", ").join(f"{e} {result_label(r)}" for e, r in one.results.items())
    verdict = verdict or _("no checks")
    verdict += _("; {error}").format(error=one.error) if one.error else ""
    return f"[{done}/{total}] {one.notebook}: {verdict}"


def grade(args: argparse.Namespace) -> int:
    import signal

    from slotmap.exercises.grade import (
        GradeOptions,
        grade_folder,
        grades_json,
        table,
        write_atomically,
    )

    folder = Path(args.folder)
    if not folder.is_dir():
        print(_("slotmap grade: {folder} is not a folder").format(folder=folder), file=sys.stderr)
        return 2
    solutions = Path(args.solutions)
    if not any(solutions.glob("*.ipynb")):
        # Without them every notebook would fail, for a reason that is not the learner's.
        print(
            _("slotmap grade: no solutions in {solutions} (--solutions)").format(
                solutions=solutions
            ),
            file=sys.stderr,
        )
        return 2
    total = sum(1 for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    if not total:
        print(
            _("slotmap grade: no notebooks under {folder}").format(folder=folder), file=sys.stderr
        )
        return 2
    options = GradeOptions(
        timeout=args.timeout,
        notebook_timeout=args.notebook_timeout,
        max_output=args.max_output,
        jobs=max(1, args.jobs),
    )
    bar = sys.stderr.isatty()
    started = time.monotonic()

    def finished(one, so_far) -> None:  # noqa: ANN001
        # Each notebook's result is on disk as soon as it is graded: a crash loses one at most.
        if args.json:
            write_atomically(Path(args.json), grades_json(so_far))
        done = len(so_far)
        if bar:
            print(
                "\r" + progress_bar(done, total, time.monotonic() - started),
                end="" if done < total else "\n",
                file=sys.stderr,
                flush=True,
            )
        else:
            print(progress_line(one, done, total), file=sys.stderr, flush=True)

    # A terminated (or hung-up) grader stops its notebooks (grade_folder cleans up on the way
    # out); a killed one takes them along by their parent-death signal.
    previous = {
        sig: signal.signal(sig, lambda number, _: sys.exit(128 + number))
        for sig in (signal.SIGTERM, signal.SIGHUP)
    }
    try:
        grades = grade_folder(folder, solutions=solutions, options=options, on_grade=finished)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # Every kernel is dead by now: nothing can change the table or the file after this.
    print(table(grades))
    if args.json:
        write_atomically(Path(args.json), grades_json(grades))
    return 0


# argparse's own error messages, as Python 3.10 to 3.13 write them, each read back into its
# parts and said again in the course's language (Python ships no catalog for argparse).
ARGPARSE_ERRORS = [
    (r"argument (?P<argument>.+?): (?P<message>.+)", N_("argument {argument}: {message}")),
    (
        r"the following arguments are required: (?P<arguments>.+)",
        N_("the following arguments are required: {arguments}"),
    ),
    (
        r"invalid choice: (?P<value>.+) \(choose from (?P<choices>.+)\)",
        N_("invalid choice: {value} (choose from {choices})"),
    ),
    (r"invalid (?P<type>\w+) value: (?P<value>.+)", N_("invalid {type} value: {value}")),
    (r"expected one argument", N_("expected one argument")),
    (r"expected at most one argument", N_("expected at most one argument")),
    (r"expected at least one argument", N_("expected at least one argument")),
    (
        r"ambiguous option: (?P<option>.+?) could match (?P<matches>.+)",
        N_("ambiguous option: {option} could match {matches}"),
    ),
    (r"unrecognized arguments: (?P<arguments>.+)", N_("unrecognized arguments: {arguments}")),
]


def argparse_message(message: str) -> str:
    """One of argparse's error messages in the course's language; one it does not know, as is."""
    for pattern, template in ARGPARSE_ERRORS:
        found = re.fullmatch(pattern, message, re.S)
        if found:
            parts = found.groupdict()
            if "message" in parts:
                parts["message"] = argparse_message(parts["message"])
            return tr(template).format(**parts)
    return message


class _UsageFormatter(argparse.HelpFormatter):
    def add_usage(self, usage, actions, groups, prefix=None) -> None:  # noqa: ANN001
        super().add_usage(
            usage, actions, groups, prefix=_("usage: ") if prefix is None else prefix
        )


class CourseParser(argparse.ArgumentParser):
    """argparse in the course's language: its help option, section titles, usage line and
    error messages too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _UsageFormatter)
        super().__init__(*args, **{**kwargs, "add_help": False})
        self._positionals.title = _("positional arguments")
        self._optionals.title = _("options")
        self.add_argument("-h", "--help", action="help", help=_("show this help and exit"))

    def format_help(self) -> str:
        # argparse ends each section's title with its own half-width colon.
        text = super().format_help()
        for group in self._action_groups:
            heading = _("{heading}:").format(heading=group.title)
            text = text.replace(f"\n{group.title}:\n", f"\n{heading}\n")
        return text

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        said = argparse_message(message)
        self.exit(2, _("{prog}: error: {message}").format(prog=self.prog, message=said) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = CourseParser(
        prog="slotmap",
        description=_("The slotmap command: the course, its checks, its grader and its workshop."),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help=_("report the backend and versions, run a canary launch"))
    lab_parser = sub.add_parser("lab", help=_("open the course in JupyterLab"))
    lab_parser.add_argument(
        "--port", type=int, default=None, help=_("JupyterLab's port (default: JupyterLab's)")
    )
    lab_parser.add_argument(
        "--ip",
        default="127.0.0.1",
        help=_("the address JupyterLab listens on (default: this machine only)"),
    )
    lab_parser.add_argument(
        "--token", default=None, help=_("JupyterLab's token (default: one JupyterLab makes)")
    )
    lab_parser.add_argument(
        NO_AUTH_FLAG,
        action="store_true",
        help=_("allow --token '' (no authentication: anyone who can reach the port runs code)"),
    )
    lab_parser.add_argument("--no-browser", action="store_true", help=_("open no browser"))
    lab_parser.add_argument("--dry-run", action="store_true", help=_("print the command only"))
    lab_parser.add_argument(
        "--lang",
        default=None,
        help=_(
            "the course's language, en or zh (default: $SLOTMAP_LANG, else zh for a zh locale, "
            "else en): the lessons, the exercises and JupyterLab's own menus"
        ),
    )
    lab_parser.add_argument(
        "jupyter_args", nargs=argparse.REMAINDER, help=_("more options, passed on to JupyterLab")
    )
    exercises_parser = sub.add_parser("exercises", help=_("build exercises/, copy to my_work/"))
    exercises_parser.add_argument("action", choices=("build", "copy"))
    exercises_parser.add_argument(
        "--check", action="store_true", help=_("build: only report drift (exit 1 if any)")
    )
    exercises_parser.add_argument(
        "--workspace",
        default=None,
        help=_(
            "copy: the learner's my_work/ (default: $SLOTMAP_WORKSPACE, else my_work/ of the "
            "course copy you are in, else ~/slotmap-course/my_work)"
        ),
    )
    translate_parser = sub.add_parser(
        "translate", help=_("the course in another language (translations/, slotmap/locale/)")
    )
    translate_parser.add_argument(
        "action",
        choices=("update", "build", "messages"),
        help=_(
            "update: bring translations/ up to the English notebooks; build: write the "
            "translated notebooks that are complete; messages: extract, update and compile the "
            "runtime messages' catalog"
        ),
    )
    translate_parser.add_argument(
        "--check",
        action="store_true",
        help=_("build, messages: only report drift (exit 1 if any)"),
    )
    translate_parser.add_argument(
        "--lang", default="zh", help=_("the translation's language (zh)")
    )
    grade_parser = sub.add_parser("grade", help=_("grade a folder of learner notebooks"))
    grade_parser.add_argument(
        "folder", help=_("the learners' notebooks: every .ipynb in it and its subfolders")
    )
    grade_parser.add_argument("--timeout", type=int, default=300, help=_("seconds per cell"))
    grade_parser.add_argument(
        "--notebook-timeout", type=int, default=1800, help=_("seconds per notebook, all cells")
    )
    grade_parser.add_argument(
        "--max-output",
        type=int,
        default=20_000_000,
        help=_("characters of output a notebook may print; past it, it is stopped"),
    )
    grade_parser.add_argument("--jobs", "-j", type=int, default=1, help=_("notebooks at once"))
    grade_parser.add_argument("--json", default=None, help=_("also write the results here"))
    grade_parser.add_argument(
        "--solutions",
        default=str(course_root() / "solutions"),
        help=_("where the solution of each notebook (same file name) says what it must check"),
    )
    workshop_parser = sub.add_parser("workshop", help=_("the course on JupyterHub (workshop/)"))
    workshop_parser.add_argument(
        "action",
        choices=("dashboard", "learner-server", "proxy", "preflight", "collect", "confirm"),
        help=_(
            "dashboard: the instructor's live view (a hub service); learner-server: what the "
            "hub starts per learner; proxy: the hub's proxy run apart (slotmap-proxy.service); "
            "preflight: check this machine before the room arrives; "
            "collect: copy the learners' notebooks (as root); "
            "confirm: check the room's passes against slotmap grade's"
        ),
    )
    workshop_parser.add_argument("--into", help=_("collect: a folder only root reads"))
    workshop_parser.add_argument("--state", help=_("collect: the hub's state folder"))
    workshop_parser.add_argument("--collected", help=_("confirm: the folder collect filled"))
    workshop_parser.add_argument("--learners", type=int, default=30, help=_("preflight: how many"))
    workshop_parser.add_argument("--room", help=_("confirm: the dashboard's api/progress JSON"))
    workshop_parser.add_argument("--grades", help=_("confirm: slotmap grade --json's file"))
    bench_parser = sub.add_parser("bench", help=_("time the kernels against the floor"))
    ascend_parser = sub.add_parser(
        "ascend", help=_("compile every recorded NPU launch with triton-ascend (no NPU needed)")
    )
    ascend_parser.add_argument(
        "--record", action="store_true", help=_("first record the launches again (course's env)")
    )
    ascend_parser.add_argument(
        "--write", action="store_true", help=_("write benchmarks/results/ascend-ir.{md,json}")
    )
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # lazy: slotmap.bench imports torch and the kernels
        from slotmap import bench

        bench.add_arguments(bench_parser)
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command not in ("lab", "workshop"):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")  # argparse's, translated
    if args.command == "lab":
        # Options slotmap does not know go to JupyterLab (after an optional "--").
        args.jupyter_args = [a for a in args.jupyter_args + unknown if a != "--"]
    if args.command == "bench":
        return bench.run(args)
    commands = {
        "doctor": doctor,
        "lab": lab,
        "exercises": exercises,
        "grade": grade,
        "translate": translate,
    }
    if args.command == "workshop":  # lazy: the hub's and tornado's imports
        from slotmap.workshop.commands import run

        return run(args, unknown)
    if args.command == "ascend":  # lazy: slotmap.ascend imports the kernels
        from slotmap import ascend

        return ascend.run(args)
    return commands[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
