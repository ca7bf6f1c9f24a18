"""``python -m aiodlock``: the command line, :func:`aiodlock.cli.main`."""

from aiodlock.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
