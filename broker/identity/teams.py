"""Which team a signed-in person is in, and whether they administer Klique: from the estate's
`teams:` lists first, then from the groups the identity provider says they hold."""

from __future__ import annotations

from broker.domain import Estate


def team_for(estate: Estate, user: str, groups: list[str] | tuple[str, ...]) -> str | None:
    """A user's team: the estate's `teams:` list that names them, else the first entry of
    `identity.groups` (in file order) whose group they are in."""
    team = estate.team_of(user)
    if team is not None or estate.identity is None:
        return team
    held = set(groups)
    for group, mapped in estate.identity.groups.items():
        if group in held:
            return mapped
    return None


def is_admin(estate: Estate, groups: list[str] | tuple[str, ...]) -> bool:
    """Whether any of the groups is one of `identity.admin_groups`."""
    return estate.identity is not None and bool(set(estate.identity.admin_groups) & set(groups))
