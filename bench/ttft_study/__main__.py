"""Regenerate the TTFT study in ``docs/ttft/`` from the profiles kept there.

``promptdistill ttft report`` with the docs' folders as defaults; every option of that
command works here too and overrides them.

Usage:
    python -m bench.ttft_study [--profiles docs/ttft/profiles] [--out docs/ttft] [--n-boot 500] [--note TEXT]
"""

from __future__ import annotations

import sys

from bench.common import setup

setup()

from promptdistill.cli import main  # noqa: E402

DOCS_DEFAULTS = ["--profiles", "docs/ttft/profiles", "--out", "docs/ttft"]
"""Where the study's profiles and its published report live (later options win)."""

if __name__ == "__main__":
    sys.exit(main(["ttft", "report", *DOCS_DEFAULTS, *sys.argv[1:]]))
