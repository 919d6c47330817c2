"""`python -m fabrickv --version`: the package's version, and which
Python and native module it runs on."""

import argparse
import sys

from . import __version__, _native


def main(argv: "list[str] | None" = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fabrickv",
                                 description="FabricKV's Python client.")
    ap.add_argument("--version", action="store_true",
                    help="print the package version and exit")
    args = ap.parse_args(argv)
    if args.version:
        print(f"fabrickv {__version__}")
        return 0
    print(f"fabrickv {__version__} (native module {_native.__file__}, "
          f"Python {sys.version.split()[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
