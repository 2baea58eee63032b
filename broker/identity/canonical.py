"""One Klique user per person: the name a directory or a provider gives is normalised the way
the directory compares names (NFKC, surrounding spaces dropped, lower-cased where the site's
names ignore case), so that "ALICE", " alice" and "ａｌｉｃｅ" are alice, never a second user.
Pure: no I/O."""

from __future__ import annotations

import re
import unicodedata

from broker.names import NAME

_NAME = re.compile(NAME)


class NotAName(ValueError):
    """A name that is not a Klique user name once normalised; the message says why."""


def normal_name(given: str, case_sensitive: bool = False) -> str:
    """`given` as the directory compares it: NFKC (compatibility forms such as full-width
    letters or the Kelvin sign become their plain letters), without surrounding spaces, and
    lower-cased unless the site's names are case-sensitive. Not checked: see `user_name`."""
    name = unicodedata.normalize("NFKC", given).strip()
    # NFKC first: a full-width capital must become a plain one before it is lower-cased.
    return name if case_sensitive else name.lower()


def user_name(given: str, case_sensitive: bool = False, where: str = "the user name") -> str:
    """The Klique user name `given` stands for; NotAName, with a sentence, when it is none."""
    name = normal_name(given, case_sensitive)
    if not _NAME.fullmatch(name):
        raise NotAName(
            f"{where} {given!r} is not a Klique user name (a letter or digit, then letters, "
            "digits, '.', '_' or '-', at most 64)"
        )
    return name
