"""``python -m accord`` and the ``accord`` console script: the accord command line
(``run -n N prog ...``, ``bench``, ``store``), running in this process."""

import sys


def main(argv=None) -> int:
    from . import _native

    args = list(sys.argv[1:] if argv is None else argv)
    return _native.cli_main(["accord", *args], [sys.executable, "-m", "accord"])


if __name__ == "__main__":
    sys.exit(main())
