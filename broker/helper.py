#!/usr/bin/python3
"""klique-helper: the one program, besides the scheduler's own commands, that a login-node
agent runs as users through sudo (a pool with `transport: {kind: sudo}`).

    klique-helper OPERATION ARGUMENTS...

It does exactly what the shell scripts of broker/fileops.py do, operation by operation, so that
the sudoers rule can name it instead of a shell: after writing a job folder it runs only a
scheduler's submit command (sbatch, qsub, bsub), never a program of the caller's choosing.
Standard library only, Python 3.8+; install it root-owned and read-only:
`klique agent --install-helper /usr/local/libexec/klique-helper`.
"""

import base64
import contextlib
import io
import os
import re
import stat
import subprocess
import sys
import tarfile
import tempfile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

UNPACK_FAILED = 125
UNPACK_WORDS = "klique: the files above could not be written"
MISSING = 3
SUBMIT_PROGRAMS = ("sbatch", "qsub", "bsub")
NOT_SUBMIT = 126
JOB_FOLDER = re.compile(r"(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*/klique-[0-9]+-[0-9]+-[0-9a-f]{12}")
# sbatch starts with exactly these and SLURM_CONF: a Slurm job's environment (--export=ALL).
SLURM_JOB_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR")
_CHUNK = 1 << 16


def write(path, mode):
    """write PATH MODE < data: atomically, a temporary name in the same folder, then rename."""
    folder, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=name + ".", dir=folder or ".")
    try:
        with os.fdopen(fd, "wb") as out:
            _copy(sys.stdin.buffer, out, None)
        os.chmod(tmp, int(mode, 8))
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    return 0


def read(path, start, limit):
    """read PATH FROM LIMIT: up to LIMIT bytes from byte FROM (1-based); 3 when missing."""
    if not os.path.exists(path):
        return MISSING
    with open(path, "rb") as source:
        source.seek(int(start) - 1)
        _copy(source, sys.stdout.buffer, int(limit))
    return 0


def unpack(folder, *arguments):
    """unpack FOLDER [--stdin=FILE] [COMMAND...] < tar: a new private folder, its files, then
    the scheduler's submit command in the same process."""
    os.umask(0o077)
    try:
        os.mkdir(folder, 0o700)
        _extract(folder)
    except (OSError, ValueError, tarfile.TarError) as exc:
        sys.stderr.write(f"{exc}\n{UNPACK_WORDS}\n")
        return UNPACK_FAILED
    command = list(arguments)
    if not command:
        return 0
    if command[0].startswith("--stdin="):
        source = command.pop(0)[len("--stdin=") :]
        fd = os.open(source, os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
    if not command or command[0] not in SUBMIT_PROGRAMS:
        sys.stderr.write(f"klique-helper runs only {', '.join(SUBMIT_PROGRAMS)} after unpack\n")
        return 126
    # one of SUBMIT_PROGRAMS, checked above
    os.execvpe(command[0], command, _submit_env(command[0]))  # noqa: S606
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
    made = set()
    for index, name in enumerate(names):
        try:
            os.mkdir(os.path.join(parent, name), 0o700)
            made.add(name)
        except OSError:
            pass
        sys.stdout.write(f"item {index} {0 if name in made else UNPACK_FAILED} \n")
    sys.stdout.flush()
    try:
        with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as archive:
            for member in archive:
                name, _, file = member.name.partition("/")
                if name not in names:
                    raise ValueError(f"{member.name!r} is not in one of the folders named")
                if name in made:
                    _extract_member(archive, member, os.path.join(parent, name), file)
    except (OSError, ValueError, tarfile.TarError) as exc:
        sys.stderr.write(f"{exc}\n{UNPACK_WORDS}\n")
        return UNPACK_FAILED
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
    source = "/dev/null"
    if command[0].startswith("--stdin="):
        source = command.pop(0)[len("--stdin=") :]
    if not command or command[0] not in SUBMIT_PROGRAMS:
        words = f"klique: runs only {', '.join(SUBMIT_PROGRAMS)} after unpack\n"
        return NOT_SUBMIT, b"", words.encode()
    env = _submit_env(command[0])
    try:
        stdin = open(source, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        return 2, b"", f"{exc}\n".encode()  # as the shell's failed redirection
    with stdin:
        try:  # one of SUBMIT_PROGRAMS, checked above
            done = subprocess.run(command, stdin=stdin, capture_output=True, env=env, check=False)  # noqa: S603
        except OSError as exc:
            return (127 if isinstance(exc, FileNotFoundError) else 126), b"", f"{exc}\n".encode()
    code = done.returncode
    return (code if code >= 0 else 128 - code), done.stdout, done.stderr


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
    """One regular file of the tar into folder as name, a plain name, created new."""
    if not member.isreg() or "/" in name or name in ("", ".", ".."):
        raise ValueError(f"{member.name!r} is not a plain file name")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(os.path.join(folder, name), flags, member.mode & 0o777)
    with os.fdopen(fd, "wb") as out:
        source = archive.extractfile(member)
        if source is not None:
            _copy(source, out, None)


def collect(*paths):
    """collect PATH...: the regular files among them as a tar stream, each read once; links
    and missing files left out."""
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.USTAR_FORMAT) as out:
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as source:
                found = os.fstat(source.fileno())
                if not stat.S_ISREG(found.st_mode):
                    continue
                data = source.read()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), stat.S_IMODE(found.st_mode)
            info.mtime = found.st_mtime
            out.addfile(info, io.BytesIO(data))
    return 0


def private_dir(path):
    """private-dir PATH: a folder of this account's own, made mode 700 if missing."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    found = os.lstat(path)
    return 0 if stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid() else 1


def mkdir(path):
    os.makedirs(path, exist_ok=True)
    return 0


def mode(path):
    sys.stdout.write(f"{stat.S_IMODE(os.stat(path).st_mode):o}\n")
    return 0


def executable(path):
    return 0 if os.path.isfile(path) and os.access(path, os.X_OK) else 1


def remove(path):
    if not os.path.lexists(path):
        return 0
    if not os.path.isfile(path):
        return 1
    os.unlink(path)
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


def _unlink(path):
    with contextlib.suppress(OSError):
        os.unlink(path)


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
    paths = rest if args[0] == "collect" else [] if args[0] == "submit-each" else rest[:1]
    if any(not path.startswith("/") for path in paths):
        sys.stderr.write(f"klique-helper {args[0]}: paths must be absolute\n")
        return 2
    try:
        return function(*rest)
    except OSError as exc:
        sys.stderr.write(f"klique-helper {args[0]}: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
