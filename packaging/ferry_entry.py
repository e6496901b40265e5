"""PyInstaller entry point: the same as the `ferry` console script (app.cli:main)."""
from app.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
