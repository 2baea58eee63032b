#!/usr/bin/python3 -I
"""klique-helper: the one program, besides the scheduler's own commands, that a login-node
agent runs as users through sudo (a pool with `transport: {kind: sudo}`).

    klique-helper OPERATION ARGUMENTS...

It does what the shell scripts of broker/fileops.py do, operation by operation, so that the
sudoers rule can name it instead of a shell, and it is confined, because its caller is not
trusted: it reads and writes only inside the job roots that CONFIG (root-owned) lists, opening
each path one name at a time from its root and never through a link, and after writing a job
folder it runs only a scheduler's submit command (sbatch, qsub, bsub) found on the scheduler's
PATH, never a program of the caller's choosing. A refusal exits non-zero (REFUSED, or the
operation's own failure code) with one line on stderr that says what and why.
Standard library only, Python 3.8+; install it root-owned and read-only:
`klique agent --install-helper /usr/local/libexec/klique-helper`, then list the job roots in
CONFIG (docs/login-node-agent.md).
"""

import base64
import contextlib
import errno
import functools
import io
import os
import re
import secrets
import stat
import subprocess
import sys
import tarfile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

# The job roots, one absolute path a line, and optionally `path=DIR:DIR` (where the submit
# commands are). Read from here only, never from the arguments or the environment: the caller
# is the agent, which this program does not trust. `klique agent --install-helper` can fix
# another path into the installed copy (this line is rewritten).
CONFIG = "/etc/klique/helper.conf"
# Where the submit commands are looked for unless CONFIG says `path=`: sudo's usual secure_path.
SCHEDULER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
UNPACK_FAILED = 125
UNPACK_WORDS = "klique: the files above could not be written"
MISSING = 3
REFUSED = 4  # outside the job roots, through a link, or a program not a submit command
SUBMIT_PROGRAMS = ("sbatch", "qsub", "bsub")
NOT_SUBMIT = 126
JOB_FOLDER = re.compile(r"(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*/klique-[0-9]+-[0-9]+-[0-9a-f]{12}")
# sbatch starts with exactly these and SLURM_CONF: a Slurm job's environment (--export=ALL).
SLURM_JOB_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR")
_CHUNK = 1 << 16
# A folder on the way, opened relative to the one before it: O_NOFOLLOW makes a link ELOOP (or
# ENOTDIR), so no name below a job root can lead out of it, whoever made the link and when.
# O_PATH: a folder the account may pass through but not list (a root of mode 1733) opens too.
_PATH = getattr(os, "O_PATH", os.O_RDONLY)
_FOLDER = _PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Refused(Exception):
    """A request the helper will not carry out; its message is the one line on stderr."""


class NotSubmit(Refused):
    """A program other than a submit command (NOT_SUBMIT, as the shell scripts answer)."""


@functools.lru_cache(maxsize=None)  # noqa: UP033 - functools.cache is Python 3.9+
def settings():
    """(the job roots, longest first; the folders the submit commands are looked for in), from
    CONFIG, which must be owned by root (or by this program's owner) and writable by no one
    else, in a folder likewise: another account that could change it could widen the roots."""
    try:
        fd = os.open(CONFIG, _FILE)
    except OSError as exc:
        raise Refused(
            f"cannot read {CONFIG} ({exc.strerror}); it lists the pool's job roots, one per "
            "line, root-owned (docs/login-node-agent.md)"
        ) from None
    with os.fdopen(fd, "rb") as source:
        _trusted(CONFIG, os.fstat(fd))
        _trusted(os.path.dirname(CONFIG), os.stat(os.path.dirname(CONFIG)))
        lines = source.read(1 << 16).decode("utf-8", "replace").splitlines()
    roots, path = [], SCHEDULER_PATH
    for line in (line.strip() for line in lines):
        if line.startswith("path="):
            path = line[len("path=") :]
        elif line and not line.startswith("#"):
            roots.append(_root(line))
    if not roots:
        raise Refused(f"{CONFIG} lists no job root")
    folders = [folder for folder in path.split(":") if folder.startswith("/")]
    return sorted(roots, key=len, reverse=True), folders


def _trusted(path, found):
    owners = {0, os.stat(os.path.realpath(__file__)).st_uid}
    if found.st_uid not in owners or found.st_mode & 0o022:
        raise Refused(f"{path} must be owned by root and writable by no one else")


def _root(line):
    """A job root as CONFIG names it: absolute and plain, and not / (which confines nothing)."""
    if not line.startswith("/") or os.path.normpath(line) != line or line == "/":
        raise Refused(f"{CONFIG}: {line!r} is not a job root (an absolute path, not /)")
    return line


def names_below_root(path):
    """(the job root PATH is in, the names below it); Refused unless PATH is absolute, has no
    empty, `.` or `..` name, and lies in one of the job roots."""
    if not path.startswith("/"):
        raise Refused(f"{path!r} is not an absolute path")
    names = path[1:].split("/")
    if any(name in ("", ".", "..") for name in names):
        raise Refused(f"{path!r} has an empty, '.' or '..' name in it")
    roots, _folders = settings()
    for root in roots:
        top = root[1:].split("/")
        if names[: len(top)] == top:
            return root, names[len(top) :]
    raise Refused(f"{path} is outside the job roots ({', '.join(roots)}) that {CONFIG} lists")


def open_folder(path, make=False):
    """PATH as an open folder, opened from its job root one name at a time, never through a
    link (made first, mode 777 less the umask, where missing and `make`). The root itself is
    the administrator's, so a link in its own path is followed; a trailing / is no name."""
    root, names = names_below_root(path.rstrip("/") or path)
    fd = os.open(root, _PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in names:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
            try:
                below = os.open(name, _FOLDER, dir_fd=fd)
            except OSError as exc:
                raise _not_followed(exc, path, name) from None
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def in_folder(path):
    """(PATH's folder, open; PATH's last name): what an operation on one file works in."""
    folder, _, name = path.rpartition("/")
    if not names_below_root(path)[1]:  # PATH itself, not only its folder, is checked
        raise Refused(f"{path} is a job root itself, not a file in one")
    fd = open_folder(folder)
    try:
        yield fd, name
    finally:
        os.close(fd)


def _not_followed(exc, path, name):
    """The error of a name that could not be opened: a link, or a file where a folder should
    be, is a refusal; anything else (missing, denied) stays what it was."""
    if isinstance(exc, OSError) and exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return Refused(f"{path}: {name!r} is a link or not a folder; links are not followed")
    return exc


def _no_link(folder, name, path):
    """Refused when NAME in FOLDER is a link."""
    with contextlib.suppress(FileNotFoundError):
        found = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISLNK(found.st_mode):
            raise Refused(f"{path} is a link; links are not followed")


def open_file(path):
    """A regular file below a job root, opened for reading, never through a link."""
    with in_folder(path) as (folder, name):
        try:
            fd = os.open(name, _FILE, dir_fd=folder)
        except OSError as exc:
            raise _not_followed(exc, path, name) from None
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
        os.close(fd)
        raise Refused(f"{path} is not a regular file with one name")
    return fd


def write(path, mode):
    """write PATH MODE < data: atomically, a new temporary name in the same folder, then
    rename (never over a link); the mode without set-id bits."""
    with in_folder(path) as (folder, name):
        _no_link(folder, name, path)
        tmp = f".{name}.{secrets.token_hex(6)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as out:
                _copy(sys.stdin.buffer, out, None)
                os.fchmod(out.fileno(), int(mode, 8) & 0o777)
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
    return 0


def read(path, start, limit):
    """read PATH FROM LIMIT: up to LIMIT bytes from byte FROM (1-based); 3 when missing."""
    try:
        fd = open_file(path)
    except FileNotFoundError:
        return MISSING
    with os.fdopen(fd, "rb") as source:
        source.seek(int(start) - 1)
        _copy(source, sys.stdout.buffer, int(limit))
    return 0


def unpack(folder, *arguments):
    """unpack FOLDER [--stdin=FILE] [COMMAND...] < tar: a new private folder, its files, then
    the scheduler's submit command in the same process."""
    os.umask(0o077)
    try:
        with in_folder(folder) as (parent, name):
            os.mkdir(name, 0o700, dir_fd=parent)
            made = os.open(name, _FOLDER, dir_fd=parent)
        try:
            _extract(made)
        finally:
            os.close(made)
    except (OSError, ValueError, tarfile.TarError, Refused) as exc:
        sys.stderr.write(f"{exc}\n{UNPACK_WORDS}\n")
        return UNPACK_FAILED
    command = list(arguments)
    if not command:
        return 0
    if command[0].startswith("--stdin="):
        fd = open_file(command.pop(0)[len("--stdin=") :])
        os.dup2(fd, 0)
        os.close(fd)
    program = submit_program(command[0] if command else "")
    os.execve(program, command, _submit_env(command[0]))  # noqa: S606 - a submit command
    return 127  # not reached


def unpack_each(parent, *names):
    """unpack-each PARENT NAME... < tar: in PARENT, a new private folder for each NAME, a line
    "item INDEX EXIT " for each (0: made; 125: not), then the tar's files, each NAME/FILE, into
    the folders made here; the files of a name not made are skipped."""
    os.umask(0o077)
    named = [JOB_FOLDER.fullmatch(os.path.join(parent, n)) and "/" not in n for n in names]
    if not names or not all(named):
        sys.stderr.write(f"klique-helper unpack-each makes only job folders\n{UNPACK_WORDS}\n")
        return UNPACK_FAILED
    try:
        top = open_folder(parent)
    except (OSError, Refused) as exc:
        sys.stderr.write(f"{exc}\n{UNPACK_WORDS}\n")
        return UNPACK_FAILED
    made = {}
    try:
        for index, name in enumerate(names):
            with contextlib.suppress(OSError):
                os.mkdir(name, 0o700, dir_fd=top)
                made[name] = os.open(name, _FOLDER, dir_fd=top)
            sys.stdout.write(f"item {index} {0 if name in made else UNPACK_FAILED} \n")
        sys.stdout.flush()
        with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as archive:
            for member in archive:
                name, _, file = member.name.partition("/")
                if name not in names:
                    raise ValueError(f"{member.name!r} is not in one of the folders named")
                if name in made:
                    _extract_member(archive, member, made[name], file)
    except (OSError, ValueError, tarfile.TarError) as exc:
        sys.stderr.write(f"{exc}\n{UNPACK_WORDS}\n")
        return UNPACK_FAILED
    finally:
        for fd in (top, *made.values()):
            os.close(fd)
    return 0


def submit_each(*arguments):
    """submit-each [N [--stdin=FILE] COMMAND...]...: each item's command, one of
    SUBMIT_PROGRAMS, run as a child (stdin /dev/null or its --stdin file), then one line "item
    INDEX EXIT STDOUT STDERR" (base64). A fault in the framing ends the whole."""
    os.umask(0o077)
    items, rest = [], list(arguments)
    while rest:
        count = rest.pop(0)
        if not count.isdigit() or not 0 < int(count) <= len(rest):
            return UNPACK_FAILED
        items.append(rest[: int(count)])
        rest = rest[int(count) :]
    for index, command in enumerate(items):
        code, out, err = _submit(command)
        words = (base64.b64encode(out).decode(), base64.b64encode(err).decode())
        sys.stdout.write(f"item {index} {code} {words[0]} {words[1]}\n")
        sys.stdout.flush()
    return 0


def _submit(command):
    """One item of submit-each: (exit code, stdout, stderr)."""
    try:
        source = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        if command[0].startswith("--stdin="):
            os.close(source)
            source = open_file(command.pop(0)[len("--stdin=") :])
    except Refused as exc:
        return REFUSED, b"", f"klique-helper: refused: {exc}\n".encode()
    except OSError as exc:
        return 2, b"", f"{exc}\n".encode()  # as the shell's failed redirection
    with os.fdopen(source, "rb") as stdin:
        try:
            program = submit_program(command[0] if command else "")
        except Refused as exc:
            code = NOT_SUBMIT if isinstance(exc, NotSubmit) else 127
            return code, b"", f"klique: {exc}\n".encode()
        env = _submit_env(command[0])
        try:  # a submit command, found by submit_program
            done = subprocess.run(  # noqa: S603
                command, executable=program, stdin=stdin, capture_output=True, env=env, check=False
            )
        except OSError as exc:
            return 126, b"", f"{exc}\n".encode()
    code = done.returncode
    return (code if code >= 0 else 128 - code), done.stdout, done.stderr


def submit_program(name):
    """The absolute path of a submit command (one of SUBMIT_PROGRAMS) on the scheduler's PATH
    (CONFIG's, never the caller's): a program of the caller's choosing is never run."""
    if name not in SUBMIT_PROGRAMS:
        raise NotSubmit(f"runs only {', '.join(SUBMIT_PROGRAMS)} after unpack")
    _roots, folders = settings()
    for folder in folders:
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise Refused(f"{name} is not in {':'.join(folders)} (`path=` in {CONFIG})")


def _submit_env(program):
    """The submit command's environment: without the scheduler's input variables (sbatch(1):
    SBATCH_* and SLURM_* but SLURM_CONF override the script's lines); sbatch's, only the job's
    variables (fileops.SLURM_JOB_ENV)."""
    if program == "sbatch":
        kept = (*SLURM_JOB_ENV, "SLURM_CONF")
        return {name: os.environ[name] for name in kept if name in os.environ}
    scheduler_input = ("SBATCH_", "SLURM_")
    return {
        k: v
        for k, v in os.environ.items()
        if k == "SLURM_CONF" or not k.startswith(scheduler_input)
    }


def _extract(folder):
    """The tar stream's regular files, each a plain name, created new with its own mode."""
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as archive:
        for member in archive:
            _extract_member(archive, member, folder, member.name)


def _extract_member(archive, member, folder, name):
    """One regular file of the tar into the open folder as name, a plain name, created new: a
    link, a device, an absolute name or one with `..` is refused."""
    if not member.isreg() or "/" in name or name in ("", ".", ".."):
        raise ValueError(f"{member.name!r} is not a regular file with a plain name")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, member.mode & 0o777, dir_fd=folder)
    with os.fdopen(fd, "wb") as out:
        source = archive.extractfile(member)
        if source is not None:
            _copy(source, out, None)


def collect(*paths):
    """collect PATH...: the regular files among them as a tar stream, each read once; links
    and missing files left out. Every PATH must be in a job root."""
    for path in paths:
        names_below_root(path)
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.USTAR_FORMAT) as out:
        for path in paths:
            try:
                fd = open_file(path)
            except (OSError, Refused):
                continue
            with os.fdopen(fd, "rb") as source:
                found = os.fstat(source.fileno())
                data = source.read()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), stat.S_IMODE(found.st_mode)
            info.mtime = found.st_mtime
            out.addfile(info, io.BytesIO(data))
    return 0


def private_dir(path):
    """private-dir PATH: a folder of this account's own, made mode 700 if missing."""
    with in_folder(path) as (folder, name):
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=folder)
        found = os.stat(name, dir_fd=folder, follow_symlinks=False)
    return 0 if stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid() else 1


def mkdir(path):
    """mkdir PATH: with its parents below its job root (which must exist)."""
    os.close(open_folder(path, make=True))
    return 0


def mode(path):
    """mode PATH: its permission bits, in octal (a job root's own, or a file's in one)."""
    fd = open_folder(path) if not names_below_root(path.rstrip("/") or path)[1] else None
    if fd is not None:
        found = os.fstat(fd)
        os.close(fd)
    else:
        with in_folder(path) as (folder, name):
            found = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISLNK(found.st_mode):
            raise Refused(f"{path} is a link; links are not followed")
    sys.stdout.write(f"{stat.S_IMODE(found.st_mode):o}\n")
    return 0


def executable(path):
    """executable PATH: 0 when a regular file (not a link) this account may run."""
    with in_folder(path) as (folder, name):
        try:
            found = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return 1
        runs = stat.S_ISREG(found.st_mode) and os.access(name, os.X_OK, dir_fd=folder)
    return 0 if runs else 1


def remove(path):
    """remove FILE: a regular file; nothing when missing; 1 for anything else (a link too)."""
    try:
        with in_folder(path) as (folder, name):
            found = os.stat(name, dir_fd=folder, follow_symlinks=False)
            if not stat.S_ISREG(found.st_mode):
                return 1
            os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        return 0
    return 0


OPERATIONS: "dict[str, tuple[Callable[..., int], int | None]]" = {
    "write": (write, 2),
    "read": (read, 3),
    "unpack": (unpack, None),
    "submit-each": (submit_each, None),
    "unpack-each": (unpack_each, None),
    "collect": (collect, None),
    "private-dir": (private_dir, 1),
    "mkdir": (mkdir, 1),
    "mode": (mode, 1),
    "executable": (executable, 1),
    "remove": (remove, 1),
}


def _copy(source, target, limit):
    left = limit
    while left is None or left > 0:
        data = source.read(_CHUNK if left is None else min(_CHUNK, left))
        if not data:
            return
        target.write(data)
        if left is not None:
            left -= len(data)


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in OPERATIONS:
        sys.stderr.write(f"usage: klique-helper {{{','.join(OPERATIONS)}}} ARGUMENTS...\n")
        return 2
    function, count = OPERATIONS[args[0]]
    rest = args[1:]
    if count is not None and len(rest) != count:
        sys.stderr.write(f"klique-helper {args[0]} takes {count} arguments\n")
        return 2
    try:
        return function(*rest)
    except Refused as exc:
        sys.stderr.write(f"klique-helper {args[0]}: refused: {exc}\n")
        return NOT_SUBMIT if isinstance(exc, NotSubmit) else REFUSED
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"klique-helper {args[0]}: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
