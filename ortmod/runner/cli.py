"""``ortmod-train``: runs the native training runner (the compiled C binary) with the
given arguments. See ``ortmod-train --help``."""
import os
import sys

from ortmod.runner import find_binary


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        binary = find_binary()
    except ValueError as e:
        sys.stderr.write(f"ortmod-train: {e}\n")
        return 1
    if binary is None:
        sys.stderr.write("ortmod-train: the compiled runner was not found (looked in ortmod/bin/ and "
                         "ORTMOD_TRAIN_BINARY); build it with 'make build' or 'pip install .'\n")
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(binary, [binary] + argv)   # does not return


if __name__ == "__main__":
    sys.exit(main())
