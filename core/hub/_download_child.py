"""Entry point of the download child process: `python -m core.hub._download_child WRITE_FD`."""

import sys

from core.hub.download import child_entry

if __name__ == "__main__":
    child_entry(int(sys.argv[1]))
