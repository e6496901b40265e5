"""`ferry users ...`, and the check that a shared server has users to sign in with.

The user store itself is web.access.users.UserStore (users.json in the data dir); this module only
drives it from the command line.
"""
from __future__ import annotations

import argparse
import sys

from app.paths import Paths
from web.access.users import UserError, UserStore


def users_exist(paths: Paths) -> bool:
    """True when the users file holds at least one user (someone can sign in).

    Raises web.access.users.UserError when the file exists but cannot be read or is damaged.
    """
    return UserStore(paths.users_file).has_users()


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


def _fail(action: str, message: str) -> int:
    print(f"ferry users {action}: error: {message}", file=sys.stderr)
    return 1


def _show_token(name: str, token: str) -> None:
    # the token alone on stdout (so `ferry users add bob > bob.token` works); notes on stderr
    print(f"Access token for {name} (shown only this once: it cannot be displayed again, "
          f"only replaced with `ferry users rotate {name}`):", file=sys.stderr)
    print(token, flush=True)
    print("Sign in with it on the login page, or send it as `Authorization: Bearer <token>`.",
          file=sys.stderr)


def run(args: argparse.Namespace, paths: Paths) -> int:
    action = args.users_action
    store = UserStore(paths.users_file)
    try:
        if action == "add":
            token = store.add(args.name, admin=args.admin)
            role = "admin" if args.admin else "user"
            print(f"Created {role} {args.name} in {paths.users_file}.", file=sys.stderr)
            _show_token(args.name, token)
        elif action == "rotate":
            token = store.rotate(args.name)
            print(f"New token for {args.name}; the old token and their browser sessions "
                  f"no longer work.", file=sys.stderr)
            _show_token(args.name, token)
        elif action == "remove":
            store.remove(args.name)
            print(f"Removed {args.name}; their token and browser sessions no longer work.")
        else:
            records = store.list()
            if not records:
                print(f"No users yet ({paths.users_file}). "
                      f"Add one with `ferry users add NAME --admin`.")
                return 0
            width = max(4, *(len(r.name) for r in records))
            print(f"{'NAME':<{width}}  ADMIN  CREATED               ROTATED")
            for r in records:
                print(f"{r.name:<{width}}  {'yes' if r.admin else 'no':<5}  {r.created:<20}  "
                      f"{r.rotated or '-'}")
    except UserError as exc:
        return _fail(action, str(exc))
    except OSError as exc:
        return _fail(action, f"cannot write {paths.users_file}: {exc.strerror or exc}")
    return 0
