"""What a transport does in a job folder, as the account: each operation one small shell
script whose paths and modes arrive as arguments ("$1", "$2"), never as script text. A sudo
transport runs the same operations through the one helper program its sudoers rule allows
(broker/helper.py), which must do what these scripts do and, since its caller is not trusted,
nothing outside the job roots its own configuration lists: no link followed, no program run but
SUBMIT_PROGRAMS.
"""

from __future__ import annotations

import io
import re
import tarfile
import time
from collections.abc import Mapping

from broker.errors import TransportError

UNPACK_FAILED = 125
UNPACK_WORDS = "klique: the files above could not be written"
MISSING = 3  # read: the file is not there
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# A job folder as PoolDriver.new_job_dir names it (tag, attempt, 12 random hex digits), at an
# absolute path of plain names: the only folders unpack-each makes.
JOB_FOLDER = re.compile(r"(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*/klique-[0-9]+-[0-9]+-[0-9a-f]{12}")
# The programs an unpack may run after writing a job folder (its submit command): the helper
# runs these and nothing else, so a sudoers rule for it grants no shell.
SUBMIT_PROGRAMS = ("sbatch", "qsub", "bsub")
NOT_SUBMIT = 126  # submit-each: the item's command is not one of SUBMIT_PROGRAMS
# submit-each and unpack-each: one line per item on stdout, "item INDEX EXIT STDOUT STDERR"
# (base64, so that nothing a command prints can break the lines).
ITEM_LINE = re.compile(r"item (\d+) (\d+) ([A-Za-z0-9+/=]*) ?([A-Za-z0-9+/=]*)")
# Without SBATCH_* and SLURM_* but SLURM_CONF: sbatch(1), "INPUT ENVIRONMENT VARIABLES", they
# override the script's #SBATCH lines (a login shell's SBATCH_TIMELIMIT or SBATCH_PARTITION
# would change the job), and an enclosing job's SLURM_* would leak into the new one.
_SCRUB = (
    "for name in $(env | sed -n 's/^\\(S\\(BATCH\\|LURM\\)_[A-Za-z0-9_]*\\)=.*/\\1/p'); do "
    '[ "$name" = SLURM_CONF ] || unset "$name"; done; '
)
# A Slurm job's environment: sbatch starts with exactly these (the step's own values) and
# SLURM_CONF, and the job script asks for --export=ALL. sbatch(1) --export: a list of names, or
# NONE, also sets SLURM_GET_USER_ENV, so that slurmd runs the account's login shell for every
# job it starts and adds that environment to the job's (docs/slurm-sites.md).
SLURM_JOB_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR")
_SBATCH_ENV = (
    'case "$1" in sbatch) set -- env -i '
    + " ".join(f'${{{name}+"{name}=${name}"}}' for name in (*SLURM_JOB_ENV, "SLURM_CONF"))
    + ' "$@";; esac; '
)
_UNPACKED = f'{{ echo "{UNPACK_WORDS}" >&2; exit {UNPACK_FAILED}; }}'

SCRIPTS: dict[str, str] = {
    # write PATH MODE < data: atomically (a temporary name in the same folder, then rename).
    "write": (
        'set -e; tmp=$(mktemp "$1.XXXXXX"); trap \'rm -f "$tmp"\' EXIT; '
        'cat >"$tmp"; chmod "$2" "$tmp"; mv -f "$tmp" "$1"; trap - EXIT'
    ),
    # read PATH FROM LIMIT: up to LIMIT bytes from byte FROM (1-based); exit 3 when missing.
    "read": f'test -e "$1" || exit {MISSING}; tail -c +"$2" -- "$1" | head -c "$3"',
    # unpack FOLDER [--stdin=FILE] [COMMAND...] < tar: a NEW folder (mkdir without -p fails on
    # any existing name: a folder, a link, a file someone planted; -m 700 makes it private from
    # the first instant), its files with their modes, then the command, if any, in the same
    # process (umask 077: what it starts, a batch job, makes private files too), without the
    # scheduler's input variables (_SCRUB), sbatch with the job's environment only (_SBATCH_ENV).
    "unpack": (
        f'umask 077; mkdir -m 700 -- "$1" && tar -x -m -p -f - -C "$1" || {_UNPACKED}; shift; '
        f'[ "$#" -eq 0 ] && exit 0; {_SCRUB}'
        'case "$1" in --stdin=*) input=${1#--stdin=}; shift; exec <"$input";; esac; '
        f'{_SBATCH_ENV}exec "$@"'
    ),
    # submit-each [N [--stdin=FILE] COMMAND...]...: each item's command (its N words), one of
    # SUBMIT_PROGRAMS, run from /dev/null or its --stdin file (_SCRUB once for all, then
    # _SBATCH_ENV; the subshell that slices out its words becomes the command), then its
    # ITEM_LINE. Items are independent; a fault in the framing ends the whole with
    # UNPACK_FAILED. A burst of submissions is unpack-each for the folders, then this for those
    # made.
    "submit-each": (
        f"umask 077; {_SCRUB}out=$(mktemp -d) || exit {UNPACK_FAILED}; "
        "trap 'rm -rf -- \"$out\"' EXIT; i=0; "
        'while [ "$#" -gt 0 ]; do n=$1; shift; '
        f'case "$n" in ""|*[!0-9]*) exit {UNPACK_FAILED};; esac; '
        f'[ "$n" -ge 1 ] && [ "$n" -le "$#" ] || exit {UNPACK_FAILED}; '
        '( c=$#; k=0; for a do k=$((k + 1)); [ "$k" -gt "$n" ] || set -- "$@" "$a"; done; '
        'shift "$c"; input=/dev/null; case "$1" in --stdin=*) input=${1#--stdin=}; shift;; esac; '
        f'case "$1" in {"|".join(SUBMIT_PROGRAMS)}) {_SBATCH_ENV}exec "$@" <"$input";; esac; '
        f'echo "klique: runs only {", ".join(SUBMIT_PROGRAMS)} after unpack" >&2; '
        f'exit {NOT_SUBMIT} ) >"$out/1" 2>"$out/2"; rc=$?; o=; e=; '
        '[ -s "$out/1" ] && o=$(base64 -w0 "$out/1"); [ -s "$out/2" ] && e=$(base64 -w0 "$out/2"); '
        'printf "item %s %s %s %s\\n" "$i" "$rc" "$o" "$e"; shift "$n"; i=$((i + 1)); done'
    ),
    # unpack-each PARENT NAME... < tar: in PARENT, a NEW folder of mode 700 for each NAME (one
    # mkdir for all: a NAME that was there before, or that is not then a folder of the account's
    # own, is not made), then one tar of their files, each NAME/FILE; a line per NAME, "item
    # INDEX EXIT " (0: made; UNPACK_FAILED: not). The files of a name not made are left out of
    # the tar (--exclude), so that nothing lands in a folder or a link another account planted
    # or that was there before; a fault in the tar fails the whole.
    "unpack-each": (
        f'umask 077; cd -- "$1" || {_UNPACKED}; shift; n=$#; old=" "; i=0; '
        'for d do { [ -e "$d" ] || [ -L "$d" ]; } && old="$old$i "; i=$((i + 1)); done; '
        'mkdir -m 700 -- "$@" 2>/dev/null; i=0; '
        'for d do r=0; case "$old" in *" $i "*) r=125;; esac; '
        '[ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] || r=125; '
        f'[ "$r" -eq 0 ] || {{ r={UNPACK_FAILED}; set -- "$@" "--exclude=$d"; }}; '
        'echo "item $i $r "; i=$((i + 1)); done; '
        f'shift "$n"; tar -x -m -p -f - --anchored "$@" || {_UNPACKED}'
    ),
    # collect PATH...: the regular files among them as a tar stream, each read once; links
    # stored as links (never followed); missing ones skipped.
    "collect": 'exec tar -c -f - --ignore-failed-read --warning=no-failed-read -- "$@" 2>/dev/null',
    # private-dir PATH: a folder of the account's own, made mode 700 if missing; else refused.
    "private-dir": (
        'mkdir -m 700 -- "$1" 2>/dev/null; test -d "$1" && test ! -L "$1" && test -O "$1"'
    ),
    "mkdir": 'exec mkdir -p -- "$1"',  # mkdir PATH, with its parents
    "mode": 'exec stat -L -c %a -- "$1"',  # mode PATH: its permission bits, in octal
    "executable": 'test -f "$1" && test -x "$1"',  # executable PATH
    "remove": 'test ! -e "$1" || { test -f "$1" && exec rm -f -- "$1"; }',  # remove FILE
}


def tar_of(files: Mapping[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def untar(data: bytes) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    if not data:
        return found
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for member in archive:
                content = archive.extractfile(member) if member.isreg() else None
                if content is not None:
                    found["/" + member.name.lstrip("/")] = content.read()
    except tarfile.TarError as exc:
        raise TransportError(f"a file listing could not be read: {exc}") from exc
    return found
