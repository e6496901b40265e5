"""`ferry users ...`, and the check that a shared server has users to sign in with.

The user store itself belongs to web/ (web.auth); this module only drives it from the CLI.
"""
from __future__ import annotations

import argparse
import sys

from app.paths import Paths


def users_exist(paths: Paths) -> bool:
    """True when the data dir holds a non-empty users file (someone can sign in)."""
    path = paths.users_file
    try:
        return path.is_file() and path.stat().st_size > 0 and path.read_text().strip() not in (
            "", "{}", "[]")
    except OSError:
        return False


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser(
        "users", help="manage users and access tokens for LAN sharing",
        description="Manage the users who may sign in when Ferry listens beyond this machine "
                    "(--host other than 127.0.0.1). Each user gets an access token; admins see "
                    "and cancel every request, others only their own.")
    actions = parser.add_subparsers(dest="users_action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="create a user and print their access token",
                             description="Create a user and print their new access token once.")
    add.add_argument("name", metavar="NAME")
    add.add_argument("--admin", action="store_true", help="may see and cancel all requests")
    actions.add_parser("list", help="list users (never their tokens)",
                       description="List users and whether each is an admin.")
    remove = actions.add_parser("remove", help="delete a user and revoke their token",
                                description="Delete a user; their token stops working.")
    remove.add_argument("name", metavar="NAME")
    rotate = actions.add_parser("rotate", help="issue a new token, revoking the old one",
                                description="Replace a user's token and print the new one.")
    rotate.add_argument("name", metavar="NAME")


def run(args: argparse.Namespace, paths: Paths) -> int:
    # TODO(lead): wire to web.auth.UserStore once web/ provides it.
    print(f"ferry users {args.users_action}: the user store (web.auth) is not available yet",
          file=sys.stderr)
    return 1
